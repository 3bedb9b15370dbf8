"""How a parallel layout splits each layer across ranks, where megatron-core refuses an uneven split: the attention
heads and query groups over tensor parallelism (and gated delta net's linear-attention heads, which 0.19 also
splits over context parallelism and 0.16 does not split over it at all), the MLP widths over tensor and expert
tensor parallelism, and the experts over expert parallelism. The CPU differential (tests/differential.py) found the
heads' split missing at layouts of 16 ranks; the checks beside it in TransformerConfig's __post_init__, and the
divisions of the parallel linears and the MoE layer that building those layouts on the CPU hit, gave the others."""

from typing import Callable, Dict

from bridge.config.model_facts import expert_tensor_parallel_size, has_dense_layers, is_moe_model
from bridge.config.releases import in_range
from bridge.validation.registry import rule, violation
from bridge.validation.training_rules import divisors, expert_parallel_fix

GATED_DELTA_NET = "gated_delta_net"


@rule("tensor_parallel_heads",
      rejects="attention heads that tensor parallelism cannot split evenly: `model.num_attention_heads` not a multiple "
              "of TP, query groups neither a multiple nor a divisor of TP, or gated delta net's linear-attention heads "
              "not a multiple of TP (of TP x CP on megatron-core 0.19)",
      fix="the `model.tensor_model_parallel_size` the message names")
def tensor_parallel_heads(cfg, target):
    # llama/tiny's 8 heads at TP16 planned valid and TransformerConfig refused them, on both releases.
    model = cfg.model
    tp, heads = model.tensor_model_parallel_size, model.num_attention_heads
    groups = model.num_query_groups or heads
    if min(tp, heads, groups, model.context_parallel_size) < 1:
        return None  # positive_sizes and attention_heads report sizes below 1
    if not splits_heads(tp, heads, groups):
        fitting = largest_divisor(tp, lambda size: splits_heads(size, heads, groups))
        return violation(
            "tensor_parallel_heads",
            ["model.tensor_model_parallel_size", "model.num_attention_heads", "model.num_query_groups"],
            f"TP={tp} splits the attention heads across its ranks: num_attention_heads={heads} must be a multiple of "
            f"it, and num_query_groups={groups} a multiple or a divisor; set model.tensor_model_parallel_size="
            f"{fitting} (or heads and groups that it splits)",
        )
    return linear_heads_violation(cfg, target)


def splits_heads(tp: int, heads: int, groups: int) -> bool:
    return heads % tp == 0 and (groups % tp == 0 or tp % groups == 0)


def largest_divisor(size: int, fits: Callable[[int], bool]) -> int:
    """The largest divisor of a parallel ``size``, below it, that ``fits``: as a divisor it keeps train.num_gpus a
    multiple of the model-parallel sizes."""
    return max(divisor for divisor in divisors(size) if divisor < size and fits(divisor))


def linear_heads_violation(cfg, target):
    """Gated delta net's key and value heads, split over TP (megatron-core 0.16) or TP x CP (0.19)."""
    model = cfg.model
    if model.experimental_attention_variant != GATED_DELTA_NET:
        return None
    over_context = in_range(target.megatron_core, ">=0.19")
    shards = model.tensor_model_parallel_size * (model.context_parallel_size if over_context else 1)
    counts: Dict[str, int] = {"model.linear_num_key_heads": model.linear_num_key_heads,
                              "model.linear_num_value_heads": model.linear_num_value_heads}
    uneven = {key: count for key, count in counts.items() if count % shards}
    if not uneven:
        return None
    ranks = "TP x CP" if over_context else "TP"
    listed = ", ".join(f"{key.split('.')[-1]}={count}" for key, count in uneven.items())
    return violation(
        "tensor_parallel_heads",
        [*uneven, "model.tensor_model_parallel_size", *(["model.context_parallel_size"] if over_context else [])],
        f"gated delta net splits its linear-attention heads over {ranks} = {shards} ranks on megatron-core "
        f"{target.megatron_core}, and {listed} {'is not a multiple' if len(uneven) == 1 else 'are not multiples'} "
        f"of {shards}; set {ranks} to a divisor of {' and '.join(str(count) for count in counts.values())}",
    )


