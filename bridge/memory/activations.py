"""The memory estimate's activation terms (bridge.memory.estimate puts them together).

What one layer keeps for its backward, per micro-batch, after Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models"): sbh(34 + 5as/h) bytes for GPT with GELU,
here term by term so that SwiGLU, GQA, MoE (top-k routed tokens, shared expert) and fused/flash
attention (no s x s scores: the 5as/h term is gone) follow from the config. Tensor parallelism
divides all of it with sequence parallelism, else all but the 10sbh of layer inputs, norms and
dropout masks; context parallelism divides the sequence.

A linear layer keeps its input for its weight gradient (Transformer Engine: only when the weight
requires a gradient). Under fp8 or fp4 that saved input is its quantized column-wise copy, not the
bf16 tensor: the norms' outputs feeding QKV and FC1, FC2's input and the experts' inputs shrink to
the low-precision element; the attention output stays bf16 (flash attention keeps it for its own
backward) and the output projection's fp8 copy comes on top. Under LoRA (base weights frozen) a
frozen layer keeps no input; an adapted one's input stays, in bf16, for its adapter's down-projection
(linear_proj's is the attention output flash attention keeps anyway). The adapters' own rank-sized
activations are left out: rank / hidden of a layer input each.

``recompute_granularity=full`` keeps each layer's input only (plus one layer's activations while it
is recomputed); ``selective`` drops the modules it recomputes. With pipelining, the first stage
holds min(PP, micro-batches) micro-batches in flight; interleaved, PP(1 + (PP-1)/(PP x VP)) of them
as Korthikanti et al. count, at most every micro-batch of the step (megatron-core's interleaved
schedule runs the whole step as warm-up when its warm-up count reaches the micro-batches x VP
chunk passes). ``model.cpu_offloading`` moves the activations of ``cpu_offloading_num_layers``
layers of the stage to the host. The logits add, per token and vocabulary entry / TP: 2 bytes with
Transformer Engine's fused loss (cross_entropy_fusion_impl=te writes its gradient into the bf16
logits in place); 5.5 unfused (the fp32 softmax it keeps on top; measured: the unfused loss peaked
3.4 GiB higher over 1.05 G logit entries, benchmarks/results/vs_bridge/llama32_1b_*.json, where
the layers' terms account for the rest of both peaks within 2 %); 10 with megatron-core's own
fused loss (cross_entropy_fusion_impl=native, the default): its backward, compiled by
torch.compile (megatron.core.jit), updates the saved fp32 softmax out of place before casting the
gradient to bf16, so 4 + 4 + 2 bytes are live at once (measured on the CPU with
benchmarks/memory_terms.py: 10.0 bytes against the unfused loss's 6.0). Without gradient
accumulation fusion the output layer's weight gradient (vocabulary x hidden / TP, bf16) is made
whole before it is added to the gradient buffer, beside the logits.

A gated MLP without ``bias_activation_fusion`` runs megatron-core's glu in eager ops, which keep the
activation's output and ``x_linear + glu_linear_offset`` (a copy, even at offset 0) beside FC1's
output: 4 more bytes per token and FFN channel than the fused SwiGLU, which keeps FC1's output
alone. Measured on an H100 (benchmarks/capture_holders.py, what is live at the peak of Llama 3.2
1B's widths at four layers, megatron-core 0.19.2, memory_diagnosis_025da11.json): 1.0 GiB of glu
copies and 0.49 GiB of the output layer's weight gradient; with them the estimate is 1 % under the
measured peak instead of 12 %.

megatron-core's local spec computes attention in eager ops over the s x s scores (per micro-batch, heads / TP x
s x s elements; Transformer Engine's spec runs flash attention and keeps none). Its torch softmax
(masked_softmax_fusion=false, or no fused kernel on the machine) keeps its fp32 output for its backward and the
bf16 copy the context's matmul saves: 6 bytes per score and layer (the fused kernel keeps its bf16 output alone:
2); attention dropout keeps a mask and its output on top (3). The scores are written into one bf16 buffer that
megatron-core keeps for the job (its global memory buffer). The backward of a layer's softmax has three fp32
score-sized tensors live at once (the incoming gradient in fp32, the softmax's and the scale's gradients) after
the layer's bf16 copy is freed: 10 bytes per score on top of every layer's, with the logits already freed, so the
backward peaks at the larger of the two. Measured on an H100 (Llama 3.2 1B's widths at four layers, seq 2048,
megatron-core 0.19.2, holders_local_fb59268.json): 2.0 GiB of fp32 softmax outputs over the four layers, 0.75 of
bf16 copies over the three not yet through their backward, 1.52 GiB of gradients made by autograd, and the 0.25 GiB
buffer.
"""

