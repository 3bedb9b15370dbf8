"""The GPU differential: plan equals run, on the GPU. Seeded random configurations of the tiny recipes
(benchmarks/differential_draw.py) are planned on this machine, every one the plan accepts trains for a few
steps through the real `graphbridge` CLI, and the failures are grouped by cause:

    python benchmarks/gpu_differential.py --seed 0 --count 700 --out gpu_differential.json
    bash scripts/gpu_check.sh differential       # on the GPU machine, into $OUT/mcore-<release>/
    bash scripts/gpu_check.sh differential2      # the same at two GPUs a configuration (--gpus 2)

Besides the accepted configurations it trains two samples:
- refused ones with the refusing rules not asked again (benchmarks/unchecked_run.py): a rule whose refused
  configurations all train is over-strict;
- the eager twin of graphed ones (the same overrides with cuda_graph=none): a graphed run whose losses leave
  its twin's by more than ROUNDING_TOLERANCE (LOSS_TOLERANCE where it draws dropout) trains differently, a
  failure like a crash.

Several runs share the GPU at once (--workers); the JSON is rewritten atomically after every run, so a run cut
off by its time limit still leaves what it finished, and --deadline-s stops starting runs in time. --resume
RECORD goes on where such a record stopped (another block of device time, the same code and releases): it draws
and plans again, refuses in one line unless every draw and plan is the record's, keeps what the record trained
and trains the rest; the summary lists the earlier blocks.
"""

import argparse
import json
import multiprocessing
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bridge.atomic import write_text_atomic  # noqa: E402
from differential_draw import DROPOUTS, draw, varied  # noqa: E402
from differential_launch import Launch, port_range_problem, train  # noqa: E402
from differential_witnesses import WITNESS_CASES, gpus_of  # noqa: E402
from schema_draw import coverage  # noqa: E402

STEPS = 6
"""Enough for the default three eager warmup steps, the capture and two replays."""
LOSS_TOLERANCE = 0.02
"""Largest relative gap, at any of the first STEPS steps, between a graphed run's loss and its eager twin's when
the run draws dropout: graphs and eager kernels draw their masks from other RNG streams (up to 1.6 % measured).
A graph that replays stale inputs or skips an update leaves its twin by far more."""
ROUNDING_TOLERANCE = 0.002
"""The same without dropout, where only rounding parts the two (graphs and eager kernels sum in other orders):
at most 4.2e-4 in every twin pair of the records up to 0d3b80c, and 0 in most. Transformer Engine's graphs on
the local spec left their twins by 7.9e-3 from the capture step on (gpu_witnesses.json at 0d3b80c)."""
ACCEPTED, BYPASS, EAGER_TWIN, WITNESS = "accepted", "bypass", "eager_twin", "witness"
OUTCOME = ("status", "error", "losses", "seconds", "peak_reserved_gb", "retried_after", "log_tail")
"""What training a run gave, which --resume takes over from the record."""


@dataclass
class Run:
    index: int
    overrides: List[str]
    kind: str = ACCEPTED
    plan: Dict[str, object] = field(default_factory=dict)
    unchecked_rules: List[str] = field(default_factory=list)
    twin_of: Optional[int] = None
    label: Optional[str] = None
    status: Optional[str] = None
    error: Optional[str] = None
    losses: List[float] = field(default_factory=list)
    seconds: Optional[float] = None
    peak_reserved_gb: Optional[float] = None
    retried_after: Optional[str] = None
    """The first attempt's error, when it was the GPU's resources shared with the other runs
    (perf.preloaded.SHARED_GPU_FAILURES)."""
    log_tail: Optional[str] = None
    """The end of the log that says why a run failed (differential_launch.failure_log_tail): its folder is temporary."""


