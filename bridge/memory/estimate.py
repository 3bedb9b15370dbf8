"""The memory estimate of a plan: peak memory one GPU reserves, from the config alone (no torch).

The estimate is of the job as Bridge runs the preset on megatron-core: weights, gradients and
optimizer states (bridge.memory.params, with Megatron-FSDP, LoRA and fp8 primary weights where the
preset uses them), activations (bridge.memory.activations), and on top:

- CUDA-graph pools: a graph replays into the memory it was captured with, in a private pool that
  stays reserved for it. megatron-core's FullCudaGraphWrapper captures the whole forward-backward on
  a side stream into a fresh pool, which holds the step's activations (as the eager step's peak
  has them: the capture reuses the blocks freed inside it once bridge.allocator gives the job
  graph_capture_record_stream_reuse; without it the pool grew to three times the activations).
  The optimizer step outside the graph makes its fp32 gradient copies in the default pool, where
  they no longer share blocks with the activations: the two add up (measured: Llama 3.2 1B's
  widths at four layers reserved 16.69 GiB graphed against 13.62 eager; memory_diagnosis_025da11.json).
  On top come the capture stream's two cuBLAS workspaces. graphbridge's own
  optimizer step inside that graph (optimizer.optimizer_in_graph without the distributed optimizer)
  keeps 4 bytes per parameter allocated on top:
  the fp32 copies of bf16/fp16 gradients its master weights step with, and as much with fp32
  gradients (measured: +6.77 GiB over 1.87 G parameters on the Qwen3 proxy, +0.10 GiB over 28 M on
  llama/tiny with ddp.grad_reduce_in_fp32). Transformer Engine's per-layer graphs
  (make_graphed_callables) hold each graphed callable's static inputs, outputs and saved
  activations as tensors of the graph, allocated for the job's life, per graphed layer and
  micro-batch in flight: the graphed share of the activations, held through the optimizer step.
  Their replays write the graphed modules' activations into that pool instead of allocating them,
  so in the backward's peak it holds its share of the activations (counted once) and in the
  optimizer step's it comes on top of the step's copies.
- megatron-core's local per-layer graphs (CudaGraphManager) capture at the end of the first step,
  after its eager backward freed its activations: every layer's forward graph in order, then the
  backward graphs in reverse, all into one shared pool. The layers' activations are allocated
  once there (as in an eager backward, and before Adam's moments exist); each backward capture
  frees its layer's share back to the pool, and the replays reuse those blocks unallocated. What
  stays allocated, and tops every later optimizer step, is: per graphed layer and runner (one per
  layer without PP, one per micro-batch with PP) its static output and input-gradient buffers
  (2 x sbh in the activation dtype, plus the first input and the last output gradient); in
  megatron-core 0.16.1 without Transformer Engine, the weight gradients the backward graph
  returns (one per graphed parameter in the parameter dtype; 0.19 adds them to main_grad inside
  the graph: counted as 0.16.1 has it); and four more cuBLAS workspaces (32 MiB each, one per
  thread, forward and autograd's, and stream): the capture stream's, in the pool, and the
  default stream's, which megatron-core switches to after capture.
- the optimizer step: megatron-core's mixed-precision optimizer gives its fp32 master weights
  fp32 copies of bf16/fp16 gradients for the step (4 bytes per trainable parameter, sharded like
  the optimizer), and clipping scales one gradient at a time out of place (bridge.memory.params'
  clip_copy); the trainer frees them before the next forward, so the peak is the larger of the
  backward's (activations) and the step's (measured: Llama 3 8B's widths peaked in the step, 29.75
  GiB, with 5.54 of fp32 gradients and 1.96 of the clip's copy live; memory_diagnosis_025da11.json).
- workspaces: cuBLAS's and Transformer Engine's GEMM workspaces, about 64 MiB (PyTorch gives
  each cuBLAS handle and stream its own, 32 MiB on Hopper: the forward's and the backward's).

Where graphbridge's engine runs the job otherwise (DDP for Megatron-FSDP, every weight trained for
LoRA, bf16 weights for Bridge's fp8 primary weights), the estimate also gives what its run needs
(``engine_gib``); result.json compares a run's peak with that one.

The estimate is of the peak the PyTorch allocator reserves (``result.json``'s
memory.peak_reserved_gb, what an out-of-memory error follows): the allocated peak
(``allocated_gib``) and what the caching allocator keeps beside it (``allocator_gib``). The CUDA
context and NCCL buffers come on top, so a job "fits" when the estimate leaves 10 % of the GPU free
and is "tight" within that 10 %. Beyond
the GPU it "does not fit" while the estimate's own error could still bring it under (likely out
of memory: the plan says so loudly), and it "cannot fit" when even an estimate ESTIMATE_ERROR too
high would leave it beyond the GPU (the catalogue's memory_capacity rules refuse it).
Calibration: tests/test_memory.py holds the committed GPU rows within ESTIMATE_ERROR of their
reserved peaks (docs/memory.md says which rows and why some are left out).
"""

