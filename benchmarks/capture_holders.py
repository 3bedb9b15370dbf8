"""What the allocator holds when a graph is captured, and what is live at the run's peak: a graphbridge job through
the CLI, with PyTorch's memory history recorded in its training process, summarized at every capture's begin and
end, and at the process's exit replayed to the moment the most memory was allocated, whose live allocations are
totalled by the site that made them (the terms the memory estimate must count, as the GPU has them).

    python benchmarks/capture_holders.py --out holders.json recipe=llama/llama32_1b cuda_graph=full_iteration ...

A graph captures into a private pool of its own; what the default pool keeps reserved beside it (cached blocks
that torch.cuda.graph's empty_cache could not release, because a live tensor shares their segment) is what a
graphed run reserves on top of its eager twin. Per moment, per pool: reserved and allocated bytes, and for the
default pool the segments that hold both, with the allocations that pin them (size and the first frames of
graphbridge, megatron-core, Transformer Engine or torch.optim that made them), largest stranded space first.

The training process (``python -m bridge.run``) imports this module from a sitecustomize.py written to a
temporary folder put first on its PYTHONPATH; no other process records.
"""

import argparse
import atexit
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
HOLDERS_ENV = "GRAPHBRIDGE_CAPTURE_HOLDERS"
"""The JSON file the training process writes its moments to."""
EMPTY_FIRST_STEP_ENV = "GRAPHBRIDGE_EMPTY_CACHE_BEFORE_FIRST_STEP"
"""Set: the allocator's cache is emptied before the first optimizer step, so that optimizer state made lazily there
gets segments of its own instead of splitting the first step's freed activation blocks (a hypothesis to test)."""
OWN_FRAMES = ("/bridge/", "/megatron/", "/transformer_engine/", "/torch/optim/")
GIB = 2 ** 30
MOMENTS = 4
"""The first two captures' begin and end (Transformer Engine's per-layer graphs capture dozens)."""
SITECUSTOMIZE = f"""import sys
if "bridge.run" in getattr(sys, "orig_argv", []):
    sys.path.insert(0, {str(ROOT / 'benchmarks')!r})
    import capture_holders
    capture_holders.install()
"""


def install() -> None:
    """In the training process: record every allocation's stack, and summarize at each capture's begin and end."""
    import torch

    path = Path(os.environ[HOLDERS_ENV])
    if not torch.cuda.is_available():
        return
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    moments: List[dict] = []
    graph_class = torch.cuda.CUDAGraph
    begin, end = graph_class.capture_begin, graph_class.capture_end

    def record(moment: str) -> None:
        if len(moments) >= MOMENTS:
            return
        torch.cuda.synchronize()
        moments.append({"moment": moment, **summarize(torch.cuda.memory._snapshot()["segments"])})
        path.write_text(json.dumps(moments, indent=1))

    def capture_begin(self, *args, **kwargs):
        record(f"capture {sum(m['moment'].startswith('capture') for m in moments) // 2 + 1} begins")
        return begin(self, *args, **kwargs)

    def capture_end(self, *args, **kwargs):
        result = end(self, *args, **kwargs)
        record(f"capture {(sum(m['moment'].startswith('capture') for m in moments) + 1) // 2} ends")
        return result

    graph_class.capture_begin, graph_class.capture_end = capture_begin, capture_end
    atexit.register(lambda: path.with_name(path.stem + "_peak.json").write_text(
        json.dumps(live_at_peak(torch.cuda.memory._snapshot()["device_traces"][0]), indent=1)))
    if os.environ.get(EMPTY_FIRST_STEP_ENV):
        empty_cache_before_first_step()


def empty_cache_before_first_step() -> None:
    import torch

    def pre_hook(optimizer, args, kwargs):
        handle.remove()
        torch.cuda.empty_cache()

    handle = torch.optim.optimizer.register_optimizer_step_pre_hook(pre_hook)


def summarize(segments: List[dict]) -> Dict[str, object]:
    pools: Dict[str, Dict[str, float]] = defaultdict(lambda: {"reserved_gib": 0.0, "allocated_gib": 0.0})
    pinning: List[dict] = []
    for segment in segments:
        pool = "default" if tuple(segment["segment_pool_id"]) == (0, 0) else f"private {segment['segment_pool_id']}"
        pools[pool]["reserved_gib"] += segment["total_size"] / GIB
        pools[pool]["allocated_gib"] += segment["allocated_size"] / GIB
        stranded = segment["total_size"] - segment["allocated_size"]
        if pool == "default" and segment["allocated_size"] and stranded >= 2 ** 20:
            live = [block for block in segment["blocks"] if block["state"] == "active_allocated"]
            pinning.append({"segment_mib": segment["total_size"] / 2 ** 20, "stranded_mib": stranded / 2 ** 20,
                            "stream": segment["stream"],
                            "live": [{"mib": round(block["size"] / 2 ** 20, 2), "made_by": made_by(block)}
                                     for block in live[:4]]})
    pinning.sort(key=lambda entry: -entry["stranded_mib"])
    stranded_gib = sum(entry["stranded_mib"] for entry in pinning) / 1024
    return {"pools": dict(pools), "default_stranded_gib": stranded_gib, "pinned_segments": len(pinning),
            "largest_pinned": pinning[:25], "made_by_totals": made_by_totals(pinning)}