def plan_verdict(overrides: List[str]) -> Dict[str, object]:
    """The plan of this machine for ``overrides``: what ``graphbridge mode=plan`` decides, in-process, with
    megatron-core's own config classes asked as a training run asks them before its launch."""
    import bridge

    try:
        plan = bridge.plan([*overrides, "plan.check_megatron=true"])
    except Exception as error:  # an override the CLI refuses in one line before any rule runs
        return {"valid": False, "runnable_here": False, "violations": [{"rule": "override", "where": "config"}],
                "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
    return {"valid": plan.valid, "runnable_here": plan.runnable_here,
            "violations": [{"rule": v.rule, "where": v.where} for v in plan.violations]}


def refused_rules(plan: Dict[str, object]) -> List[str]:
    return sorted({v["rule"] for v in plan["violations"]})


def drawn_runs(seed: int, count: int, workers: int, gpus: int) -> List[Run]:
    rng = random.Random(seed)
    runs = [Run(index, draw(rng, gpus) + [f"train.train_iters={STEPS}"]) for index in range(count)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:  # a plan costs ~0.2 s of one core
        for run, verdict in zip(runs, pool.map(plan_verdict, [run.overrides for run in runs])):
            run.plan = verdict
    return runs


def samples(runs: List[Run], rng: random.Random, per_rule: int, twins: int, next_index: int) -> List[Run]:
    """Refused runs to train unchecked (up to ``per_rule`` for each rule, refused by config rules alone) and
    eager twins of accepted graphed runs."""
    extra = []
    by_rule = defaultdict(list)
    for run in runs:
        if not run.plan["valid"] and all(v["where"] == "config" for v in run.plan["violations"]) \
                and "override" not in refused_rules(run.plan):
            for rule in refused_rules(run.plan):
                by_rule[rule].append(run)
    for rule in sorted(by_rule):
        for run in rng.sample(by_rule[rule], min(per_rule, len(by_rule[rule]))):
            extra.append(Run(next_index, run.overrides, BYPASS, run.plan, refused_rules(run.plan)))
            next_index += 1
    graphed = [run for run in runs if run.plan["runnable_here"] and "cuda_graph=none" not in run.overrides]
    for run in rng.sample(graphed, min(twins, len(graphed))):
        twin = eager_twin(run, next_index)
        if twin:
            extra.append(twin)
            next_index += 1
    return extra


def eager_twin(run: Run, index: int) -> Optional[Run]:
    """``run`` without its graphs (nor the optimizer step inside them), if this machine's plan accepts that."""
    overrides = [("cuda_graph=none" if item.startswith("cuda_graph=") else item) for item in run.overrides
                 if not item.startswith("optimizer.optimizer_in_graph=")]
    twin = Run(index, overrides, EAGER_TWIN, plan_verdict(overrides), twin_of=run.index)
    return twin if twin.plan["runnable_here"] else None


def witness_twins(cases: List[Run]) -> List[Run]:
    """The eager twin of each graphed witness case (--witness-twins): a case that trains with a rule unasked shows
    whether it trains the same, and not only that it completes."""
    twins = []
    for case in cases:
        graphed = any(item.startswith("cuda_graph=") and item != "cuda_graph=none" for item in case.overrides)
        twin = eager_twin(case, cases[-1].index + 1 + len(twins)) if graphed else None
        twins += [twin] if twin else []
    return twins


def witnesses(first_index: int, gpus: int, labels: List[str]) -> List[Run]:
    """The witness cases named by ``labels``, or with none named every one that trains on ``gpus`` GPUs."""
    runs = []
    cases = [(label, overrides) for label, overrides in WITNESS_CASES.items()
             if label in labels or not labels and gpus_of(overrides) == gpus]
    for index, (label, overrides) in enumerate(cases, first_index):
        overrides = [*overrides, f"train.train_iters={STEPS}"]
        verdict = plan_verdict(overrides)
        runs.append(Run(index, overrides, WITNESS, verdict, refused_rules(verdict), label=label))
    return runs


def take_over(record: Dict, runs: List[Run], args, env: Dict[str, object]) -> Optional[str]:
    """Give ``runs`` the outcomes that ``record``, an earlier block of the same draws, trained (--resume). What
    keeps them from being the record's draws, in one line, or None: the same seed, count, GPUs and releases, and
    for every run the same overrides and the same plan (the catalogue decides on this machine as it did)."""
    earlier = record["summary"]
    for key, ours in (("seed", args.seed), ("drawn", args.count), ("num_gpus", args.gpus),
                      ("megatron_core", env["megatron_core"]), ("transformer_engine", env["transformer_engine"])):
        if earlier.get(key) != ours:
            return f"--resume: the record has {key} {earlier.get(key)} and this run {ours}; resume with the record's"
    theirs = {run["index"]: run for run in record["runs"]}
    for run in runs:
        old = theirs.get(run.index, {})
        if (old.get("kind"), old.get("overrides"), old.get("plan")) != (run.kind, run.overrides, run.plan):
            return (f"--resume: run {run.index} is not drawn or planned as the record's (other arguments, or the "
                    "catalogue decides otherwise now); start a new record")
        if old["status"] is not None:
            for name in OUTCOME:
                setattr(run, name, old[name])
    return None


def block(summary: Dict[str, object]) -> Dict[str, object]:
    """The block of device time a record's summary ends (``trained``: how many had trained by then)."""
    return {key: summary[key] for key in ("commit", "gpu", "command", "trained", "elapsed_s")}


def failure_class(error: Optional[str]) -> str:
    """The cause of a failure without its numbers, names of temporary paths and addresses."""
    text = (error or "no reason").split("; e.g.")[0]
    text = re.sub(r"0x[0-9a-f]+|/[\w./-]+|\d+(\.\d+)?", "#", text)
    return text[:200]


def max_relative_gap(losses: List[float], reference: List[float]) -> Optional[float]:
    """The largest relative gap between two runs' losses at the same steps; None without a step in common."""
    return max((abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, reference)), default=None)


def twin_pairs(runs: List[Run]) -> List[Dict[str, object]]:
    """Each graphed run whose eager twin completed, both completed: the largest relative loss gap between them."""
    by_index = {run.index: run for run in runs}
    pairs = []
    for twin in runs:
        graphed = by_index.get(twin.twin_of) if twin.kind == EAGER_TWIN else None
        if graphed is None or twin.status != "completed" or graphed.status != "completed":
            continue
        gap = max_relative_gap(graphed.losses, twin.losses)
        pairs.append({"graphed": graphed.index, "twin": twin.index, "max_relative_gap": 0.0 if gap is None else gap,
                      "tolerance": LOSS_TOLERANCE if draws_dropout(graphed.overrides) else ROUNDING_TOLERANCE,
                      "cuda_graph": next(o for o in graphed.overrides if o.startswith("cuda_graph="))})
    return pairs


def draws_dropout(overrides: List[str]) -> bool:
    """Whether the run sets a dropout above zero (the recipes' own are zero)."""
    return any(key in DROPOUTS and float(value) > 0 for key, _, value in (item.partition("=") for item in overrides))


def eager_agreement(runs: List[Run]) -> Dict[str, object]:
    """The twin pairs compared, and those whose graphed run left its twin's losses by more than the pair's tolerance
    (LOSS_TOLERANCE with dropout, ROUNDING_TOLERANCE without)."""
    pairs = twin_pairs(runs)
    differ = [pair for pair in pairs if pair["max_relative_gap"] > pair["tolerance"]]
    return {"compared": len(pairs), "tolerance": LOSS_TOLERANCE, "rounding_tolerance": ROUNDING_TOLERANCE,
            "differ": differ,
            "largest_gap": max((pair["max_relative_gap"] for pair in pairs), default=None)}


def summary(runs: List[Run], args, environment: Dict[str, object], elapsed: float,
            earlier_blocks: List[Dict[str, object]]) -> Dict[str, object]:
    drawn = [run for run in runs if run.kind == ACCEPTED]
    accepted = [run for run in drawn if run.plan["runnable_here"]]
    trained = [run for run in accepted if run.status is not None]
    crashed = [run for run in trained if run.status != "completed"]
    bypass = defaultdict(Counter)
    for run in runs:
        if run.kind == BYPASS and run.status is not None:
            for rule in run.unchecked_rules:
                bypass[rule]["completed" if run.status == "completed" else "failed"] += 1
    classes = Counter(failure_class(run.error) for run in crashed)
    gaps = {pair["graphed"]: pair["max_relative_gap"] for pair in twin_pairs(runs)}
    fields = coverage((varied(run.overrides), run.plan["runnable_here"]) for run in drawn)
    return {
        **environment, "num_gpus": args.gpus, "seed": args.seed, "drawn": len(drawn), "accepted": len(accepted),
        "fields_drawn": fields["fields_drawn"], "fields_varied": fields["fields_varied"],
        "field_coverage": fields["per_field"],
        "trained": len(trained), "completed": len(trained) - len(crashed), "crash_after_accept": len(crashed),
        "rejections": dict(Counter(rule for run in drawn if not run.plan["runnable_here"]
                                   for rule in refused_rules(run.plan)).most_common()),
        "failure_classes": [{"cause": cause, "count": count,
                             "example": next(run.index for run in crashed if failure_class(run.error) == cause)}
                            for cause, count in classes.most_common()],
        "bypassed_rules": {rule: dict(counts) for rule, counts in sorted(bypass.items())},
        "eager_twins": eager_agreement(runs),
        "witnesses": [{"label": run.label, "overrides": run.overrides, "unchecked_rules": run.unchecked_rules,
                       "status": run.status, "error": run.error, "eager_gap": gaps.get(run.index)}
                      for run in runs if run.kind == WITNESS],
        "launcher": args.launcher, "steps": STEPS, "elapsed_s": round(elapsed, 1), "earlier_blocks": earlier_blocks,
    }


def environment(command: List[str]) -> Dict[str, object]:
    from bridge.machine import host_cpu, probe

    machine = probe()
    return {"megatron_core": machine.version("megatron-core"), "transformer_engine": machine.version("transformer-engine"),
            "torch": machine.version("torch"), "gpu": machine.gpus[0].name if machine.gpus else None,
            "host_cpu": host_cpu(),  # a run's seconds are mostly the host's: records compare only with it named
            "commit": os.environ.get("GRAPHBRIDGE_COMMIT") or git_commit(), "command": " ".join(command)}


def git_commit() -> Optional[str]:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=700, help="configurations drawn")
    # One run alone on the H100 (benchmarks/results/h100/mcore-0.16.1/run_footprint.json): 32 s, 20 of them importing
    # torch, Transformer Engine and megatron-core on one core, and 2.8 GiB of device memory (8.1 GiB before the
    # engine's NCCL communicators became lazy). So the GPU's memory holds about 25 at once and the cores decide: at
    # one run a core (16 on that machine) the load average was 18 and 0.35 runs finished a second.
    parser.add_argument("--gpus", type=int, default=1, help="GPUs each drawn configuration trains on, in one "
                        "parallel layout (tensor, pipeline, context, expert or data)")
    parser.add_argument("--workers", type=int, default=None,
                        help="runs sharing the GPUs at once (default: the cores over --gpus, a process a GPU)")
    parser.add_argument("--bypass-per-rule", type=int, default=2, help="refused runs trained unchecked, per rule")
    parser.add_argument("--eager-twins", type=int, default=30)
    parser.add_argument("--witnesses", nargs="*", default=None, metavar="LABEL",
                        help="first train WITNESS_CASES, rules unasked: those of --gpus GPUs, or the LABELs named")
    parser.add_argument("--witness-twins", action="store_true",
                        help="train each graphed witness case's eager twin as well and record their loss gap")
    parser.add_argument("--deadline-s", type=float, default=None, help="start no run after this many seconds")
    parser.add_argument("--run-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in every training process (benchmarks/run_footprint.py measures what pays off)")
    parser.add_argument("--launcher", choices=("process", "preloaded"), default="process",
                        help="preloaded: fork each training process from one that imported torch, TE and megatron-core "
                        "(perf/preloaded.py); process: the CLI in a fresh process, as a user runs it")
    parser.add_argument("--port-base", type=int, default=20000,
                        help="first rendezvous port, two a run (two differentials on one machine need ranges apart, "
                        "and both below the kernel's ephemeral ports)")
    parser.add_argument("--resume", type=Path, default=None, metavar="RECORD",
                        help="go on where RECORD (an earlier --out of the same arguments) stopped")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.workers = args.workers or max(1, (os.cpu_count() or 1) // args.gpus)
    if args.resume and not args.resume.is_file():
        parser.error(f"--resume {args.resume}: no such record")
    for label in args.witnesses or []:
        if label not in WITNESS_CASES:
            parser.error(f"--witnesses {label}: no such case; the cases are in benchmarks/differential_witnesses.py")
        if gpus_of(WITNESS_CASES[label]) != args.gpus:
            parser.error(f"--witnesses {label}: it trains on {gpus_of(WITNESS_CASES[label])} GPUs; "
                         f"run it with --gpus {gpus_of(WITNESS_CASES[label])}")
    return args


def record_text(summary_of_runs: dict, runs: list) -> str:
    """The record as JSON: its summary indented to read, then a run a line (an indented run took twice the bytes,
    and every byte of the committed records travels with each GPU call)."""
    head = json.dumps({"summary": summary_of_runs}, indent=2)[:-2]  # all but the closing "\n}"
    lines = ",\n".join(f"    {json.dumps(run)}" for run in runs)
    return f'{head},\n  "runs": ' + (f"[\n{lines}\n  ]" if runs else "[]") + "\n}\n"


def main() -> int:
    args = arguments()
    start = time.monotonic()
    run_env = dict(item.split("=", 1) for item in args.run_env)
    # Read when the libraries load (OpenMP's pool), so set before the planning workers and the preloaded
    # launcher's server start: a pool of a core's worth of threads in every process starves the machine.
    os.environ.update({"OMP_NUM_THREADS": "2", **run_env})
    env = environment(["python", "benchmarks/gpu_differential.py", *sys.argv[1:]])
    runs = drawn_runs(args.seed, args.count, args.workers, args.gpus)
    first = witnesses(len(runs), args.gpus, args.witnesses) if args.witnesses is not None else []
    first += witness_twins(first) if args.witness_twins and first else []
    rest = [run for run in runs if run.plan["runnable_here"]]
    rest += samples(runs, random.Random(args.seed), args.bypass_per_rule, args.eager_twins, len(runs) + len(first))
    # Mixed, so that the refused samples and eager twins train before --deadline-s as the accepted ones do (queued
    # last, none of them trained in the first records).
    random.Random(args.seed).shuffle(rest)
    queue = first + rest
    all_runs = runs + [run for run in queue if run.kind != ACCEPTED]
    earlier_blocks = []
    if args.resume:
        earlier = json.loads(args.resume.read_text())
        problem = take_over(earlier, all_runs, args, env)
        if problem:
            print(problem, file=sys.stderr)
            return 2
        earlier_blocks = [*earlier["summary"].get("earlier_blocks", []), block(earlier["summary"])]
        queue = [run for run in queue if run.status is None]
    print(f"{len(runs)} drawn and planned in {time.monotonic() - start:.0f} s, {len(queue)} to train, "
          f"{args.workers} at once", flush=True)

    def record() -> None:
        write_text_atomic(args.out, record_text(summary(all_runs, args, env, time.monotonic() - start, earlier_blocks),
                                                [asdict(run) for run in all_runs]))

    ports = port_range_problem(args.port_base, 2 * len(all_runs))  # Launch.port: two a run, for its retry
    if ports:
        print(ports, file=sys.stderr)
        return 2
    record()  # what was drawn and accepted, before the first run ends
    launch = Launch(args.launcher, run_env, args.port_base)
    # The runs' directories matter only while they train: what the record keeps of each (status, losses, error, log
    # tail) is read from them as it ends. A process a timed-out run left behind may still write there, so a failed
    # clean-up leaves what it could not remove rather than failing the harness.
    with tempfile.TemporaryDirectory(prefix="gpu_differential_", ignore_cleanup_errors=True) as workdir, \
            ThreadPoolExecutor(args.workers) as pool:
        def in_time(run: Run) -> Run:
            late = args.deadline_s is not None and time.monotonic() - start > args.deadline_s
            return run if late else train(run, Path(workdir), launch)

        for done, future in enumerate(as_completed([pool.submit(in_time, run) for run in queue]), 1):
            run = future.result()
            if run.status is not None and run.status != "completed":
                print(f"[{done}/{len(queue)}] {run.kind} {run.status}: {' '.join(run.overrides)}\n    {run.error}",
                      flush=True)
            record()
    record()
    result = summary(all_runs, args, env, time.monotonic() - start, earlier_blocks)
    print({key: result[key] for key in ("drawn", "accepted", "trained", "completed", "crash_after_accept")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
