"""``cuda_graph=auto`` at run time: the choice to train with, decided before the run trains.

On a GPU, unless the decision cache (bridge.auto.cache) holds this workload's decision, the candidates the
plan accepted (bridge.auto.candidates) are probed in rounds of successive halving where that pays
(bridge.auto.decision):

    <run dir>/auto/round1/0 ... eager, every graph candidate, eager: a short screening round
    <run dir>/auto/round2/0 ... eager, the faster half not clearly slower, eager: the round that decides
    <run dir>/auto/confirm/0 ... the fastest graph choice (or the broadest within its reach), eager, in pairs:
                                 only where the probe kept eager for its noise and could not rule out a gain over
                                 3 %; every run of the two decides, from the second pair on, once they settle it
                                 (at most six pairs)

The first run, eager, is timed in full; where it shows that starting a run costs more than the steps screening
would save, round 1 times every run in full and decides alone.

Each run is the candidate's configuration, written as the launcher writes a job (with the probe's length), and
trained in a process of its own, forked from one that imported torch, Transformer Engine and megatron-core once
(perf.preloaded, whose server starts and imports before the first run, apart from the runs' times): each
capture is clean, and no run pays the imports again. A job of several GPUs of this node is probed at its own
layout, one forked process per GPU. The runs of a round start together, as many as the GPU holds by the plan's
estimate (AutoPlan.runs_at_once), so that their builds and captures overlap; each then waits, idle, before its
first timed step (bridge.start_gate) until the runs before it have written their results (their teardown is not
waited for), and times its steps alone on the GPU; one that did not complete beside others trains again alone,
whatever its error: what the others held (memory beyond the estimate, a port) need not name itself (at bdbbf68 three
of llama32_1b's candidates failed beside two others and were not tried alone); its attempt beside them is kept in
the run's BESIDE_OTHERS folder. The runs' result.json files decide, the decision is cached, and
``<run dir>/auto.json`` keeps it, with the probe's wall time, for the run's result.json (its ``auto`` record);
summary.md and summary.png in ``<run dir>/auto/`` are the probe's table and plot. The terminal gets a line as the
probe starts, one for each run trained again alone, and one saying what was chosen and why. Without a CUDA device
nothing is probed: graphs cannot pay off there, and the run trains eagerly.

A candidate that fails in the probe was accepted by the plan, so it is a plan-equals-run bug: it is logged as
an error with its status and reason, recorded, never chosen, and the probe goes on.
"""

import logging
import shutil
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List, Optional, Protocol, Tuple

from bridge.atomic import WriteError, write_json_atomic
from bridge.auto.cache import store
from bridge.auto.candidates import PROBE_DIR, ROUND_TIMED_STEPS, AutoPlan, without_graph_choice
from bridge.auto.decision import (COMPLETED, FIRST_CONFIRMING_LOOK, MOST_CONFIRMING_PAIRS, STOPPED_EARLY,
                                  WORTH_CONFIRMING, Decision, Measurement, confirmation_order, confirmation_settled,
                                  decide, decide_confirmed, screening_pays, stopped_early, survivors,
                                  worth_confirming)
from bridge.config.graphs import EAGER_CHOICE
from bridge.config.schema import GraphBridgeConfig
from bridge.machine import free_ports
from bridge.planning import Plan
from bridge.result import AUTO_RECORD, RESULT_FILE
from bridge.start_gate import GATE_ENV, POLL_S, open_gate, ready_ranks
from perf import preloaded
from perf.launch import SignalForwarding, job_record, write_job
from perf.report import build_summary, load_jobs, write_summary

log = logging.getLogger("graphbridge")
RUN_LOG = "train.log"
PROBE_ONLY = ("perf.profile=false", "perf.nsys=false", "perf.tensorboard=false", "mode=train")
"""What every probe run sets besides its length: the probe times steps, it records nothing else."""
RUN_TIMEOUT_S = 900.0
"""A probe run that has not ended by then is killed and recorded as such (a hung collective, a stuck capture)."""