from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from bridge.config.graphs import graph_impl
from bridge.config.schema import CudaGraphImpl
from bridge.machine import PRESET_GPUS
from bridge.memory.activations import (
    activation_bytes,
    layer_activations,
    local_softmax_cached_bytes,
    micro_batches,
    micro_batches_in_flight,
    tokens_per_micro_batch,
)
from bridge.memory.params import (
    FP32_BYTES,
    Regime,
    bridge_regime,
    engine_regime,
    layers_per_stage,
    model_dtype_bytes,
    parameters_per_gpu,
    state_bytes,
)

GIB = 2 ** 30
GPU_MEMORY_GB = {name: gpu.memory_gb for name, gpu in PRESET_GPUS.items()}
"""Memory of each preset GPU in GB (10^9 bytes), as NVIDIA specifies it."""
USABLE_FRACTION = 0.9
"""What a job may plan to reserve: the rest is the CUDA context's and NCCL's, which PyTorch's allocator does not see,
and the estimate's own error."""
ESTIMATE_ERROR = 0.15
"""How far the estimate may be from a measured peak: tests/test_memory.py holds every committed GPU row
within it (the worst measured is about 10 %). An estimate that stays beyond the GPU after taking this
much off is certain not to fit, since the CUDA context and NCCL only add to the true peak."""
CUBLAS_WORKSPACE_BYTES = 32 * 2 ** 20
"""PyTorch's cuBLAS workspace per handle (thread) and stream on Hopper (CUBLAS_WORKSPACE_CONFIG :4096:8)."""
WORKSPACE_BYTES = 2 * CUBLAS_WORKSPACE_BYTES
CAPTURE_STREAM_WORKSPACE_BYTES = 2 * CUBLAS_WORKSPACE_BYTES
ALLOCATOR_CACHED_FRACTION = 0.02
ALLOCATOR_SMALL_POOL_BYTES = 64 * 2 ** 20
"""Reserved beyond the allocated peak, as measured: eager one-GPU runs reserved 1.00 to 1.10 times their allocated
peak (llama/tiny's 0.62 GiB peaks 0.04 to 0.06 GiB more; Llama 3.2 1B's widths 1.02 to 1.03, Llama 3 8B's 1.04, the
MoE proxies 1.00 to 1.09: benchmarks/results/*.json, memory_diagnosis_025da11.json); 2 % and 64 MiB hold every such
row's estimate within 10 % of its reserved peak, and at 3 % presets Bridge runs near their GPU's capacity would
estimate beyond it."""
"""A graph captured on its own stream gets that stream's cuBLAS workspaces, forward's and backward's."""


