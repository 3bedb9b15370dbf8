"""Is graphed training the same training? Every variant of llama/tiny trains --steps steps at the recipe's
default warmup through the real `graphbridge` CLI, beside its eager twin (the same overrides with cuda_graph=none
and the optimizer outside any graph), for a few seeds; the record keeps every per-step loss of both:

    python benchmarks/equivalence.py --out equivalence.json [--seeds 1234 1 2 3 4] [--steps 100] [--workers 6]
    MCORE=0.19.2 TE=2.20.2 bash scripts/gpu_check.sh equivalence    # on the GPU machine, into $OUT/mcore-<release>/

Two runs that round differently part after a while: on the H100 (2196b56, equivalence.json of both releases)
llama/tiny's loss spikes from about step 30 on, and a run that differs from eager by rounding alone (local_layer
on megatron-core 0.16.1) then ends its steps 50-99 up to 9 % away from eager's, so no window there can tell a
small real difference from rounding. Up to step 30 the same pairs stay within 0.03 %. So a variant is compared
by its window mean over steps 10-29 (WINDOW: past the learning-rate warmup, 10 steps by default, and before the
spikes) against its twin's; LATE_WINDOW (steps 50-99) is recorded to show how far rounding alone carries.
The rounding-only pair (ROUNDING_VARIANT: eager trained in two micro-batches of one instead of one of two, the
same math summed in another order, on every release) measures how far two such windows lie apart when nothing
but rounding differs; the GPU loss tests (tests/gpu/megatron_cases.py) allow ROUNDING_MARGIN times the largest
such gap recorded here. Variants this machine refuses (the distributed optimizer in the graph before
megatron-core 0.19) are recorded as refused.
"""

import argparse
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import differential_launch  # noqa: E402
import gpu_differential  # noqa: E402
import suite  # noqa: E402

RECIPE = "recipe=llama/tiny"
SPECS = {"local": ("model.transformer_impl=local",), "transformer_engine": ("model.transformer_impl=transformer_engine",)}
IN_GRAPH = "optimizer.optimizer_in_graph=true"
ROUNDING_VARIANT = "eager_microbatch_split"
VARIANTS = {
    ROUNDING_VARIANT: ("cuda_graph=none", "train.micro_batch_size=1"),
    "full_iteration": ("cuda_graph=full_iteration",),
    "local_layer": ("cuda_graph=local_layer",),
    "full_iteration+optimizer": ("cuda_graph=full_iteration", IN_GRAPH),
    "full_iteration+optimizer+distributed": ("cuda_graph=full_iteration", IN_GRAPH, "ddp.use_distributed_optimizer=true"),
}
STEPS = 100
"""Each run's length: its learning-rate schedule (the recipe's warmup is a tenth of the steps) is the one the
windows were measured on."""
WINDOW = (10, 30)
"""Steps [10, 30): past the learning-rate warmup (a tenth of 100 steps) and before the loss spikes after which
runs that differ by rounding alone part (module docstring)."""
LATE_WINDOW = (50, STEPS)
"""Steps [50, 100): recorded, not judged; how far rounding alone carries two runs apart."""
ROUNDING_MARGIN = 2
"""A run trains the same when its window mean lies within twice the largest gap rounding alone made. The few
seeds measured are a few draws of that noise and only hint at its spread: on issue #29's H100 run the
in-graph optimizer's gap (+0.30 %) was larger than the one rounding-only gap measured (+0.24 %) and
within twice it."""
RUN_TIMEOUT_S = 900
"""Each run through the CLI in a fresh process; 100 steps of several runs sharing the GPU take longer than the
differential's six."""


def eager_twin(overrides: Sequence[str]) -> Tuple[str, ...]:
    """The same training without graphs: cuda_graph=none, the optimizer outside any graph, the recipe's
    micro-batch size."""
    kept = [item for item in overrides
            if not item.startswith(("cuda_graph=", "optimizer.optimizer_in_graph=", "train.micro_batch_size="))]
    return (*kept, "cuda_graph=none")


def window_gap(losses: Sequence[float], eager_losses: Sequence[float], window: Tuple[int, int] = WINDOW) -> float:
    """The relative gap of the window means: (mean - eager's mean) / eager's mean."""
    start, end = window
    mean, eager = statistics.fmean(losses[start:end]), statistics.fmean(eager_losses[start:end])
    return (mean - eager) / eager


def rounding_gap(record: dict) -> Optional[float]:
    """The largest |window gap| of the rounding-only pair in an equivalence record, from its per-step losses."""
    gaps = [abs(window_gap(run["losses"], run["eager_losses"])) for run in record["runs"]
            if run["variant"] == ROUNDING_VARIANT and run["status"] == run["eager_status"] == "completed"]
    return max(gaps, default=None)


def runs_to_make(seeds: Sequence[int], steps: int) -> List[dict]:
    """Every (spec, variant, seed) with its overrides and its twin's."""
    runs = []
    for spec, spec_overrides in SPECS.items():
        for variant, overrides in VARIANTS.items():
            for seed in seeds:
                full = (RECIPE, *spec_overrides, *overrides, f"rng.seed={seed}", f"train.train_iters={steps}")
                runs.append({"spec": spec, "variant": variant, "seed": seed, "overrides": list(full),
                             "eager_overrides": list(eager_twin(full))})
    return runs


