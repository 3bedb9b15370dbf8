"""The structured schema: one dataclass per Megatron-Bridge ConfigContainer section.

Section names follow Bridge's ConfigContainer and field names follow megatron-core's
TransformerConfig (0.19's CUDA-graph API; bridge.config.releases says how each supported
release spells them), so a Bridge user's ``cfg.model.x = y`` is ``model.x=y`` on the command
line. Types stay OmegaConf-native (no Literal, no Union of containers); closed sets are
string Enums, cross-field rules live in ``bridge.validation``.
"""

from dataclasses import dataclass, field
from enum import Enum
from typing import Dict, List, Optional

from omegaconf import II

from bridge.config.model_schema import CUDA_GRAPH_MODULES, CudaGraphImpl, InferenceCudaGraphScope, ModelConfig

# The whole schema is imported from here; the model section has a module of its own for its size.
__all__ = ["CUDA_GRAPH_MODULES", "CudaGraphImpl", "DDPConfig", "DatasetConfig", "Device", "EngineChoice",
           "GraphBridgeConfig", "InferenceCudaGraphScope", "LoraTarget", "Mode", "ModelConfig", "OptimizerConfig",
           "PeftConfig", "PeftScheme", "PerfConfig", "PlanConfig", "PlanFormat", "RNGConfig", "RerunStateMachineConfig",
           "ShardingStrategy",
           "TrainConfig", "WorkloadConfig", "profiling_window"]


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


class ShardingStrategy(str, Enum):
    """What Megatron-FSDP shards over the data-parallel ranks (megatron-core's data_parallel_sharding_strategy)."""
    no_shard = "no_shard"
    optim = "optim"
    optim_grads = "optim_grads"
    optim_grads_params = "optim_grads_params"


class PlanFormat(str, Enum):
    text = "text"
    json = "json"
    bridge = "bridge"  # a Megatron-Bridge 0.3.1 ConfigContainer YAML (perf/bridge_config_export.py)


@dataclass
class RNGConfig:
    seed: int = 1234
    """Seed of the weights and the mock data: the same seed gives the same weights and batches for every
    graph impl."""
    te_rng_tracker: bool = II("graphbridge.graphed:${model.cuda_graph_impl}")
    """Transformer Engine's RNG tracker, which CUDA graphs need; derived: on exactly when a graph
    impl is set."""
    inference_rng_tracker: bool = False
    """A separate RNG tracker for inference graphs (megatron-core's local manager accepts it)."""


@dataclass
class RerunStateMachineConfig:
    check_for_nan_in_loss: bool = II("graphbridge.host_checks:${model.cuda_graph_impl}")
    """Derived: on, except under full-iteration graphs, where a host read cannot be captured."""


@dataclass
class DDPConfig:
    check_for_nan_in_grad: bool = II("graphbridge.host_checks:${model.cuda_graph_impl}")
    """Derived: on, except under full-iteration graphs, where a host read cannot be captured."""
    use_distributed_optimizer: bool = False
    """Shard the optimizer state over the data-parallel ranks (ZeRO-1)."""
    overlap_grad_reduce: bool = False
    """Overlap the gradient reduce-scatter/all-reduce with the backward pass."""
    overlap_param_gather: bool = False
    """Overlap the parameter all-gather with the next forward (distributed optimizer)."""
    grad_reduce_in_fp32: bool = False
    """Reduce gradients in fp32."""
    average_in_collective: bool = False
    """Average gradients inside the collective instead of scaling before it."""
    use_megatron_fsdp: bool = False
    """Megatron-FSDP: megatron-core's FullyShardedDataParallel in place of DDP, sharding what
    ddp.data_parallel_sharding_strategy names over the data-parallel ranks (Bridge's FSDP presets set it)."""
    data_parallel_sharding_strategy: ShardingStrategy = ShardingStrategy.optim_grads_params
    """What Megatron-FSDP shards: optim, optim_grads or optim_grads_params (optimizer state, then gradients, then
    weights: each layer's weights are gathered for its forward and backward), or no_shard. Bridge's FSDP presets
    shard all three; read only with ddp.use_megatron_fsdp."""
    fsdp_double_buffer: bool = False
    """Megatron-FSDP gathers weights and reduces gradients through two persistent buffers of the largest layer
    (Bridge sets it for Llama 3 70B and 405B) instead of buffers allocated as it goes."""


