"""Migration of the older CUDA-graph spellings onto the canonical impl + modules API.

Accepted inputs (megatron-core <= 0.16 and Megatron-Bridge v0.3.x):
  model.enable_cuda_graph=true      -> cuda_graph_impl=local
  model.external_cuda_graph=true    -> cuda_graph_impl=transformer_engine
  model.cuda_graph_scope=<scope>    -> cuda_graph_modules (full -> []), or
                                       cuda_graph_impl=full_iteration for full_iteration
Each migration is one info line; a conflicting mix of old and new inputs is a violation.
With impl none a legacy scope is a parked setting (inert, as in 0.16.1) and is left alone.
"""

from dataclasses import dataclass, field
from typing import List

from bridge.config.schema import CUDA_GRAPH_MODULES, CudaGraphImpl, ModelConfig
from bridge.validation.violation import Violation

LEGACY_SCOPE_NAMES = ("full", "full_iteration") + CUDA_GRAPH_MODULES


@dataclass
class MigrationReport:
    notes: List[str] = field(default_factory=list)
    violations: List[Violation] = field(default_factory=list)


def scope_names(scope) -> List[str]:
    """Normalise every accepted form of cuda_graph_scope to a list of stripped names."""
    if scope is None:
        return []
    if isinstance(scope, str):
        return [name.strip() for name in scope.split(",")]
    return [str(getattr(item, "name", item)).strip() for item in scope]


def migrate(model: ModelConfig) -> MigrationReport:
    report = MigrationReport()
    _migrate_flags(model, report)
    _migrate_scope(model, report)
    return report


def _migrate_flags(model: ModelConfig, report: MigrationReport) -> None:
    if model.enable_cuda_graph and model.external_cuda_graph:
        report.violations.append(
            Violation(
                "legacy_flags_conflict",
                ["model.enable_cuda_graph", "model.external_cuda_graph"],
                "enable_cuda_graph and external_cuda_graph cannot both be on; "
                "keep one, or use model.cuda_graph_impl=local|transformer_engine instead",
            )
        )
        return
    for flag, impl in (("enable_cuda_graph", "local"), ("external_cuda_graph", "transformer_engine")):
        if not getattr(model, flag):
            continue
        if model.cuda_graph_impl != CudaGraphImpl.none:
            report.violations.append(
                Violation(
                    "legacy_flags_conflict",
                    [f"model.{flag}", "model.cuda_graph_impl"],
                    f"the deprecated model.{flag} cannot be combined with "
                    f"model.cuda_graph_impl={model.cuda_graph_impl.value}; drop model.{flag}",
                )
            )
            return
        model.cuda_graph_impl = CudaGraphImpl(impl)
        setattr(model, flag, False)
        report.notes.append(f"model.{flag}=true is deprecated: migrated to model.cuda_graph_impl={impl}")


def _migrate_scope(model: ModelConfig, report: MigrationReport) -> None:
    if model.cuda_graph_scope is None:
        return
    if not isinstance(model.cuda_graph_scope, (str, list, tuple)):
        report.violations.append(
            Violation(
                "legacy_scope_names",
                ["model.cuda_graph_scope"],
                f"model.cuda_graph_scope={model.cuda_graph_scope!r} must be a name, a comma list or a "
                "list of names; better: model.cuda_graph_modules=[...]",
            )
        )
        return
    names = scope_names(model.cuda_graph_scope)
    bad = [name for name in names if name not in LEGACY_SCOPE_NAMES]
    if bad:
        report.violations.append(
            Violation(
                "legacy_scope_names",
                ["model.cuda_graph_scope"],
                f"model.cuda_graph_scope has unknown name(s) {bad}; valid names are "
                f"{list(LEGACY_SCOPE_NAMES)} (better: model.cuda_graph_modules=[...])",
            )
        )
        return
    if "full" in names and len(names) > 1:
        report.violations.append(
            Violation(
                "legacy_scope_names",
                ["model.cuda_graph_scope"],
                f"'full' (the whole layer) cannot be mixed with other scopes in {names}; "
                "use model.cuda_graph_modules=[] for whole layers",
            )
        )
        return
    if model.cuda_graph_impl == CudaGraphImpl.none:
        return  # parked, exactly as megatron-core 0.16.1 treats it
    if model.cuda_graph_modules:
        report.violations.append(
            Violation(
                "legacy_scope_conflict",
                ["model.cuda_graph_scope", "model.cuda_graph_modules"],
                "model.cuda_graph_scope and model.cuda_graph_modules cannot be set together; "
                "drop model.cuda_graph_scope",
            )
        )
        return
    if "full_iteration" in names:
        _migrate_full_iteration_scope(model, names, report)
        return
    modules = [] if names == ["full"] else names
    model.cuda_graph_modules = modules
    model.cuda_graph_scope = None
    report.notes.append(
        f"model.cuda_graph_scope is deprecated: migrated to model.cuda_graph_modules={modules}"
    )


def _migrate_full_iteration_scope(model: ModelConfig, names: List[str], report: MigrationReport) -> None:
    if names != ["full_iteration"]:
        report.violations.append(
            Violation(
                "legacy_scope_names",
                ["model.cuda_graph_scope"],
                f"full_iteration cannot be combined with other scopes in {names}; "
                "use cuda_graph=full_iteration alone",
            )
        )
        return
    if model.cuda_graph_impl == CudaGraphImpl.transformer_engine:
        report.violations.append(
            Violation(
                "legacy_scope_conflict",
                ["model.cuda_graph_scope", "model.cuda_graph_impl"],
                "To use full iteration cuda graph, please use cuda_graph_impl=local instead of "
                "cuda_graph_impl=transformer_engine. Fix: cuda_graph=full_iteration",
            )
        )
        return
    model.cuda_graph_impl = CudaGraphImpl.full_iteration
    model.cuda_graph_scope = None
    report.notes.append(
        "model.cuda_graph_scope=full_iteration is deprecated: migrated to "
        "model.cuda_graph_impl=full_iteration"
    )
