"""Shapes that fp8 and fp4 GEMMs need: every size a Transformer Engine linear multiplies in multiples of 16, and, where
Transformer Engine gathers a linear's block-scaled input across the tensor-parallel ranks (sequence parallel), a
gathered tensor that splits into whole scaling blocks."""

from typing import Dict, List, Optional, Tuple

from bridge.config.model_facts import dense_ffn_hidden_size, has_dense_layers, is_moe_model
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


def linear_sizes(cfg) -> List[Tuple[str, int]]:
    """The sizes a rank's Transformer Engine linear layers multiply, each by the key that sets it: the tokens a rank
    holds (its input rows), the hidden size, and each linear's output and input widths per tensor-parallel rank. MLA's
    down-projections are replicated across TP; its up-projections and the output projection are split."""
    model = cfg.model
    tp, heads = max(model.tensor_model_parallel_size, 1), model.num_attention_heads
    tokens = model.seq_length // max(model.context_parallel_size, 1) * cfg.train.micro_batch_size
    sizes = [("dataset.seq_length", tokens), ("model.hidden_size", model.hidden_size)]
    if model.multi_latent_attention:
        if model.q_lora_rank:
            sizes.append(("model.q_lora_rank", model.q_lora_rank))
        sizes += [("model.qk_head_dim", heads * (model.qk_head_dim + model.qk_pos_emb_head_dim) // tp),
                  ("model.kv_lora_rank", model.kv_lora_rank),
                  ("model.kv_lora_rank", model.kv_lora_rank + model.qk_pos_emb_head_dim),
                  ("model.v_head_dim", heads * (model.qk_head_dim + model.v_head_dim) // tp),
                  ("model.v_head_dim", heads * model.v_head_dim // tp)]
    elif heads > 0:
        head = model.kv_channels or model.hidden_size // heads
        queries = 2 * heads if model.attention_output_gate else heads  # the gate is a second query-sized output
        sizes += [("model.kv_channels", (queries + 2 * (model.num_query_groups or heads)) * head // tp),
                  ("model.kv_channels", heads * head // tp)]
    if not is_moe_model(model) or has_dense_layers(model):
        sizes.append(("model.ffn_hidden_size", dense_ffn_hidden_size(model) // tp))
    if is_moe_model(model):
        etp = max(model.expert_tensor_parallel_size or tp, 1)
        sizes.append(("model.moe_ffn_hidden_size", (model.moe_ffn_hidden_size or model.ffn_hidden_size or 0) // etp))
        if model.moe_shared_expert_intermediate_size:
            sizes.append(("model.moe_shared_expert_intermediate_size", model.moe_shared_expert_intermediate_size // tp))
    return sizes


@rule("quantized_gemm_widths", engine="megatron",
      rejects="fp8 or fp4 with a size a linear layer multiplies not a multiple of 16: the tokens a rank holds (sequence "
              "over CP x micro batch), the hidden size, or a linear's width per tensor-parallel rank (attention's, "
              "multi-latent attention's ranks and heads, the dense MLP's, the experts' over ETP, the shared expert's)",
      fix="sizes that are multiples of 16 (the message names the key), or `precision=bf16`")
def quantized_gemm_widths(cfg, target):
    # cuBLASLt's fp8 GEMMs take leading dimensions in multiples of 16 and TE asserts fp8 shapes before them, forward
    # and backward, so a layer's inputs, outputs and tokens all count. Each planned valid and failed in the first
    # step on both releases: the experts' width (1, 4 or 255: runs 7, 199, 702, 1458 of 9901178 on an H200), a
    # sequence of 257 or 4 tokens (runs 184 and 230 of gpu_differential_schema_e6aa918 on an H100), MLA's kv rank of 2
    # (671, 1201) and its qk head of 31 (1639, blockwise: "Leading dimension requirement on NVTE_BLOCK_SCALING
    # GEMM"). No fp8 or fp4 run of either record trained with a size this rule refuses.
    model = cfg.model
    if not (model.fp8 or model.fp4) or builds_local_spec(cfg, target):
        return None
    uneven = next(((key, size) for key, size in linear_sizes(cfg) if size % FP8_GEMM_ALIGNMENT), None)
    if uneven is None:
        return None
    key, size = uneven
    what = "the tokens a rank holds (sequence / CP x micro batch)" if key == "dataset.seq_length" else \
        f"a linear width that {key} sets"
    return violation(
        "quantized_gemm_widths", [key, "model.fp4" if model.fp4 else "model.fp8"],
        f"fp8 and fp4 GEMMs take sizes in multiples of {FP8_GEMM_ALIGNMENT}, and {what} is {size}; change {key} so "
        f"that this size is a multiple of {FP8_GEMM_ALIGNMENT}, or set precision=bf16 (model.fp8=null model.fp4=null)",
    )
