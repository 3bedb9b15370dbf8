"""Migration of the older CUDA-graph spellings onto the canonical impl + modules API.

What each older input is, and what it becomes:
  model.enable_cuda_graph=true      deprecated in megatron-core 0.16.1 -> cuda_graph_impl=local
  model.external_cuda_graph=true    deprecated in megatron-core 0.16.1 -> cuda_graph_impl=transformer_engine
  model.cuda_graph_scope=<scope>    megatron-core 0.16.1's own field (Megatron-Bridge v0.3.x sets it);
                                    megatron-core 0.19 renamed it cuda_graph_modules: full -> [],
                                    full_iteration -> cuda_graph_impl=full_iteration
  model.cuda_graph_modules=[full_iteration]
                                    megatron-core 0.19's deprecated scope value -> cuda_graph_impl=full_iteration
  model.cuda_graph_modules=[full]   megatron-core 0.19's deprecated whole layer -> []
  full_iteration_inference          megatron-core 0.19's deprecated scope value (in either field) ->
                                    inference_cuda_graph_scope=block under local; no effect under none
Each migration is one info line. With impl none a 0.16.1 scope is a parked setting (inert, as in
megatron-core 0.16.1) and stays. An input that cannot be migrated unambiguously (old and new
spellings that disagree, unknown names) is left as it is: ``legacy_conflict`` says what is wrong,
and the catalogue's legacy rule reports it with the fix.

Works on the composed DictConfig (before the derived values resolve, so they follow the migrated
impl) and on a GraphBridgeConfig object alike.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import OmegaConf

from bridge.config.schema import CUDA_GRAPH_MODULES, CudaGraphImpl

DEPRECATED_VALUES = ("full_iteration", "full_iteration_inference")
"""megatron-core 0.19's deprecated scope values: each stands for a setting of another field."""
LEGACY_SCOPE_NAMES = ("full",) + DEPRECATED_VALUES + CUDA_GRAPH_MODULES
SCOPE_FIELD = "model.cuda_graph_scope (megatron-core 0.16.1's name of model.cuda_graph_modules)"


@dataclass
class Conflict:
    rule: str
    keys: List[str]
    message: str


@dataclass
class MigrationReport:
    notes: List[str] = field(default_factory=list)


def scope_names(scope) -> List[str]:
    """Normalise every accepted form of cuda_graph_scope to a list of stripped names."""
    if scope is None:
        return []
    if isinstance(scope, str):
        return [name.strip() for name in scope.split(",")]
    return [str(getattr(item, "name", item)).strip() for item in scope]


def _plain(value):
    """A list or scalar as plain Python (a DictConfig hands out ListConfig nodes)."""
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _impl(model) -> CudaGraphImpl:
    return CudaGraphImpl(model.cuda_graph_impl)


def legacy_conflict(model) -> Optional[Conflict]:
    """Why the older spellings in ``model`` cannot be migrated, or None when they can (or are absent)."""
    if model.enable_cuda_graph and model.external_cuda_graph:
        return Conflict("legacy_flags", ["model.enable_cuda_graph", "model.external_cuda_graph"],
                        "enable_cuda_graph and external_cuda_graph cannot both be on; keep one, or use "
                        "model.cuda_graph_impl=local|transformer_engine instead")
    for flag in ("enable_cuda_graph", "external_cuda_graph"):
        if getattr(model, flag) and _impl(model) != CudaGraphImpl.none:
            return Conflict("legacy_flags", [f"model.{flag}", "model.cuda_graph_impl"],
                            f"the deprecated model.{flag} cannot be combined with model.cuda_graph_impl="
                            f"{_impl(model).value}; drop model.{flag}")
    return _modules_conflict(model) or _scope_conflict(model)


def _modules_conflict(model) -> Optional[Conflict]:
    modules = _plain(model.cuda_graph_modules)
    if not isinstance(modules, list):
        return None  # the module_names rule reports a malformed list
    if "full" in modules and modules != ["full"]:
        return Conflict("legacy_scope", ["model.cuda_graph_modules"],
                        f"full scope cannot be used with other scopes: {modules}; model.cuda_graph_modules=[] is "
                        "the whole layer")
    return _deprecated_values_conflict(model, modules, "model.cuda_graph_modules")


def _deprecated_values_conflict(model, names: List[str], key: str) -> Optional[Conflict]:
    """megatron-core 0.19's checks of its deprecated scope values, in the field ``key`` holding ``names``."""
    present = [value for value in DEPRECATED_VALUES if value in names]
    if len(present) > 1:
        return Conflict("legacy_scope", [key],
                        f"{key} cannot contain multiple deprecated values at the same time: {present}; keep one")
    scope = getattr(model.inference_cuda_graph_scope, "value", model.inference_cuda_graph_scope)
    if "full_iteration" in names:
        if names != ["full_iteration"]:
            return Conflict("legacy_scope", [key],
                            f"full_iteration is the whole iteration and cannot be combined with modules {names}; "
                            "use cuda_graph=full_iteration alone")
        if _impl(model) == CudaGraphImpl.transformer_engine:
            return Conflict("legacy_scope", [key, "model.cuda_graph_impl"],
                            f"{key}=[full_iteration] cannot be combined with cuda_graph_impl=transformer_engine; "
                            "use cuda_graph=full_iteration")
        if scope not in (None, "none"):
            return Conflict("legacy_scope", [key, "model.inference_cuda_graph_scope"],
                            f"{key}=[full_iteration] cannot be combined with inference_cuda_graph_scope={scope}; "
                            "use cuda_graph=full_iteration with model.inference_cuda_graph_scope=null")
    if "full_iteration_inference" in names:
        if _impl(model) not in (CudaGraphImpl.none, CudaGraphImpl.local):
            return Conflict("legacy_scope", [key, "model.cuda_graph_impl"],
                            f"full_iteration_inference cannot be combined with cuda_graph_impl={_impl(model).value}; "
                            "use model.cuda_graph_impl=local model.inference_cuda_graph_scope=block")
        if scope not in (None, "block"):
            return Conflict("legacy_scope", [key, "model.inference_cuda_graph_scope"],
                            f"full_iteration_inference cannot be combined with inference_cuda_graph_scope={scope}; "
                            "use model.inference_cuda_graph_scope=block alone")
    return None


