"""The MoE router's settings that TransformerConfig checks together: the score function an expert bias needs, and
group-limited routing's groups. Each planned valid and failed at build before its rule (the schema-wide draw found
them, tests/differential.py)."""

from bridge.config.releases import in_range
from bridge.validation.registry import rule, violation


@rule("expert_bias_score_function",
      rejects="aux-loss-free expert bias (`model.moe_router_enable_expert_bias=true`) with a router score function "
              "other than sigmoid (or, on megatron-core 0.19, sqrtsoftplus)",
      fix="`model.moe_router_score_function=sigmoid`, or `model.moe_router_enable_expert_bias=false`")
def expert_bias_score_function(cfg, target):
    # TransformerConfig raises it in __post_init__ (0.16.1: sigmoid only; 0.19.2 also sqrtsoftplus): deepseek/tiny,
    # which enables the bias, with model.moe_router_score_function=softmax planned valid and failed at build.
    model = cfg.model
    scores = ("sigmoid", "sqrtsoftplus") if in_range(target.megatron_core, ">=0.19") else ("sigmoid",)
    if not model.moe_router_enable_expert_bias or model.moe_router_score_function in scores:
        return None
    return violation(
        "expert_bias_score_function", ["model.moe_router_score_function", "model.moe_router_enable_expert_bias"],
        f"megatron-core {target.megatron_core} routes with an expert bias only under the "
        f"{' or '.join(scores)} score function (model.moe_router_score_function={model.moe_router_score_function}); "
        "set model.moe_router_score_function=sigmoid, or model.moe_router_enable_expert_bias=false",
    )


@rule("router_group_limited",
      rejects="group-limited routing (`model.moe_router_group_topk`) without `model.moe_router_num_groups` or "
              "experts, with groups that do not divide the experts, or with more groups picked than there are",
      fix="`model.moe_router_num_groups` (a divisor of the experts), or `model.moe_router_group_topk=null`")
def router_group_limited(cfg, target):
    # TransformerConfig raises "When using group limited routing, moe_router_num_groups must be specified" (0.16.1
    # and 0.19.2), for dense models too: qwen/tiny with model.moe_router_group_topk=4 planned valid and failed so.
    model = cfg.model
    if not model.moe_router_group_topk:
        return None
    if model.moe_router_num_groups:
        return uneven_router_groups(model)
    groups = next((size for size in (8, 4, 2) if model.num_moe_experts and model.num_moe_experts % size == 0
                   and size >= model.moe_router_group_topk), None)
    fix = f"model.moe_router_num_groups={groups}" if groups else "model.moe_router_num_groups=<groups of the experts>"
    return violation(
        "router_group_limited", ["model.moe_router_group_topk", "model.moe_router_num_groups"],
        f"group-limited routing picks the best {model.moe_router_group_topk} of model.moe_router_num_groups expert "
        f"groups, which is unset; set {fix}, or model.moe_router_group_topk=null",
    )


def uneven_router_groups(model):
    # TransformerConfig asserts both (0.16.1 and 0.19.2): the cluster-scale CPU differential drew deepseek/tiny with
    # seven experts in four groups, which planned valid and megatron-core refused.
    experts, groups, picked = model.num_moe_experts, model.moe_router_num_groups, model.moe_router_group_topk
    if not experts:
        # TransformerConfig divides the experts by the groups even on a dense model (TypeError: None % groups, both
        # releases): the 0.19.2 CPU differential drew deepseek/tiny with model.num_moe_experts=null (seed 34, draw 516)
        return violation(
            "router_group_limited", ["model.moe_router_group_topk", "model.num_moe_experts"],
            f"group-limited routing (model.moe_router_group_topk={picked}) splits the experts into groups, and "
            "model.num_moe_experts is unset (a dense model); set model.moe_router_group_topk=null, or the experts",
        )
    if experts % groups:
        return violation(
            "router_group_limited", ["model.moe_router_num_groups", "model.num_moe_experts"],
            f"model.moe_router_num_groups={groups} does not divide model.num_moe_experts={experts} into equal groups; "
            f"set model.moe_router_num_groups to a divisor of {experts}, or model.moe_router_group_topk=null",
        )
    if picked > groups:
        return violation(
            "router_group_limited", ["model.moe_router_group_topk", "model.moe_router_num_groups"],
            f"group-limited routing picks {picked} of model.moe_router_num_groups={groups} groups; set "
            f"model.moe_router_group_topk={groups} or fewer",
        )
    return None


