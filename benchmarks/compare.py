"""Side-by-side step-time comparison of graphbridge jobs, measured in one run.

Each variant is a set of Hydra overrides on top of shared ones; every job runs through the real
`graphbridge` command (a fresh process each), rounds alternate the order of variants to cancel
drift, and the table gives each variant's median step time (median over rounds of the per-job
medians), its ratio to the first variant, and peak memory against it.

    python benchmarks/compare.py --set torch_engine --rounds 2
    python benchmarks/compare.py --common recipe=llama/tiny engine=torch \\
        --variant eager=cuda_graph=none --variant full=cuda_graph=full_iteration

The torch_engine set produces the torch-engine numbers in docs/benchmarks.md (llama/tiny: 8
layers, hidden 512, seq 256, micro-batch 2); benchmarks/suite.py the megatron ones.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

TINY = ["recipe=llama/tiny", "train.train_iters=60"]
SETS: Dict[str, Dict[str, List[str]]] = {
    "torch_engine": {
        "eager": ["engine=torch", "cuda_graph=none"],
        "full_iteration (optimizer inside)": ["engine=torch", "cuda_graph=full_iteration"],
        "local_layer": ["engine=torch", "cuda_graph=local_layer"],
        "torch.compile default": ["engine=torch", "cuda_graph=none", "torch_compile=default"],
        "torch.compile reduce-overhead": ["engine=torch", "cuda_graph=none", "torch_compile=reduce-overhead"],
        "megatron full_iteration": ["engine=megatron", "cuda_graph=full_iteration"],
    },
}


def run_job(overrides: List[str], job_dir: Path) -> dict:
    command = [sys.executable, "-m", "perf.main", *overrides, f"hydra.run.dir={job_dir}"]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    result_file = job_dir / "result.json"
    if not result_file.is_file():
        return {"status": "no result", "reason": completed.stderr.strip().splitlines()[-1:]}
    return json.loads(result_file.read_text())


def compare(common: List[str], variants: Dict[str, List[str]], rounds: int, workdir: Path) -> List[dict]:
    names = list(variants)
    medians: Dict[str, List[float]] = {name: [] for name in names}
    peaks: Dict[str, List[float]] = {name: [] for name in names}
    notes: Dict[str, str] = {}
    for round_index in range(rounds):
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            job_dir = workdir / f"r{round_index}_{names.index(name)}"
            result = run_job(common + variants[name], job_dir)
            step = (result.get("step_time_ms") or {}).get("median")
            if result.get("status") != "completed" or step is None:
                notes[name] = f"{result.get('status')}: {result.get('reason')}"
                continue
            medians[name].append(step)
            peak = (result.get("memory") or {}).get("peak_allocated_gb")
            if peak is not None:
                peaks[name].append(peak)
            print(f"  round {round_index} {name}: {step:.2f} ms ({result.get('effective_impl')}, "
                  f"{result.get('env', {}).get('gpu')})", flush=True)
    base = names[0]
    base_ms = statistics.median(medians[base]) if medians[base] else None
    base_peak = statistics.median(peaks[base]) if peaks[base] else None
    rows = []
    for name in names:
        ms = statistics.median(medians[name]) if medians[name] else None
        peak = statistics.median(peaks[name]) if peaks[name] else None
        rows.append({
            "variant": name, "median_ms": ms,
            "speedup": base_ms / ms if ms and base_ms else None,
            "peak_gb": peak, "memory_vs_first": peak / base_peak if peak and base_peak else None,
            "note": notes.get(name, ""),
        })
    return rows


def markdown(rows: List[dict]) -> str:
    def fmt(value, spec, unit=""):
        return "n/a" if value is None else format(value, spec) + unit

    lines = ["| variant | step time (ms) | speedup vs first | peak memory (GB) | memory vs first | note |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['variant']} | {fmt(r['median_ms'], '.2f')} | {fmt(r['speedup'], '.2f', 'x')} | "
              f"{fmt(r['peak_gb'], '.2f')} | {fmt(r['memory_vs_first'], '.2f', 'x')} | {r['note']} |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), help="a predefined variant set (on llama/tiny)")
    parser.add_argument("--common", nargs="*", default=[], help="overrides shared by every variant")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=OVERRIDE[,OVERRIDE]")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if args.set:
        common, variants = TINY + args.common, SETS[args.set]
    elif args.variant:
        common = args.common
        variants = {spec.split("=", 1)[0]: spec.split("=", 1)[1].split(",") for spec in args.variant}
    else:
        parser.error("give --set or at least one --variant")
    with tempfile.TemporaryDirectory(prefix="graphbridge-compare-") as workdir:
        rows = compare(common, variants, args.rounds, Path(workdir))
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
