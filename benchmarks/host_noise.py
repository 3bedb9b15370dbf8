"""How far a host-bound step's time moves from one process to the next, and whether binding each process to the
CPUs beside its GPU narrows that: one suite variant trained --runs times unbound and --runs times bound, turn by
turn, each run a fresh `graphbridge` process as the suite starts it (benchmarks/suite.py).

    python benchmarks/host_noise.py qwen3_moe_dropless [--variant eager] [--runs 4] [--steps 40] --out noise.json
    bash scripts/gpu_check.sh host_noise qwen3_moe_dropless     # on the GPU machine, into $OUT/mcore-<release>/

Why: the suite's auto row sets auto's run against the best other variant's, each a process of its own, and issue
40 asks auto within 3 % of the best. On the Qwen3 proxy (about 10,700 kernel launches a step) one process's eager
step took 428 ms and another's 320 ms on the same H200 (75b3d6e). Kernel launches from CPUs far from the GPU
(another NUMA node) cost more, and a process the scheduler moves between CPUs lands on either. The CPUs bound are
the GPU's NUMA-local ones (/sys/bus/pci/devices/<its bus id>/local_cpulist, within this process's own), or --cpus.
Where those are all of this process's CPUs (one NUMA node, as on the 16-CPU H200 machine of b217322), binding
changes nothing: the runs are unbound only, and the record says why, so the spread measured is the host's alone.
Each run also keeps the CPU time the hypervisor gave others while it ran (steal_s, from /proc/stat), and the
record which logical CPUs share a physical core (core_siblings): on a virtual machine, what else could set a
process's speed for the whole of its life. Each run keeps its timed steps in step order (result.json's
timed_step_ms) and their medians by WINDOW_STEPS: with --steps of a few hundred, a run of minutes shows whether
its step stays at one level while it runs (the process sets it) or moves with the host while the next run
starts where the last one ended (the time does).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import suite  # noqa: E402
from bridge.atomic import write_json_atomic  # noqa: E402
from bridge.machine import cpu_list, host_cpu  # noqa: E402
from suite_workloads import EAGER, WORKLOADS  # noqa: E402

UNBOUND, BOUND = "unbound", "bound"


def gpu_local_cpus() -> Optional[Set[int]]:
    """The CPUs on the NUMA node of the first GPU this process sees, within its own; None where nothing says."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    try:
        bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", visible],
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        local = Path("/sys/bus/pci/devices") / bus[-12:].lower() / "local_cpulist"
        return cpu_list(local.read_text()) & os.sched_getaffinity(0) or None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def core_siblings(cpus: Set[int], topology: Path = Path("/sys/devices/system/cpu")) -> List[List[int]]:
    """The logical CPUs of ``cpus`` grouped by the physical core they share (two to a core where threads pair up);
    empty where /sys does not say."""
    groups = set()
    for cpu in sorted(cpus):
        try:
            groups.add(tuple(sorted(cpu_list((topology / f"cpu{cpu}/topology/thread_siblings_list").read_text()))))
        except (OSError, ValueError):
            return []
    return [list(group) for group in sorted(groups)]


def spread(medians: List[float]) -> Optional[float]:
    """(slowest - fastest) / fastest of the runs' median step times."""
    return (max(medians) - min(medians)) / min(medians) if len(medians) > 1 else None


WINDOW_STEPS = 20
"""The timed steps each window median of a run takes, in step order: whether its step moved while it ran."""


def window_medians(steps_ms: List[float]) -> List[float]:
    """The median of each WINDOW_STEPS consecutive timed steps (a last, shorter window too, where it holds half)."""
    windows = [steps_ms[start:start + WINDOW_STEPS] for start in range(0, len(steps_ms), WINDOW_STEPS)]
    return [statistics.median(window) for window in windows if len(window) * 2 >= WINDOW_STEPS]


def binding_changes_nothing(cpus: Set[int]) -> Optional[str]:
    """Why binding to ``cpus`` cannot move a step, where it cannot: they hold every CPU this process may use."""
    own = os.sched_getaffinity(0)
    if own <= cpus:
        return (f"the CPUs to bind to hold all {len(own)} of this process's, so a bound run would run where an unbound "
                "one does: every run is unbound")
    return None


