"""The memory estimate's weight, gradient and optimizer-state terms (bridge.memory.estimate puts them together).

Per GPU of the pipeline stage with the most layers, in bytes per parameter:

- weights: 2 per parameter in bf16/fp16, 4 in fp32. Dense weights split over TP and PP, experts
  over EP x expert-TP and PP; the first and last stage also hold the (padded) embedding and the
  output layer, so the stage counted holds one of them (both without PP, one with tied weights).
  Under fp8 or fp4, Transformer Engine quantizes each linear weight for its GEMMs and, across the
  micro-batches of a step (megatron-core passes ``is_first_microbatch``), keeps that copy
  (te/pytorch/module/linear.py, ``get_weight_workspace(cache_name="weight")``) on top: row- and
  column-wise, two low-precision elements per linear parameter, one for tensorwise fp8 on Blackwell
  (its GEMMs take the row-wise data in every layout). Bridge's fp8 recipes with fp8 primary weights
  (``fp8_param_gather``: tensorwise and MXFP8) hold the linear weights as those fp8 tensors instead
  of bf16 ones, and keep no copy; its SFT and LoRA recipes set ``disable_parameter_transpose_cache``,
  which drops the copy too.
- gradients: megatron-core DDP's contiguous gradient buffer, fp32 with
  ``ddp.grad_reduce_in_fp32`` or an fp32 model, else in the parameter dtype.
- optimizer: Adam's two fp32 moments, plus fp32 master weights for a bf16/fp16 model: 12 bytes
  per parameter (8 in fp32); ``ddp.use_distributed_optimizer`` shards it over the data- and
  context-parallel ranks (the expert-data-parallel ranks for experts).
- Megatron-FSDP (``ddp.use_megatron_fsdp`` with ``optim_grads_params``, as Bridge's FSDP presets set it)
  shards weights and gradients as well as the optimizer state; a layer's weights are gathered for
  its forward and backward and its gradients reduce-scattered after, through two buffers
  (``fsdp_double_buffer``): two of the largest gather unit (a layer, or the embedding) of
  weights and of gradients stay unsharded.
- LoRA (peft=lora, in Bridge and in graphbridge's engines alike: adapters of rank ``peft.dim`` on
  ``peft.target_modules``, every base weight frozen): DDP builds gradient buffers, and the optimizer
  states, for the trainable adapters only; the frozen base keeps its weights. An adapter's A and B
  split over TP as its layer does: (input + output) x rank / TP parameters a GPU.
"""

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from bridge.config.model_facts import (dense_ffn_hidden_size, expert_tensor_parallel_size, moe_layer_count,
                                       padded_vocab_size)
from bridge.config.peft import lora_targets
from bridge.machine import PRESET_GPUS

ADAM_STATE_BYTES, MASTER_BYTES, FP32_BYTES = 8, 4, 4
FSDP_BUFFERS = 2
"""Megatron-FSDP's double buffer (Bridge sets fsdp_double_buffer with use_megatron_fsdp)."""
LOW_PRECISION_BYTES = {"tensorwise": 1.0, "delayed": 1.0, "mxfp8": 1 + 1 / 32, "blockwise": 1 + 4 / 128,
                       "nvfp4": 0.5 + 1 / 16}
"""Bytes per quantized element with its scales: fp8 e4m3/e5m2; MXFP8's e8m0 scale per 32 elements;
blockwise fp8's fp32 scale per 128; NVFP4's e2m1 with an e4m3 scale per 16."""
FP8_PRIMARY_PRECISIONS = ("fp8_cs", "fp8_mx")
"""Bridge's precision presets with fp8_param_gather (bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed)."""


@dataclass(frozen=True)
class Regime:
    """How the job holds its weights: as Bridge runs the preset, or as graphbridge's engine trains it
    (engine_regime: megatron-core DDP or Megatron-FSDP and LoRA as configured, bf16 weights)."""

    megatron_fsdp: bool = False
    adapted: Optional[Tuple[str, ...]] = None
    """LoRA's target layers (None: no LoRA, every weight trains)."""
    fp8_primary_weights: bool = False
    weight_copies: bool = True
    """Transformer Engine keeps its quantized copy of each weight (off: disable_parameter_transpose_cache)."""

    def differences(self) -> list:
        """What graphbridge's engine does not do of this regime (it trains from bf16 weights), in words."""
        return ["fp8 primary weights"] if self.fp8_primary_weights else []


