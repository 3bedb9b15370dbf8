"""The model section of the schema (megatron-core's TransformerConfig and GPTModel fields), with the
CUDA-graph vocabulary it uses; bridge.config.schema assembles it with the other sections."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, List, Optional

from omegaconf import II


class CudaGraphImpl(str, Enum):
    """Canonical (decomposed) CUDA-graph implementation, megatron-core 0.19's; translated to each
    supported release's spelling (bridge.config.releases)."""

    none = "none"
    local = "local"
    transformer_engine = "transformer_engine"
    full_iteration = "full_iteration"


class InferenceCudaGraphScope(str, Enum):
    """What owns a CUDA graph during inference (megatron-core 0.19's InferenceCudaGraphScope)."""

    none = "none"
    layer = "layer"
    block = "block"


# Per-layer capture regions, the names of megatron-core's CudaGraphScope minus full_iteration.
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")


@dataclass
class ModelConfig:
    # --- architecture (megatron-core TransformerConfig / GPTModel names) ---
    num_layers: int = 2
    """Transformer layers in the decoder."""
    hidden_size: int = 256
    """Width of the residual stream."""
    ffn_hidden_size: Optional[int] = None
    """Dense MLP width; None means 4 * hidden_size as in megatron-core."""
    num_attention_heads: int = 4
    """Query heads per attention layer."""
    num_query_groups: Optional[int] = None
    """GQA groups; None means one per head (plain multi-head attention)."""
    kv_channels: Optional[int] = None
    """Per-head dimension; None means hidden_size / num_attention_heads."""
    vocab_size: int = 4096
    """Tokens in the vocabulary (padded to make_vocab_size_divisible_by x TP for the embedding)."""
    make_vocab_size_divisible_by: int = 128
    """Pad the vocabulary to a multiple of this (times TP), as Megatron-LM does."""
    seq_length: int = 256
    """The model's sequence length; conf/config.yaml ties it to dataset.seq_length (graphs need one static
    length)."""
    share_embeddings_and_output_weights: bool = False
    """Tie the output layer to the input embedding."""
    normalization: str = "RMSNorm"
    """RMSNorm or LayerNorm."""
    layernorm_epsilon: float = 1e-5
    """Epsilon of the normalisation layers (above 0)."""
    gated_linear_unit: bool = True
    """A gated MLP (SwiGLU with silu): the first projection is twice ffn_hidden_size wide."""
    activation_func: str = "silu"
    """One of silu, gelu, quick_gelu, squared_relu (a callable in megatron-core)."""
    activation_func_clamp_value: Optional[float] = None
    """Clamp the MLP activation to +-this value (GPT-OSS); None: no clamp."""
    glu_linear_offset: float = 0.0
    """Offset added to the linear half of a gated linear unit (GPT-OSS uses 1.0)."""
    add_bias_linear: bool = False
    """Biases in the linear layers of attention and MLP."""
    add_qkv_bias: bool = False
    """Biases in the query/key/value projection only (Qwen2-style)."""
    qk_layernorm: bool = False
    """Normalise queries and keys per head before attention (Qwen3)."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities; 0 in every Bridge recipe (graphed recompute forbids it)."""
    hidden_dropout: float = 0.0
    """Dropout on the residual stream; 0 in every Bridge recipe (graphed recompute forbids it)."""
    init_method_std: float = 0.02
    """Standard deviation of the normal weight initialisation."""
    position_embedding_type: str = "rope"
    """rope, yarn, learned_absolute or none."""
    rotary_base: float = 10000.0
    """RoPE base frequency (theta)."""
    rotary_percent: float = 1.0
    """Fraction of each head's dimensions that rotate (0 to 1)."""
    rope_scaling: bool = False
    """Llama 3.1's RoPE frequency scaling for long context."""
    rope_scaling_factor: float = 8.0
    """The factor of Llama 3.1's RoPE scaling."""
    window_size: Optional[List[int]] = None
    """Sliding-window attention (left, right); None is full attention."""
    window_attn_skip_freq: Optional[int] = None
    """Every N-th layer attends fully while the others use window_size (GPT-OSS alternates); None: all
    windowed."""
    softmax_type: str = "vanilla"
    """vanilla, off-by-one or learnable (attention sinks)."""
    attention_output_gate: bool = False
    """Gate the attention output with a sigmoid of a projection of the input (Qwen3-Next)."""
    layernorm_zero_centered_gamma: bool = False
    """Norm weights stored as offsets from 1 (Qwen3-Next's zero-centred RMSNorm)."""
    # --- linear attention (Qwen3-Next's Gated DeltaNet layers) ---
    experimental_attention_variant: Optional[str] = None
    """None or gated_delta_net (which needs linear_attention_freq); megatron-core 0.19's dsa needs indexer fields
    graphbridge does not have."""
    linear_attention_freq: Any = None
    """An int N (N-1 linear-attention layers per full-attention layer) or a 0/1 list per layer."""
    linear_conv_kernel_dim: int = 4
    """Gated DeltaNet: width of the short convolution."""
    linear_key_head_dim: int = 128
    """Gated DeltaNet: key head dimension."""
    linear_value_head_dim: int = 128
    """Gated DeltaNet: value head dimension."""
    linear_num_key_heads: int = 16
    """Gated DeltaNet: key heads."""
    linear_num_value_heads: int = 32
    """Gated DeltaNet: value heads."""
    # --- multi-latent attention (MLATransformerConfig) ---
    multi_latent_attention: bool = False
    """DeepSeek's multi-latent attention (megatron-core's MLATransformerConfig)."""
    q_lora_rank: Optional[int] = None
    """MLA: rank of the query down-projection; None: queries are projected directly."""
    kv_lora_rank: int = 512
    """MLA: rank of the compressed key/value latent."""
    qk_head_dim: int = 128
    """MLA: query/key head dimension without the rotary part."""
    qk_pos_emb_head_dim: int = 64
    """MLA: the rotary part of the query/key head dimension."""
    v_head_dim: int = 128
    """MLA: value head dimension."""
    rotary_scaling_factor: float = 1.0
    """YaRN: context extension factor."""
    original_max_position_embeddings: int = 4096
    """YaRN: the context length the model was trained with."""
    beta_fast: float = 32.0
    """YaRN: the fast boundary of the frequency ramp."""
    beta_slow: float = 1.0
    """YaRN: the slow boundary of the frequency ramp."""
    mscale: float = 1.0
    """YaRN: attention temperature scale."""
    mscale_all_dim: float = 0.0
    """YaRN: attention temperature scale over all dimensions."""
    yarn_correction_range_round_to_int: bool = True
    """YaRN outside MLA: round the frequency ramp's bounds to whole dimensions (megatron-core's default);
    GPT-OSS does not (its rope_scaling says truncate: false). MLA's YaRN always rounds."""
    # --- mixture of experts ---
    num_moe_experts: Optional[int] = None
    """Experts per MoE layer; None (or 1) is a dense model."""
    moe_ffn_hidden_size: Optional[int] = None
    """Width of each expert's MLP."""
    moe_router_topk: int = 2
    """Experts each token is routed to."""
    moe_layer_freq: Any = 1
    """An int (every n-th layer is MoE) or a 0/1 list with one entry per layer."""
    moe_shared_expert_intermediate_size: Optional[int] = None
    """Width of the shared expert that every token passes through; None: no shared expert."""
    moe_shared_expert_overlap: bool = False
    """Overlap the shared expert with the token dispatch (changes what a moe_router graph holds)."""
    moe_shared_expert_gate: bool = False
    """A sigmoid gate on the shared expert's output (Qwen3-Next)."""
    moe_router_score_function: str = "softmax"
    """softmax or sigmoid scores of the router."""
    moe_router_pre_softmax: bool = False
    """Softmax over all experts before top-k (else over the chosen k)."""
    moe_router_enable_expert_bias: bool = False
    """DeepSeek-V3's aux-loss-free load balancing bias per expert."""
    moe_router_num_groups: Optional[int] = None
    """Group-limited routing: expert groups (DeepSeek-V3); None: no groups."""
    moe_router_group_topk: Optional[int] = None
    """Group-limited routing: groups each token may use."""
    moe_router_topk_scaling_factor: Optional[float] = None
    """Scale of the top-k routing weights; None: 1."""
    moe_router_dtype: Optional[str] = None
    """Dtype of the router's computation (fp32 or fp64); None: the model's."""
    moe_router_load_balancing_type: str = "aux_loss"
    """aux_loss, seq_aux_loss, sinkhorn or none."""
    moe_aux_loss_coeff: float = 0.0
    """Weight of the load-balancing loss."""
    moe_router_force_load_balancing: bool = False
    """Route tokens uniformly at random (benchmarks: balanced experts whatever the weights)."""
    moe_router_fusion: bool = False
    """Transformer Engine's fused router kernel."""
    moe_router_padding_for_fp8: bool = False
    """Pad the routing map for fp8 GEMMs (host syncs in the alltoall preprocess)."""
    moe_token_dispatcher_type: str = "allgather"
    """allgather, alltoall or flex (DeepEP/HybridEP; needs TP x EP > 1)."""
    moe_flex_dispatcher_backend: Optional[str] = None
    """deepep or hybridep under the flex dispatcher."""
    moe_expert_capacity_factor: Optional[float] = None
    """Tokens per expert as a multiple of the balanced share; None: dropless."""
    moe_pad_expert_input_to_capacity: bool = False
    """Pad every expert's input to its capacity: static shapes (drop-and-pad), which graphs of whole MoE
    layers need."""
    moe_input_jitter_eps: Optional[float] = None
    """Multiplicative jitter on the router input; None: off."""
    moe_grouped_gemm: bool = False
    """Run the experts as one grouped GEMM."""
    moe_permute_fusion: bool = False
    """Transformer Engine's fused token permutation."""
    moe_use_legacy_grouped_gemm: bool = False
    """The older grouped GEMM implementation (no delayed wgrad); megatron-core 0.19 removed it."""
    mtp_num_layers: Optional[int] = None
    """Multi-token prediction layers (DeepSeek-V3); None: off."""
    mtp_loss_scaling_factor: float = 0.1
    """Weight of the multi-token prediction loss."""
    # --- parallelism (ModelParallelConfig) ---
    tensor_model_parallel_size: int = 1
    """TP: GPUs that split every layer's weights."""
    pipeline_model_parallel_size: int = 1
    """PP: pipeline stages."""
    virtual_pipeline_model_parallel_size: Optional[int] = None
    """VP: model chunks per pipeline stage (interleaved schedule); None: one."""
    context_parallel_size: int = 1
    """CP: GPUs that split the sequence in attention."""
    expert_model_parallel_size: int = 1
    """EP: GPUs that split the experts."""
    expert_tensor_parallel_size: Optional[int] = None
    """ETP: tensor parallelism inside experts; None: the same as TP."""
    sequence_parallel: bool = False
    """Split the non-attention activations over the TP ranks (needs TP > 1)."""
    pipeline_model_parallel_layout: Optional[str] = None
    """An explicit layer layout over the stages (E embedding, t layer, m MTP, L loss); None: even split."""
    account_for_embedding_in_pipeline_split: bool = False
    """Count the embedding as a layer when splitting layers over pipeline stages."""
    num_layers_in_first_pipeline_stage: Optional[int] = None
    """Uneven pipeline split: layers of the first stage; None: an even split."""
    num_layers_in_last_pipeline_stage: Optional[int] = None
    """Uneven pipeline split: layers of the last stage; None: an even split."""
    account_for_loss_in_pipeline_split: bool = False
    """Count the LM head and loss as a layer when splitting layers over pipeline stages."""
    batch_p2p_sync: bool = II("graphbridge.host_checks:${model.cuda_graph_impl}")
    """megatron-core synchronises the device after each batched pipeline send/recv (a workaround
    for old PyTorch). Derived: on, except under full-iteration graphs, which cannot capture it."""
    overlap_moe_expert_parallel_comm: bool = False
    """Overlap the EP all-to-all with computation (A2A overlap)."""
    delay_wgrad_compute: bool = False
    """Delay weight-gradient GEMMs to overlap them with the EP all-to-all."""
    tp_comm_overlap: bool = False
    """Overlap TP communication with GEMMs (Transformer Engine userbuffers)."""
    # --- recompute and offloading ---
    recompute_granularity: Optional[str] = None
    """None, full or selective."""
    recompute_method: Optional[str] = None
    """uniform or block, for full recompute."""
    recompute_num_layers: Optional[int] = None
    """Layers recomputed per stage under full recompute."""
    recompute_modules: Optional[List[str]] = None
    """Selective recompute: which parts (core_attn, mlp, moe, moe_act, layernorm, mla_up_proj, ...); None
    means [core_attn] as in megatron-core."""
    cpu_offloading: bool = False
    """Offload activations to the CPU (no CUDA graph can run with it)."""
    cpu_offloading_num_layers: int = 0
    """Layers whose activations are offloaded."""
    # --- precision and kernels ---
    bf16: bool = True
    """bfloat16 parameters and compute (mixed precision with fp32 main grads)."""
    fp16: bool = False
    """float16 parameters and compute with a loss scaler."""
    fp8: Optional[str] = None
    """None, e4m3 or hybrid."""
    fp8_recipe: str = "tensorwise"
    """tensorwise, delayed, mxfp8 or blockwise scaling of fp8 GEMMs."""
    fp4: Optional[str] = None
    """None, or the fp4 format of megatron-core's fp4 GEMMs (Blackwell): e2m1, as precision=nvfp4 sets it (the
    recipe, fp4_recipe, defaults to nvfp4)."""
    transformer_impl: str = "transformer_engine"
    """transformer_engine or local: which megatron-core layer spec the megatron engine uses."""
    apply_rope_fusion: bool = False
    """A fused RoPE kernel."""
    bias_activation_fusion: bool = False
    """Fuse the bias add with the MLP activation."""
    gradient_accumulation_fusion: bool = False
    """Accumulate weight gradients into the fp32 main grads in the GEMM (needs the fused kernel)."""
    cross_entropy_loss_fusion: bool = False
    """Compute the loss with a fused cross-entropy kernel (cross_entropy_fusion_impl picks it) instead of
    upcasting the whole logits tensor to fp32: at a 128k vocabulary and seq 8192 it saved 3.4 GiB and 8 %
    of the step (llama32_1b beside Bridge, docs/benchmarks.md; every Bridge model sets it)."""
    cross_entropy_fusion_impl: str = "native"
    """native or te: the fused cross-entropy kernel, when cross_entropy_loss_fusion is on."""
    bias_dropout_fusion: bool = False
    """Fuse the bias add, dropout and residual add after attention and the MLP."""
    masked_softmax_fusion: bool = False
    """A fused scale-mask-softmax in the local layer spec's attention (Transformer Engine's has its own)."""
    persist_layer_norm: bool = False
    """Apex's persistent layer-norm kernel where the local layer spec uses apex."""
    disable_parameter_transpose_cache: bool = False
    """Under fp8 or fp4, Transformer Engine quantizes each linear weight again every micro-batch instead of keeping
    its quantized copies across the step's micro-batches: one low-precision copy of every weight less, a cast more
    each micro-batch. Bridge's Llama 3 SFT and LoRA recipes set it (preset/bridge_finetune)."""
    # --- CUDA graphs (canonical, decomposed API) ---
    cuda_graph_impl: CudaGraphImpl = CudaGraphImpl.none
    """none, full_iteration, local or transformer_engine: how the step is graphed (the cuda_graph group sets
    it with the modules)."""
    cuda_graph_modules: List[str] = field(default_factory=list)
    """Per-layer capture regions (see CUDA_GRAPH_MODULES); empty means the whole layer."""
    inference_cuda_graph_scope: Optional[InferenceCudaGraphScope] = None
    """megatron-core 0.19's inference CUDA-graph owner: layer or block for local, none for every
    other impl; None is that release's default for the impl (layer for local, else none).
    megatron-core 0.16.1 has no such field."""
    moe_pad_experts_for_cuda_graph_inference: bool = False
    """megatron-core 0.19's switch for MoE decoding under CUDA graphs: drop-and-pad routing at a
    capacity no expert can exceed, so the decode step has no host sync (its inference engine requires
    it for local graphs with expert parallelism). Training never reads it; graphbridge passes it on.
    megatron-core 0.16.1 has no such field."""
    cuda_graph_warmup_steps: int = 3
    """Eager steps before capture (megatron-core's local graphs capture during the first step instead)."""
    cuda_graph_use_single_mempool: bool = False
    """One memory pool: on 0.16.1 for all local per-layer graphs (each graph then runs once per step), on
    0.19 for the full-iteration training, evaluation and optimizer graphs."""
    cuda_graph_retain_backward_graph: bool = False
    """Capture the backward pass with retain_graph=True."""
    use_te_rng_tracker: bool = II("rng.te_rng_tracker")
    """megatron-core's own switch for the TE RNG tracker; derived: follows rng.te_rng_tracker."""
    # --- older CUDA-graph spellings, migrated by bridge.config.migration ---
    cuda_graph_scope: Any = None
    """megatron-core 0.16.1's field for the per-layer module list, which 0.19 renamed cuda_graph_modules
    (a name, a comma list or a list: full, full_iteration, attn, ...): migrated into cuda_graph_impl and
    cuda_graph_modules with one note, and given back to 0.16.1 under its own name."""
    enable_cuda_graph: bool = False
    """Deprecated: the same as cuda_graph_impl=local."""
    external_cuda_graph: bool = False
    """Deprecated: the same as cuda_graph_impl=transformer_engine."""
