"""The workloads record (issue 83): each workload Megatron-Bridge's recipes name and graphbridge now trains, eager and
graphed, through the benchmark suite (benchmarks/suite.py), in one file a GPU and release:

    python benchmarks/workloads.py [WORKLOAD...] [--steps 40] [--rounds 1] [--out DIR]   # DIR/workloads.json

Named workloads (default: every one of RECORDED) are measured into the record already at DIR/workloads.json, whose
other workloads keep their rows (each workload's record names the commit and command that measured it).

A row a variant: status, first and last loss, median step time, peak reserved memory and parameters (total and
trainable); beside the rows, each workload's whole suite record. The file is written (atomically) after every
workload, so a block cut off keeps the workloads it finished. Exit 1 when a workload was refused on this machine
or none of its variants completed."""

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Dict, List

import suite
from suite_workloads import WORKLOADS

RECORDED = ("llama_tiny_lora", "llama_tiny_packed", "llama_tiny_fsdp", "llama3_70b_lora", "llama3_70b_gb200_fsdp")
"""The workloads of the record: tiny LoRA, packed tiny SFT, tiny Megatron-FSDP, Llama 3 70B LoRA's H100 preset and
its GB200 FSDP preset at one GPU."""
ROW_KEYS = ("status", "reason", "loss", "median_ms", "peak_reserved_gb", "parameters", "graph_count", "speedup")


def rows(records: Dict[str, dict]) -> List[dict]:
    """One row a variant of every measured workload."""
    return [{"workload": name, "variant": variant, **{key: row.get(key) for key in ROW_KEYS}}
            for name, record in records.items() for variant, row in record.get("variants", {}).items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD", help=f"of {', '.join(RECORDED)} (default: all)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=suite.RESULTS)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/graphbridge-workloads"))
    args = parser.parse_args(argv)
    unknown = sorted(set(args.workloads) - set(RECORDED))
    if unknown:
        parser.error(f"no such workload: {', '.join(unknown)}; the record's are {', '.join(RECORDED)}")
    args.workloads = args.workloads or list(RECORDED)
    command = f"python benchmarks/workloads.py --steps {args.steps} --rounds {args.rounds}"
    path = args.out / "workloads.json"
    earlier = json.loads(path.read_text()) if path.is_file() else {"records": {}, "refused": {}}
    records: Dict[str, dict] = {name: record for name, record in earlier["records"].items()
                                if name in RECORDED and name not in args.workloads}
    refused: Dict[str, str] = {name: why for name, why in earlier["refused"].items() if name not in args.workloads}

    def save() -> None:
        ordered = {name: records[name] for name in RECORDED if name in records}
        suite.write_json_atomic(path, {
            "command": command, "workloads": list(RECORDED), "refused": refused, "rows": rows(ordered),
            "records": ordered})

    args.out.mkdir(parents=True, exist_ok=True)
    for name in [name for name in RECORDED if name in args.workloads]:
        refusal = suite.cannot_run_here(WORKLOADS[name], args.steps)
        if refusal:
            print(f"{name}: {refusal}; not measured", flush=True)
            refused[name] = refusal
            continue
        records[name] = suite.run_workload(name, args.steps, args.scratch / time.strftime("%H%M%S"), args.rounds)
        save()
        print(f"{name}: " + ", ".join(f"{variant} {row['status']}" for variant, row in records[name]["variants"].items()),
              flush=True)
    save()
    return 1 if refused or not all(suite.has_completed(record) for record in records.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
