"""The structured schema: one dataclass per Megatron-Bridge ConfigContainer section.

Section names follow Bridge's ConfigContainer and field names follow megatron-core 0.16.1's
TransformerConfig, so a Bridge user's ``cfg.model.x = y`` is ``model.x=y`` on the command
line. Types stay OmegaConf-native (no Literal, no Union of containers); closed sets are
string Enums, cross-field rules live in ``bridge.validation``.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from omegaconf import II


class EngineChoice(str, Enum):
    auto = "auto"
    megatron = "megatron"
    torch = "torch"


class Device(str, Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


class Mode(str, Enum):
    train = "train"
    plan = "plan"


class PlanFormat(str, Enum):
    text = "text"
    json = "json"


class CudaGraphImpl(str, Enum):
    """Canonical (decomposed) CUDA-graph implementation; translated to 0.16.1's API."""

    none = "none"
    local = "local"
    transformer_engine = "transformer_engine"
    full_iteration = "full_iteration"


# Per-layer capture regions, the names of megatron-core's CudaGraphScope minus full_iteration.
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")


@dataclass
class ModelConfig:
    # --- architecture (megatron-core TransformerConfig / GPTModel names) ---
    num_layers: int = 2
    hidden_size: int = 256
    ffn_hidden_size: Optional[int] = None
    """Dense MLP width; None means 4 * hidden_size as in megatron-core."""
    num_attention_heads: int = 4
    num_query_groups: Optional[int] = None
    """GQA groups; None means one per head (plain multi-head attention)."""
    kv_channels: Optional[int] = None
    """Per-head dimension; None means hidden_size / num_attention_heads."""
    vocab_size: int = 4096
    make_vocab_size_divisible_by: int = 128
    seq_length: int = 256
    share_embeddings_and_output_weights: bool = False
    normalization: str = "RMSNorm"
    layernorm_epsilon: float = 1e-5
    gated_linear_unit: bool = True
    activation_func: str = "silu"
    """One of silu, gelu, quick_gelu, squared_relu (a callable in megatron-core)."""
    activation_func_clamp_value: Optional[float] = None
    glu_linear_offset: float = 0.0
    add_bias_linear: bool = False
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    init_method_std: float = 0.02
    position_embedding_type: str = "rope"
    rotary_base: float = 10000.0
    rotary_percent: float = 1.0
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0
    window_size: Optional[List[int]] = None
    """Sliding-window attention (left, right); None is full attention."""
    window_attn_skip_freq: Optional[int] = None
    softmax_type: str = "vanilla"
    """vanilla, off-by-one or learnable (attention sinks)."""
    attention_output_gate: bool = False
    """Gate the attention output with a sigmoid of a projection of the input (Qwen3-Next)."""
    layernorm_zero_centered_gamma: bool = False
    """Norm weights stored as offsets from 1 (Qwen3-Next's zero-centred RMSNorm)."""
    # --- linear attention (Qwen3-Next's Gated DeltaNet layers) ---
    experimental_attention_variant: Optional[str] = None
    """None, gated_delta_net or dsa; gated_delta_net needs linear_attention_freq."""
    linear_attention_freq: Any = None
    """An int N (N-1 linear-attention layers per full-attention layer) or a 0/1 list per layer."""
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    # --- multi-latent attention (MLATransformerConfig) ---
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    rotary_scaling_factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    # --- mixture of experts ---
    num_moe_experts: Optional[int] = None
    moe_ffn_hidden_size: Optional[int] = None
    moe_router_topk: int = 2
    moe_layer_freq: Any = 1
    """An int (every n-th layer is MoE) or a 0/1 list with one entry per layer."""
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_shared_expert_overlap: bool = False
    moe_shared_expert_gate: bool = False
    """A sigmoid gate on the shared expert's output (Qwen3-Next)."""
    moe_router_score_function: str = "softmax"
    moe_router_pre_softmax: bool = False
    moe_router_enable_expert_bias: bool = False
    moe_router_num_groups: Optional[int] = None
    moe_router_group_topk: Optional[int] = None
    moe_router_topk_scaling_factor: Optional[float] = None
    moe_router_dtype: Optional[str] = None
    moe_router_load_balancing_type: str = "aux_loss"
    moe_aux_loss_coeff: float = 0.0
    moe_router_force_load_balancing: bool = False
    moe_router_fusion: bool = False
    moe_router_padding_for_fp8: bool = False
    moe_token_dispatcher_type: str = "allgather"
    moe_flex_dispatcher_backend: Optional[str] = None
    moe_expert_capacity_factor: Optional[float] = None
    moe_pad_expert_input_to_capacity: bool = False
    moe_input_jitter_eps: Optional[float] = None
    moe_grouped_gemm: bool = False
    moe_permute_fusion: bool = False
    moe_use_legacy_grouped_gemm: bool = False
    mtp_num_layers: Optional[int] = None
    mtp_loss_scaling_factor: float = 0.1
    # --- parallelism (ModelParallelConfig) ---
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None
    sequence_parallel: bool = False
    pipeline_model_parallel_layout: Optional[str] = None
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as a layer when splitting layers over pipeline stages."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the LM head and loss as a layer when splitting layers over pipeline stages."""
    batch_p2p_sync: bool = II("graphbridge.host_checks:${model.cuda_graph_impl}")
    """megatron-core synchronises the device after each batched pipeline send/recv (a workaround
    for old PyTorch). Derived: on, except under full-iteration graphs, which cannot capture it."""
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    tp_comm_overlap: bool = False
    # --- recompute and offloading ---
    recompute_granularity: Optional[str] = None
    """None, full or selective."""
    recompute_method: Optional[str] = None
    recompute_num_layers: Optional[int] = None
    recompute_modules: Optional[List[str]] = None
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    # --- precision and kernels ---
    bf16: bool = True
    fp16: bool = False
    fp8: Optional[str] = None
    """None, e4m3 or hybrid."""
    fp8_recipe: str = "tensorwise"
    fp4: Optional[str] = None
    transformer_impl: str = "transformer_engine"
    """transformer_engine or local: which megatron-core layer spec the megatron engine uses."""
    apply_rope_fusion: bool = False
    bias_activation_fusion: bool = False
    gradient_accumulation_fusion: bool = False
    cross_entropy_fusion_impl: str = "native"
    # --- CUDA graphs (canonical, decomposed API) ---
    cuda_graph_impl: CudaGraphImpl = CudaGraphImpl.none
    cuda_graph_modules: List[str] = field(default_factory=list)
    """Per-layer capture regions (see CUDA_GRAPH_MODULES); empty means the whole layer."""
    cuda_graph_warmup_steps: int = 3
    cuda_graph_use_single_mempool: bool = False
    cuda_graph_retain_backward_graph: bool = False
    use_te_rng_tracker: bool = II("rng.te_rng_tracker")
    """megatron-core's own switch for the TE RNG tracker; derived: follows rng.te_rng_tracker."""
    # --- older CUDA-graph spellings, migrated by bridge.config.migration ---
    cuda_graph_scope: Any = None
    """Deprecated: a name, a comma list or a list (full, full_iteration, attn, ...)."""
    enable_cuda_graph: bool = False
    """Deprecated: the same as cuda_graph_impl=local."""
    external_cuda_graph: bool = False
    """Deprecated: the same as cuda_graph_impl=transformer_engine."""


