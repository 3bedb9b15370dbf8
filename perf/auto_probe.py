"""``cuda_graph=auto`` at run time: the choice to train with, decided before the run trains.

On a GPU, unless the decision cache (bridge.auto.cache) holds this workload's decision, the candidates the
plan accepted (bridge.auto.candidates) are probed as one sweep of graphbridge itself::

    graphbridge -m <the job's overrides> cuda_graph=none,<graph choices>,none train.train_iters=<probe> ...

with its sweep directory ``<run dir>/auto/``: every job trains in a fresh process, as every sweep's does, so
each capture is clean, and the sweep's summary.md and summary.png stay there as the probe's table and plot
(its output goes to ``auto/probe.log``). bridge.auto.decision decides from the jobs' result.json files, the
decision is cached, and ``<run dir>/auto.json`` keeps it for the run's result.json (its ``auto`` record).
The terminal gets a line as the probe starts and one saying what was chosen and why. Without a CUDA
device nothing is probed: graphs cannot pay off there, and the run trains eagerly.

A candidate that fails in the probe was accepted by the plan, so it is a plan-equals-run bug: it is logged as
an error with its status and reason, recorded, never chosen, and the probe goes on (a sweep goes on past a
failed job).
"""

import logging
import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List, Optional

from bridge.atomic import write_json_atomic
from bridge.auto.cache import store
from bridge.auto.candidates import PROBE_DIR, PROBE_TIMED_STEPS, AutoPlan, without_graph_choice
from bridge.auto.decision import COMPLETED, Decision, Measurement, decide
from bridge.config.graphs import EAGER_CHOICE
from bridge.config.schema import GraphBridgeConfig
from bridge.planning import Plan
from bridge.result import AUTO_RECORD
from perf.launch import SignalForwarding
from perf.report import Job, load_jobs
from perf.workload_map import quoted

log = logging.getLogger("graphbridge")
PROBE_LOG = "probe.log"
PROBE_ONLY = ("perf.profile=false", "perf.nsys=false", "perf.tensorboard=false", "mode=train")
"""What every probe job sets besides its length: the probe times steps, it records nothing else."""

Probe = Callable[[AutoPlan, Path], List[Measurement]]


def choose_graphs(plan: Plan, job_dir: Path, probe: Optional[Probe] = None) -> GraphBridgeConfig:
    """The configuration the run trains with; ``<job_dir>/auto.json`` records how it was chosen. ``probe``
    measures the candidates (default: the sweep, run_probe)."""
    auto = plan.auto
    record = decision_record(auto, job_dir, probe or run_probe)
    write_json_atomic(job_dir / AUTO_RECORD, record)
    return auto.candidate(record["chosen"]).plan.config


def decision_record(auto: AutoPlan, job_dir: Path, probe: Probe) -> dict:
    if auto.device != "cuda":
        return unprobed(auto, "no_cuda_device", "no CUDA device here, so graphs cannot pay off (they remove GPU "
                                                "launch gaps): training eagerly")
    if not auto.graph_candidates:
        return unprobed(auto, "no_graph_choice", "the catalogue accepts no graph choice for this configuration "
                                                 "here: training eagerly")
    if auto.cache_problem:
        log.warning("%s", auto.cache_problem)
    if auto.cached is not None:
        cached = auto.cached
        log.info("cuda_graph=auto chose %s from the cache, so the probe is skipped: this workload was probed on %s "
                 "(%s: %s); delete %s to probe again", shown(cached["chosen"]), cached.get("decided"),
                 cached.get("gpu"), cached.get("reason"), auto.path)
        return {**cached, "source": "cache"}
    probe_dir = job_dir / PROBE_DIR
    log.info("cuda_graph=auto: probing %s, %d steps each in a process of its own, in %s", ", ".join(auto.probe_order),
             auto.probe_iters, probe_dir)
    measurements = probe(auto, probe_dir)
    report_failures(measurements)
    decision = decide(measurements)
    record = probed_record(auto, decision, measurements, probe_dir)
    problem = store(Path(auto.path), auto.key, record)
    if problem:
        log.warning("%s", problem)
    log.info("cuda_graph=auto chose %s: %s (the probe's table and plot: %s, summary.png)", shown(decision.chosen),
             decision.reason, probe_dir / "summary.md")
    return {**record, "source": "probe"}


