"""The memory estimate of a plan: peak memory one GPU allocates, from the config alone (no torch).

The model, per GPU (the pipeline stage with the most layers; bytes per parameter or token):

- weights: 2 per parameter in bf16/fp16, 4 in fp32. Dense weights split over TP and PP, experts
  over EP x expert-TP and PP; the first and last stage also hold the (padded) embedding and the
  output layer, so the stage counted holds one of them (both without PP, one with tied weights).
- gradients: megatron-core DDP's contiguous gradient buffer, fp32 with
  ``ddp.grad_reduce_in_fp32`` or an fp32 model, else in the parameter dtype.
- optimizer: Adam's two fp32 moments, plus fp32 master weights for a bf16/fp16 model: 12 bytes
  per parameter (8 in fp32); ``ddp.use_distributed_optimizer`` shards it over the data- and
  context-parallel ranks (the expert-data-parallel ranks for experts).
- activations: what one layer keeps for its backward, per micro-batch, after Korthikanti et al.
  2022 ("Reducing Activation Recomputation in Large Transformer Models"): sbh(34 + 5as/h) bytes
  for GPT with GELU, here term by term so that SwiGLU, GQA, MoE (top-k routed tokens, shared
  expert) and fused/flash attention (no s x s scores: the 5as/h term is gone) follow from the
  config. Tensor parallelism divides all of it with sequence parallelism, else all but the 10sbh
  of layer inputs, norms and dropout masks; context parallelism divides the sequence.
  ``recompute_granularity=full`` keeps each layer's input only (plus one layer's activations
  while it is recomputed); ``selective`` drops the modules it recomputes. With pipelining, the
  first stage holds min(PP, micro-batches) micro-batches in flight (interleaved:
  PP(1 + (PP-1)/(PP x VP)) of them, as Korthikanti et al. count). ``model.cpu_offloading`` moves
  the activations of ``cpu_offloading_num_layers`` layers of the stage to the host. The logits add
  2 bytes per token and vocabulary entry / TP with model.cross_entropy_loss_fusion (Transformer
  Engine's fused loss writes its gradient into the bf16 logits in place), 5.5 without it (the fp32
  softmax it keeps on top; measured: the unfused loss peaked 3.4 GiB higher over 1.05 G logit
  entries, benchmarks/results/vs_bridge/llama32_1b_*.json, where the layers' terms account for the
  rest of both peaks within 2 %).
- CUDA-graph pools: a graph replays into the memory it was captured with, in a private pool that
  stays reserved for it; what counts here is what stays allocated in it. megatron-core's
  FullCudaGraphWrapper captures the whole forward-backward on a side stream into a fresh pool:
  the step's activations are allocated there during capture as in an eager step and freed by its
  backward, so they stay reserved for the replays (``peak_reserved_gb`` roughly doubles: the eager
  steps' cached blocks, which the allocator releases when it runs short, and the pool) but are
  not allocated twice. What it adds is the capture stream's two cuBLAS workspaces (forward thread
  and autograd's; measured: full_iteration peaked 0.06 GiB above eager on llama/tiny, the Qwen3
  proxy (35.11 against 35.05 GiB) and Llama 3.2 1B (32.69 against 32.62 GiB)). An optimizer step
  inside that graph (optimizer.optimizer_in_graph) keeps 4 bytes per parameter allocated on top:
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
  fp32 copies of bf16/fp16 gradients for the step (4 bytes per parameter, sharded like the
  optimizer); the trainer frees them before the next forward, so the peak is the larger of the
  backward's (activations) and the step's.
- workspaces: cuBLAS's and Transformer Engine's GEMM workspaces, about 64 MiB (PyTorch gives
  each cuBLAS handle and stream its own, 32 MiB on Hopper: the forward's and the backward's).

The estimate is of the peak the PyTorch allocator sees (``result.json``'s
memory.peak_allocated_gb); the CUDA context, NCCL buffers and fragmentation come on top, so a
job "fits" when the estimate leaves 10 % of the GPU free, is "tight" within that 10 % and "does not
fit" beyond the GPU. Calibration: tests/test_memory.py, against every row of benchmarks/results/.
"""