@rule("moe_ffn_without_experts",
      rejects="`model.moe_ffn_hidden_size` on a model without `model.num_moe_experts` (megatron-core 0.19 lets it pass "
              "when `model.moe_layer_freq` leaves dense layers)",
      fix="`model.moe_ffn_hidden_size=null`, or `model.num_moe_experts`")
def moe_ffn_without_experts(cfg, target):
    # TransformerConfig refuses an experts' width without experts (0.16.1 asserts it; 0.19.2 raises unless the layer
    # frequency marks dense layers, where it drops the width): the schema-wide draw planned it valid.
    model = cfg.model
    if model.num_moe_experts is not None or model.moe_ffn_hidden_size is None:
        return None
    freq = model.moe_layer_freq
    mixed = (isinstance(freq, (list, tuple)) and 0 in freq) or (
        isinstance(freq, int) and not isinstance(freq, bool) and freq > 1)
    if mixed and in_range(target.megatron_core, ">=0.19"):
        return None
    return violation(
        "moe_ffn_without_experts", ["model.moe_ffn_hidden_size", "model.num_moe_experts"],
        f"model.moe_ffn_hidden_size={model.moe_ffn_hidden_size} sizes experts this model does not have "
        "(model.num_moe_experts is null); set model.moe_ffn_hidden_size=null",
    )


@rule("sinkhorn_aux_loss",
      rejects="Sinkhorn load balancing (`model.moe_router_load_balancing_type=sinkhorn`) with an auxiliary loss "
              "(`model.moe_aux_loss_coeff` above 0)",
      fix="`model.moe_aux_loss_coeff=0.0`, or another load-balancing type")
def sinkhorn_aux_loss(cfg, target):
    # The Sinkhorn router asserts "Sinkhorn routing does not support aux loss" in its first forward (0.16.1 and
    # 0.19.2): deepseek/tiny (aux-loss coefficient set) with Sinkhorn balancing planned valid and failed at a step.
    model = cfg.model
    if model.moe_router_load_balancing_type != "sinkhorn" or not model.moe_aux_loss_coeff:
        return None
    return violation(
        "sinkhorn_aux_loss", ["model.moe_router_load_balancing_type", "model.moe_aux_loss_coeff"],
        f"Sinkhorn routing balances the experts itself and takes no auxiliary loss (model.moe_aux_loss_coeff="
        f"{model.moe_aux_loss_coeff}); set model.moe_aux_loss_coeff=0.0, or model.moe_router_load_balancing_type=aux_loss",
    )


@rule("router_topk_experts",
      rejects="an MoE router that picks more experts a token (`model.moe_router_topk`) than the model has "
              "(`model.num_moe_experts`)",
      fix="`model.num_moe_experts` of at least `model.moe_router_topk`, or a smaller `model.moe_router_topk`")
def router_topk_experts(cfg, target):
    # The router's torch.topk takes k from the experts' scores: llama/tiny with model.num_moe_experts=1 (top-k 2)
    # planned valid and failed in the first forward ("selected index k out of range") on an H100, both releases
    # (run 843 of gpu_differential_schema_b0ccb80.json). TransformerConfig does not check it.
    model = cfg.model
    if not model.num_moe_experts or model.moe_router_topk <= model.num_moe_experts:
        return None
    return violation(
        "router_topk_experts", ["model.moe_router_topk", "model.num_moe_experts"],
        f"the router picks model.moe_router_topk={model.moe_router_topk} experts a token, but the model has "
        f"model.num_moe_experts={model.num_moe_experts}; set model.num_moe_experts={model.moe_router_topk} or more",
    )