def shown(choice: str) -> str:
    return f"eager ({EAGER_CHOICE})" if choice == EAGER_CHOICE else choice


def unprobed(auto: AutoPlan, source: str, reason: str) -> dict:
    log.info("cuda_graph=auto: %s", reason)
    return {"chosen": EAGER_CHOICE, "reason": reason, "source": source,
            "candidates": [Measurement(candidate.choice, "not_probed").as_dict() for candidate in auto.accepted]}


def probed_record(auto: AutoPlan, decision: Decision, measurements: List[Measurement], probe_dir: Path) -> dict:
    """What result.json and the cache keep of a probe: the decision, every candidate's numbers, and what the
    decision holds for (the workload, the GPU, the packages)."""
    return {"chosen": decision.chosen, "reason": decision.reason, "eager_ms": decision.eager_ms,
            "noise_ms": decision.noise_ms, "candidates": [m.as_dict() for m in measurements],
            "probe": {"directory": str(probe_dir), "train_iters": auto.probe_iters, "timed_steps": PROBE_TIMED_STEPS},
            "workload": " ".join(auto.overrides), "gpu": auto.gpu, "versions": auto.versions, "key": auto.key,
            "decided": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def report_failures(measurements: List[Measurement]) -> None:
    for failed in (m for m in measurements if not m.measured):
        log.error("cuda_graph=auto: %s ended %s in the probe although the plan accepted it, a plan-equals-run bug "
                  "(please report it): %s; its job: %s. It is not chosen.", failed.choice, failed.status,
                  failed.reason, failed.job)


def run_probe(auto: AutoPlan, probe_dir: Path) -> List[Measurement]:
    """Probe the candidates as one sweep of graphbridge (see the module); a signal that stops it ends the run."""
    probe_dir.mkdir(parents=True, exist_ok=True)
    with SignalForwarding() as forwarding:
        forwarding.run(probe_command(auto, probe_dir), dict(os.environ), probe_dir / PROBE_LOG, shown=False)
    if forwarding.received:  # Ctrl-C or the scheduler's notice: the run ends here, as a sweep's does
        raise SystemExit(128 + forwarding.received)
    return read_probe(auto.probe_order, probe_dir)


def probe_command(auto: AutoPlan, probe_dir: Path) -> List[str]:
    iters = auto.probe_iters
    # Later overrides win: the probe's length and settings replace the job's own.
    return [sys.executable, "-m", "perf.main", "-m", *without_graph_choice(auto.overrides),
            f"cuda_graph={','.join(auto.probe_order)}", f"train.train_iters={iters}",
            f"optimizer.lr_warmup_iters={iters // 10}", *PROBE_ONLY, f"hydra.sweep.dir={quoted(str(probe_dir))}"]


def read_probe(order: List[str], probe_dir: Path) -> List[Measurement]:
    """One measurement per probe job, in the sweep's order (job N is in ``<probe_dir>/N``)."""
    jobs = {job.name: job for job in load_jobs(probe_dir)}
    return [measured(choice, jobs.get(str(number)), probe_dir) for number, choice in enumerate(order)]


def measured(choice: str, job: Optional[Job], probe_dir: Path) -> Measurement:
    if job is None:
        return Measurement(choice, "missing", reason=f"the probe left no record of it (see {probe_dir / PROBE_LOG})")
    where = str(probe_dir / job.name)
    step = job.step_time
    if job.status != COMPLETED:
        return Measurement(choice, job.status, reason=job.reason, job=where)
    if step.get("median") is None:
        return Measurement(choice, "no_timed_steps", reason="it completed without a timed step", job=where)
    if choice != EAGER_CHOICE and job.effective_impl in (None, EAGER_CHOICE):
        return Measurement(choice, "ran_eagerly", reason="it captured no graph (effective_impl none)", job=where)
    return Measurement(choice, COMPLETED, step["median"], step["p90"] - step["p10"], job=where)
