"""``cuda_graph=auto`` in the plan: its candidates, how the run will measure them, and what the decision cache
already holds for this workload.

The candidates are every choice that trains the same model the same way and that the catalogue accepts for
this configuration on the machine it is judged for: eager, every graph choice of the cuda_graph group, and
full_iteration with the optimizer step inside the graph (``optimizer.optimizer_in_graph=true``: the same AdamW
on the same values, replayed instead of launched; with the distributed optimizer on megatron-core 0.19 it is
megatron-core's own optimizer graph). None changes the math: a switch that does, such as drop-and-pad token
dropping, is never a candidate. A switch the user set on the command line is theirs for every candidate.
Each candidate is composed exactly as ``graphbridge <the same overrides> <its overrides>`` composes it and
judged by the same catalogue, so that the probe runs what the plan accepted and the run trains with what
those overrides train (plan equals run).

On a GPU the run probes them (perf.auto_probe) in rounds of successive halving where that pays
(bridge.auto.decision): each run a process of its own at the job's layout, eager first and last in every round;
a lead over eager inside the noise but worth having is timed again in a confirming round.
A multi-node job is refused (bridge/validation/auto_rules.py): the probe runs on one node.
"""

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Dict, List, Optional, Sequence, Tuple

import hydra
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from bridge.auto.cache import cache_path, decision_key, read_decisions
from bridge.auto.decision import (FIRST_CONFIRMING_LOOK, ITERATION_AND_OPTIMIZER_GRAPH, ITERATION_GRAPH, LAYER_GRAPHS,
                                  MOST_CONFIRMING_PAIRS, WORTH_CONFIRMING, Scope)
from bridge.config.graphs import EAGER_CHOICE, graph_choices, graph_impl
from bridge.config.load import compose_config
from bridge.config.schema import GraphBridgeConfig
from bridge.machine import Machine, probe
from bridge.planning import Plan, build_plan, wrapped
from bridge.prepare import prepare
from bridge.result import MIN_TIMED_STEPS, first_timed_step
from bridge.validation.graph_facts import captured_modules

