"""MoE rules under fp8 and fp4: what Transformer Engine's grouped experts take when they pad each expert's tokens
to the quantized GEMM's alignment."""

from bridge.config.model_facts import is_moe_model
from bridge.config.releases import in_range
from bridge.validation.local_spec_rules import builds_local_spec
from bridge.validation.registry import rule, violation

ROUTER_PADDING_DISPATCHERS = ("hybridep", "ncclep")
"""The flex dispatcher's backends that pad for quantization themselves (megatron-core 0.19's
skip_routed_expert_padding)."""


@rule("quantized_experts_fp64_probs", engine="megatron",
      rejects="fp64 router probabilities (`model.moe_router_dtype=fp64`) into Transformer Engine's grouped experts "
              "under fp8 or fp4, which pad them with a kernel that takes no fp64 (on megatron-core 0.19 unless the "
              "router pads for quantization)",
      fix="`model.moe_router_dtype=fp32`, `model.moe_grouped_gemm=false`, or on megatron-core 0.19 "
          "`model.moe_router_padding_for_fp8=true` with the alltoall or flex dispatcher")
def quantized_experts_fp64_probs(cfg, target):
    # TEGroupedMLP pads the permuted probs with Fp8Padding, whose fused_multi_row_padding raised "GetTransformerEngine
    # DType: Invalid type" at the first forward (qwen/tiny, fp8_cs, alltoall, CP2, eager; megatron-core 0.19.2 and
    # TE 2.10.0 on two H200s). Every dispatcher hands the experts the router's dtype (flex casts back to fp64).
    # 0.16.1's TEGroupedMLP pads the probs the same way whenever fp8 or fp4 is on; 0.19 skips it where the router
    # (moe_router_padding_for_quantization) or HybridEP/NCCL-EP already padded.
    model = cfg.model
    if not (is_moe_model(model) and (model.fp8 or model.fp4) and model.moe_router_dtype == "fp64"
            and model.moe_grouped_gemm and not builds_local_spec(cfg, target)):
        return None
    before_019 = in_range(target.megatron_core, "<0.19")
    if before_019:
        if model.moe_use_legacy_grouped_gemm:
            return None  # the legacy GroupedMLP (grouped_gemm_package says where it builds) pads nothing
    elif model.moe_router_padding_for_fp8 or (model.moe_token_dispatcher_type == "flex"
                                              and model.moe_flex_dispatcher_backend in ROUTER_PADDING_DISPATCHERS):
        return None
    return violation(
        "quantized_experts_fp64_probs", ["model.moe_router_dtype", "model.moe_grouped_gemm",
                                         "model.fp8" if model.fp8 else "model.fp4"],
        "Transformer Engine's grouped experts pad the router's probabilities for fp8/fp4 with a kernel that takes no "
        "fp64; set model.moe_router_dtype=fp32, or model.moe_grouped_gemm=false"
        + ("" if before_019 else
           ", or model.moe_router_padding_for_fp8=true (the router pads; alltoall or flex dispatcher)"),
    )