def _scope_conflict(model) -> Optional[Conflict]:
    scope = _plain(model.cuda_graph_scope)
    if scope is None:
        return None
    if not isinstance(scope, (str, list)):
        return Conflict("legacy_scope", ["model.cuda_graph_scope"],
                        f"{SCOPE_FIELD} is {scope!r}; it must be a name, a comma list or a list of names "
                        "(better: model.cuda_graph_modules=[...])")
    names = scope_names(scope)
    unknown = [name for name in names if name not in LEGACY_SCOPE_NAMES]
    if unknown:
        return Conflict("legacy_scope", ["model.cuda_graph_scope"],
                        f"{SCOPE_FIELD} has unknown name(s) {unknown}; use names from {list(LEGACY_SCOPE_NAMES)} "
                        "(better: model.cuda_graph_modules=[...])")
    if "full" in names and len(names) > 1:
        return Conflict("legacy_scope", ["model.cuda_graph_scope"],
                        f"'full' (the whole layer) cannot be mixed with other scopes in {names}; "
                        "set model.cuda_graph_scope=null model.cuda_graph_modules=[] for whole layers")
    if "full_iteration" in names and names != ["full_iteration"]:
        return Conflict("legacy_scope", ["model.cuda_graph_scope"],
                        f"full_iteration cannot be combined with other scopes in {names}; use "
                        "cuda_graph=full_iteration alone")
    if _impl(model) == CudaGraphImpl.none:
        return None  # parked, exactly as megatron-core 0.16.1 treats it
    if _plain(model.cuda_graph_modules):
        return Conflict("legacy_scope", ["model.cuda_graph_scope", "model.cuda_graph_modules"],
                        "model.cuda_graph_scope and model.cuda_graph_modules cannot be set together (the first is "
                        "megatron-core 0.16.1's name of the second); drop model.cuda_graph_scope")
    if names == ["full_iteration"] and _impl(model) == CudaGraphImpl.transformer_engine:
        return Conflict("legacy_scope", ["model.cuda_graph_scope", "model.cuda_graph_impl"],
                        "To use full iteration cuda graph, please use cuda_graph_impl=local instead of "
                        "cuda_graph_impl=transformer_engine. Fix: cuda_graph=full_iteration")
    return _deprecated_values_conflict(model, names, "model.cuda_graph_scope")


def migrate(model) -> MigrationReport:
    """Rewrite the older spellings in ``model`` (a model section) in place; the info lines."""
    report = MigrationReport()
    if legacy_conflict(model) is not None:
        return report  # left as it is for the catalogue to report
    for flag, impl in (("enable_cuda_graph", "local"), ("external_cuda_graph", "transformer_engine")):
        if getattr(model, flag):
            model.cuda_graph_impl = CudaGraphImpl(impl)
            setattr(model, flag, False)
            report.notes.append(f"model.{flag}=true is deprecated: migrated to model.cuda_graph_impl={impl}")
    _migrate_scope(model, report)
    _migrate_deprecated_modules(model, report)
    return report


def _migrate_scope(model, report: MigrationReport) -> None:
    names = scope_names(_plain(model.cuda_graph_scope))
    if not names or _impl(model) == CudaGraphImpl.none:
        return
    if names == ["full_iteration"]:
        model.cuda_graph_impl = CudaGraphImpl.full_iteration
        report.notes.append("model.cuda_graph_scope=full_iteration (megatron-core 0.16.1's spelling) is "
                            "model.cuda_graph_impl=full_iteration here: migrated")
    else:
        model.cuda_graph_modules = [] if names == ["full"] else names
        report.notes.append(f"model.cuda_graph_scope={names} (megatron-core 0.16.1's field) is "
                            f"model.cuda_graph_modules={list(model.cuda_graph_modules)} here: migrated")
    model.cuda_graph_scope = None


def _migrate_deprecated_modules(model, report: MigrationReport) -> None:
    """megatron-core 0.19's deprecated values in cuda_graph_modules (also those a scope just moved there)."""
    modules = _plain(model.cuda_graph_modules)
    if modules == ["full_iteration"]:
        model.cuda_graph_impl, model.cuda_graph_modules = CudaGraphImpl.full_iteration, []
        report.notes.append("model.cuda_graph_modules=[full_iteration] is megatron-core 0.19's deprecated spelling: "
                            "migrated to model.cuda_graph_impl=full_iteration")
    elif modules == ["full"]:
        model.cuda_graph_modules = []
        report.notes.append("model.cuda_graph_modules=[full] is megatron-core's deprecated whole layer: migrated to "
                            "model.cuda_graph_modules=[]")
    elif isinstance(modules, list) and "full_iteration_inference" in modules:
        model.cuda_graph_modules = [name for name in modules if name != "full_iteration_inference"]
        if _impl(model) == CudaGraphImpl.local:
            model.inference_cuda_graph_scope = "block"
            report.notes.append("full_iteration_inference is megatron-core 0.19's deprecated scope value: migrated "
                                "to model.inference_cuda_graph_scope=block")
        else:
            report.notes.append("full_iteration_inference has no effect with cuda_graph_impl=none: dropped (use "
                                "model.cuda_graph_impl=local model.inference_cuda_graph_scope=block)")