@dataclass
class TrainConfig:
    micro_batch_size: int = 1
    """Sequences per micro-batch on one data-parallel rank."""
    global_batch_size: int = II("graphbridge.global_batch:")
    """Derived: the preset's global batch weak-scaled to train.num_gpus (the batch per GPU stays), or
    one micro-batch per data-parallel rank when no preset names one."""
    train_iters: int = 50
    """Optimizer steps to run."""
    num_gpus: int = 1
    """GPUs the job runs on; data parallel size = num_gpus / (TP * PP * CP)."""
    num_nodes: int = II("graphbridge.num_nodes:${train.num_gpus},${workload.gpus_per_node}")
    """Nodes the job spans; GPUs per node = num_gpus / num_nodes (one torchrun per node). Derived: as few
    nodes of the preset GPU's machine (workload.gpus_per_node) as hold train.num_gpus; one without a gpu=."""
    exit_signal_handler: bool = True
    """Stop at the next step boundary on SIGINT/SIGTERM and write a partial result (never inside a captured
    region)."""


@dataclass
class OptimizerConfig:
    optimizer: str = "adam"
    """adam (the only optimizer both engines implement)."""
    lr: float = 3e-4
    """Peak learning rate, reached after the warmup."""
    min_lr: float = 3e-5
    """Learning rate at the end of the decay."""
    weight_decay: float = 0.1
    """Decoupled weight decay (not on biases and 1-D parameters)."""
    adam_beta1: float = 0.9
    """Adam's first-moment decay."""
    adam_beta2: float = 0.95
    """Adam's second-moment decay."""
    adam_eps: float = 1e-8
    """Adam's epsilon."""
    clip_grad: float = 1.0
    """Clip the global gradient norm to this; 0: no clipping."""
    lr_warmup_iters: int = II("graphbridge.lr_warmup:${train.train_iters}")
    """Derived: a tenth of train.train_iters; megatron-core's scheduler needs it below train_iters."""
    lr_decay_style: str = "cosine"
    """constant, linear or cosine, from lr down to min_lr at train_iters."""
    overlap_param_gather_with_optimizer_step: bool = False
    """Overlap the param all-gather with the optimizer step (not with the full-iteration graph)."""
    optimizer_in_graph: bool = False
    """Capture the optimizer step with the full-iteration graph (capturable optimizer, learning rate
    as a device tensor): graphbridge's capturable AdamW inside it; with ddp.use_distributed_optimizer,
    megatron-core's own optimizer graph beside it (megatron-core 0.19, Bridge's optimizer_cuda_graph).
    Read by the megatron engine; the torch engine's full-iteration graph always holds its optimizer."""


@dataclass
class DatasetConfig:
    seq_length: int = 256
    """Tokens per sequence: the static shape every graph is captured with."""
    mock: bool = True
    """Synthetic token data with static shapes (the embedded default dataset)."""
    packed_sequence: bool = False
    """Bridge's SFT/LoRA packing: the mock data packs several samples into each row, and the model gets them
    as megatron-core's packed-sequence parameters (thd, cu_seqlens), so attention sees the path that decides what
    can be graphed (TE scopes without attention). One row a micro-batch; the megatron engine needs Transformer
    Engine's attention for it, the torch engine keeps each sample to itself."""
    pad_to_max_length: bool = True
    """Pad packed rows to seq_length (static shapes for graphs); false cuts a row after its last sample, rounded
    up to 16 tokens."""


class PeftScheme(str, Enum):
    none = "none"
    lora = "lora"


class LoraTarget(str, Enum):
    """The linear layers LoRA adapts, by megatron-core's module names (the torch engine maps them onto its own):
    the column-parallel ones take the whole hidden state in and shard their output, the row-parallel ones take a
    sharded input and reduce their output."""

    linear_qkv = "linear_qkv"
    linear_proj = "linear_proj"
    linear_fc1 = "linear_fc1"
    linear_fc2 = "linear_fc2"


@dataclass
class PeftConfig:
    """Bridge's ``peft`` section (megatron.bridge.peft.lora.LoRA, with its defaults): ``peft=lora`` trains
    low-rank adapters beside frozen base weights; the DDP buffers and the optimizer hold the adapters only."""

    scheme: PeftScheme = PeftScheme.none
    """none: every weight trains; lora: adapters on target_modules, every other weight frozen."""
    target_modules: List[LoraTarget] = field(default_factory=lambda: list(LoraTarget))
    """The linear layers that get an adapter, in every transformer layer (dense MLPs and shared experts)."""
    dim: int = 32
    """The adapters' rank: A maps a layer's input to dim, B maps dim to its output."""
    alpha: int = 32
    """The adapter's output is scaled by alpha / dim."""
    dropout: float = 0.0
    """Dropout of the adapter's input (dropout_position=pre) or of its output (post)."""
    dropout_position: str = "pre"
    """pre or post."""