@dataclass
class MemoryEstimate:
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    optimizer_step_gib: float
    graphs_gib: float
    graphed_activations_gib: float
    """The part of the activations that lives in the graphs' pools: in graphs_gib, counted once."""
    workspace_gib: float
    gpu: Optional[str]
    capacity_gib: Optional[float]
    allocator_gib: float = 0.0
    """What the caching allocator keeps reserved beyond the allocated peak (ALLOCATOR_CACHED_FRACTION of it, and
    ALLOCATOR_SMALL_POOL_BYTES): with it, total_gib estimates peak reserved memory."""
    as_bridge_runs_it: List[str] = field(default_factory=list)
    """What the estimate counts that graphbridge's engine does not do (Megatron-FSDP, LoRA, fp8 weights)."""
    engine_gib: Optional[float] = None
    """Where as_bridge_runs_it is not empty: what graphbridge's engine needs for the same job."""

    @property
    def allocated_gib(self) -> float:
        """The peak the allocator hands out (result.json's peak_allocated_gb)."""
        eager_activations = self.activations_gib - self.graphed_activations_gib
        return (self.weights_gib + self.gradients_gib + self.optimizer_gib
                + max(eager_activations, self.optimizer_step_gib) + self.graphs_gib + self.workspace_gib)

    @property
    def total_gib(self) -> float:
        """The peak reserved memory (result.json's peak_reserved_gb), what an out-of-memory error follows."""
        return self.allocated_gib + self.allocator_gib

    @property
    def graphbridge_gib(self) -> float:
        """What graphbridge's engine needs for the job: engine_gib where it runs it otherwise, else total_gib."""
        return self.engine_gib if self.engine_gib is not None else self.total_gib

    @property
    def fits(self) -> Optional[bool]:
        return None if self.capacity_gib is None else self.total_gib <= USABLE_FRACTION * self.capacity_gib

    @property
    def verdict(self) -> Optional[str]:
        """fits (leaves the headroom), tight (inside the headroom: it may or may not run), does not fit
        (beyond the GPU, within the estimate's error: likely out of memory), cannot fit (certain)."""
        return None if self.capacity_gib is None else memory_verdict(self.total_gib, self.capacity_gib)

    @property
    def engine_verdict(self) -> Optional[str]:
        """The verdict for graphbridge's engine's run, where it runs the job otherwise (engine_gib)."""
        if self.capacity_gib is None or self.engine_gib is None:
            return None
        return memory_verdict(self.engine_gib, self.capacity_gib)

    def warning(self) -> Optional[str]:
        """What the plan's verdict line says after VALID: no headroom, likely beyond the GPU, or beyond it
        for graphbridge's engine; None when the job fits."""
        found = []
        if self.verdict in ("tight", "does not fit", "cannot fit"):
            found.append(f"MEMORY {self.verdict.upper()}: ~{self.total_gib:.1f} GiB per GPU of {self.capacity_gib:.0f} "
                         f"GiB ({self.gpu}); lower train.micro_batch_size, recompute (model.recompute_granularity), "
                         "more parallelism (TP/PP/CP/EP) or ddp.use_distributed_optimizer=true")
        if self.engine_verdict in ("does not fit", "cannot fit"):
            found.append(f"OUT OF MEMORY IN GRAPHBRIDGE'S ENGINE: ~{self.engine_gib:.0f} GiB per GPU of "
                         f"{self.capacity_gib:.0f} without {' and '.join(self.as_bridge_runs_it)}, as Bridge runs it")
        return "; ".join(found) or None

    def as_dict(self) -> Dict[str, object]:
        return {**asdict(self), "allocated_gib": self.allocated_gib, "total_gib": self.total_gib, "fits": self.fits,
                "verdict": self.verdict,
                "engine_verdict": self.engine_verdict}

    def to_text(self) -> str:
        eager = (f"activations {self.activations_gib:.2f} - {self.graphed_activations_gib:.2f} in graphs"
                 if self.graphed_activations_gib else f"activations {self.activations_gib:.2f}")
        parts = (f"weights {self.weights_gib:.2f} + grads {self.gradients_gib:.2f} + optimizer "
                 f"{self.optimizer_gib:.2f} + max({eager}, optimizer step "
                 f"{self.optimizer_step_gib:.2f}) + graphs {self.graphs_gib:.2f} + workspace {self.workspace_gib:.2f} "
                 f"+ allocator cache {self.allocator_gib:.2f}")
        bridge = ""
        if self.as_bridge_runs_it:
            bridge = (f"; as Bridge runs it ({', '.join(self.as_bridge_runs_it)}): graphbridge's engine, which "
                      f"does not, needs ~{self.engine_gib:.1f} GiB")
        return f"~{self.total_gib:.2f} GiB reserved per GPU = {parts}: {self.verdict_text()}{bridge}"

    def verdict_text(self) -> str:
        if self.capacity_gib is None:
            return f"GPU memory unknown (set gpu=<{'|'.join(GPU_MEMORY_GB)}>)"
        where = f"{self.capacity_gib:.0f} GiB ({self.gpu}"
        if self.verdict == "tight":
            return (f"tight in {where}): above the {USABLE_FRACTION:.0%} a job can count on, the rest is the CUDA "
                    "context's, NCCL's and fragmentation's")
        if self.verdict == "does not fit":
            return (f"does not fit in {where}): likely out of memory, though within the estimate's "
                    f"{ESTIMATE_ERROR:.0%} error")
        return f"{self.verdict} in {where}; {USABLE_FRACTION:.0%} usable)"


def memory_verdict(total_gib: float, capacity_gib: float) -> str:
    if total_gib <= USABLE_FRACTION * capacity_gib:
        return "fits"
    if total_gib <= capacity_gib:
        return "tight"
    return "does not fit" if total_gib * (1 - ESTIMATE_ERROR) <= capacity_gib else "cannot fit"