NO_TIMED_STEPS, RAN_EAGERLY = "no_timed_steps", "ran_eagerly"
"""How a run that completed can still give no measurement (read_run)."""

BESIDE_OTHERS = "beside_others"
"""The folder in a probe run's directory that keeps its attempt beside other runs, where it trained again alone."""

CONFIRM_ROUND = "confirm"
"""The folder, inside the probe's, of the round that times a lead inside the noise again (bridge.auto.decision)."""

GATE = "gate"
"""The folder in a probe run's directory where it waits before its first timed step (bridge.start_gate)."""


class Launched(Protocol):
    """A probe run started: its processes, forked from the preloaded launcher (perf.preloaded.ForkedJob)."""

    def ended(self) -> bool: ...

    def kill(self) -> None: ...


Launcher = Callable[[GraphBridgeConfig, Path, Path, int], Launched]
"""Starts one probe run from its job directory, to wait at the gate (its folder, the third argument), its ranks to
meet at the port (the fourth: runs that start together each have their own)."""


@dataclass(frozen=True)
class ProbeRuns:
    """How the probe trains its runs: ``start`` readies the launcher before the first (its seconds), ``launch``
    starts one run."""

    start: Callable[[], float]
    launch: Launcher


def choose_graphs(plan: Plan, job_dir: Path, runs: Optional[ProbeRuns] = None) -> GraphBridgeConfig:
    """The configuration the run trains with; ``<job_dir>/auto.json`` records how it was chosen. ``runs``
    trains the probe (default: each run forked from the preloaded launcher, FORKED)."""
    auto = plan.auto
    record = decision_record(auto, job_dir, runs or FORKED)
    write_json_atomic(job_dir / AUTO_RECORD, record)
    return auto.candidate(record["chosen"]).plan.config


def decision_record(auto: AutoPlan, job_dir: Path, runs: ProbeRuns) -> dict:
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
    log.info("cuda_graph=auto: probing %s (successive halving where it pays) on %d GPU(s), each run forked from one "
             "process that imported the training stack, in %s", ", ".join(auto.probe_order), auto.gpus, probe_dir)
    started = time.monotonic()
    imports_s = runs.start()
    measurements, rounds, decision = run_probe(auto, probe_dir, runs.launch)
    probe = {"directory": str(probe_dir), "wall_s": round(time.monotonic() - started, 1),
             "imports_s": round(imports_s, 1), "gpus": auto.gpus}
    report_failures(measurements)
    record = probed_record(auto, decision, measurements, rounds, probe)
    problem = store(Path(auto.path), auto.key, record)
    if problem:
        log.warning("%s", problem)
    log.info("cuda_graph=auto chose %s: %s (the probe took %.1f s; its table and plot: %s, summary.png)",
             shown(decision.chosen), decision.reason, probe["wall_s"], probe_dir / "summary.md")
    return {**record, "source": "probe"}


def shown(choice: str) -> str:
    return f"eager ({EAGER_CHOICE})" if choice == EAGER_CHOICE else choice


def unprobed(auto: AutoPlan, source: str, reason: str) -> dict:
    log.info("cuda_graph=auto: %s", reason)
    return {"chosen": EAGER_CHOICE, "reason": reason, "source": source,
            "candidates": [Measurement(candidate.choice, "not_probed").as_dict() for candidate in auto.accepted]}