from typing import Dict, Optional, Tuple

from bridge.config.model_facts import moe_layer_count, padded_vocab_size, recompute_modules
from bridge.memory.params import FP32_BYTES, data_parallel_sizes, layers_per_stage, low_precision_bytes

LOGIT_BYTES = {"unfused": 5.5, "te": 2, "native": 10}
"""Bytes per logit entry at the loss's peak, by loss: unfused, or fused by cross_entropy_fusion_impl."""
ACTIVATION_BYTES = 2
"""bf16: the activations' element (the calibration rows are all bf16)."""
# Bytes per element of the local spec's s x s scores (the module's docstring).
SOFTMAX_KEPT_BYTES = {"fused": 2, "torch": 6}
ATTENTION_DROPOUT_BYTES = 3
SOFTMAX_BACKWARD_BYTES = 10


def layer_activation_terms(model, seq: int, adapted: Optional[Tuple[str, ...]] = None) -> Dict[str, float]:
    """Bytes one layer keeps per token of a micro-batch, by module, before tensor parallelism:
    ``replicated`` (sbh-sized inputs, norms and masks) is what TP alone does not divide. ``adapted``:
    under LoRA, the layers with adapters (the others are frozen and keep no input for a weight gradient)."""
    h, heads = model.hidden_size, model.num_attention_heads
    channels = model.kv_channels or h // heads
    q, kv = channels * heads, channels * (model.num_query_groups or heads)
    masks = h if model.hidden_dropout > 0 else 0
    glu = 2 if model.gated_linear_unit else 1
    moe_share = moe_layer_count(model) / model.num_layers
    ffn = model.ffn_hidden_size or 4 * h
    topk, moe_ffn = model.moe_router_topk, model.moe_ffn_hidden_size or ffn
    shared = model.moe_shared_expert_intermediate_size or 0
    low = low_precision_bytes(model)
    kept = low or ACTIVATION_BYTES  # a saved linear input, per element
    qkv_input = fc1_input = fc2_input = kept
    if adapted is not None:  # frozen layers keep nothing; an adapter keeps its layer's input in bf16
        qkv_input, fc1_input, fc2_input = (ACTIVATION_BYTES if name in adapted else 0
                                           for name in ("linear_qkv", "linear_fc1", "linear_fc2"))
        kept = 0  # the routed experts: never adapted
    proj_copy = 0 if adapted is not None or low is None else low  # beside flash attention's own bf16 output
    scores = score_bytes_kept(model) * heads * seq
    mlp = 2 * glu * ffn + fc2_input * ffn
    if model.gated_linear_unit and not model.bias_activation_fusion:
        mlp += 4 * ffn  # the unfused glu's activation output and its x_linear + offset copy, bf16
    # Routed: each of the top-k copies of a token through an expert; the fp32 router logits; the shared expert.
    moe = (topk * (kept * h + 2 * glu * moe_ffn + kept * moe_ffn) + 4 * (model.num_moe_experts or 0)
           + (2 * glu + fc2_input) * shared)
    return {
        "replicated": 4 * h + 2 * masks + (qkv_input + fc1_input) * h,  # norm inputs, QKV and MLP inputs, masks
        "core_attn": scores + 2 * q + proj_copy * q,  # the attention output; scores when not fused
        "qkv": 2 * (q + 2 * kv),
        "mlp": (1 - moe_share) * mlp,
        "moe": moe_share * moe,
    }


def score_bytes_kept(model) -> float:
    """Bytes a layer keeps per element of its s x s attention scores: none under flash attention (Transformer
    Engine's spec), else the softmax's (the module's docstring)."""
    if model.transformer_impl != "local":
        return 0
    kept = SOFTMAX_KEPT_BYTES["fused" if model.masked_softmax_fusion else "torch"]
    return kept + (ATTENTION_DROPOUT_BYTES if model.attention_dropout > 0 else 0)


