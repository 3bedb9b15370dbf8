"""MoE rules under fp8 and fp4: what Transformer Engine's grouped experts take when they pad each expert's tokens
to the quantized GEMM's alignment."""

import math
from typing import Optional

from bridge.config.model_facts import is_drop_and_pad, is_moe_model
from bridge.config.releases import in_range
from bridge.validation.local_spec_rules import builds_local_spec
from bridge.validation.registry import rule, violation

ROUTER_PADDING_DISPATCHERS = ("hybridep", "ncclep")
"""The flex dispatcher's backends that pad for quantization themselves (megatron-core 0.19's
skip_routed_expert_padding)."""


def quantized_row_alignment(model) -> int:
    """The rows Transformer Engine's Fp8Padding aligns each expert's input to (TE 2.10: 32 under mxfp8 and nvfp4,
    16 under the other fp8 recipes; 32 for every fp4 recipe, the stricter one)."""
    return 32 if model.fp4 or model.fp8_recipe == "mxfp8" else 16


def drop_and_pad_capacity(cfg) -> Optional[int]:
    """The rows each expert takes from one rank under drop-and-pad: megatron-core's get_capacity over the tokens one
    rank's router sees. None without drop-and-pad, or where the capacity exceeds those tokens (the router then pads
    every expert to the tokens instead)."""
    model = cfg.model
    if not is_drop_and_pad(model):
        return None
    shards = model.context_parallel_size * (model.tensor_model_parallel_size if model.sequence_parallel else 1)
    tokens = model.seq_length // shards * cfg.train.micro_batch_size
    capacity = math.ceil(tokens * model.moe_router_topk / model.num_moe_experts * model.moe_expert_capacity_factor)
    return capacity if capacity <= tokens else None


@rule("quantized_experts_fp64_probs", engine="megatron",
      rejects="fp64 router probabilities (`model.moe_router_dtype=fp64`) into Transformer Engine's grouped experts "
              "under fp8 or fp4, which pad them with a kernel that takes no fp64 (not where the router pads for "
              "quantization, nor under drop-and-pad whose expert capacity is a multiple of 16, or of 32 under mxfp8 "
              "and nvfp4)",
      fix="`model.moe_router_dtype=fp32`, `model.moe_grouped_gemm=false`, drop-and-pad with an aligned capacity, or "
          "`model.moe_router_padding_for_fp8=true` with the alltoall or flex dispatcher")
def quantized_experts_fp64_probs(cfg, target):
    # TEGroupedMLP pads the permuted probs with Fp8Padding, whose fused_multi_row_padding raised "GetTransformerEngine
    # DType: Invalid type" at the first forward (qwen/tiny, fp8_cs, alltoall, CP2, eager; megatron-core 0.19.2 and
    # TE 2.10.0 on two H200s). Every dispatcher hands the experts the router's dtype (flex casts back to fp64).
    # 0.16.1's TEGroupedMLP pads the probs the same way whenever fp8 or fp4 is on; 0.19 skips it where the router
    # (moe_router_padding_for_quantization) or HybridEP/NCCL-EP already padded. Fp8Padding returns before the kernel
    # where every expert's rows are aligned already: gpt_oss/tiny under fp8_sc, drop-and-pad at capacity 128, trained
    # with this rule bypassed on both releases (runs 1761 and 1759 of the H200 differentials at 8a7890f); so does
    # 0.16.1's router padding, which rounds each expert's tokens up to the same alignment (get_align_size_for_
    # quantization): qwen/tiny under fp8_cs trained there with this rule unasked, its losses within 4e-5 of 0.19.2's
    # (witness fp64_probs_router_padding, run 1745 of the H200 differentials at ec177b3).
    model = cfg.model
    if not (is_moe_model(model) and (model.fp8 or model.fp4) and model.moe_router_dtype == "fp64"
            and model.moe_grouped_gemm and not builds_local_spec(cfg, target)):
        return None
    capacity, alignment = drop_and_pad_capacity(cfg), quantized_row_alignment(model)
    if capacity is not None and capacity % alignment == 0:
        return None  # every expert's rows come in whole capacities: nothing to pad
    if model.moe_router_padding_for_fp8:
        return None  # the router padded every expert's tokens already
    if in_range(target.megatron_core, "<0.19"):
        if model.moe_use_legacy_grouped_gemm:
            return None  # the legacy GroupedMLP (grouped_gemm_package says where it builds) pads nothing
    elif model.moe_token_dispatcher_type == "flex" and model.moe_flex_dispatcher_backend in ROUTER_PADDING_DISPATCHERS:
        return None
    return violation(
        "quantized_experts_fp64_probs", ["model.moe_router_dtype", "model.moe_grouped_gemm",
                                         "model.fp8" if model.fp8 else "model.fp4",
                                         *(["model.moe_expert_capacity_factor"] if capacity else [])],
        "Transformer Engine's grouped experts pad the router's probabilities for fp8/fp4 with a kernel that takes no "
        "fp64; set model.moe_router_dtype=fp32, or model.moe_grouped_gemm=false, or drop and pad "
        "(model.moe_pad_expert_input_to_capacity=true) at a capacity factor whose expert capacity is a multiple of "
        f"{alignment}" + ("" if capacity is None else f" (it is {capacity} here)")
        + ", or model.moe_router_padding_for_fp8=true (the router pads; alltoall or flex dispatcher)",
    )
