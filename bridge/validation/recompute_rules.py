"""Activation recompute and offloading: what megatron-core 0.16.1 allows together with CUDA graphs
(R11 in the reference) and on its own (its checks outside the graph block)."""

from bridge.validation.graph_facts import FULL_ITERATION, IMPL, MODULES, impl_of, is_graphed, modules_of
from bridge.validation.model_facts import recompute_modules
from bridge.validation.registry import rule, violation


@rule("full_recompute",
      rejects='full recompute without full_iteration',
      fix='`cuda_graph=full_iteration` or selective recompute')
def full_recompute(cfg, target):
    if is_graphed(cfg) and cfg.model.recompute_granularity == "full" and impl_of(cfg) != FULL_ITERATION:
        return violation(
            "full_recompute", [IMPL, "model.recompute_granularity"],
            "full recompute is only supported with full iteration CUDA graph; use "
            "cuda_graph=full_iteration or model.recompute_granularity=selective",
        )
    return None


def _whole_layer_or_iteration(cfg) -> bool:
    return impl_of(cfg) == FULL_ITERATION or not modules_of(cfg)


def _graphs_module(cfg, name: str) -> bool:
    return is_graphed(cfg) and (_whole_layer_or_iteration(cfg) or name in modules_of(cfg))


@rule("recompute_attention_dropout",
      rejects='attention dropout with graphed selective recompute of core_attn',
      fix='`model.attention_dropout=0.0`, or recompute other modules')
def recompute_attention_dropout(cfg, target):
    model = cfg.model
    if (
        model.recompute_granularity == "selective"
        and model.attention_dropout != 0
        and "core_attn" in recompute_modules(model)
        and _graphs_module(cfg, "attn")
    ):
        return violation(
            "recompute_attention_dropout",
            ["model.attention_dropout", "model.recompute_modules", MODULES],
            "attention dropout is not supported with graphed attention recomputation; set "
            "model.attention_dropout=0.0 or remove core_attn from model.recompute_modules",
        )
    return None


@rule("recompute_hidden_dropout",
      rejects='hidden dropout with graphed selective recompute of mlp or moe',
      fix='`model.hidden_dropout=0.0`, or recompute other modules')
def recompute_hidden_dropout(cfg, target):
    model = cfg.model
    mods = recompute_modules(model)
    graphed_recompute = ("mlp" in mods and _graphs_module(cfg, "mlp")) or (
        "moe" in mods and _graphs_module(cfg, "moe")
    )
    if model.recompute_granularity == "selective" and model.hidden_dropout != 0 and graphed_recompute:
        return violation(
            "recompute_hidden_dropout",
            ["model.hidden_dropout", "model.recompute_modules", MODULES],
            "hidden dropout is not supported with graphed MLP/MoE recomputation; set "
            "model.hidden_dropout=0.0 or remove mlp/moe from model.recompute_modules",
        )
    return None


@rule("recompute_moe_jitter",
      rejects='MoE input jitter with graphed selective recompute of moe',
      fix='`model.moe_input_jitter_eps=null`, or recompute other modules')
def recompute_moe_jitter(cfg, target):
    model = cfg.model
    if (
        model.recompute_granularity == "selective"
        and model.moe_input_jitter_eps is not None
        and "moe" in recompute_modules(model)
        and _graphs_module(cfg, "moe")
    ):
        return violation(
            "recompute_moe_jitter",
            ["model.moe_input_jitter_eps", "model.recompute_modules", MODULES],
            "moe_input_jitter_eps is not supported with graphed moe recomputation; set "
            "model.moe_input_jitter_eps=null or remove moe from model.recompute_modules",
        )
    return None


@rule("recompute_settings",
      rejects="an unknown recompute granularity or module; full recompute without a method and layer count; a "
              "method or layer count without full recompute; moe_act without grouped GEMM, mla_up_proj without MLA",
      fix='as the message says')
def recompute_settings(cfg, target):
    model = cfg.model
    granularity = model.recompute_granularity
    if granularity not in (None, "full", "selective"):
        return violation(
            "recompute_settings", ["model.recompute_granularity"],
            f"model.recompute_granularity={granularity!r}: use null, full or selective",
        )
    if granularity == "full" and (model.recompute_method is None or model.recompute_num_layers is None):
        return violation(
            "recompute_settings",
            ["model.recompute_granularity", "model.recompute_method", "model.recompute_num_layers"],
            "full recompute needs a method and a layer count; set model.recompute_method=uniform "
            "model.recompute_num_layers=1",
        )
    if granularity != "full" and (model.recompute_method is not None or model.recompute_num_layers is not None):
        return violation(
            "recompute_settings", ["model.recompute_method", "model.recompute_num_layers"],
            "recompute_method and recompute_num_layers apply to full recompute only; set "
            "model.recompute_granularity=full or drop them (=null)",
        )
    if granularity == "selective":
        return recompute_modules_problem(model)
    return None


RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""What megatron-core 0.16.1 can recompute selectively."""


def recompute_modules_problem(model):
    modules = recompute_modules(model)
    unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
    if unknown:
        return violation("recompute_settings", ["model.recompute_modules"],
                         f"model.recompute_modules has {unknown}; use names from {list(RECOMPUTE_MODULES)}")
    if "moe_act" in modules and not model.moe_grouped_gemm:
        return violation("recompute_settings", ["model.recompute_modules", "model.moe_grouped_gemm"],
                         "moe_act in recompute_modules is only supported with moe_grouped_gemm; set "
                         "model.moe_grouped_gemm=true or drop moe_act")
    if "mla_up_proj" in modules and not model.multi_latent_attention:
        return violation("recompute_settings", ["model.recompute_modules", "model.multi_latent_attention"],
                         "mla_up_proj in recompute_modules is only supported with multi_latent_attention; drop "
                         "mla_up_proj from model.recompute_modules")
    return None


@rule("cpu_offloading_conflicts",
      rejects='CPU offloading with recompute or pipeline parallelism',
      fix='`model.cpu_offloading=false`')
def cpu_offloading_conflicts(cfg, target):
    model = cfg.model
    if not model.cpu_offloading:
        return None
    if model.recompute_granularity is not None:
        return violation(
            "cpu_offloading_conflicts", ["model.cpu_offloading", "model.recompute_granularity"],
            "CPU offloading does not work when activation recomputation is enabled; set "
            "model.recompute_granularity=null or model.cpu_offloading=false",
        )
    if model.pipeline_model_parallel_size > 1:
        return violation(
            "cpu_offloading_conflicts", ["model.cpu_offloading", "model.pipeline_model_parallel_size"],
            "there is no CPU offloading with pipeline parallelism; set model.cpu_offloading=false",
        )
    return None