@dataclass
class WorkloadConfig:
    """Which per-(gpu, precision) preset a recipe was tuned with; filled by recipe presets."""

    task: str = "pretrain"
    """pretrain, sft or lora: the Bridge task of the recipe (recorded; LoRA's adapters themselves are peft=lora)."""
    gpu: Optional[str] = None
    """h100, h200 (the H100 presets), b200, b300, gb200 or gb300; None when the recipe has no preset."""
    precision: Optional[str] = None
    """The preset's precision key (bf16, fp8_cs, fp8_mx, fp8_sc, nvfp4)."""
    gpus_per_node: Optional[int] = None
    """GPUs in one node of the gpu= preset's machine (conf/gpu/, Bridge's per-GPU -gn default: 8 on HGX,
    4 on a GB200/GB300 compute tray); train.num_nodes derives from it. None without a gpu=."""
    preset_num_gpus: Optional[int] = None
    """GPU count the preset was tuned for (global batch is weak-scaled from it)."""
    preset_global_batch_size: Optional[int] = None
    """The preset's global batch at preset_num_gpus; train.global_batch_size derives from it."""


@dataclass
class PlanConfig:
    format: PlanFormat = PlanFormat.text
    """text, json, or bridge: the config as a Megatron-Bridge 0.3.1 ConfigContainer YAML, to replay in Bridge."""
    megatron_core: Optional[str] = None
    """The megatron-core release to plan for (0.16.1 or 0.19.2, bridge.config.releases); None:
    the installed one when graphbridge supports it, else the newest this Python can install. A run
    refuses a plan for a release other than the installed one."""
    check_megatron: bool = False
    """Also build megatron-core's own TransformerConfig, DistributedDataParallelConfig and OptimizerConfig
    from the translated arguments, as a mode=train job the rules accept does before its launch; a refusal is
    the violation megatron_core_config. Off by default: importing megatron-core adds seconds to a plan of about
    one. It judges configs for the megatron engine and the installed release only (the plan says why it did not)."""


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
    """Trace the profiling window (``profile_start_step``, ``profile_steps``) with torch.profiler
    (trace.json in the job directory) and report GPU kernel time per step and the GPU-busy
    fraction in result.json. Those steps are left out of the step-time statistics: the profiler
    slows the host."""
    profile_steps: int = 5
    """Length of the profiling window of perf.profile and perf.nsys, in steps."""
    profile_start_step: Optional[int] = None
    """First step of the profiling window (0-based, as the trainer counts); None: the window is the
    last ``profile_steps`` steps. It must start after the warmup and capture steps."""
    nsys: bool = False
    """Profile with Nsight Systems: the launcher starts the training process under ``nsys profile``
    (one report per rank, ``<job_dir>/profile_<rank>.nsys-rep``), which records only between the
    trainer's cudaProfilerStart/Stop around the profiling window; each step is an NVTX range
    "step N" (with "capture" or "replay" inside where the step captures or replays graphs). Needs
    ``nsys`` on PATH; not with perf.profile (both use CUPTI). The window's steps are not timed."""
    nsys_trace: List[str] = field(default_factory=lambda: ["cuda", "nvtx"])
    """What nsys traces (its ``--trace``): e.g. cuda, nvtx, osrt, cublas, cudnn."""
    nsys_extra_args: List[str] = field(
        default_factory=lambda: ["--sample=none", "--cuda-graph-trace=node", "--cuda-event-trace=false"])
    """More ``nsys profile`` arguments, as written on its command line. The default is what Bridge's
    launcher (NeMo-Run) passes: no CPU sampling, each kernel inside a CUDA graph traced on its own."""
    tensorboard: Optional[bool] = None
    """Write loss, step time and memory per step (and the GPU-busy fraction with perf.profile) as
    TensorBoard scalars to ``<job_dir>/tensorboard/``. None: when the tensorboard package is installed
    (``pip install 'graphbridge[tensorboard]'``); true: always, and a run without the package says so in
    one line; false: never."""


def profiling_window(perf: PerfConfig, train_iters: int) -> range:
    """The steps perf.profile and perf.nsys record: ``profile_steps`` from ``profile_start_step``,
    by default the last ones."""
    start = perf.profile_start_step if perf.profile_start_step is not None else train_iters - perf.profile_steps
    return range(start, start + perf.profile_steps)


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
    peft: PeftConfig = field(default_factory=PeftConfig)
    env_vars: Dict[str, str] = field(default_factory=dict)
    """Environment variables the training process sets before its first CUDA call (presets set NCCL and
    allocator knobs; add yours with +env_vars.NAME=value)."""
    engine: EngineChoice = EngineChoice.auto
    """auto: megatron when CUDA and megatron-core are present, else torch."""
    device: Device = Device.auto
    """auto: CUDA when a GPU is visible, else the CPU; cuda or cpu to insist."""
    torch_compile: str = "none"
    """torch engine only: none, default or reduce-overhead."""
    mode: Mode = Mode.train
    """train runs the job; plan stops after validation and translation."""
    plan: PlanConfig = field(default_factory=PlanConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
