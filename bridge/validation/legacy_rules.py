"""The older CUDA-graph spellings that migration could not carry over (bridge.config.migration
says why): old and new inputs that disagree, unknown or mixed scope names."""

from bridge.config.migration import legacy_conflict
from bridge.validation.registry import rule, violation


def _conflict_of(cfg, name: str):
    conflict = legacy_conflict(cfg.model)
    if conflict is None or conflict.rule != name:
        return None
    return violation(conflict.rule, conflict.keys, conflict.message)


@rule("legacy_flags",
      rejects="both deprecated flags (`enable_cuda_graph`, `external_cuda_graph`) on, or one with a graph impl",
      fix="`model.cuda_graph_impl=local` or `transformer_engine` alone")
def legacy_flags(cfg, target):
    return _conflict_of(cfg, "legacy_flags")


@rule("legacy_scope",
      rejects="a `model.cuda_graph_scope` (0.16.1's field) or a deprecated value of 0.19 (`full`, `full_iteration`, "
              "`full_iteration_inference`) that is malformed, mixed with other names or with each other, or "
              "disagrees with `model.cuda_graph_modules`, the impl or the inference scope",
      fix="`model.cuda_graph_modules=[...]` with `model.cuda_graph_impl`, or `cuda_graph=<choice>`")
def legacy_scope(cfg, target):
    return _conflict_of(cfg, "legacy_scope")