def measure(name: str, variant: str, runs: int, steps: int, cpus: Set[int], scratch: Path,
            bind: bool = True) -> Dict[str, dict]:
    """``runs`` runs of each mode, unbound and bound taking turns (the first mode alternates too), so that a
    drift of the host over the minutes falls on both; unbound alone without ``bind``."""
    workload = WORKLOADS[name]
    chosen = (UNBOUND, BOUND) if bind else (UNBOUND,)
    modes: Dict[str, dict] = {mode: {"medians_ms": [], "steal_s": [], "window_medians_ms": [], "timed_step_ms": [],
                                     "failed": []} for mode in chosen}
    for turn in range(runs):
        for mode in list(modes) if turn % 2 == 0 else list(modes)[::-1]:
            measured = suite.run_variant(workload, workload.variants[variant], scratch / f"{turn}_{mode}", steps,
                                         cpus=cpus if mode == BOUND else None)
            median, stolen = (measured.result.get("step_time_ms") or {}).get("median"), measured.steal_s
            steps_ms = measured.result.get("timed_step_ms") or []
            if measured.result.get("status") == "completed" and median:
                windows = window_medians(steps_ms)
                for key, value in (("medians_ms", median), ("steal_s", stolen), ("window_medians_ms", windows),
                                   ("timed_step_ms", steps_ms)):
                    modes[mode][key].append(value)
            else:
                windows = []
                modes[mode]["failed"].append({"status": measured.result.get("status"), "log_tail": measured.log_tail})
            print(f"run {turn} {mode}: {measured.result.get('status')}, median {median} ms, steal {stolen} s, by "
                  f"{WINDOW_STEPS} steps {' '.join(f'{ms:.0f}' for ms in windows)}", flush=True)
    for numbers in modes.values():
        medians = numbers["medians_ms"]
        numbers.update(median_ms=statistics.median(medians) if medians else None, spread=spread(medians))
    return modes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--variant", default=EAGER)
    parser.add_argument("--runs", type=int, default=4, help="runs of each mode")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--cpus", type=cpu_list, default=None, help="the CPUs to bind to (default: the GPU's own)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/graphbridge-host-noise"))
    args = parser.parse_args(argv)
    if args.variant not in WORKLOADS[args.workload].variants:
        parser.error(f"--variant {args.variant}: {args.workload} has {', '.join(WORKLOADS[args.workload].variants)}")
    cpus = args.cpus or gpu_local_cpus()
    if not cpus:
        print("no GPU says which CPUs are beside it here: name them with --cpus", file=sys.stderr)
        return 2
    unbindable = binding_changes_nothing(cpus)
    if unbindable:
        print(unbindable, flush=True)
    modes = measure(args.workload, args.variant, args.runs, args.steps, cpus, args.scratch / time.strftime("%H%M%S"),
                    bind=not unbindable)
    gpus = suite.cuda_gpus()
    write_json_atomic(args.out, {
        "workload": args.workload, "variant": args.variant, "runs": args.runs, "steps": args.steps,
        "gpu": gpus[0].name if gpus else None, "host_cpu": host_cpu(), "cpus_bound": sorted(cpus),
        "cpus_of_the_process": len(os.sched_getaffinity(0)), "binding_changes_nothing": unbindable,
        "core_siblings": core_siblings(os.sched_getaffinity(0)),
        "commit": suite.git_commit(),
        "date": time.strftime("%Y-%m-%d"), "command": " ".join(["python", "benchmarks/host_noise.py", *sys.argv[1:]]),
        "modes": modes})
    for mode, numbers in modes.items():
        print(f"{mode}: median {numbers['median_ms']} ms over {len(numbers['medians_ms'])} runs, spread "
              f"{numbers['spread']}, {len(numbers['failed'])} failed")
    return 0 if all(numbers["medians_ms"] for numbers in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