@rule("gated_delta_net_context_parallel", engine="megatron", megatron_core="<0.19",
      rejects="gated delta net (`model.experimental_attention_variant=gated_delta_net`, Qwen3-Next) with context "
              "parallelism before megatron-core 0.19",
      fix="`model.context_parallel_size=1`, or `plan.megatron_core=0.19.2`")
def gated_delta_net_context_parallel(cfg, target):
    # TransformerConfig 0.16.1 asserts context_parallel_size == 1 for gated delta net (Qwen3-Next at CP2 planned valid
    # and failed to build on the CPU); 0.19 splits the linear heads over CP.
    model = cfg.model
    if model.experimental_attention_variant != GATED_DELTA_NET or model.context_parallel_size == 1:
        return None
    return violation(
        "gated_delta_net_context_parallel", ["model.context_parallel_size", "model.experimental_attention_variant"],
        f"megatron-core {target.megatron_core}'s gated delta net takes no context parallelism "
        f"(model.context_parallel_size={model.context_parallel_size}); set model.context_parallel_size=1, or "
        "plan.megatron_core=0.19.2, which splits it",
    )


@rule("tensor_parallel_widths",
      rejects="MLP widths that their tensor parallelism cannot split evenly: `model.ffn_hidden_size` (dense layers) or "
              "`model.moe_shared_expert_intermediate_size` not a multiple of TP, `model.moe_ffn_hidden_size` not a "
              "multiple of the experts' tensor parallelism (ETP)",
      fix="widths that are multiples of TP (ETP for the experts), or the parallel size the message names")
def tensor_parallel_widths(cfg, target):
    # The parallel linears divide their output (or input) by the tensor-parallel ranks and assert it divides: llama/
    # tiny's ffn_hidden_size=1002 at TP4 built on the CPU failed "501 is not divisible by 2" (0.16.1), and qwen/tiny's
    # moe_ffn_hidden_size=101 at ETP2 "101 is not divisible by 2"; both planned valid before this rule.
    model = cfg.model
    tp, etp = model.tensor_model_parallel_size, expert_tensor_parallel_size(model)
    widths = [("model.ffn_hidden_size", model.ffn_hidden_size if has_dense_layers(model) else None, tp,
               "model.tensor_model_parallel_size")]
    if is_moe_model(model):
        widths += [("model.moe_ffn_hidden_size", model.moe_ffn_hidden_size, etp,
                    "model.expert_tensor_parallel_size" if model.expert_tensor_parallel_size else
                    "model.tensor_model_parallel_size"),
                   ("model.moe_shared_expert_intermediate_size", model.moe_shared_expert_intermediate_size, tp,
                    "model.tensor_model_parallel_size")]
    uneven = [(key, width, ranks, size_key) for key, width, ranks, size_key in widths
              if width and ranks > 0 and width % ranks]
    if not uneven:
        return None
    key, width, ranks, size_key = uneven[0]
    fitting = largest_divisor(ranks, lambda size: width % size == 0)
    return violation(
        "tensor_parallel_widths", [key, size_key],
        f"{key.split('.')[-1]}={width} is split over {ranks} tensor-parallel ranks ({size_key.split('.')[-1]}) and is "
        f"not a multiple of {ranks}; set {key} to a multiple of {ranks}, or {size_key}={fitting}",
    )


@rule("expert_parallel_experts",
      rejects="experts that expert parallelism cannot split evenly: `model.num_moe_experts` not a multiple of EP",
      fix="the `model.expert_model_parallel_size` the message names")
def expert_parallel_experts(cfg, target):
    # The MoE layer asserts num_moe_experts % EP == 0 (a bare AssertionError): qwen/tiny's 8 experts at EP16 planned
    # valid and failed at model build on the CPU (0.16.1).
    model = cfg.model
    ep = model.expert_model_parallel_size
    if not is_moe_model(model) or ep < 1 or model.num_moe_experts % ep == 0:
        return None
    expert_world = cfg.train.num_gpus // model.pipeline_model_parallel_size
    return violation(
        "expert_parallel_experts", ["model.expert_model_parallel_size", "model.num_moe_experts"],
        f"EP={ep} splits the {model.num_moe_experts} experts across its ranks, and they are not a multiple of it; "
        f"{expert_parallel_fix(model, expert_world, expert_tensor_parallel_size(model))} (or experts that it splits)",
    )
