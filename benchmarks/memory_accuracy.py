"""The plan's memory estimate against what one GPU reserves: one-GPU jobs at the recipes' own widths (fewer layers),
eager and graphed, each through the real `graphbridge` CLI in a fresh process.

    python benchmarks/memory_accuracy.py --out benchmarks/results/h200/mcore-0.19.2/memory_accuracy.json
    python benchmarks/memory_accuracy.py --list
    python benchmarks/memory_accuracy.py --re-estimate benchmarks/results/h200/mcore-0.19.2/memory_accuracy.json
    python scripts/memory_table.py      # docs/memory.md's table, from the records

Per row: the overrides, the plan's estimate (``plan.format=json``'s memory.total_gib, the estimate of peak reserved
memory, and its terms), the run's peak allocated and peak reserved memory (result.json), the estimate's error
against the reserved peak, and for a graphed row ``reserved_vs_eager``: its reserved peak over its eager twin's.
Several jobs share the GPU at once where their estimates leave room (the allocator's figures are per process);
the record is rewritten atomically after every row. ``--re-estimate`` (on any machine) gives a record's measured
rows the estimate bridge/memory makes now, and names the commit in ``summary.estimated_at``: the jobs do not depend
on the estimate, so after a change to bridge/memory the record shows it against the same peaks until the GPU
measures them again.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import bridge  # noqa: E402
from bridge.atomic import write_json_atomic  # noqa: E402
from bridge.machine import cuda_gpus, installed_version  # noqa: E402
from bridge.memory import estimate_memory  # noqa: E402
from suite import driver_version, git_commit, stop_session, tail  # noqa: E402
from suite_workloads import DROP_AND_PAD, ONE_GPU, moe_proxy  # noqa: E402

STEPS = 8
"""Three eager warmup steps, the capture step and four replays: every graph's pool exists before the last step."""
JOB_TIMEOUT_S = 600.0
SHARE = 0.85
"""The part of the GPU the jobs running at once may plan to reserve between them."""


@dataclass(frozen=True)
class Case:
    overrides: Tuple[str, ...]
    eager_twin: Optional[str] = None
    """The row this one is the graphed twin of."""


LLAMA32_1B = ("recipe=llama/llama32_1b", "gpu=h100", "model.num_layers=4")
LOCAL = ("model.transformer_impl=local", "dataset.seq_length=2048", "model.masked_softmax_fusion=false")
"""The local spec's fused softmax needs apex's compiled kernels, which the GPU machine has not."""
LLAMA3_8B = ("recipe=llama/llama3_8b", "gpu=h100", "precision=bf16", "model.num_layers=2", *ONE_GPU,
             "train.micro_batch_size=1", "train.global_batch_size=2")