def engine_regime(cfg) -> Regime:
    """The regime of ``cfg`` as graphbridge's engine trains it: DDP or Megatron-FSDP, its own LoRA, bf16 weights
    and Transformer Engine's quantized copies unless model.disable_parameter_transpose_cache drops them."""
    return Regime(megatron_fsdp=fsdp_shards_weights(cfg), adapted=lora_targets(cfg.peft),
                  weight_copies=not cfg.model.disable_parameter_transpose_cache)


def bridge_regime(cfg) -> Regime:
    """The regime of ``cfg`` as Bridge runs it: its FSDP, LoRA and precision settings (ddp, workload.*, peft, and
    the transpose cache its finetune recipes disable)."""
    return Regime(megatron_fsdp=fsdp_shards_weights(cfg), adapted=lora_targets(cfg.peft),
                  fp8_primary_weights=cfg.workload.precision in FP8_PRIMARY_PRECISIONS,
                  weight_copies=not cfg.model.disable_parameter_transpose_cache)


def fsdp_shards_weights(cfg) -> bool:
    """Megatron-FSDP sharding weights, gradients and optimizer state (optim_grads_params, what Bridge's presets set);
    its lighter strategies are counted as the distributed optimizer shards."""
    return cfg.ddp.use_megatron_fsdp and cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"


def model_dtype_bytes(cfg) -> int:
    """Bytes per element of the weights and activations: 2 in bf16/fp16, else 4."""
    return 2 if cfg.model.bf16 or cfg.model.fp16 else 4


def low_precision_bytes(model):
    """Bytes per element of fp8/fp4 GEMM operands, or None without fp8 or fp4."""
    if model.fp4:
        return LOW_PRECISION_BYTES["nvfp4"]
    return LOW_PRECISION_BYTES.get(model.fp8_recipe, 1.0) if model.fp8 else None


def half_gradients(cfg) -> bool:
    """Whether DDP's gradient buffers are bf16/fp16, so that the fp32 master weights need copies."""
    return (cfg.model.bf16 or cfg.model.fp16) and not cfg.ddp.grad_reduce_in_fp32


