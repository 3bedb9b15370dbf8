"""The GPU differential's two launchers side by side: the same witness cases (benchmarks/differential_witnesses.py)
trained at the same time by fresh processes (the CLI, as a user runs it) on some GPUs and by the preloaded launcher
(forked from one process that imported torch, TE and megatron-core: perf/preloaded.py) on others, or on the
same ones where the machine has too few (at once, so that each meets the other's load). Says how long each
case took under each, whether the preloaded runs ended as the fresh ones did with the same losses, and exits 1
where they did not, so that a GPU block uses the preloaded launcher only where it holds:

    python benchmarks/launchers.py --gpus 2 --devices 0,1 2,3 --out launchers_2gpu.json \\
        --witnesses moe_tp_with_sp local_layer_pp2_1_microbatches
    bash scripts/gpu_check.sh launchers2 LABEL...   # on the GPU machine, into $OUT/mcore-<release>/
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bridge.atomic import write_json_atomic  # noqa: E402
from gpu_differential import LOSS_TOLERANCE, max_relative_gap  # noqa: E402

LAUNCHERS = {"process": 20000, "preloaded": 26000}
"""Each launcher's first rendezvous port: apart, and below the kernel's ephemeral ports (differential_launch)."""


def compared(records: Dict[str, dict]) -> dict:
    """Case by case, each launcher's status and seconds, and the largest relative gap between their losses."""
    runs = {launcher: {run["label"]: run for run in record["runs"] if run["kind"] == "witness"}
            for launcher, record in records.items()}
    cases = []
    for label, fresh in runs["process"].items():
        forked = runs["preloaded"].get(label, {})
        cases.append({"label": label, "process": [fresh["status"], fresh["seconds"]],
                      "preloaded": [forked.get("status"), forked.get("seconds")],
                      "max_relative_loss_gap": max_relative_gap(forked.get("losses", []), fresh["losses"])})
    both = [case for case in cases if case["process"][0] == case["preloaded"][0] == "completed"]
    differ = [case["label"] for case in cases
              if case["process"][0] == "completed" and case["preloaded"][0] != "completed"
              or case["max_relative_loss_gap"] is not None and case["max_relative_loss_gap"] > LOSS_TOLERANCE]
    medians = {launcher: statistics.median(case[launcher][1] for case in both) if both else None
               for launcher in LAUNCHERS}
    return {"cases": cases, "trained_by_both": len(both), "median_seconds": medians,
            "speedup": medians["process"] / medians["preloaded"] if both else None,
            "loss_tolerance": LOSS_TOLERANCE, "preloaded_differs": differ, "holds": bool(both) and not differ}


def train_side_by_side(args: argparse.Namespace, passed: List[str]) -> Dict[str, Path]:
    """Both launchers at once, each on its own GPUs: a gpu_differential.py of the witness cases alone."""
    outputs, children = {}, []
    for (launcher, port), devices in zip(LAUNCHERS.items(), args.devices):
        outputs[launcher] = args.out.with_name(f"launcher_{launcher}_{args.gpus}gpu.json")
        command = [sys.executable, str(ROOT / "benchmarks" / "gpu_differential.py"), "--gpus", str(args.gpus),
                   "--count", "0", "--witnesses", *args.witnesses, "--workers", str(len(args.witnesses)),
                   "--launcher", launcher, "--port-base", str(port), *passed, "--out", str(outputs[launcher])]
        children.append(subprocess.Popen(command, env={**os.environ, "CUDA_VISIBLE_DEVICES": devices}))
    for child in children:
        child.wait()
    return outputs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1, help="GPUs each case trains on")
    parser.add_argument("--devices", nargs=2, default=["0", "1"], metavar="CUDA_VISIBLE_DEVICES",
                        help="the fresh processes' GPUs, then the preloaded launcher's")
    parser.add_argument("--witnesses", nargs="+", required=True, metavar="LABEL")
    parser.add_argument("--out", type=Path, required=True)
    args, passed = parser.parse_known_args()  # the rest (--deadline-s, --run-env) goes to gpu_differential.py
    outputs = train_side_by_side(args, passed)
    missing = [str(path) for path in outputs.values() if not path.exists()]
    if missing:
        print(f"no record from {', '.join(missing)}; its output above says why", file=sys.stderr)
        return 1
    records = {launcher: json.loads(path.read_text()) for launcher, path in outputs.items()}
    result = {"summary": {**{key: records["process"]["summary"][key] for key in
                             ("megatron_core", "transformer_engine", "torch", "gpu", "commit")},
                          "num_gpus": args.gpus, "command": " ".join(["python", *sys.argv])},
              **compared(records)}
    write_json_atomic(args.out, result)
    for case in result["cases"]:
        print(f"{case['label']:<48} process {case['process']}  preloaded {case['preloaded']}  "
              f"loss gap {case['max_relative_loss_gap']}")
    print(f"median s {result['median_seconds']}, speedup {result['speedup']}, holds {result['holds']}")
    return 0 if result["holds"] else 1


if __name__ == "__main__":
    sys.exit(main())