ROUND_TIMED_STEPS = (MIN_TIMED_STEPS // 3, MIN_TIMED_STEPS)
"""Timed steps per candidate in each round of the probe: a short screening round, then as many as a sweep's
report trusts for a median, which the decision rests on."""
PROBE_DIR = "auto"
"""The probe's directory, inside the run directory: one folder per round, one job directory per run."""
OPTIMIZER_IN_GRAPH = "optimizer.optimizer_in_graph"
PROCESS_OUTSIDE_ALLOCATOR_GIB = 2.5
"""What a training process holds on its GPU beside PyTorch's allocator (the CUDA context, cuBLAS, lazy NCCL): 2.44
GiB measured on an H100 (benchmarks/results/h100/mcore-0.16.1/run_footprint.json, lazy_nccl)."""
SHARED_GPU_MEMORY = 0.8
"""The share of the GPU's memory the probe's runs that start together may take, by the plan's estimates."""


@dataclass(frozen=True)
class Option:
    """What a candidate sets: a cuda_graph choice and the math-neutral switches beside it."""

    name: str
    graph_choice: str
    switches: Tuple[str, ...] = ()

    @property
    def overrides(self) -> List[str]:
        return [f"cuda_graph={self.graph_choice}", *self.switches]


def options(overrides: Sequence[str]) -> List[Option]:
    """Eager, every graph choice, and full_iteration with the optimizer step in the graph unless the user set
    optimizer.optimizer_in_graph (then their value holds for every candidate)."""
    found = [Option(choice, choice) for choice in [EAGER_CHOICE, *graph_choices()]]
    if not any(override_key(text) == OPTIMIZER_IN_GRAPH for text in overrides):
        found.append(Option("full_iteration+optimizer_in_graph", "full_iteration", (f"{OPTIMIZER_IN_GRAPH}=true",)))
    return found


def option_named(name: str, overrides: Sequence[str]) -> Optional[Option]:
    """The option called ``name`` (a candidate's choice, as a decision names it) among ``options(overrides)``."""
    return next((option for option in options(overrides) if option.name == name), None)


@dataclass
class Candidate:
    option: Option
    plan: Plan
    refused_by: List[str]
    """The rules that refuse it on the machine it is judged for; empty when it is a candidate."""

    @property
    def choice(self) -> str:
        return self.option.name

    @property
    def accepted(self) -> bool:
        return not self.refused_by

    def changes(self) -> str:
        """What it sets and what that graphs."""
        if self.choice == EAGER_CHOICE:
            return ("eager, probed first and last in every round: how far apart they land is the noise between "
                    "processes")
        return f"{' '.join(self.option.overrides)}: {self.plan.graphs()['summary']}"

    @property
    def scope(self) -> Optional[Scope]:
        """What it captures (None: nothing), for the decision to tell which of two choices captures more."""
        cfg = self.plan.config
        unit = graph_impl(cfg.model.cuda_graph_impl).unit
        if unit is None:
            return None
        if unit == "layer":
            return Scope(LAYER_GRAPHS, frozenset(captured_modules(cfg.model.cuda_graph_modules)))
        return Scope(ITERATION_AND_OPTIMIZER_GRAPH if cfg.optimizer.optimizer_in_graph else ITERATION_GRAPH)

    @property
    def untimed_steps(self) -> int:
        """The steps before its first timed one: perf.warmup_steps, or up to the capture step included."""
        cfg = self.plan.config
        capture = graph_impl(cfg.model.cuda_graph_impl).capture_step(cfg.model.cuda_graph_warmup_steps,
                                                                      self.plan.target.engine)
        return first_timed_step(cfg.perf.warmup_steps, capture)


@dataclass
class AutoPlan:
    candidates: List[Candidate]
    """Eager first, then the graph choices in the group's order, then the switches; refused ones included (eager alone
    without a CUDA device)."""
    overrides: List[str]
    """The job's command-line overrides: the probe's jobs are these with their candidate's own."""
    device: str
    train_iters: int
    gpus: int
    """The job's GPUs, on one node (auto_one_node): every probe run uses them all, at the job's layout."""
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
        """The first round's runs. Eager first and last: how far its two medians lie apart is the noise between
        processes."""
        return [EAGER_CHOICE, *self.graph_candidates, EAGER_CHOICE]

    @cached_property
    def runs_at_once(self) -> int:
        """How many probe runs start together (perf.auto_probe): as many as SHARED_GPU_MEMORY of the GPU holds by
        the plan's estimate of the largest candidate, each with what a process holds outside PyTorch's allocator,
        and no more than the cores give a core to each rank; one where the plan has no estimate."""
        estimates = [candidate.plan.memory() for candidate in self.accepted]
        if not estimates or any(estimate is None or not estimate.capacity_gib for estimate in estimates):
            return 1
        per_run_gib = max(estimate.graphbridge_gib for estimate in estimates) + PROCESS_OUTSIDE_ALLOCATOR_GIB
        by_memory = int(SHARED_GPU_MEMORY * min(estimate.capacity_gib for estimate in estimates) // per_run_gib)
        by_cores = (os.cpu_count() or 1) // max(self.gpus, 1)
        return max(1, min(len(self.probe_order), by_memory, by_cores))

    def scopes(self) -> Dict[str, Scope]:
        """What each accepted graph candidate captures, by its choice."""
        return {c.choice: c.scope for c in self.accepted if c.scope is not None}

    def probe_iters(self, timed_steps: int) -> int:
        """Steps per run of a round: the longest warmup and capture among the candidates, then ``timed_steps``."""
        return max((candidate.untimed_steps for candidate in self.accepted), default=0) + timed_steps

    def candidate(self, choice: str) -> Candidate:
        return next(candidate for candidate in self.candidates if candidate.choice == choice)

    def probe_config(self, choice: str, settings: Sequence[str]) -> GraphBridgeConfig:
        """The configuration of a probe run of ``choice``: the candidate's, with the probe's ``settings``."""
        return prepare(compose_candidate(self.overrides, self.candidate(choice).option, settings)).config

    def graphed_summary(self) -> str:
        if self.device != "cuda":
            return "nothing (eager): cuda_graph=auto measures graphs on a CUDA device, and there is none here"
        return "measured before training (cuda_graph=auto, below): the fastest candidate beyond the probe's noise"

    def lines(self) -> List[str]:
        """The plan's auto section."""
        width = max(len(candidate.choice) for candidate in self.candidates)
        lines = [f"  auto:      {self.headline()}"]
        for candidate in self.accepted if self.device == "cuda" else []:
            lines.append(f"    {candidate.choice:<{width}}  {candidate.changes()}")
        refused = [f"{c.choice} ({', '.join(c.refused_by)})" for c in self.candidates if not c.accepted]
        if refused:
            lines += wrapped("    refused:   ", refused)
        return lines + [f"  probe:     {self.probe_line()}", f"  cache:     {self.cache_line()}"]

    def headline(self) -> str:
        if self.device != "cuda":
            return ("no CUDA device here, so graphs cannot pay off (they remove GPU launch gaps): the run trains "
                    "eagerly, without a probe or graph candidates; gpu=<preset> (e.g. gpu=h100) plans for a GPU node "
                    "and lists what auto would measure there")
        return (f"eager and {len(self.graph_candidates)} graph candidate(s) the catalogue accepts here, each training "
                "the same; the run keeps the fastest (or, where the probe cannot tell them apart, one that captures "
                "all it does and more) only where it beats eager by more than the probe's own noise, else trains "
                "eagerly:")

    def probe_line(self) -> str:
        if self.device != "cuda":
            return "none (no CUDA device here)"
        if not self.graph_candidates:
            return "none: no graph choice to measure, the run trains eagerly"
        first, last = (self.probe_iters(timed) for timed in (ROUND_TIMED_STEPS[0], ROUND_TIMED_STEPS[-1]))
        skipped = "; skipped: the cache holds this workload's decision" if self.cached is not None else ""
        return (f"round 1: {len(self.probe_order)} runs ({', '.join(self.probe_order)}), the first of {last} "
                f"steps, {ROUND_TIMED_STEPS[-1]} timed (warmup and capture excluded), the others of {first} steps, "
                f"{ROUND_TIMED_STEPS[0]} timed, where screening pays; the faster half of the graph candidates, less "
                f"any slower than the round's fastest by more than the probe's noise, goes on to round 2: eager, "
                f"those, eager, {last} steps each, whose medians decide. Where the first run shows that starting a "
                f"run costs more than the steps screening saves, every run of round 1 is of {last} steps and it "
                f"decides alone. Where eager is then kept for the noise and the probe cannot rule out that the "
                f"fastest graph choice gains more than {WORTH_CONFIRMING:.0%}, a confirming round times it (or the "
                f"broadest choice within its reach) and eager again in pairs, alternating, {last} steps each, until "
                f"all their runs settle it (from the pair {FIRST_CONFIRMING_LOOK} on, at most "
                f"{MOST_CONFIRMING_PAIRS} pairs). "
                f"Each run is a process of its own on the job's {self.gpus} GPU(s), forked from one that imported "
                f"torch, Transformer Engine and megatron-core once; up to {self.runs_at_once} start together (by "
                f"the memory estimate and the cores), build and capture side by side, then time their steps one at "
                f"a time, each alone on the GPU; its wall time is in result.json's auto record; "
                f"the runs and a summary.md and summary.png are in <run dir>/{PROBE_DIR}/{skipped}")

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
            "candidates": [{"choice": c.choice, "overrides": c.option.overrides, "accepted": c.accepted,
                            "refused_by": c.refused_by, "graphed": c.plan.graphs()["summary"]}
                           for c in self.candidates],
            "probe": {"runs": self.probe_order if self.probes else [], "gpus": self.gpus, "directory": PROBE_DIR,
                      "runs_at_once": self.runs_at_once,
                      "rounds": [{"timed_steps": timed, "train_iters": self.probe_iters(timed)}
                                 for timed in ROUND_TIMED_STEPS],
                      "confirming": {"first_runs": 2 * FIRST_CONFIRMING_LOOK, "most_runs": 2 * MOST_CONFIRMING_PAIRS,
                                     "timed_steps": ROUND_TIMED_STEPS[-1], "gain_over": WORTH_CONFIRMING}},
            "cache": {"path": self.path, "key": self.key, "cached": self.cached, "problem": self.cache_problem},
        }


def plan_auto(plan: Plan, overrides: Sequence[str], machine: Optional[Machine] = None) -> Optional[AutoPlan]:
    """The auto section of ``plan`` (the eager configuration cuda_graph=auto composes to, judged with auto's rules:
    build_plan's graphs_measured), its candidates judged on ``machine`` (default: this one) as ``plan`` was; None
    when the configuration is invalid."""
    cfg = plan.config
    if not plan.valid:
        return None
    # Without a CUDA device there is no probe and the run trains eagerly: graph choices judged for this machine would
    # list what it never runs, at a full composition each (a plan for a GPU node, gpu=<preset>, judges them there).
    if plan.target.device == "cuda":
        candidates = [judge(option, overrides, machine) for option in options(overrides)]
    else:
        # The one candidate, eager, is the plan's own configuration: cuda_graph=auto sets what cuda_graph=none sets
        # (conf/cuda_graph/auto.yaml), so it is judged without a second composition (a third of a CPU plan's time).
        candidates = [judge(Option(EAGER_CHOICE, EAGER_CHOICE), overrides, machine, composed=cfg)]
    accepted = [candidate.choice for candidate in candidates if candidate.accepted]
    probed_on = probing_machine(plan, machine)
    key = decision_key(cfg, accepted, probed_on) if plan.target.device == "cuda" else None
    auto = AutoPlan(candidates, list(overrides), plan.target.device, cfg.train.train_iters, cfg.train.num_gpus, key,
                    probed_on.gpus[0].name if probed_on.gpus else None, dict(probed_on.packages))
    decisions, auto.cache_problem = read_decisions(cache_path())
    auto.cache_entries = len(decisions)
    auto.cached = decisions.get(key) if key is not None else None
    if auto.cached is not None and auto.cached["chosen"] not in accepted:  # edited by hand
        auto.cache_problem = (f"the decision cache {auto.path} chooses {auto.cached['chosen']} for this workload, "
                              "which is no candidate here: the run probes again and replaces it")
        auto.cached = None
    return auto


def probing_machine(plan: Plan, machine: Optional[Machine]) -> Machine:
    """The machine a decision holds for: this one (``machine``, default this one) where it has a GPU, for the
    probe times its steps here whatever preset gpu= names (at cc26cf6 an H200 running gpu=h100 recorded and keyed
    its decisions as an H100's with TE 2.20.2, the preset node's); without one, the node the plan judged on."""
    here = machine or probe()
    return here if here.gpus else plan.target.machine


def judge(option: Option, overrides: Sequence[str], machine: Optional[Machine],
          composed: Optional[GraphBridgeConfig] = None) -> Candidate:
    """``option`` composed with the job's other overrides (or ``composed``, that composition made already) and
    judged: on this machine, or on the preset GPU's node when gpu= names one this machine does not have (then that
    node's verdict alone counts)."""
    plan = build_plan(prepare(composed if composed is not None else compose_candidate(overrides, option)), machine)
    counted = plan.violations if plan.here is None else plan.config_violations
    return Candidate(option, plan, sorted({v.rule for v in counted}))


def compose_candidate(overrides: Sequence[str], option: Option, settings: Sequence[str] = ()) -> DictConfig:
    """The composition of ``graphbridge <overrides> <option's overrides> <settings>`` (later overrides win)."""
    swapped = [*without_graph_choice(overrides), *option.overrides, *settings]
    if GlobalHydra.instance().is_initialized():  # inside graphbridge's Hydra app: compose as it composed
        return hydra.compose(config_name="config", overrides=swapped)
    return compose_config(swapped)


def override_key(text: str) -> str:
    """The key an override sets: ``+a.b=1``, ``~a.b`` and ``group@pkg=x`` set a.b, a.b and group."""
    return text.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def without_graph_choice(overrides: Sequence[str]) -> List[str]:
    return [text for text in overrides if override_key(text) != "cuda_graph"]
