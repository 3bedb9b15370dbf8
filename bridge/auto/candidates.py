"""``cuda_graph=auto`` in the plan: its candidates, how the run will measure them, and what the decision cache
already holds for this workload.

The candidates are eager and every graph choice of the cuda_graph group that the catalogue accepts for this
configuration on the machine it is judged for. Each is composed exactly as ``graphbridge <the same overrides>
cuda_graph=<choice>`` composes it and judged by the same catalogue, so that the probe runs what the plan
accepted and the run trains with what ``cuda_graph=<choice>`` trains (plan equals run).

On a GPU the run probes them (perf.auto_probe): every candidate runs ``probe_iters`` steps in a process of
its own, as one sweep, eager first and last. A multi-node job is refused: the probe runs on one node.
"""

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import hydra
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from bridge.auto.cache import cache_path, decision_key, read_decisions
from bridge.config.graphs import EAGER_CHOICE, graph_choices, graph_impl
from bridge.config.load import compose_config
from bridge.config.schema import GraphBridgeConfig
from bridge.machine import Machine
from bridge.planning import Plan, build_plan, wrapped
from bridge.prepare import prepare
from bridge.result import MIN_TIMED_STEPS

PROBE_TIMED_STEPS = MIN_TIMED_STEPS
"""Timed steps per candidate: as many as a sweep's report trusts for a median."""
PROBE_DIR = "auto"
"""The probe's sweep directory, inside the run directory."""


@dataclass
class Candidate:
    choice: str
    plan: Plan
    refused_by: List[str]
    """The rules that refuse it on the machine it is judged for; empty when it is a candidate."""

    @property
    def accepted(self) -> bool:
        return not self.refused_by

    @property
    def untimed_steps(self) -> int:
        """The steps before its first timed one: perf.warmup_steps, or up to the capture step included."""
        cfg = self.plan.config
        capture = graph_impl(cfg.model.cuda_graph_impl).capture_step(cfg.model.cuda_graph_warmup_steps,
                                                                      self.plan.target.engine)
        return max(cfg.perf.warmup_steps, capture + 1 if capture is not None else 0)


@dataclass
class AutoPlan:
    candidates: List[Candidate]
    """Eager first, then the graph choices in the group's order, refused ones included."""
    overrides: List[str]
    """The job's command-line overrides: the probe's jobs are these with their own cuda_graph."""
    device: str
    train_iters: int
    key: Optional[str]
    """The decision's key in the cache (bridge.auto.cache); None without a GPU."""
    gpu: Optional[str] = None
    versions: dict = field(default_factory=dict)
    """The GPU and the package versions the key holds, for the cache's reader."""
    cached: Optional[dict] = None
    cache_entries: int = 0
    cache_problem: Optional[str] = None
    path: str = field(default_factory=lambda: str(cache_path()))

    @property
    def accepted(self) -> List[Candidate]:
        return [candidate for candidate in self.candidates if candidate.accepted]

    @property
    def graph_candidates(self) -> List[str]:
        return [candidate.choice for candidate in self.accepted if candidate.choice != EAGER_CHOICE]

    @property
    def probes(self) -> bool:
        """Whether the run probes: on a GPU, with a graph choice to measure and no cached decision."""
        return self.device == "cuda" and bool(self.graph_candidates) and self.cached is None

    @property
    def probe_order(self) -> List[str]:
        """Eager first and last: how far its two medians lie apart is the noise between processes."""
        return [EAGER_CHOICE, *self.graph_candidates, EAGER_CHOICE]

    @property
    def probe_iters(self) -> int:
        return max((candidate.untimed_steps for candidate in self.accepted), default=0) + PROBE_TIMED_STEPS

    def candidate(self, choice: str) -> Candidate:
        return next(candidate for candidate in self.candidates if candidate.choice == choice)

    def graphed_summary(self) -> str:
        if self.device != "cuda":
            return "nothing (eager): cuda_graph=auto measures graphs on a CUDA device, and there is none here"
        return "measured before training (cuda_graph=auto, below): the fastest candidate beyond the probe's noise"

    def lines(self) -> List[str]:
        """The plan's auto section."""
        width = max(len(candidate.choice) for candidate in self.candidates)
        lines = [f"  auto:      {self.headline()}"]
        for candidate in self.accepted:
            what = (candidate.plan.graphs()["summary"] if candidate.choice != EAGER_CHOICE
                    else "eager, probed first and last: how far apart they land is the noise between processes")
            lines.append(f"    {candidate.choice:<{width}}  {what}")
        refused = [f"{c.choice} ({', '.join(c.refused_by)})" for c in self.candidates if not c.accepted]
        if refused:
            lines += wrapped("    refused:   ", refused)
        return lines + [f"  probe:     {self.probe_line()}", f"  cache:     {self.cache_line()}"]

    def headline(self) -> str:
        if self.device != "cuda":
            return ("no CUDA device here, so graphs cannot pay off (they remove GPU launch gaps): the run trains "
                    "eagerly, without a probe; the candidates here:")
        return (f"eager and {len(self.graph_candidates)} graph choice(s) the catalogue accepts here; the run keeps "
                "the fastest only where it beats eager by more than the probe's own noise, else trains eagerly:")

    def probe_line(self) -> str:
        if self.device != "cuda":
            return "none (no CUDA device here)"
        if not self.graph_candidates:
            return "none: no graph choice to measure, the run trains eagerly"
        runs, iters = len(self.probe_order), self.probe_iters
        total = runs * iters
        share = f"{total / self.train_iters:.0%} of" if total < self.train_iters else f"{total / self.train_iters:.1f}x"
        skipped = "; skipped: the cache holds this workload's decision" if self.cached is not None else ""
        return (f"{runs} runs ({', '.join(self.probe_order)}), each in a process of its own: {iters} steps, "
                f"{PROBE_TIMED_STEPS} or more of them timed (warmup and capture excluded); {total} steps, {share} "
                f"this run's {self.train_iters}, plus a start-up each; a sweep in <run dir>/{PROBE_DIR}/ with its "
                f"summary.md and summary.png{skipped}")

    def cache_line(self) -> str:
        if self.cache_problem:
            return self.cache_problem
        if self.key is None:
            return f"{self.path} ({self.cache_entries} decision(s)): not consulted without a CUDA device"
        if self.cached is not None:
            probed = f"{self.cached['chosen']} (probed {self.cached.get('decided')})"
            return (f"{self.path}: this workload's decision, {probed}, is used without a probe; delete the file to "
                    "probe again")
        return (f"{self.path} ({self.cache_entries} decision(s)): none for this workload, GPU and packages yet; the "
                "run adds it (delete the file to forget every decision)")

    def as_dict(self) -> dict:
        return {
            "candidates": [{"choice": c.choice, "accepted": c.accepted, "refused_by": c.refused_by,
                            "graphed": c.plan.graphs()["summary"]} for c in self.candidates],
            "probe": {"runs": self.probe_order if self.probes else [], "train_iters": self.probe_iters,
                      "timed_steps": PROBE_TIMED_STEPS, "directory": PROBE_DIR},
            "cache": {"path": self.path, "key": self.key, "cached": self.cached, "problem": self.cache_problem},
        }