import math
from dataclasses import asdict, dataclass
from typing import Dict, Optional

from bridge.config.graphs import graph_impl
from bridge.config.schema import CudaGraphImpl
from bridge.machine import PRESET_GPUS
from bridge.translate import padded_vocab_size
from bridge.validation.model_facts import moe_layer_pattern, recompute_modules

GIB = 2 ** 30
GPU_MEMORY_GB = {name: gpu.memory_gb for name, gpu in PRESET_GPUS.items()}
"""Memory of each preset GPU in GB (10^9 bytes), as NVIDIA specifies it."""
USABLE_FRACTION = 0.9
"""What a job may plan to allocate: the rest is the CUDA context, NCCL buffers, fragmentation."""
CUBLAS_WORKSPACE_BYTES = 32 * 2 ** 20
"""PyTorch's cuBLAS workspace per handle (thread) and stream on Hopper (CUBLAS_WORKSPACE_CONFIG :4096:8)."""
WORKSPACE_BYTES = 2 * CUBLAS_WORKSPACE_BYTES
CAPTURE_STREAM_WORKSPACE_BYTES = 2 * CUBLAS_WORKSPACE_BYTES
"""A graph captured on its own stream gets that stream's cuBLAS workspaces, forward's and backward's."""
ADAM_STATE_BYTES, MASTER_BYTES, FP32_BYTES = 8, 4, 4
LOGIT_BYTES, FUSED_LOSS_LOGIT_BYTES = 5.5, 2


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

    @property
    def total_gib(self) -> float:
        eager_activations = self.activations_gib - self.graphed_activations_gib
        return (self.weights_gib + self.gradients_gib + self.optimizer_gib
                + max(eager_activations, self.optimizer_step_gib) + self.graphs_gib + self.workspace_gib)

    @property
    def fits(self) -> Optional[bool]:
        return None if self.capacity_gib is None else self.total_gib <= USABLE_FRACTION * self.capacity_gib

    @property
    def verdict(self) -> Optional[str]:
        """fits (leaves the headroom), tight (inside the headroom: it may or may not run), does not fit."""
        if self.capacity_gib is None:
            return None
        return "fits" if self.fits else "tight" if self.total_gib <= self.capacity_gib else "does not fit"

    def as_dict(self) -> Dict[str, object]:
        return {**asdict(self), "total_gib": self.total_gib, "fits": self.fits, "verdict": self.verdict}

    def to_text(self) -> str:
        eager = (f"activations {self.activations_gib:.2f} - {self.graphed_activations_gib:.2f} in graphs"
                 if self.graphed_activations_gib else f"activations {self.activations_gib:.2f}")
        parts = (f"weights {self.weights_gib:.2f} + grads {self.gradients_gib:.2f} + optimizer "
                 f"{self.optimizer_gib:.2f} + max({eager}, optimizer step "
                 f"{self.optimizer_step_gib:.2f}) + graphs {self.graphs_gib:.2f} + workspace {self.workspace_gib:.2f}")
        if self.capacity_gib is None:
            verdict = f"GPU memory unknown (set gpu=<{'|'.join(GPU_MEMORY_GB)}>)"
        elif self.verdict == "tight":
            verdict = (f"tight in {self.capacity_gib:.0f} GiB ({self.gpu}): above the {USABLE_FRACTION:.0%} a job "
                       "can count on, the rest is the CUDA context's, NCCL's and fragmentation's")
        else:
            verdict = f"{self.verdict} in {self.capacity_gib:.0f} GiB ({self.gpu}; {USABLE_FRACTION:.0%} usable)"
        return f"~{self.total_gib:.2f} GiB per GPU = {parts}: {verdict}"


