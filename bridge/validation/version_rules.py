"""Rules that hold for some megatron-core releases only: what the target release has no field for,
and where 0.19 changed a CUDA-graph rule of 0.16.1 (its TransformerConfig checks, its EP-overlap
schedule, its inference scope). The rule a release replaced declares the older range where it is
defined; each rule here declares its own (bridge.validation.registry)."""

import dataclasses

from bridge.config.releases import RELEASES, release
from bridge.config.schema import GraphBridgeConfig, ModelConfig
from bridge.validation.graph_facts import FULL_ITERATION, IMPL, LOCAL, MODULES, TE, impl_of, modules_of
from bridge.config.model_facts import recompute_modules
from bridge.validation.registry import rule, violation

INFERENCE_SCOPE = "model.inference_cuda_graph_scope"
OVERLAP = "model.overlap_moe_expert_parallel_comm"
SECTIONS = {"model": ModelConfig}


def _default(dotted: str):
    section, name = dotted.split(".")
    field = next(f for f in dataclasses.fields(SECTIONS[section]) if f.name == name)
    return field.default


def _override(value) -> str:
    """A value as a command-line override spells it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _value(cfg: GraphBridgeConfig, dotted: str):
    section, name = dotted.split(".")
    value = getattr(getattr(cfg, section), name)
    return getattr(value, "value", value)


@rule("version_fields",
      rejects="a value for a field the target megatron-core release does not have "
              "(`model.inference_cuda_graph_scope` and `model.moe_pad_experts_for_cuda_graph_inference` before 0.19, "
              "`model.moe_use_legacy_grouped_gemm` from 0.19 on)",
      fix="drop it (its default), or plan for a release that has it (`plan.megatron_core=...`)")
def version_fields(cfg, target):
    row = release(target.megatron_core)
    if row is None:
        return None  # megatron_core_version reports the release itself
    found = []
    for dotted, carrier in row.carriers.items():
        value = _value(cfg, dotted)
        if carrier is not None or value == _default(dotted):
            continue
        others = [other.version for other in RELEASES.values() if other.carrier(dotted) is not None]
        found.append(violation(
            "version_fields", [dotted, "plan.megatron_core"],
            f"{dotted}={_override(value)} has no field in megatron-core {row.version} ({', '.join(others)} has it); "
            f"drop it (set {dotted}={_override(_default(dotted))}), or plan for {others[-1]}: set "
            f"plan.megatron_core={others[-1]}"))
    return found


@rule("inference_scope", megatron_core=">=0.19",
      rejects="an inference CUDA-graph scope the impl does not allow (local: layer or block; every other impl: none)",
      fix="`model.inference_cuda_graph_scope=null` (the impl's default)")
def inference_scope(cfg, target):
    row, scope = release(target.megatron_core), _value(cfg, INFERENCE_SCOPE)
    if row is None or scope is None:
        return None
    impl = row.full_iteration[0] if impl_of(cfg) == FULL_ITERATION else impl_of(cfg).value
    allowed = row.inference_scopes[impl]
    if scope in allowed:
        return None
    return violation(
        "inference_scope", [INFERENCE_SCOPE, IMPL],
        f"Invalid inference CUDA graph scope {scope!r} for cuda_graph_impl={impl!r} (megatron-core {row.version} "
        f"allows {list(allowed)}); set {INFERENCE_SCOPE}=null for the impl's default",
    )


@rule("inference_block_training", engine="megatron", megatron_core=">=0.19",
      rejects="local whole-layer graphs with the block inference scope (megatron-core then gives the layers no "
              "training graph: nothing would be captured)",
      fix="`model.inference_cuda_graph_scope=layer` (or null), or name modules")
def inference_block_training(cfg, target):
    if impl_of(cfg) == LOCAL and not modules_of(cfg) and _value(cfg, INFERENCE_SCOPE) == "block":
        return violation(
            "inference_block_training", [INFERENCE_SCOPE, IMPL, MODULES],
            "with inference_cuda_graph_scope=block megatron-core leaves whole-layer local graphs to its inference "
            "blocks, so training would capture nothing; set model.inference_cuda_graph_scope=layer (or null), or "
            "use cuda_graph=full_iteration",
        )
    return None


@rule("ep_overlap_te_graphs", megatron_core=">=0.19",
      rejects="EP A2A overlap with moe, mlp or whole-layer TE graphs (0.19 allows full_iteration with it)",
      fix="`cuda_graph=te_attn_moe_router` or `cuda_graph=full_iteration`")
def ep_overlap_te_graphs(cfg, target):
    modules = set(modules_of(cfg))
    if cfg.model.overlap_moe_expert_parallel_comm and impl_of(cfg) == TE and ({"moe", "mlp"} & modules or not modules):
        return violation(
            "ep_overlap_te_graphs", [MODULES, OVERLAP],
            "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm (a whole-layer "
            "TE graph holds the MLP too); use cuda_graph=te_attn_moe_router or cuda_graph=full_iteration",
        )
    return None


@rule("ep_overlap_local_graphs", engine="megatron", megatron_core=">=0.19",
      rejects="EP A2A overlap with local per-layer graphs (the overlap schedule runs each layer's parts past them: "
              "nothing would be captured)",
      fix="`cuda_graph=full_iteration` or `cuda_graph=te_attn_moe_router`")
def ep_overlap_local_graphs(cfg, target):
    # megatron-core 0.19's TransformerConfig allows it, but its overlap schedule calls each layer's
    # attention and MLP parts itself, past the graph manager that wraps the whole layer.
    if cfg.model.overlap_moe_expert_parallel_comm and impl_of(cfg) == LOCAL:
        return violation(
            "ep_overlap_local_graphs", [IMPL, OVERLAP],
            "under EP A2A overlap megatron-core 0.19 runs each layer's parts past the local per-layer graphs, which "
            "would capture nothing; use cuda_graph=full_iteration or a TE scope such as "
            "cuda_graph=te_attn_moe_router, or set model.overlap_moe_expert_parallel_comm=false",
        )
    return None


@rule("ep_overlap_moe_recompute", megatron_core=">=0.19",
      rejects="EP A2A overlap with moe in `model.recompute_modules`",
      fix="remove moe from `model.recompute_modules`")
def ep_overlap_moe_recompute(cfg, target):
    model = cfg.model
    # megatron-core checks the list even without selective recompute.
    if model.overlap_moe_expert_parallel_comm and "moe" in recompute_modules(model):
        return violation(
            "ep_overlap_moe_recompute", [OVERLAP, "model.recompute_modules"],
            "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm; remove moe from "
            "model.recompute_modules or set model.overlap_moe_expert_parallel_comm=false",
        )
    return None


@rule("cpu_offloading_layer_graphs", megatron_core=">=0.19",
      rejects="CPU offloading with local or TE per-layer graphs (full_iteration is allowed from 0.19 on)",
      fix="`model.cpu_offloading=false`, or `cuda_graph=full_iteration`")
def cpu_offloading_layer_graphs(cfg, target):
    if cfg.model.cpu_offloading and impl_of(cfg) in (LOCAL, TE):
        return violation(
            "cpu_offloading_layer_graphs", [IMPL, "model.cpu_offloading"],
            "CUDA graphs not supported with CPU offloading (megatron-core 0.19 allows it only under full_iteration); "
            "set model.cpu_offloading=false, or use cuda_graph=full_iteration",
        )
    return None


@rule("delay_wgrad_legacy_gemm", megatron_core="<0.19",
      rejects="delay_wgrad with the legacy grouped GEMM",
      fix="`model.moe_use_legacy_grouped_gemm=false`")
def delay_wgrad_legacy_gemm(cfg, target):
    model = cfg.model
    if model.delay_wgrad_compute and model.overlap_moe_expert_parallel_comm and model.moe_use_legacy_grouped_gemm:
        return violation(
            "delay_wgrad_legacy_gemm", ["model.delay_wgrad_compute", "model.moe_use_legacy_grouped_gemm"],
            "delay_wgrad_compute is not supported with legacy groupedgemm implementation; set "
            "model.moe_use_legacy_grouped_gemm=false",
        )
    return None