def estimate_memory(cfg, gpu_memory_gib: Optional[float] = None, gpu_name: Optional[str] = None,
                    regime: Optional[Regime] = None) -> MemoryEstimate:
    """The estimate for ``cfg`` on the GPU ``workload.gpu`` names, else on the one given (this machine's),
    as Bridge runs it (bridge_regime), or as ``regime`` says (bridge.memory.params.engine_regime: graphbridge's
    run)."""
    regime = bridge_regime(cfg) if regime is None else regime
    state = state_bytes(cfg, regime)
    gpu = cfg.workload.gpu
    estimate = MemoryEstimate(
        weights_gib=state.weights / GIB,
        gradients_gib=state.gradients / GIB,
        optimizer_gib=state.optimizer / GIB,
        activations_gib=activation_bytes(cfg, regime.adapted) / GIB,
        optimizer_step_gib=state.optimizer_step / GIB,
        graphs_gib=graph_pool_bytes(cfg, state.trainable, regime.adapted) / GIB,
        graphed_activations_gib=graphed_activation_bytes(cfg, regime.adapted) / GIB,
        workspace_gib=WORKSPACE_BYTES / GIB,
        gpu=gpu if gpu in GPU_MEMORY_GB else gpu_name,
        capacity_gib=GPU_MEMORY_GB[gpu] * 1e9 / GIB if gpu in GPU_MEMORY_GB else gpu_memory_gib,
        as_bridge_runs_it=regime.differences(),
    )
    cached = allocator_cache_bytes(estimate.allocated_gib * GIB) + local_softmax_cached_bytes(cfg)
    estimate.allocator_gib = cached / GIB
    if estimate.as_bridge_runs_it:
        estimate.engine_gib = estimate_memory(cfg, gpu_memory_gib, gpu_name, engine_regime(cfg)).total_gib
    return estimate


def allocator_cache_bytes(allocated: float) -> float:
    """What the caching allocator keeps reserved beside an allocated peak: freed blocks it cannot hand to a request
    of another size or stream, and its small-block segments."""
    return ALLOCATOR_CACHED_FRACTION * allocated + ALLOCATOR_SMALL_POOL_BYTES


def graph_pool_bytes(cfg, trainable: float, adapted: Optional[Tuple[str, ...]] = None) -> float:
    """What the captured graphs keep on top (see the module's docstring)."""
    impl = graph_impl(cfg.model.cuda_graph_impl)
    if not impl.graphed:
        return 0.0
    if impl.unit == "iteration":
        # With the distributed optimizer the step is megatron-core's own optimizer graph (0.19; the catalogue
        # refuses it before): its fp32 gradient copies are made in the step and sharded, as eagerly, which the
        # optimizer-step term counts already.
        own_step = cfg.optimizer.optimizer_in_graph and not cfg.ddp.use_distributed_optimizer
        optimizer = FP32_BYTES * trainable if own_step else 0
        return CAPTURE_STREAM_WORKSPACE_BYTES + optimizer + graphed_activation_bytes(cfg, adapted)
    if impl.impl == CudaGraphImpl.local:
        return local_graph_bytes(cfg)
    return graphed_activation_bytes(cfg, adapted)


def graphed_activation_bytes(cfg, adapted: Optional[Tuple[str, ...]] = None) -> float:
    """The activations Transformer Engine's per-layer graphs hold in their pool: their replays write
    them there instead of allocating them, so they are not on top of the eager activations."""
    impl = graph_impl(cfg.model.cuda_graph_impl)
    if impl.unit == "iteration":
        # The whole step's activations live in the graph's pool, apart from the default pool, where the optimizer
        # step outside the graph makes its fp32 gradient copies: they no longer share blocks, so the two add up.
        # An optimizer step inside the graph (its own, or megatron-core's optimizer graph in the same pool) reuses
        # the activations' blocks as an eager step does.
        return 0.0 if cfg.optimizer.optimizer_in_graph else activation_bytes(cfg, adapted)
    if impl.impl != CudaGraphImpl.transformer_engine:
        return 0.0
    return layers_per_stage(cfg) * layer_activations(cfg, adapted, graphed_only=True) * micro_batches_in_flight(cfg)


def local_graph_bytes(cfg) -> float:
    """What megatron-core's local per-layer graphs keep allocated after capture (the module's docstring)."""
    model = cfg.model
    runners = 1 if model.pipeline_model_parallel_size == 1 else micro_batches(cfg)  # per graphed layer
    layers = layers_per_stage(cfg) * runners
    hidden = tokens_per_micro_batch(cfg) * model.hidden_size * model_dtype_bytes(cfg)
    if model.sequence_parallel:
        hidden /= model.tensor_model_parallel_size
    static_io = (2 * layers + 2) * hidden
    params = parameters_per_gpu(cfg)
    weight_grads = (params["dense"] + params["experts"] - params["embeddings"]) * runners * model_dtype_bytes(cfg)
    return static_io + weight_grads + 4 * CUBLAS_WORKSPACE_BYTES
