"""Shapes that block-scaled fp8 and fp4 need where Transformer Engine gathers a linear's quantized input across the
tensor-parallel ranks (sequence parallel): the gathered tensor must split into whole scaling blocks."""

from typing import Dict, Optional

from bridge.config.model_facts import has_dense_layers, is_moe_model
from bridge.validation.local_spec_rules import builds_local_spec
from bridge.validation.registry import rule, violation

SCALING_BLOCKS = {"blockwise": 128, "mxfp8": 32}
"""fp8 recipes that scale in blocks, and the block's length (TE 2.10: Float8BlockQuantizer.block_len, MXFP8's
MXFP8_BLOCK_SCALING_SIZE); tensorwise and delayed scaling have one scale a tensor and take any shape."""
NVFP4_BLOCK = 16
"""NVFP4's block (NVFP4_BLOCK_SCALING_SIZE), the fp4 recipe megatron-core defaults to."""


def scaling_block(model) -> Optional[int]:
    """The length of the blocks a quantized GEMM input is scaled in, or None for one scale a tensor."""
    if model.fp4:
        return NVFP4_BLOCK
    return SCALING_BLOCKS.get(model.fp8_recipe) if model.fp8 else None


def gathered_sizes(cfg) -> Dict[str, int]:
    """What each sequence-parallel rank's input to a column-parallel TE linear holds: its tokens (the rows) and the
    input widths, by the key that sets each. Every layer's qkv and fc1 (and a shared expert's) take the hidden
    size; multi-latent attention's up-projections take the compressed q and kv, which it scatters along the
    sequence before them (multi_latent_attention.py, 0.16.1 and 0.19.2)."""
    model = cfg.model
    ranks = model.tensor_model_parallel_size * model.context_parallel_size
    sizes = {"train.micro_batch_size": model.seq_length // ranks * cfg.train.micro_batch_size,
             "model.hidden_size": model.hidden_size}
    if model.multi_latent_attention:
        if model.q_lora_rank:
            sizes["model.q_lora_rank"] = model.q_lora_rank
        sizes["model.kv_lora_rank"] = model.kv_lora_rank
    return sizes


@rule("block_scaled_gather_shapes", engine="megatron",
      rejects="block-scaled fp8 or fp4 (blockwise 128, mxfp8 32, nvfp4 16) with sequence parallelism where a "
              "gathered linear input does not split into whole blocks: the tokens a rank holds (seq_length / (TP x CP) "
              "x micro batch), the hidden size, or multi-latent attention's q and kv ranks",
      fix="sizes that are multiples of the block, a precision with one scale a tensor (`precision=fp8_cs`), or, "
          "without MoE layers, `model.sequence_parallel=false`")
def block_scaled_gather_shapes(cfg, target):
    # Transformer Engine quantizes a sequence-parallel linear's input before it gathers it and asserts that the
    # local shard splits into whole blocks (utils.assert_dim_for_all_gather, TE 2.10): deepseek/tiny with fp8_sc at
    # TP2 with sequence parallel failed so in its first eager forward, at MLA's linear_q_up_proj (q_lora_rank 64),
    # on two H200s (0.19.2, run 541 of gpu_differential_2gpu_c236fc3.json.gz).
    model = cfg.model
    block = scaling_block(model)
    if block is None or not model.sequence_parallel or model.tensor_model_parallel_size == 1 \
            or builds_local_spec(cfg, target):
        return None
    uneven = {key: size for key, size in gathered_sizes(cfg).items() if size % block}
    if not uneven:
        return None
    listed = ", ".join(f"{'tokens a rank holds' if key == 'train.micro_batch_size' else key}={size}"
                       for key, size in uneven.items())
    return violation(
        "block_scaled_gather_shapes", [*uneven, "model.sequence_parallel", "model.fp4" if model.fp4 else "model.fp8"],
        f"{'nvfp4' if model.fp4 else model.fp8_recipe} scaling gathers sequence-parallel inputs in blocks of {block}, "
        f"and {listed} {'is not a multiple' if len(uneven) == 1 else 'are not multiples'} of {block}; make "
        f"{'it one' if len(uneven) == 1 else 'them so'}, or use precision=fp8_cs (one scale a tensor)"
        + ("" if is_moe_model(model) else ", or set model.sequence_parallel=false"),
    )


FP8_GEMM_ALIGNMENT = 16
"""Transformer Engine's fp8 and fp4 GEMMs take leading dimensions that are multiples of 16 (cuBLASLt's
"Leading dimension requirement on A for FP8 GEMM", TE 2.10)."""


@rule("quantized_gemm_widths", engine="megatron",
      rejects="fp8 or fp4 with a linear layer's width per tensor-parallel rank not a multiple of 16: the hidden size, "
              "the dense MLP's, the experts' (over ETP) or the shared expert's",
      fix="widths that are multiples of 16 per rank, or `precision=bf16`")
def quantized_gemm_widths(cfg, target):
    # gpt_oss/tiny and qwen/tiny with fp8_cs and model.moe_ffn_hidden_size of 1, 4 or 255 planned valid and failed at
    # the first forward on an H200, on both releases (runs 7, 199, 702 and 1458 of gpu_differential_schema_9901178).
    model = cfg.model
    if not (model.fp8 or model.fp4) or builds_local_spec(cfg, target):
        return None
    tp = max(model.tensor_model_parallel_size, 1)
    etp = max(model.expert_tensor_parallel_size or tp, 1)
    widths = {"model.hidden_size": model.hidden_size}
    if not is_moe_model(model) or has_dense_layers(model):
        widths["model.ffn_hidden_size"] = (model.ffn_hidden_size or 4 * model.hidden_size) // tp
    if is_moe_model(model):
        widths["model.moe_ffn_hidden_size"] = (model.moe_ffn_hidden_size or model.ffn_hidden_size or 0) // etp
        if model.moe_shared_expert_intermediate_size:
            widths["model.moe_shared_expert_intermediate_size"] = model.moe_shared_expert_intermediate_size // tp
    uneven = {key: width for key, width in widths.items() if width % FP8_GEMM_ALIGNMENT}
    if not uneven:
        return None
    key, width = next(iter(uneven.items()))
    return violation(
        "quantized_gemm_widths", [key, "model.fp4" if model.fp4 else "model.fp8"],
        f"fp8 and fp4 GEMMs take widths in multiples of {FP8_GEMM_ALIGNMENT} per rank, and {key} gives {width}; set "
        f"{key} to a multiple of {FP8_GEMM_ALIGNMENT} per rank, or precision=bf16 (model.fp8=null model.fp4=null)",
    )