@dataclass
class RNGConfig:
    seed: int = 1234
    te_rng_tracker: bool = II("graphbridge.graphed:${model.cuda_graph_impl}")
    """Transformer Engine's RNG tracker, which CUDA graphs need; derived: on exactly when a graph
    impl is set."""
    inference_rng_tracker: bool = False


@dataclass
class RerunStateMachineConfig:
    check_for_nan_in_loss: bool = II("graphbridge.host_checks:${model.cuda_graph_impl}")
    """Derived: on, except under full-iteration graphs, where a host read cannot be captured."""


@dataclass
class DDPConfig:
    check_for_nan_in_grad: bool = II("graphbridge.host_checks:${model.cuda_graph_impl}")
    """Derived: on, except under full-iteration graphs, where a host read cannot be captured."""
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    grad_reduce_in_fp32: bool = False
    average_in_collective: bool = False


@dataclass
class TrainConfig:
    micro_batch_size: int = 1
    global_batch_size: int = II("graphbridge.global_batch:")
    """Derived: the preset's global batch weak-scaled to train.num_gpus (the batch per GPU stays), or
    one micro-batch per data-parallel rank when no preset names one."""
    train_iters: int = 50
    num_gpus: int = 1
    """GPUs the job runs on; data parallel size = num_gpus / (TP * PP * CP)."""
    num_nodes: int = 1
    """Nodes the job spans; GPUs per node = num_gpus / num_nodes (one torchrun per node)."""
    exit_signal_handler: bool = True