QWEN3 = moe_proxy("qwen/qwen3_30b_a3b", "h100")
CASES: Dict[str, Case] = {
    "llama32_1b_eager": Case((*LLAMA32_1B, "cuda_graph=none")),
    "llama32_1b_full_iteration": Case((*LLAMA32_1B, "cuda_graph=full_iteration"), "llama32_1b_eager"),
    "llama32_1b_full_iteration_optimizer": Case(
        # graphbridge's own capturable AdamW in the graph: megatron-core's optimizer graph (the distributed
        # optimizer's) needs Transformer Engine >= 2.14
        (*LLAMA32_1B, "cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true",
         "ddp.use_distributed_optimizer=false"), "llama32_1b_eager"),
    "llama32_1b_te_attn_mlp": Case((*LLAMA32_1B, "cuda_graph=te_attn_mlp"), "llama32_1b_eager"),
    # megatron-core's local spec has no fused attention: its attention scores grow with the square of the sequence
    "llama32_1b_local_eager": Case((*LLAMA32_1B, *LOCAL, "cuda_graph=none")),
    "llama32_1b_local_layer": Case((*LLAMA32_1B, *LOCAL, "cuda_graph=local_layer"), "llama32_1b_local_eager"),
    # the local spec's score terms at twice the depth (the stranded segment a layer) and twice the sequence (s x s)
    "llama32_1b_local_eager_8_layers": Case(("recipe=llama/llama32_1b", "gpu=h100", "model.num_layers=8", *LOCAL,
                                             "cuda_graph=none")),
    "llama32_1b_local_eager_seq_4096": Case((*LLAMA32_1B, "model.transformer_impl=local", "dataset.seq_length=4096",
                                             "model.masked_softmax_fusion=false", "cuda_graph=none")),
    # the same at another width, heads and vocabulary-sized tensors alike: does what the torch softmax leaves cached
    # stop at the ceiling the 1B rows showed (LOCAL_SOFTMAX_CACHED_MAX_BYTES) at this width too?
    "llama3_8b_local_eager": Case((*LLAMA3_8B, *LOCAL, "cuda_graph=none")),
    "llama32_1b_selective_recompute": Case((*LLAMA32_1B, "cuda_graph=none", "dataset.seq_length=4096",
                                            "train.micro_batch_size=2", "model.recompute_granularity=selective")),
    "llama32_1b_distributed_optimizer": Case((*LLAMA32_1B, "cuda_graph=none", "ddp.use_distributed_optimizer=true")),
    "llama32_1b_fp8_eager": Case((*LLAMA32_1B, "precision=fp8_cs", "cuda_graph=none")),
    "llama32_1b_fp8_full_iteration": Case((*LLAMA32_1B, "precision=fp8_cs", "cuda_graph=full_iteration"),
                                          "llama32_1b_fp8_eager"),
    "llama3_8b_eager": Case((*LLAMA3_8B, "cuda_graph=none")),
    "llama3_8b_te_mlp": Case((*LLAMA3_8B, "cuda_graph=te_mlp"), "llama3_8b_eager"),
    "qwen3_moe_alltoall_eager": Case((*QWEN3, "cuda_graph=none")),
    "qwen3_moe_allgather_eager": Case((*QWEN3, "cuda_graph=none", "model.moe_token_dispatcher_type=allgather")),
    "qwen3_moe_te_attn_moe_router": Case((*QWEN3, "cuda_graph=te_attn_moe_router"), "qwen3_moe_alltoall_eager"),
    "qwen3_moe_drop_and_pad_eager": Case((*QWEN3, *DROP_AND_PAD, "cuda_graph=none")),
    "qwen3_moe_drop_and_pad_full_iteration": Case((*QWEN3, *DROP_AND_PAD, "cuda_graph=full_iteration"),
                                                  "qwen3_moe_drop_and_pad_eager"),
    "gpt_oss_moe_eager": Case((*moe_proxy("gpt_oss/gpt_oss_20b", "h100"), "cuda_graph=none")),
    "deepseek_mla_moe_eager": Case((*moe_proxy("deepseek/deepseek_v3", "h100", "model.moe_layer_freq=[0,1]",
                                               "model.mtp_num_layers=null", "model.recompute_granularity=null",
                                               "model.recompute_modules=null", "+env_vars.NCCL_GRAPH_REGISTER=0",
                                               experts=16), "cuda_graph=none")),
}


def estimate_of(case: Case) -> dict:
    """The plan's estimate of the job's peak reserved memory, and its terms."""
    estimate = estimate_memory(bridge.load(list(case.overrides)))
    return {"estimate_gib": round(estimate.graphbridge_gib, 3),
            "terms": {key: round(value, 3) if isinstance(value, float) else value
                      for key, value in estimate.as_dict().items()}}


def start(name: str, case: Case, scratch: Path) -> Tuple[subprocess.Popen, Path, object]:
    job_dir = scratch / name
    log = open(scratch / f"{name}.log", "wb")
    command = [sys.executable, "-m", "perf.main", *case.overrides, f"train.train_iters={STEPS}",
               f"hydra.run.dir={job_dir}"]
    return subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), \
        job_dir, log


def measured_row(name: str, case: Case, job_dir: Path, wall_s: float, planned: dict) -> dict:
    result_path = job_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    memory = result.get("memory") or {}
    row = {"name": name, "overrides": list(case.overrides) + [f"train.train_iters={STEPS}"],
           "status": result.get("status", "no result"), "reason": result.get("reason"),
           "eager_twin": case.eager_twin, **planned,
           "peak_allocated_gib": memory.get("peak_allocated_gb"), "peak_reserved_gib": memory.get("peak_reserved_gb"),
           "wall_s": round(wall_s, 1)}
    if row["status"] != "completed":
        row["log_tail"] = tail(job_dir.with_name(job_dir.name + ".log"))
    if row["peak_reserved_gib"]:
        row["estimate_vs_reserved"] = round(row["estimate_gib"] / row["peak_reserved_gib"], 3)
    return row


def with_twins(rows: Dict[str, dict]) -> None:
    """reserved_vs_eager of every graphed row whose eager twin completed."""
    for row in rows.values():
        twin = rows.get(row["eager_twin"] or "")
        if twin and row.get("peak_reserved_gib") and twin.get("peak_reserved_gib"):
            row["reserved_vs_eager"] = round(row["peak_reserved_gib"] / twin["peak_reserved_gib"], 3)


