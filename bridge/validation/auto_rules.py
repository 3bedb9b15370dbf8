"""Rules of ``cuda_graph=auto``, the measured choice. Its configuration is eager until the probe picks a graph
choice, so these judge what auto cannot decide for: they fire only on a target whose graph choice is measured
(Target.graphs_measured, set where the job composed cuda_graph=auto)."""

from bridge.config.graphs import MEASURED_CHOICE
from bridge.validation.graph_facts import IMPL, MODULES, impl_of, is_graphed
from bridge.validation.registry import rule, violation


@rule("auto_graph_fields",
      rejects="`cuda_graph=auto` with a graph impl or module list set besides it (an override, an older spelling, "
              "or a preset composed after it)",
      fix="drop those graph fields, or `cuda_graph=<choice>` instead of auto")
def auto_graph_fields(cfg, target):
    if not target.graphs_measured or not (is_graphed(cfg) or cfg.model.cuda_graph_modules):
        return None
    return violation(
        "auto_graph_fields", ["cuda_graph", IMPL, MODULES],
        f"cuda_graph={MEASURED_CHOICE} picks the graph impl and modules itself, but {IMPL}={impl_of(cfg).value} "
        f"{MODULES}={list(cfg.model.cuda_graph_modules)} are set besides it (an override, an older spelling, or a "
        "preset composed after it); drop them, or choose cuda_graph=<choice> instead")


@rule("auto_one_node",
      rejects="`cuda_graph=auto` on a job of several nodes: each node would probe and decide on its own",
      fix="`cuda_graph=<choice>`: a one-node run of `cuda_graph=auto` at the same per-node layout, or a sweep, "
          "measures them")
def auto_one_node(cfg, target):
    if not target.graphs_measured or cfg.train.num_nodes <= 1:
        return None
    return violation(
        "auto_one_node", ["cuda_graph", "train.num_nodes"],
        f"cuda_graph={MEASURED_CHOICE} probes on one node and this job spans train.num_nodes={cfg.train.num_nodes}; "
        f"use cuda_graph=<choice> (a one-node run of cuda_graph={MEASURED_CHOICE} at the same per-node layout, or a "
        "sweep, measures them)")