def data_parallel_sizes(cfg):
    """(data-parallel size, expert-data-parallel size)."""
    model, gpus = cfg.model, cfg.train.num_gpus
    tp, pp, cp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size, model.context_parallel_size
    etp = expert_tensor_parallel_size(model)
    return max(1, gpus // (tp * pp * cp)), max(1, gpus // (model.expert_model_parallel_size * etp * pp))


def optimizer_shards(cfg):
    """(dense, expert) ranks the distributed optimizer and Megatron-FSDP shard over: context-parallel
    ranks hold the same weights, so megatron-core reduces and shards dense gradients over data x context
    parallel."""
    model = cfg.model
    _, expert_dp = data_parallel_sizes(cfg)
    dense = cfg.train.num_gpus // (model.tensor_model_parallel_size * model.pipeline_model_parallel_size)
    return max(1, dense), expert_dp


def layers_per_stage(cfg) -> int:
    model = cfg.model
    return math.ceil((model.num_layers + (model.mtp_num_layers or 0)) / model.pipeline_model_parallel_size)


def parameters_per_gpu(cfg) -> Dict[str, float]:
    """Parameters one GPU of the largest stage holds: dense ones and experts (and of the dense ones,
    the embedding and output layer's)."""
    model = cfg.model
    tp, pp = model.tensor_model_parallel_size, model.pipeline_model_parallel_size
    etp = expert_tensor_parallel_size(model)
    moe_share = moe_layer_count(model) / model.num_layers
    stage = layers_per_stage(cfg)
    per_layer = attention_parameters(model) + 2 * model.hidden_size
    glu = 3 if model.gated_linear_unit else 2
    h, ffn = model.hidden_size, dense_ffn_hidden_size(model)
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


def lora_parameters(cfg) -> float:
    """The adapters one GPU of the largest stage trains: each adapted layer's A (input x rank) and B (rank x
    output), split over TP; the MLP's in dense layers and shared experts (routed experts have none)."""
    model = cfg.model
    h, heads = model.hidden_size, model.num_attention_heads
    channels = model.kv_channels or h // heads
    glu = 2 if model.gated_linear_unit else 1
    dense_share = 1 - moe_layer_count(model) / model.num_layers
    shared = model.moe_shared_expert_intermediate_size or 0
    ffn = dense_share * dense_ffn_hidden_size(model) + (1 - dense_share) * shared
    sides = {"linear_qkv": h + channels * (heads + 2 * (model.num_query_groups or heads)),
             "linear_proj": heads * channels + h, "linear_fc1": h + glu * ffn, "linear_fc2": ffn + h}
    per_layer = sum(sides[target] for target in lora_targets(cfg.peft) or ())
    return layers_per_stage(cfg) * cfg.peft.dim * per_layer / model.tensor_model_parallel_size


@dataclass
class StateBytes:
    """The four parameter terms of the estimate, in bytes."""
    weights: float
    gradients: float
    optimizer: float
    optimizer_step: float
    """fp32 copies of bf16/fp16 gradients the master weights step with (bridge.memory)."""
    trainable: float
    """Parameters with gradients: what an optimizer step inside a graph copies."""


def state_bytes(cfg, regime: Regime) -> StateBytes:
    """Weights, gradients, optimizer states and the optimizer step's copies under ``regime``."""
    params = parameters_per_gpu(cfg)
    held = params["dense"] + params["experts"]
    dense_shards, expert_shards = optimizer_shards(cfg)
    if regime.adapted is not None:  # the adapters are dense: sharded over data x context parallel
        trainable, sharded = lora_parameters(cfg), lora_parameters(cfg) / dense_shards
    else:
        trainable, sharded = held, params["dense"] / dense_shards + params["experts"] / expert_shards
    weight_bytes = model_dtype_bytes(cfg)
    grad_bytes = weight_bytes if half_gradients(cfg) else FP32_BYTES
    optimizer_bytes = ADAM_STATE_BYTES + (MASTER_BYTES if cfg.model.bf16 or cfg.model.fp16 else 0)
    optimized = sharded if cfg.ddp.use_distributed_optimizer or cfg.ddp.use_megatron_fsdp else trainable
    weights, gradients = held, trainable
    if regime.megatron_fsdp:
        unit = FSDP_BUFFERS * gather_unit(cfg, params)
        weights = params["dense"] / dense_shards + params["experts"] / expert_shards + unit
        gradients = sharded + unit
    linear = weights * (1 - params["embeddings"] / held)  # the rest: embedding and output layer
    return StateBytes(
        weights=weights * weight_bytes + linear * (linear_weight_bytes(cfg, regime) - weight_bytes),
        gradients=gradients * grad_bytes,
        optimizer=optimized * optimizer_bytes,
        optimizer_step=(optimized + clip_copy(cfg, optimized)) * (FP32_BYTES if half_gradients(cfg) else 0),
        trainable=trainable)


def clip_copy(cfg, optimized: float) -> float:
    """Parameters of the fp32 gradient the clip's scale copies at once: megatron-core 0.19 with a Transformer Engine
    that lacks multi_tensor_scale_tensor, and without apex, falls back to its local multi_tensor_scale, which scales
    each gradient out of place (measured: 1.96 GiB live at the peak of Llama 3 8B's widths, the output layer's fp32
    gradient, memory_diagnosis_025da11.json). Counted for every release: the largest single tensor."""
    if not cfg.optimizer.clip_grad:
        return 0.0
    model = cfg.model
    h, tp = model.hidden_size, model.tensor_model_parallel_size
    glu = 2 if model.gated_linear_unit else 1
    largest = max(padded_vocab_size(cfg) * h / tp, glu * dense_ffn_hidden_size(model) * h / tp)
    if model.num_moe_experts:
        largest = max(largest, glu * (model.moe_ffn_hidden_size or dense_ffn_hidden_size(model)) * h
                      / expert_tensor_parallel_size(model))
    return min(largest, optimized)


def gather_unit(cfg, params: Dict[str, float]) -> float:
    """Parameters of the largest unit Megatron-FSDP gathers at once: one layer, or the embedding (the
    output layer is a unit of its own)."""
    per_layer = (params["dense"] - params["embeddings"] + params["experts"]) / layers_per_stage(cfg)
    return max(per_layer, padded_vocab_size(cfg) * cfg.model.hidden_size / cfg.model.tensor_model_parallel_size)


def linear_weight_bytes(cfg, regime: Regime) -> float:
    """Bytes per linear-layer parameter: its weight, fp8 primary or in the model dtype, and Transformer
    Engine's cached quantized copies."""
    element = low_precision_bytes(cfg.model)
    if element is None:
        return model_dtype_bytes(cfg)
    gpu = PRESET_GPUS.get(cfg.workload.gpu)
    one_layout = (cfg.model.fp4 is None and cfg.model.fp8_recipe in ("tensorwise", "delayed")
                  and gpu is not None and gpu.capability >= (10, 0))
    quantized = element * (1 if one_layout else 2)
    if regime.fp8_primary_weights:
        return quantized
    return model_dtype_bytes(cfg) + (quantized if regime.weight_copies else 0)