def estimate_memory(cfg, gpu_memory_gib: Optional[float] = None, gpu_name: Optional[str] = None) -> MemoryEstimate:
    """The estimate for ``cfg`` on the GPU ``workload.gpu`` names, else on the one given (this machine's)."""
    params = parameters_per_gpu(cfg)
    dense, experts = params["dense"], params["experts"]
    half = cfg.model.bf16 or cfg.model.fp16
    weight_bytes = model_dtype_bytes(cfg)
    grad_bytes = weight_bytes if half_gradients(cfg) else FP32_BYTES
    optimizer_bytes = ADAM_STATE_BYTES + (MASTER_BYTES if half else 0)
    dense_shards, expert_shards = (optimizer_shards(cfg) if cfg.ddp.use_distributed_optimizer else (1, 1))
    step_copies = FP32_BYTES if half_gradients(cfg) else 0
    gpu = cfg.workload.gpu
    capacity = GPU_MEMORY_GB[gpu] * 1e9 / GIB if gpu in GPU_MEMORY_GB else gpu_memory_gib
    return MemoryEstimate(
        weights_gib=(dense + experts) * weight_bytes / GIB,
        gradients_gib=(dense + experts) * grad_bytes / GIB,
        optimizer_gib=(dense / dense_shards + experts / expert_shards) * optimizer_bytes / GIB,
        activations_gib=activation_bytes(cfg) / GIB,
        optimizer_step_gib=(dense / dense_shards + experts / expert_shards) * step_copies / GIB,
        graphs_gib=graph_pool_bytes(cfg, dense + experts) / GIB,
        graphed_activations_gib=graphed_activation_bytes(cfg) / GIB,
        workspace_gib=WORKSPACE_BYTES / GIB,
        gpu=gpu if gpu in GPU_MEMORY_GB else gpu_name,
        capacity_gib=capacity,
    )