def run_cases(names: List[str], capacity_gib: float, save) -> Dict[str, dict]:
    """Every case, as many at once as their estimates (doubled for a graphed one: its pool was not yet measured
    when this ran) leave room for in SHARE of the GPU; the largest first."""
    planned = {name: estimate_of(CASES[name]) for name in names}

    def charge(name: str) -> float:
        return planned[name]["estimate_gib"] * (2.0 if CASES[name].eager_twin else 1.2) + 1.0

    pending = sorted(names, key=charge, reverse=True)
    running: Dict[str, tuple] = {}
    rows: Dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="memory_accuracy_") as scratch:
        while pending or running:
            in_use = sum(charge(name) for name in running)
            for name in list(pending):
                if not running or in_use + charge(name) <= SHARE * capacity_gib:
                    running[name] = (*start(name, CASES[name], Path(scratch)), time.monotonic())
                    in_use += charge(name)
                    pending.remove(name)
            time.sleep(2)
            for name, (process, job_dir, log, started) in list(running.items()):
                if process.poll() is None and time.monotonic() - started < JOB_TIMEOUT_S:
                    continue
                if process.poll() is None:
                    stop_session(process)
                log.close()
                rows[name] = measured_row(name, CASES[name], job_dir, time.monotonic() - started, planned[name])
                del running[name]
                with_twins(rows)
                save(rows)
                print(row_line(rows[name]), flush=True)
    return rows


def re_estimate(record_path: Path) -> int:
    """The record's rows with today's estimate against their measured peaks (the module's docstring)."""
    record = json.loads(record_path.read_text())
    for row in record["rows"]:
        row.update(estimate_of(Case(tuple(row["overrides"]))))
        if row.get("peak_reserved_gib"):
            row["estimate_vs_reserved"] = round(row["estimate_gib"] / row["peak_reserved_gib"], 3)
        print(row_line(row) if row["status"] == "completed" else f"{row['name']:<40} {row['status']}")
    record["summary"]["estimated_at"] = git_commit()
    write_json_atomic(record_path, record)
    return 0


def row_line(row: dict) -> str:
    if row["status"] != "completed":
        return f"{row['name']:<40} {row['status']}: {row['reason']}"
    twin = f", {row['reserved_vs_eager']:.2f}x its eager twin" if "reserved_vs_eager" in row else ""
    return (f"{row['name']:<40} estimate {row['estimate_gib']:6.2f} GiB, reserved {row['peak_reserved_gib']:6.2f}, "
            f"allocated {row['peak_allocated_gib']:6.2f} ({row['estimate_vs_reserved']:.2f} of reserved{twin}); "
            f"{row['wall_s']:.0f} s")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="the cases to run (default: all)")
    parser.add_argument("--out", type=Path, help="the record (JSON)")
    parser.add_argument("--list", action="store_true", help="print the cases and their estimates, and stop")
    parser.add_argument("--re-estimate", type=Path, metavar="RECORD",
                        help="give RECORD's rows today's estimate against their measured peaks, and stop")
    args = parser.parse_args(argv)
    if args.re_estimate:
        return re_estimate(args.re_estimate)
    names = args.cases or list(CASES)
    unknown = [name for name in names if name not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; --list shows them")
    if args.list:
        for name in names:
            print(f"{name:<40} ~{estimate_of(CASES[name])['estimate_gib']:6.2f} GiB  {' '.join(CASES[name].overrides)}")
        return 0
    gpus = cuda_gpus()
    if not gpus or not args.out:
        parser.error("needs a CUDA GPU and --out")
    summary = {"commit": git_commit(), "date": date.today().isoformat(), "gpu": gpus[0].name,
               "gpu_memory_gib": round(gpus[0].memory_bytes / 2 ** 30, 1), "driver": driver_version(),
               "versions": {package: installed_version(package) for package in
                            ("torch", "megatron-core", "transformer-engine")} | {"python": platform.python_version()},
               "steps": STEPS, "command": " ".join(["python", "benchmarks/memory_accuracy.py", *sys.argv[1:]])}

    def save(rows: Dict[str, dict]) -> None:
        write_json_atomic(args.out, {"summary": summary, "rows": [rows[name] for name in names if name in rows]})

    rows = run_cases(names, summary["gpu_memory_gib"], save)
    failed = [name for name, row in rows.items() if row["status"] != "completed"]
    print(f"{len(rows) - len(failed)} of {len(rows)} completed; record: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
