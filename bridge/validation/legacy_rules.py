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
      rejects="a `model.cuda_graph_scope` (0.16.1's field) that is malformed, mixes `full` or `full_iteration` "
              "with other names, or disagrees with `model.cuda_graph_modules` / the impl",
      fix="`model.cuda_graph_modules=[...]` with `model.cuda_graph_impl`, or `cuda_graph=<choice>`")
def legacy_scope(cfg, target):
    return _conflict_of(cfg, "legacy_scope")