@dataclass
class OptimizerConfig:
    optimizer: str = "adam"
    lr: float = 3e-4
    min_lr: float = 3e-5
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    lr_warmup_iters: int = II("graphbridge.lr_warmup:${train.train_iters}")
    """Derived: a tenth of train.train_iters; megatron-core's scheduler needs it below train_iters."""
    lr_decay_style: str = "cosine"
    overlap_param_gather_with_optimizer_step: bool = False
    optimizer_in_graph: bool = False
    """Capture the optimizer step inside the full-iteration graph (capturable optimizer,
    learning rate as a device tensor); beyond what Bridge does on megatron-core 0.16.1. Read by
    the megatron engine; the torch engine's full-iteration graph always holds its optimizer."""


@dataclass
class DatasetConfig:
    seq_length: int = 256
    mock: bool = True
    """Synthetic token data with static shapes (the embedded default dataset)."""
    packed_sequence: bool = False
    pad_to_max_length: bool = True
    pad_cu_seqlens: bool = False


@dataclass
class WorkloadConfig:
    """Which per-(gpu, precision) preset a recipe was tuned with; filled by recipe presets."""

    task: str = "pretrain"
    gpu: Optional[str] = None
    """h100, b200, b300, gb200 or gb300; None when the recipe has no preset."""
    precision: Optional[str] = None
    preset_num_gpus: Optional[int] = None
    """GPU count the preset was tuned for (global batch is weak-scaled from it)."""
    preset_global_batch_size: Optional[int] = None
    """The preset's global batch at preset_num_gpus; train.global_batch_size derives from it."""


@dataclass
class PlanConfig:
    format: PlanFormat = PlanFormat.text
    megatron_core: Optional[str] = None
    """The megatron-core version to plan for; None: the installed one."""


@dataclass
class PerfConfig:
    warmup_steps: int = 3
    """Eager steps excluded from timing, besides the capture step."""
    nan_check_interval: int = 10
    """Read the device-side finite check of loss and gradient norm every N steps (0 = off). It
    runs inside full-iteration graphs, where the loss and grad NaN checks must be off."""
    inject_nan_at_step: Optional[int] = None
    """Testing aid: multiply the loss by NaN from this step on, inside the (graphed) step."""
    profile: bool = False
    """Trace the last ``profile_steps`` steps with torch.profiler (trace.json in the job
    directory) and report GPU kernel time per step and the GPU-busy fraction in result.json.
    Those steps are left out of the step-time statistics: the profiler slows the host."""
    profile_steps: int = 5


@dataclass
class GraphBridgeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    rng: RNGConfig = field(default_factory=RNGConfig)
    rerun_state_machine: RerunStateMachineConfig = field(default_factory=RerunStateMachineConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    env_vars: Dict[str, str] = field(default_factory=dict)
    engine: EngineChoice = EngineChoice.auto
    """auto: megatron when CUDA and megatron-core are present, else torch."""
    device: Device = Device.auto
    torch_compile: str = "none"
    """torch engine only: none, default or reduce-overhead."""
    mode: Mode = Mode.train
    """train runs the job; plan stops after validation and translation."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