def probed_record(auto: AutoPlan, decision: Decision, measurements: List[Measurement], rounds: List[dict],
                  probe: dict) -> dict:
    """What result.json and the cache keep of a probe: the decision, every candidate's numbers (with each run's
    wall time), the probe's wall time (with the launcher's imports, imports_s) and rounds, and what the
    decision holds for (the workload, its GPUs, the packages)."""
    return {"chosen": decision.chosen, "reason": decision.reason, "eager_ms": decision.eager_ms,
            "noise_ms": decision.noise_ms, "candidates": [m.as_dict() for m in measurements],
            "probe": {**probe, "rounds": rounds},
            "workload": " ".join(auto.overrides), "gpu": auto.gpu, "versions": auto.versions, "key": auto.key,
            "decided": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def report_failures(measurements: List[Measurement]) -> None:
    for failed in (m for m in measurements if not m.measured and m.status != STOPPED_EARLY):
        log.error("cuda_graph=auto: %s ended %s in the probe although the plan accepted it, a plan-equals-run bug "
                  "(please report it): %s; its job: %s. It is not chosen.", failed.choice, failed.status,
                  failed.reason, failed.job)


def run_probe(auto: AutoPlan, probe_dir: Path, launch: Launcher) -> Tuple[List[Measurement], List[dict], Decision]:
    """The probe's rounds (see the module), then a confirming round where the decision asks for one: the choices
    stopped early and every later round's measurements; each round's runs and length; the decision. A signal that
    stops it ends the run, as it ends a sweep."""
    with signals_end_the_run():
        measurements, rounds = halving_rounds(auto, probe_dir, launch)
        decision = decide(measurements, auto.scopes())
        contender = worth_confirming(measurements, decision, auto.scopes())
        if contender is not None:
            log.info("cuda_graph=auto: the probe cannot rule out that %s gains more than %.0f %% over eager (%s); "
                     "timing both again, in pairs", contender.choice, 100 * WORTH_CONFIRMING, decision.reason)
            confirming, record = confirming_round(auto, measurements, contender.choice, probe_dir, launch)
            measurements += confirming
            rounds.append(record)
            decision = decide_confirmed(measurements, contender.choice)
    write_probe_summary(probe_dir)
    return measurements, rounds, decision


def confirming_round(auto: AutoPlan, measurements: List[Measurement], contender: str, probe_dir: Path,
                     launch: Launcher) -> Tuple[List[Measurement], dict]:
    """The contender and eager timed again, FIRST_CONFIRMING_LOOK pairs, then a pair at a time until every run of
    the two settles it (bridge.auto.decision.confirmation_settled) or MOST_CONFIRMING_PAIRS have run: its runs and
    its record."""
    deciding, round_dir = ROUND_TIMED_STEPS[-1], probe_dir / CONFIRM_ROUND
    runs = run_round(auto, confirmation_order(contender), deciding, round_dir, launch)
    for _ in range(FIRST_CONFIRMING_LOOK, MOST_CONFIRMING_PAIRS):
        if confirmation_settled([*measurements, *runs], contender):
            break
        runs += run_round(auto, confirmation_order(contender, 1), deciding, round_dir, launch, len(runs))
    return runs, {**round_record(auto, len(runs), deciding, deciding), "confirming": contender}


def halving_rounds(auto: AutoPlan, probe_dir: Path, launch: Launcher) -> Tuple[List[Measurement], List[dict]]:
    """The rounds of successive halving: the choices stopped early, then the last round's measurements; and each
    round's runs and length."""
    screening, deciding = ROUND_TIMED_STEPS
    round1 = probe_dir / "round1"
    first = run_round(auto, [EAGER_CHOICE], deciding, round1, launch)
    screens = screening_pays(first[0], auto.probe_iters(deciding), len(auto.graph_candidates), screening,
                             deciding, auto.runs_at_once)
    timed = screening if screens else deciding
    measurements = first + run_round(auto, [*auto.graph_candidates, EAGER_CHOICE], timed, round1, launch, 1)
    rounds, stopped = [round_record(auto, len(measurements), timed, deciding)], []
    kept = survivors(measurements, auto.scopes()) if screens else []
    if kept:
        stopped = stopped_early(measurements, kept, 1)
        order = [EAGER_CHOICE, *(m.choice for m in kept), EAGER_CHOICE]
        measurements = run_round(auto, order, deciding, probe_dir / "round2", launch)
        rounds.append(round_record(auto, len(order), deciding, deciding))
    return stopped + measurements, rounds


def round_record(auto: AutoPlan, runs: int, timed_steps: int, first_timed_steps: int) -> dict:
    """A round as the record keeps it: its runs and their length (its first run's, where that differs), and how
    many started together."""
    return {"runs": runs, "timed_steps": timed_steps, "train_iters": auto.probe_iters(timed_steps),
            "runs_at_once": auto.runs_at_once,
            **({"first_run_timed_steps": first_timed_steps} if first_timed_steps != timed_steps else {})}


def run_round(auto: AutoPlan, order: List[str], timed_steps: int, round_dir: Path, launch: Launcher,
              first_number: int = 0) -> List[Measurement]:
    """Train the runs of ``order`` (job N in ``<round_dir>/N``, numbered from ``first_number``), up to
    auto.runs_at_once started together, and read each."""
    iters = auto.probe_iters(timed_steps)
    # Later overrides win: the probe's length and settings replace the job's own.
    settings = [f"train.train_iters={iters}", f"optimizer.lr_warmup_iters={iters // 10}", *PROBE_ONLY]
    runs = []
    for number, choice in enumerate(order, start=first_number):
        run_dir = round_dir / str(number)
        config = auto.probe_config(choice, settings)
        overrides = [*without_graph_choice(auto.overrides), *auto.candidate(choice).option.overrides, *settings]
        write_job(config, run_dir, job_record({"cuda_graph": choice}, overrides))
        runs.append((choice, config, run_dir))
    at_once = auto.runs_at_once
    measurements = [measurement for start in range(0, len(runs), at_once)
                    for measurement in run_together(runs[start:start + at_once], launch)]
    # A run that did not complete beside others may have failed for what they held (memory, a port): alone again.
    return [again_alone(run, measurement, launch) if at_once > 1 and not completed(measurement) else measurement
            for run, measurement in zip(runs, measurements)]


def again_alone(run: Tuple[str, GraphBridgeConfig, Path], beside_others: Measurement,
                launch: Launcher) -> Measurement:
    """Train ``run`` again alone on its GPUs, its attempt beside others kept in ``<run dir>/BESIDE_OTHERS``: the
    result.json left in place would pass for the new attempt's, which would be killed at its gate and read as
    failed again (at 3a791f9 te_attn and full_iteration of llama32_1b were, each 10 s in)."""
    choice, _, run_dir = run
    log.info("cuda_graph=auto: %s ended %s beside other probe runs (%s); training it again alone", choice,
             beside_others.status, beside_others.reason)
    kept = run_dir / BESIDE_OTHERS
    kept.mkdir(exist_ok=True)
    for attempt_file in [run_dir / RESULT_FILE, run_dir / RUN_LOG, *preloaded.other_rank_logs(run_dir / RUN_LOG)]:
        if attempt_file.exists():
            attempt_file.replace(kept / attempt_file.name)
    return run_together([run], launch)[0]


def completed(measurement: Measurement) -> bool:
    """Whether the run trained to its end, measured or not (a run without timed steps, or one that captured no
    graph, would do the same alone)."""
    return measurement.status in (COMPLETED, NO_TIMED_STEPS, RAN_EAGERLY)


def run_together(runs: List[Tuple[str, GraphBridgeConfig, Path]], launch: Launcher) -> List[Measurement]:
    """Start every run of ``runs`` at once: their builds, warm-ups and captures overlap. Once each waits at its
    gate (or has ended), let them time their steps one at a time, in order, each alone on the GPU: the next is let
    go once the one before has written its result (wait_for_result). A run not at its gate within RUN_TIMEOUT_S is
    killed, as is one without a result within RUN_TIMEOUT_S of being let go."""
    for _, _, run_dir in runs:  # a run trained again alone finds the gate of its first attempt: this probe's own
        shutil.rmtree(run_dir / GATE, ignore_errors=True)
    started = time.monotonic()
    launched = [launch(config, run_dir, run_dir / GATE, port)
                for (_, config, run_dir), port in zip(runs, free_ports(len(runs)))]
    try:
        ready_s = wait_at_gates(runs, launched, started)
        measurements = []
        for (choice, _, run_dir), job, setup_s in zip(runs, launched, ready_s):
            let_go = time.monotonic()
            open_gate(run_dir / GATE)
            wait_for_result(run_dir, job)
            job.kill()  # what is left after its result is teardown, which the probe does not wait for
            measurements.append(measured(choice, run_dir, round(setup_s + time.monotonic() - let_go, 2)))
        return measurements
    finally:
        for job in launched:
            job.kill()


def wait_for_result(run_dir: Path, job: Launched) -> None:
    """Until the run let go has written its result.json (its steps are over and recorded), or has ended, or
    RUN_TIMEOUT_S has passed. Its teardown (graphs, memory, the process group: seconds of a tiny run) is not
    waited for: the probe kills it and lets the next run go."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (run_dir / RESULT_FILE).exists() and not job.ended() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def wait_at_gates(runs: List[Tuple[str, GraphBridgeConfig, Path]], launched: List[Launched],
                  started: float) -> List[float]:
    """Wait until every run waits at its gate with all its ranks, or has ended, or RUN_TIMEOUT_S has passed
    (then the late ones are killed); the seconds each took to get there."""
    ready_s: List[Optional[float]] = [None] * len(runs)
    while True:
        now = time.monotonic()
        for index, ((_, config, run_dir), job) in enumerate(zip(runs, launched)):
            if ready_s[index] is None and (job.ended() or ready_ranks(run_dir / GATE) >= config.train.num_gpus):
                ready_s[index] = now - started
        if all(seconds is not None for seconds in ready_s):
            return ready_s
        if now - started > RUN_TIMEOUT_S:
            for index, job in enumerate(launched):
                if ready_s[index] is None:
                    job.kill()
                    ready_s[index] = now - started
            return ready_s
        time.sleep(POLL_S)


def launch_forked(config: GraphBridgeConfig, run_dir: Path, gate: Path, port: int) -> Launched:
    """One probe run, forked from the preloaded launcher on the job's GPUs of this node, to wait at ``gate``; its
    ranks meet at ``port`` (a single process keeps its store in memory and takes none: the megatron engine's
    init_distributed)."""
    env = {"PYTHONUNBUFFERED": "1", GATE_ENV: str(gate)}  # the rendezvous: preloaded.rank_environment
    return preloaded.start(run_dir, run_dir / RUN_LOG, env, ranks=config.train.num_gpus, port=port)


FORKED = ProbeRuns(preloaded.start_server, launch_forked)


@contextmanager
def signals_end_the_run():
    """Ctrl-C or the scheduler's notice during the probe ends the run with 128 + the signal, as a sweep's job
    ends: the launcher kills the run in progress as the exit passes it."""
    def end(signum, frame):
        raise SystemExit(128 + signum)

    previous = {signum: signal.signal(signum, end) for signum in SignalForwarding.HANDLED}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def write_probe_summary(probe_dir: Path) -> None:
    """summary.md, summary.csv and summary.png over every run of the probe, as a sweep's report writes them."""
    try:
        write_summary(build_summary(probe_dir))
    except WriteError as error:
        log.warning("cuda_graph=auto: the probe's summary was not written (%s); its runs are in %s", error, probe_dir)


def measured(choice: str, run_dir: Path, wall_s: float) -> Measurement:
    """The measurement of one probe run, from its result.json, with its wall time."""
    return replace(read_run(choice, run_dir), wall_s=wall_s)


def read_run(choice: str, run_dir: Path) -> Measurement:
    jobs = load_jobs(run_dir) if run_dir.is_dir() else []
    if not jobs:
        return Measurement(choice, "missing", reason=f"the probe left no record of it (see {run_dir / RUN_LOG})")
    job, where = jobs[0], str(run_dir)
    step = job.step_time
    if job.status != COMPLETED:
        return Measurement(choice, job.status, reason=job.reason, job=where)
    if step.get("median") is None:
        return Measurement(choice, NO_TIMED_STEPS, reason="it completed without a timed step", job=where)
    if choice != EAGER_CHOICE and job.effective_impl in (None, EAGER_CHOICE):
        return Measurement(choice, RAN_EAGERLY, reason="it captured no graph (effective_impl none)", job=where)
    return Measurement(choice, COMPLETED, step["median"], step["p90"] - step["p10"], steps=step.get("count"),
                       job=where)