def plan_auto(plan: Plan, overrides: Sequence[str], machine: Optional[Machine] = None) -> Optional[AutoPlan]:
    """The auto section of ``plan`` (the eager configuration cuda_graph=auto composes to, judged with auto's rules:
    build_plan's graphs_measured), its candidates judged on ``machine`` (default: this one) as ``plan`` was; None
    when the configuration is invalid."""
    cfg = plan.config
    if not plan.valid:
        return None
    candidates = [judge(choice, overrides, machine) for choice in [EAGER_CHOICE, *graph_choices()]]
    accepted = [candidate.choice for candidate in candidates if candidate.accepted]
    judged_on = plan.target.machine
    key = decision_key(cfg, accepted, judged_on) if plan.target.device == "cuda" else None
    auto = AutoPlan(candidates, list(overrides), plan.target.device, cfg.train.train_iters, key,
                    judged_on.gpus[0].name if judged_on.gpus else None, dict(judged_on.packages))
    decisions, auto.cache_problem = read_decisions(cache_path())
    auto.cache_entries = len(decisions)
    auto.cached = decisions.get(key) if key is not None else None
    if auto.cached is not None and auto.cached["chosen"] not in accepted:  # edited by hand
        auto.cache_problem = (f"the decision cache {auto.path} chooses {auto.cached['chosen']} for this workload, "
                              "which is no candidate here: the run probes again and replaces it")
        auto.cached = None
    return auto


def judge(choice: str, overrides: Sequence[str], machine: Optional[Machine]) -> Candidate:
    """``choice`` composed with the job's other overrides and judged: on this machine, or on the preset GPU's
    node when gpu= names one this machine does not have (then that node's verdict alone counts)."""
    plan = build_plan(prepare(compose_choice(overrides, choice)), machine)
    counted = plan.violations if plan.here is None else plan.config_violations
    return Candidate(choice, plan, sorted({v.rule for v in counted}))


def compose_choice(overrides: Sequence[str], choice: str) -> DictConfig:
    """The composition of ``graphbridge <overrides> cuda_graph=<choice>``."""
    swapped = [*without_graph_choice(overrides), f"cuda_graph={choice}"]
    if GlobalHydra.instance().is_initialized():  # inside graphbridge's Hydra app: compose as it composed
        return hydra.compose(config_name="config", overrides=swapped)
    return compose_config(swapped)


def without_graph_choice(overrides: Sequence[str]) -> List[str]:
    return [text for text in overrides if text.split("=", 1)[0].lstrip("+~").split("@", 1)[0] != "cuda_graph"]