def data_parallel_sizes(cfg):
    """(data-parallel size, expert-data-parallel size)."""
    model, gpus = cfg.model, cfg.train.num_gpus
    tp, pp, cp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size, model.context_parallel_size
    etp = model.expert_tensor_parallel_size or tp
    return max(1, gpus // (tp * pp * cp)), max(1, gpus // (model.expert_model_parallel_size * etp * pp))


def optimizer_shards(cfg):
    """(dense, expert) ranks the distributed optimizer shards over: context-parallel ranks hold the same
    weights, so megatron-core reduces and shards dense gradients over data x context parallel."""
    model = cfg.model
    _, expert_dp = data_parallel_sizes(cfg)
    return max(1, cfg.train.num_gpus // (model.tensor_model_parallel_size * model.pipeline_model_parallel_size)), expert_dp


def layers_per_stage(cfg) -> int:
    model = cfg.model
    return math.ceil((model.num_layers + (model.mtp_num_layers or 0)) / model.pipeline_model_parallel_size)


def parameters_per_gpu(cfg) -> Dict[str, float]:
    """Parameters one GPU of the largest stage holds: dense ones and experts (and of the dense ones,
    the embedding and output layer's)."""
    model = cfg.model
    tp, pp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size
    etp = model.expert_tensor_parallel_size or tp
    pattern = moe_layer_pattern(model)
    moe_share = sum(pattern) / len(pattern)
    stage = layers_per_stage(cfg)
    per_layer = attention_parameters(model) + 2 * model.hidden_size
    glu = 3 if model.gated_linear_unit else 2
    h, ffn = model.hidden_size, model.ffn_hidden_size or 4 * model.hidden_size
    dense_mlp = h * ffn * glu
    experts = model.num_moe_experts or 0
    moe_ffn = model.moe_ffn_hidden_size or ffn
    shared = h * (model.moe_shared_expert_intermediate_size or 0) * glu + h * experts  # shared expert, router
    dense_per_layer = per_layer + (1 - moe_share) * dense_mlp + moe_share * shared
    vocab = padded_vocab_size(cfg) * h
    tied = model.share_embeddings_and_output_weights
    embeddings = vocab if (pp > 1 or tied) else 2 * vocab
    return {"dense": (stage * dense_per_layer + embeddings) / tp,
            "experts": stage * moe_share * experts * h * moe_ffn * glu / (model.expert_model_parallel_size * etp),
            "embeddings": embeddings / tp}


def attention_parameters(model) -> float:
    h, heads = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        q = h * heads * qk if model.q_lora_rank is None else model.q_lora_rank * (h + heads * qk)
        kv = model.kv_lora_rank * (h + heads * (model.qk_head_dim + model.v_head_dim))
        return q + kv + h * model.qk_pos_emb_head_dim + heads * model.v_head_dim * h
    channels = model.kv_channels or h // heads
    q, kv = channels * heads, channels * (model.num_query_groups or heads)
    gate = q if model.attention_output_gate else 0
    return h * (q + 2 * kv + gate) + q * h


def layer_activation_terms(model, seq: int) -> Dict[str, float]:
    """Bytes one layer keeps per token of a micro-batch, by module, before tensor parallelism:
    ``replicated`` (sbh-sized inputs, norms and masks) is what TP alone does not divide."""
    h, heads = model.hidden_size, model.num_attention_heads
    channels = model.kv_channels or h // heads
    q, kv = channels * heads, channels * (model.num_query_groups or heads)
    masks = h if model.hidden_dropout > 0 else 0
    glu = 2 if model.gated_linear_unit else 1
    pattern = moe_layer_pattern(model)
    moe_share = sum(pattern) / len(pattern)
    ffn = model.ffn_hidden_size or 4 * h
    topk, moe_ffn = model.moe_router_topk, model.moe_ffn_hidden_size or ffn
    shared = model.moe_shared_expert_intermediate_size or 0
    # Fused and flash attention keep no s x s scores: only the unfused local path does (5as bytes per token).
    scores = 5 * heads * seq if model.transformer_impl == "local" else 0
    mlp = 2 * glu * ffn + 2 * ffn
    # Routed: each of the top-k copies of a token through an expert; the fp32 router logits; the shared expert.
    moe = topk * (2 * h + 2 * glu * moe_ffn + 2 * moe_ffn) + 4 * (model.num_moe_experts or 0) + (2 * glu + 2) * shared
    return {
        "replicated": 4 * h + 2 * h + 2 * h + 2 * masks,  # two norm inputs, attention and MLP inputs, dropout masks
        "core_attn": scores + 2 * q,  # the attention output; scores when not fused
        "qkv": 2 * (q + 2 * kv),
        "mlp": (1 - moe_share) * mlp,
        "moe": moe_share * moe,
    }


def layer_activations(cfg, graphed_only: bool = False) -> float:
    """Bytes one layer keeps for its backward for one micro-batch on one GPU."""
    model = cfg.model
    seq = cfg.dataset.seq_length // model.context_parallel_size
    tokens = seq * cfg.train.micro_batch_size
    tp = model.tensor_model_parallel_size
    terms = layer_activation_terms(model, seq)
    if model.recompute_granularity == "selective":  # what megatron-core recomputes is not kept
        for module in recompute_modules(model):
            terms.pop(module, None)
    if graphed_only:
        terms = {name: value for name, value in terms.items() if graphed_term(cfg, name)}
    replicated = terms.pop("replicated", 0)
    sharded = sum(terms.values())
    per_token = (replicated + sharded) / tp if model.sequence_parallel or tp == 1 else replicated + sharded / tp
    return tokens * per_token


def graphed_term(cfg, term: str) -> bool:
    """Whether a per-layer graph captures the part of the layer ``term`` is kept by."""
    modules = set(cfg.model.cuda_graph_modules)
    if not modules:  # the whole layer
        return True
    parts = {"replicated": {"attn", "mlp", "moe"}, "core_attn": {"attn"}, "qkv": {"attn"},
             "mlp": {"mlp"}, "moe": {"moe", "moe_router"}}
    return bool(parts[term] & modules)


def micro_batches(cfg) -> int:
    """Micro-batches one data-parallel rank runs per step."""
    dp, _ = data_parallel_sizes(cfg)
    return max(1, cfg.train.global_batch_size // (cfg.train.micro_batch_size * dp))


def micro_batches_in_flight(cfg) -> float:
    """How many micro-batches' activations the first pipeline stage holds at once."""
    model = cfg.model
    pp = model.pipeline_model_parallel_size
    if pp == 1:
        return 1
    vp = model.virtual_pipeline_model_parallel_size
    if vp:
        return pp * (1 + (pp - 1) / (pp * vp))
    return min(pp, micro_batches(cfg))


def tokens_per_micro_batch(cfg) -> int:
    """Tokens of one micro-batch on one context-parallel rank."""
    return cfg.dataset.seq_length // cfg.model.context_parallel_size * cfg.train.micro_batch_size


def model_dtype_bytes(cfg) -> int:
    """Bytes per element of the weights and activations: 2 in bf16/fp16, else 4."""
    return 2 if cfg.model.bf16 or cfg.model.fp16 else 4


def activation_bytes(cfg) -> float:
    """Activations of the largest stage at its peak, with the logits."""
    model = cfg.model
    stage = layers_per_stage(cfg)
    per_layer = layer_activations(cfg)
    tokens = tokens_per_micro_batch(cfg)
    if model.recompute_granularity == "full":
        kept = 2 * model.hidden_size * tokens / model.tensor_model_parallel_size
        stored = stage * kept + per_layer  # layer inputs, and one layer being recomputed
    else:
        stored = on_gpu_layers(cfg) * per_layer
    per_entry = FUSED_LOSS_LOGIT_BYTES if model.cross_entropy_loss_fusion else LOGIT_BYTES
    logits = per_entry * tokens * padded_vocab_size(cfg) / model.tensor_model_parallel_size
    return stored * micro_batches_in_flight(cfg) + logits


def on_gpu_layers(cfg) -> int:
    """Layers of the stage whose activations stay on the GPU: cpu_offloading moves some to the host."""
    stage = layers_per_stage(cfg)
    if not cfg.model.cpu_offloading:
        return stage
    return max(1, stage - cfg.model.cpu_offloading_num_layers)


def half_gradients(cfg) -> bool:
    """Whether DDP's gradient buffers are bf16/fp16, so that the fp32 master weights need copies."""
    return (cfg.model.bf16 or cfg.model.fp16) and not cfg.ddp.grad_reduce_in_fp32


def graph_pool_bytes(cfg, parameters: float) -> float:
    """What the captured graphs keep on top (see the module's docstring)."""
    impl = graph_impl(cfg.model.cuda_graph_impl)
    if not impl.graphed:
        return 0.0
    if impl.unit == "iteration":
        optimizer = FP32_BYTES * parameters if cfg.optimizer.optimizer_in_graph else 0
        return CAPTURE_STREAM_WORKSPACE_BYTES + optimizer
    if impl.impl == CudaGraphImpl.local:
        return local_graph_bytes(cfg)
    return graphed_activation_bytes(cfg)


def graphed_activation_bytes(cfg) -> float:
    """The activations Transformer Engine's per-layer graphs hold in their pool: their replays write
    them there instead of allocating them, so they are not on top of the eager activations."""
    if graph_impl(cfg.model.cuda_graph_impl).impl != CudaGraphImpl.transformer_engine:
        return 0.0
    return layers_per_stage(cfg) * layer_activations(cfg, graphed_only=True) * micro_batches_in_flight(cfg)


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
