"""Where a profiled step's time goes, from the trace.json that perf.profile=true writes, for one or
more jobs side by side: GPU-busy time, kernel launches and graph replays per step, the idle time
between the kernels of a graph replay, the host calls that wait for the GPU, and the kernels that
take the most GPU time.

A replay's kernels carry the correlation id of its cudaGraphLaunch. From its first kernel's start
to its last kernel's end the GPU works on nothing else, so the time in that span not covered by a
kernel is what the GPU needs between one kernel and the next: a floor under the step time that no
host-side change removes, only fewer kernels.

    python benchmarks/trace_summary.py RUN_DIR_OR_TRACE... [--top 12]

Each argument is a job dir (with trace.json and result.json) or a trace.json. Steps are the
"step N" ranges the trainer writes into the trace.
"""

import argparse
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Tuple

from bridge.profiling import busy_time_us

DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
WAITS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
"""Host calls that block until the GPU catches up. .item() and .cpu() show as a cudaMemcpyAsync then a
cudaStreamSynchronize; a cudaMemcpyAsync alone need not wait."""
STEP = re.compile(r"^step \d+$")


def summarise(trace_path: Path, top: int) -> Dict:
    events = [event for event in json.loads(trace_path.read_text())["traceEvents"] if event.get("ph") == "X"]
    steps = sum(1 for event in events if event.get("cat") == "user_annotation" and STEP.match(event.get("name", "")))
    steps = max(steps, 1)
    device = [event for event in events if event.get("cat") in DEVICE_WORK]
    runtime = [event for event in events if event.get("cat") in ("cuda_runtime", "cuda_driver")]
    kernels: Dict[str, float] = defaultdict(float)
    for event in device:
        kernels[event["name"]] += event["dur"]
    calls = Counter(event["name"] for event in runtime)
    waits = {name: count for name, count in calls.items() if name in WAITS}
    wait_us = sum(event["dur"] for event in runtime if event["name"] in WAITS)
    span_us, idle_us = replay_spans_us(runtime, device)
    return {
        "trace": str(trace_path), "steps": steps,
        "gpu_busy_ms_per_step": busy_time_us([(e["ts"], e["ts"] + e["dur"]) for e in device]) / 1e3 / steps,
        "kernels_per_step": sum(1 for event in device if event["cat"] == "kernel") / steps,
        "launches_per_step": sum(count for name, count in calls.items() if "LaunchKernel" in name) / steps,
        "graph_replays_per_step": sum(count for name, count in calls.items() if "GraphLaunch" in name) / steps,
        "replay_span_ms_per_step": span_us / 1e3 / steps,
        "replay_idle_ms_per_step": idle_us / 1e3 / steps,
        "host_waits_per_step": {name: count / steps for name, count in sorted(waits.items())},
        "host_wait_ms_per_step": wait_us / 1e3 / steps,
        "top_kernels_ms_per_step": {name[:90]: us / 1e3 / steps
                                    for name, us in sorted(kernels.items(), key=lambda item: -item[1])[:top]},
    }


def replay_spans_us(runtime: List[Dict], device: List[Dict]) -> Tuple[float, float]:
    """Over all graph replays: the summed span from first kernel start to last kernel end, and the part
    of it no kernel, copy or memset covers."""
    replays = {event["args"]["correlation"] for event in runtime
               if "GraphLaunch" in event["name"] and "correlation" in event.get("args", {})}
    work: Dict[int, List[Tuple[float, float]]] = defaultdict(list)
    for event in device:
        correlation = event.get("args", {}).get("correlation")
        if correlation in replays:
            work[correlation].append((event["ts"], event["ts"] + event["dur"]))
    spans = [max(end for _, end in intervals) - min(start for start, _ in intervals) for intervals in work.values()]
    return sum(spans), sum(spans) - sum(busy_time_us(intervals) for intervals in work.values())


def trace_of(path: Path) -> Path:
    return path / "trace.json" if path.is_dir() else path


def render(summaries: List[Dict]) -> str:
    lines = []
    for summary in summaries:
        lines.append(f"## {summary['trace']} ({summary['steps']} steps)")
        lines.append(f"GPU busy {summary['gpu_busy_ms_per_step']:.2f} ms/step; {summary['kernels_per_step']:.0f} kernels, "
                     f"{summary['launches_per_step']:.0f} kernel launches, {summary['graph_replays_per_step']:.0f} graph "
                     f"replays per step; host waits {summary['host_wait_ms_per_step']:.2f} ms/step "
                     f"{summary['host_waits_per_step']}")
        if summary["replay_span_ms_per_step"]:
            lines.append(f"graph replays span {summary['replay_span_ms_per_step']:.2f} ms/step, of which "
                         f"{summary['replay_idle_ms_per_step']:.2f} ms between kernels")
        lines += [f"  {ms:8.3f} ms  {name}" for name, ms in summary["top_kernels_ms_per_step"].items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    args = parser.parse_args(argv)
    summaries = [summarise(trace_of(path), args.top) for path in args.paths if trace_of(path).is_file()]
    print(render(summaries))
    if args.json:
        args.json.write_text(json.dumps(summaries, indent=2) + "\n")
    return 0 if summaries else 2


if __name__ == "__main__":
    raise SystemExit(main())