def score_elements(cfg) -> float:
    """Elements of one layer's s x s attention scores for a micro-batch on one GPU; 0 under flash attention."""
    model = cfg.model
    if model.transformer_impl != "local":
        return 0
    heads = model.num_attention_heads / model.tensor_model_parallel_size
    return tokens_per_micro_batch(cfg) * heads * (cfg.dataset.seq_length // model.context_parallel_size)


def layer_activations(cfg, adapted: Optional[Tuple[str, ...]] = None, graphed_only: bool = False) -> float:
    """Bytes one layer keeps for its backward for one micro-batch on one GPU."""
    model = cfg.model
    seq = cfg.dataset.seq_length // model.context_parallel_size
    tokens = seq * cfg.train.micro_batch_size
    tp = model.tensor_model_parallel_size
    terms = layer_activation_terms(model, seq, adapted)
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
        return min(pp * (1 + (pp - 1) / (pp * vp)), micro_batches(cfg))
    return min(pp, micro_batches(cfg))


def tokens_per_micro_batch(cfg) -> int:
    """Tokens of one micro-batch on one context-parallel rank."""
    return cfg.dataset.seq_length // cfg.model.context_parallel_size * cfg.train.micro_batch_size


def activation_bytes(cfg, adapted: Optional[Tuple[str, ...]] = None) -> float:
    """Activations of the largest stage at its peak, with the logits."""
    model = cfg.model
    stage = layers_per_stage(cfg)
    per_layer = layer_activations(cfg, adapted)
    tokens = tokens_per_micro_batch(cfg)
    if model.recompute_granularity == "full":
        kept = ACTIVATION_BYTES * model.hidden_size * tokens / model.tensor_model_parallel_size
        stored = stage * kept + per_layer  # layer inputs, and one layer being recomputed
    else:
        stored = on_gpu_layers(cfg) * per_layer
    # "te": Transformer Engine's kernel; "native": megatron-core's (another value fails at its first step).
    fused = "te" if model.cross_entropy_fusion_impl == "te" else "native"
    loss = fused if model.cross_entropy_loss_fusion else "unfused"
    logits = LOGIT_BYTES[loss] * tokens * padded_vocab_size(cfg) / model.tensor_model_parallel_size
    # the local spec's scores: their buffer, and the torch softmax's backward, which peaks after the logits are gone
    scores = score_elements(cfg)
    softmax_backward = 0 if model.masked_softmax_fusion else SOFTMAX_BACKWARD_BYTES * scores
    return (stored * micro_batches_in_flight(cfg) + max(logits, softmax_backward) + output_weight_gradient(cfg)
            + ACTIVATION_BYTES * scores)


LOCAL_SOFTMAX_CACHED_MAX_BYTES = 1.75 * 2 ** 30
"""What the caching allocator keeps reserved beyond its usual cache (allocator_cache_bytes) under the local spec's
torch softmax grows as one fp32 score block a layer while that is small (llama/tiny's local rows; 2.0 GiB of blocks,
1.88 measured, at Llama 3.2 1B's widths at four layers and seq 2048), but no further: 1.60 GiB at eight layers (4.0 of
blocks) and 1.70 at seq 4096 (8.0), memory_accuracy.json at 6c08afc on an H200. Where the ceiling comes from is not
known; llama3_8b_local_eager, at another width, checks it."""


def local_softmax_cached_bytes(cfg) -> float:
    """Reserved beyond the usual allocator cache under the local spec's torch softmax: one fp32 score block a layer
    on the GPU, up to LOCAL_SOFTMAX_CACHED_MAX_BYTES."""
    if cfg.model.masked_softmax_fusion:
        return 0.0
    blocks = FP32_BYTES * score_elements(cfg) * on_gpu_layers(cfg) * micro_batches_in_flight(cfg)
    return min(blocks, LOCAL_SOFTMAX_CACHED_MAX_BYTES)


def output_weight_gradient(cfg) -> float:
    """The output layer's weight gradient, made whole beside the logits when gradient accumulation is not fused
    into its GEMM."""
    model = cfg.model
    if model.gradient_accumulation_fusion:
        return 0.0
    return ACTIVATION_BYTES * padded_vocab_size(cfg) * model.hidden_size / model.tensor_model_parallel_size


def on_gpu_layers(cfg) -> int:
    """Layers of the stage whose activations stay on the GPU: cpu_offloading moves some to the host."""
    stage = layers_per_stage(cfg)
    if not cfg.model.cpu_offloading:
        return stage
    return max(1, stage - cfg.model.cpu_offloading_num_layers)