def live_at_peak(trace: List[dict]) -> Dict[str, object]:
    """Replays the allocations and frees of the trace to the moment the most was allocated: what was live then,
    totalled by the site that made it (the first of its frames in graphbridge, megatron-core, TE or torch.optim)."""
    live: Dict[int, dict] = {}
    allocated = peak = 0
    at_peak: Dict[int, dict] = {}
    for event in trace:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            allocated += event["size"]
            if allocated > peak:
                peak, at_peak = allocated, dict(live)
        elif event["action"] == "free_requested" and event["addr"] in live:
            allocated -= live.pop(event["addr"])["size"]
    sites: Dict[str, float] = defaultdict(float)
    for event in at_peak.values():
        sites[next(iter(made_by(event)), "unknown")] += event["size"] / GIB
    return {"peak_allocated_gib": peak / GIB, "events": len(trace),
            "by_site": [{"made_by": site, "gib": round(gib, 3)}
                        for site, gib in sorted(sites.items(), key=lambda item: -item[1])[:30]]}


def made_by(block: dict) -> List[str]:
    frames = block.get("frames") or []
    own = [f"{frame['filename'].split('site-packages/')[-1]}:{frame['line']} {frame['name']}" for frame in frames
           if any(part in frame["filename"] for part in OWN_FRAMES)]
    return own[:3]


def made_by_totals(pinning: List[dict]) -> List[dict]:
    """The stranded space per first frame of what pins it: which allocation site strands the most."""
    totals: Dict[str, float] = defaultdict(float)
    for entry in pinning:
        first = next((block["made_by"][0] for block in entry["live"] if block["made_by"]), "unknown")
        totals[first] += entry["stranded_mib"] / 1024
    return [{"made_by": site, "stranded_gib": round(gib, 2)}
            for site, gib in sorted(totals.items(), key=lambda item: -item[1])[:10]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the summary JSON")
    parser.add_argument("--empty-cache-before-first-step", action="store_true", help=EMPTY_FIRST_STEP_ENV + "'s test")
    parser.add_argument("overrides", nargs="+", help="graphbridge overrides (train.train_iters small)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "sitecustomize.py").write_text(SITECUSTOMIZE)
        moments = Path(scratch) / "moments.json"
        env = {**os.environ, HOLDERS_ENV: str(moments), **({EMPTY_FIRST_STEP_ENV: "1"} if
                                                              args.empty_cache_before_first_step else {}),
               "PYTHONPATH": os.pathsep.join(filter(None, [scratch, str(ROOT), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-m", "perf.main", *args.overrides,
                               f"hydra.run.dir={Path(scratch) / 'job'}"], cwd=ROOT, env=env)
        result_path = Path(scratch) / "job" / "result.json"
        result = json.loads(result_path.read_text()) if result_path.is_file() else {}
        peak = moments.with_name(moments.stem + "_peak.json")
        record = {"overrides": args.overrides, "status": result.get("status"), "memory": result.get("memory"),
                  "moments": json.loads(moments.read_text()) if moments.is_file() else [],
                  "live_at_peak": json.loads(peak.read_text()) if peak.is_file() else None}
    args.out.write_text(json.dumps(record, indent=1))
    for moment in record["moments"]:
        pools = ", ".join(f"{name} {pool['reserved_gib']:.2f} reserved / {pool['allocated_gib']:.2f} allocated"
                          for name, pool in moment["pools"].items())
        print(f"{moment['moment']}: {pools}; default pool stranded {moment['default_stranded_gib']:.2f} GiB in "
              f"{moment['pinned_segments']} segments; by {moment['made_by_totals'][:3]}")
    print("peak:", record["memory"])
    if record["live_at_peak"]:
        print(f"live at the peak ({record['live_at_peak']['peak_allocated_gib']:.2f} GiB of the traced "
              f"{record['live_at_peak']['events']} events):")
        for site in record["live_at_peak"]["by_site"][:12]:
            print(f"  {site['gib']:7.3f} GiB  {site['made_by']}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