def refusal(overrides: Tuple[str, ...]) -> Optional[dict]:
    """Why this machine would refuse the configuration, as a result; None when it trains here."""
    import bridge

    plan = bridge.plan(list(overrides))
    if plan.runnable_here:
        return None
    return {"status": "refused", "reason": "; ".join(str(v) for v in plan.refused_here), "losses": []}


def train(overrides: Tuple[str, ...], workdir: Path, index: int, launch: differential_launch.Launch) -> dict:
    """One training through the CLI, as the GPU differential trains (its own rendezvous port, once more after a
    failure for want of the GPU's shared resources): its status and per-step losses (or why it failed)."""
    run = differential_launch.train(gpu_differential.Run(index, list(overrides)), workdir, launch)
    return {"status": run.status, "reason": run.error, "losses": run.losses}


def with_gaps(run: dict) -> dict:
    if run["status"] != "completed" or run["eager_status"] != "completed":
        return run
    gaps = [abs(a - b) for a, b in zip(run["losses"], run["eager_losses"])]
    start, end = WINDOW
    return {**run, "window_mean": statistics.fmean(run["losses"][start:end]),
            "eager_window_mean": statistics.fmean(run["eager_losses"][start:end]),
            "relative_gap": window_gap(run["losses"], run["eager_losses"]),
            "late_relative_gap": window_gap(run["losses"], run["eager_losses"], LATE_WINDOW)
            if len(run["losses"]) >= LATE_WINDOW[1] else None, "largest_step_gap": max(gaps)}


def measure(runs: List[dict], workers: int, port_base: int) -> List[dict]:
    """Train every distinct configuration once (twins are shared) and put each twin's losses beside its run's."""
    distinct = sorted({tuple(run["overrides"]) for run in runs} | {tuple(run["eager_overrides"]) for run in runs})
    # Planned here, one after the other: composition is not thread-safe (Hydra's global state).
    results = {overrides: refusal(overrides) for overrides in distinct}
    runnable = [overrides for overrides in distinct if results[overrides] is None]
    launch = differential_launch.Launch("process", {}, port_base, timeout_s=RUN_TIMEOUT_S)
    # The runs' directories matter only while they train: their losses come back in the results.
    with tempfile.TemporaryDirectory(prefix="equivalence_") as workdir, ThreadPoolExecutor(workers) as pool:
        results.update(zip(runnable, pool.map(lambda index: train(runnable[index], Path(workdir), index, launch),
                                              range(len(runnable)))))
    measured = []
    for run in runs:
        own, twin = results[tuple(run["overrides"])], results[tuple(run["eager_overrides"])]
        measured.append(with_gaps({**run, **own, "eager_status": twin["status"], "eager_reason": twin["reason"],
                                   "eager_losses": twin["losses"]}))
    return measured


def environment(command: List[str]) -> Dict[str, object]:
    from bridge.machine import probe

    machine = probe()
    return {"gpu": machine.gpus[0].name if machine.gpus else None, "driver": suite.driver_version(),
            **{name.replace("-", "_"): machine.version(name) for name in ("torch", "megatron-core", "transformer-engine")},
            "python": platform.python_version(), "commit": suite.git_commit(), "command": " ".join(command),
            "date": time.strftime("%Y-%m-%d")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234, 1, 2, 3, 4], help="rng.seed of each run (1234: the "
                        "recipe's)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--workers", type=int, default=6, help="runs sharing the GPU at once")
    parser.add_argument("--port-base", type=int, default=21000, help="first rendezvous port, two a run (two "
                        "releases at once on one machine need ranges apart, below the kernel's ephemeral ports)")
    args = parser.parse_args(argv)
    if args.steps < WINDOW[1]:
        parser.error(f"--steps must reach the window's end, {WINDOW[1]}")
    to_make = runs_to_make(args.seeds, args.steps)
    ports = differential_launch.port_range_problem(args.port_base, 2 * 2 * len(to_make))  # each run and its twin
    if ports:
        parser.error(ports)
    env = environment(["python", "benchmarks/equivalence.py", *(argv if argv is not None else sys.argv[1:])])
    runs = measure(to_make, args.workers, args.port_base)
    gap = rounding_gap({"runs": runs})
    record = {**env, "steps": args.steps, "window": list(WINDOW), "late_window": list(LATE_WINDOW),
              "seeds": args.seeds, "variants": VARIANTS,
              "rounding_variant": ROUNDING_VARIANT, "rounding_gap": gap, "rounding_margin": ROUNDING_MARGIN,
              "tolerance": None if gap is None else ROUNDING_MARGIN * gap, "runs": runs}
    from bridge.atomic import write_json_atomic

    write_json_atomic(args.out, record)
    for run in runs:
        gap_text = (f"{run['relative_gap']:+.4%} (steps 50-99: {run['late_relative_gap'] or 0:+.2%})"
                    if "relative_gap" in run else f"{run['status']}/{run['eager_status']}")
        print(f"{run['spec']:18} {run['variant']:38} seed {run['seed']:5}: steps 10-29 mean vs eager {gap_text}")
    print(f"rounding-only gap {gap}; tolerance {record['tolerance']}; written to {args.out}")
    return 0 if gap is not None else 1


if __name__ == "__main__":
    sys.exit(main())
