"""The benchmark suite: one command per workload, every variant through the real `graphbridge` CLI in a
fresh process, raw results as JSON under benchmarks/results/ (GPU, versions, the exact commands).

    python benchmarks/suite.py --list
    python benchmarks/suite.py llama_tiny_local qwen3_moe_dropless [--steps 40] [--rounds 3] [--out benchmarks/results]
    python scripts/benchmark_table.py          # the docs table, from the JSON files

Every variant runs ``--steps`` steps with perf.profile=true: the first perf.warmup_steps (3) steps,
the capture step and the 5 profiled steps are left out of the step-time statistics (>= 30 timed at
the default 40), and the profiled steps give the GPU-busy fraction. Per variant: median, p10, p90
step time, GPU-busy, peak allocated and reserved memory, capture time, graphs, and the speedup over
the eager variant of the same workload. A variant that fails is recorded with its status and reason.

A launch-bound step's time follows the host, which drifts between processes and machines (the eager
llama/tiny step measured 44.8 ms in one run and 66.1 ms in the next on the same kind of H100). With
``--rounds N`` every variant runs N times, every other round in reverse order so that drift cancels
in the ratios; a variant's row is its middle round by median step time, with every round's median
and the range of the per-round speedups beside it.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GRAPHBRIDGE = [sys.executable, "-m", "perf.main"]
EAGER = "eager"
RECIPE_DEFAULT = "recipe_default"
"""The variant without a cuda_graph override: what the recipe's preset for the GPU graphs (for Qwen3-30B-A3B
on an H100, Transformer Engine graphs of moe_router and moe_preprocess)."""
FULL_ITERATION_WITH_OPTIMIZER = ("cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true")
AUTO = "auto"
"""The variant that measures the graph choices itself (cuda_graph=auto): its row says what it chose, the probe's
wall time (none when the decision came from the cache) and how its step time compares with the best other
variant of the same run."""
DISTRIBUTED_OPTIMIZER_PROXY = "qwen3_moe_distributed_optimizer"


@dataclass(frozen=True)
class Workload:
    description: str
    base: Tuple[str, ...]
    variants: Dict[str, Tuple[str, ...]]
    gpus: int = 1
    megatron_core: Optional[str] = None
    """The megatron-core releases it measures (a range, bridge.config.releases.in_range); None: all."""


def moe_proxy(recipe: str, gpu: str, *extra: str, experts: Optional[int] = None) -> Tuple[str, ...]:
    """A MoE recipe's layer shapes on one GPU: two layers, one expert-parallel rank, the alltoall dispatcher
    (flex needs TP x EP > 1), four micro-batches per step, no distributed optimizer unless ``extra`` turns it
    back on (one rank has nothing to shard it over, and before megatron-core 0.19 the in-graph optimizer step
    needs it off)."""
    shrink = ("model.num_layers=2", "train.num_gpus=1", "workload.preset_num_gpus=1", "ddp.use_distributed_optimizer=false",
              "model.expert_model_parallel_size=1", "model.tensor_model_parallel_size=1",
              "model.pipeline_model_parallel_size=1", "model.virtual_pipeline_model_parallel_size=null",
              "model.context_parallel_size=1", "model.sequence_parallel=false",
              "model.pipeline_model_parallel_layout=null", "model.moe_token_dispatcher_type=alltoall",
              "model.moe_flex_dispatcher_backend=null", "train.micro_batch_size=1", "train.global_batch_size=4")
    experts_override = (f"model.num_moe_experts={experts}",) if experts else ()
    return (f"recipe={recipe}", f"gpu={gpu}", "precision=bf16", *shrink, *experts_override, *extra)


DROP_AND_PAD = ("model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true",
                "model.moe_router_force_load_balancing=false")
EP2 = ("train.num_gpus=2", "model.expert_model_parallel_size=2", "train.global_batch_size=8")
"""Two expert-parallel ranks, which are data parallel for the rest: four micro-batches a rank, as on one GPU."""
WORKLOADS: Dict[str, Workload] = {
    "llama_tiny_local": Workload(
        "llama/tiny (8 layers, hidden 512, seq 256), megatron-core's local layer spec",
        ("recipe=llama/tiny", "model.transformer_impl=local"),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "local_layer": ("cuda_graph=local_layer",),
         AUTO: ("cuda_graph=auto",)}),
    "llama_tiny_te": Workload(
        "llama/tiny, Transformer Engine layer spec",
        ("recipe=llama/tiny",),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "te_layer": ("cuda_graph=te_layer",),
         "te_attn_mlp": ("cuda_graph=te_attn_mlp",), "te_attn": ("cuda_graph=te_attn",), AUTO: ("cuda_graph=auto",)}),
    "llama32_1b": Workload(
        "llama/llama32_1b as shipped (16 layers, hidden 2048, seq 8192)",
        ("recipe=llama/llama32_1b",),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "te_mlp": ("cuda_graph=te_mlp",), AUTO: ("cuda_graph=auto",)}),  # te_mlp: Bridge's H100 Llama3 scope
    "qwen3_moe_dropless": Workload(
        "Qwen3-30B-A3B layer shapes, 2 layers, 1 GPU, dropless alltoall",
        moe_proxy("qwen/qwen3_30b_a3b", "h100"),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), "te_moe_router": ("cuda_graph=te_moe_router",),
         AUTO: ("cuda_graph=auto",)}),
    "qwen3_moe_drop_and_pad": Workload(
        "the same with drop-and-pad routing (capacity factor 1.0)",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "te_attn_moe_router":
         ("cuda_graph=te_attn_moe_router",), AUTO: ("cuda_graph=auto",)}),
    DISTRIBUTED_OPTIMIZER_PROXY: Workload(
        "the drop-and-pad proxy with the distributed optimizer, as every Bridge perf preset trains; in the graph, "
        "megatron-core's own optimizer graph",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD, "ddp.use_distributed_optimizer=true"),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER}, megatron_core=">=0.19"),
    "qwen3_moe_ep2": Workload(
        "Qwen3-30B-A3B layer shapes, 2 layers, EP=2 over two GPUs (real all-to-all), dropless",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *EP2),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), "te_moe_router": ("cuda_graph=te_moe_router",),
         AUTO: ("cuda_graph=auto",)}, gpus=2),
    "qwen3_moe_ep2_drop_and_pad": Workload(
        "the EP=2 proxy with drop-and-pad routing (capacity factor 1.0): every graph choice it takes",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD, *EP2),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "full_iteration": ("cuda_graph=full_iteration",),
         "te_layer": ("cuda_graph=te_layer",), "te_moe": ("cuda_graph=te_moe",), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), "te_moe_router": ("cuda_graph=te_moe_router",),
         "local_layer": ("cuda_graph=local_layer",), AUTO: ("cuda_graph=auto",)}, gpus=2),
    "qwen3_moe_ep2_distributed_optimizer": Workload(
        "the EP=2 drop-and-pad proxy with the distributed optimizer sharded over both GPUs; in the graph, "
        "megatron-core's own optimizer graph",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD, "ddp.use_distributed_optimizer=true", *EP2),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER,
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), AUTO: ("cuda_graph=auto",)},
        gpus=2, megatron_core=">=0.19"),
    "llama_tiny_dp2": Workload(
        "llama/tiny at data parallel 2 (Transformer Engine spec, gradients all-reduced)",
        ("recipe=llama/tiny", "train.num_gpus=2", "train.global_batch_size=4"),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "te_layer": ("cuda_graph=te_layer",),
         "te_attn_mlp": ("cuda_graph=te_attn_mlp",), "te_attn": ("cuda_graph=te_attn",),
         "local_layer": ("cuda_graph=local_layer",), AUTO: ("cuda_graph=auto",)}, gpus=2),
    "gpt_oss_moe": Workload(
        "GPT-OSS-20B layer shapes (32 experts), 2 layers, 1 GPU",
        moe_proxy("gpt_oss/gpt_oss_20b", "h100"),
        {EAGER: ("cuda_graph=none",), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",)}),
    "deepseek_mla_moe": Workload(
        "DeepSeek-V3 layer shapes (MLA, a dense then a MoE layer, 16 of 256 experts), 1 GPU",
        moe_proxy("deepseek/deepseek_v3", "h100", "model.moe_layer_freq=[0,1]", "model.mtp_num_layers=null",
                  "model.recompute_granularity=null", "model.recompute_modules=null",
                  # the preset's expandable segments need NCCL_GRAPH_REGISTER=0; with 32 experts the weights and
                  # Adam state alone plan 76 GiB, more than an H100 (the run ran out of memory at step 0)
                  "+env_vars.NCCL_GRAPH_REGISTER=0", experts=16),
        {EAGER: ("cuda_graph=none",), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",)}),
}


@dataclass
class Measured:
    command: List[str]
    result: dict = field(default_factory=dict)

    def row(self) -> dict:
        step, memory = self.result.get("step_time_ms") or {}, self.result.get("memory") or {}
        return {"status": self.result.get("status", "missing"), "reason": self.result.get("reason"),
                "effective_impl": self.result.get("effective_impl"), "median_ms": step.get("median"),
                "p10_ms": step.get("p10"), "p90_ms": step.get("p90"), "timed_steps": step.get("count"),
                "gpu_busy": (self.result.get("profile") or {}).get("gpu_busy"),
                "peak_allocated_gb": memory.get("peak_allocated_gb"), "peak_reserved_gb": memory.get("peak_reserved_gb"),
                "estimate_gb": memory.get("estimate_gb"),
                "capture_time_s": self.result.get("capture_time_s"), "graph_count": self.result.get("graph_count"),
                "tflops_per_gpu": self.result.get("tflops_per_gpu"), "command": " ".join(self.command),
                "auto_chosen": (self.result.get("auto") or {}).get("chosen"),
                "auto_probe_s": ((self.result.get("auto") or {}).get("probe") or {}).get("wall_s")}


def run_variant(workload: Workload, overrides: Tuple[str, ...], job_dir: Path, steps: int) -> Measured:
    command = [*GRAPHBRIDGE, *workload.base, *overrides, f"train.train_iters={steps}", "perf.profile=true",
               f"hydra.run.dir={job_dir}"]
    subprocess.run(command, cwd=ROOT, check=False)
    result_path = job_dir / "result.json"
    return Measured(["graphbridge", *command[3:-1]], json.loads(result_path.read_text()) if result_path.is_file() else {})


def run_workload(name: str, steps: int, scratch: Path, rounds: int = 1) -> dict:
    workload = WORKLOADS[name]
    measured: Dict[str, List[Measured]] = {variant: [] for variant in workload.variants}
    for round_index in range(rounds):
        order = list(workload.variants) if round_index % 2 == 0 else list(workload.variants)[::-1]
        for variant in order:
            job_dir = scratch / name / (f"round{round_index + 1}" if rounds > 1 else "") / variant
            measured[variant].append(run_variant(workload, workload.variants[variant], job_dir, steps))
    round_rows = {variant: [run.row() for run in runs] for variant, runs in measured.items()}
    rows = {variant: middle_round(per_round) for variant, per_round in round_rows.items()}
    eager = rows.get(EAGER, {}).get("median_ms")
    for variant, row in rows.items():
        row["speedup"] = eager / row["median_ms"] if eager and row["median_ms"] else None
        if rounds > 1:
            speedups = [e["median_ms"] / v["median_ms"] for e, v in zip(round_rows.get(EAGER, []), round_rows[variant])
                        if e["median_ms"] and v["median_ms"]]
            row["round_medians_ms"] = [run["median_ms"] for run in round_rows[variant]]
            row["speedup_range"] = [min(speedups), max(speedups)] if speedups else None
    if AUTO in rows:
        rows[AUTO]["vs_best"] = against_the_best(rows)
    environment = next((run.result["env"] for runs in measured.values() for run in runs if "env" in run.result), {})
    return {"workload": name, "description": workload.description, "gpus": workload.gpus, "steps": steps,
            "rounds": rounds, "date": time.strftime("%Y-%m-%d"), "gpu": environment.get("gpu"),
            "driver": driver_version(),
            "versions": {key: environment.get(key) for key in ("torch", "megatron_core", "transformer_engine",
                                                                "python")} | {"graphbridge": git_commit()},
            "suite_command": f"python benchmarks/suite.py {name} --steps {steps}"
                             + (f" --rounds {rounds}" if rounds > 1 else ""),
            "variants": rows}


def against_the_best(rows: Dict[str, dict]) -> Optional[float]:
    """The auto variant's median step time over the best other variant's of the same run (issue 30 asks
    within 3 %: at most 1.03); None when either has no median."""
    others = [row["median_ms"] for variant, row in rows.items() if variant != AUTO and row["median_ms"]]
    auto = rows[AUTO]["median_ms"]
    return auto / min(others) if auto and others else None


def middle_round(rows: List[dict]) -> dict:
    """The round whose median step time is the middle one (the lower of two middles), so that its
    spread, GPU-busy and memory come from one run; the last round when none completed."""
    completed = sorted((row for row in rows if row["median_ms"]), key=lambda row: row["median_ms"])
    return dict(completed[(len(completed) - 1) // 2] if completed else rows[-1])


def driver_version() -> Optional[str]:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def git_commit() -> Optional[str]:
    """GRAPHBRIDGE_COMMIT when set (a copied tree's .git may be older than its files, as on the
    device machine), else the checkout's HEAD."""
    if os.environ.get("GRAPHBRIDGE_COMMIT"):
        return os.environ["GRAPHBRIDGE_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout.strip() or None


def other_release(workload: Workload) -> Optional[str]:
    """The installed megatron-core release when the workload does not measure it, else None."""
    if workload.megatron_core is None:
        return None
    sys.path.insert(0, str(ROOT))
    from bridge.machine import probe
    from bridge.config.releases import in_range

    installed = probe().version("megatron-core")
    return None if installed and in_range(installed, workload.megatron_core) else installed or "none"


def result_name(record: dict) -> str:
    gpu = (record.get("gpu") or "cpu").lower().replace("nvidia ", "").split()[0]
    mcore = record["versions"].get("megatron_core") or "none"
    return f"{record['workload']}_{gpu}_mcore{mcore}.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", help="names from --list")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=1, help="runs of every variant, in alternating order")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/graphbridge-suite"))
    args = parser.parse_args(argv)
    unknown = [name for name in args.workloads if name not in WORKLOADS]
    if args.list or not args.workloads or unknown:
        for name, workload in WORKLOADS.items():
            print(f"{name:24} {workload.gpus} GPU  {workload.description}: {', '.join(workload.variants)}")
        return 2 if unknown else 0
    starts = subprocess.run([*GRAPHBRIDGE, "--help"], cwd=ROOT, capture_output=True, text=True)
    if starts.returncode != 0:
        reason = (starts.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"graphbridge does not start here ({reason}): install it (README) before measuring", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    unmeasured = []
    for name in args.workloads:
        release = other_release(WORKLOADS[name])
        if release:
            print(f"{name}: measures megatron-core {WORKLOADS[name].megatron_core}, and {release} is installed; skipped")
            continue
        record = run_workload(name, args.steps, args.scratch / time.strftime("%H%M%S"), args.rounds)
        if not any(row["status"] == "completed" for row in record["variants"].values()):
            print(f"{name}: no variant completed; nothing written (the job logs are under {args.scratch})")
            unmeasured.append(name)
            continue
        (args.out / result_name(record)).write_text(json.dumps(record, indent=2) + "\n")
        print(f"{name}: " + ", ".join(f"{v} {r['median_ms'] or float('nan'):.2f} ms ({r['status']})"
                                      for v, r in record["variants"].items()), flush=True)
    print(f"python {platform.python_version()}; results in {args.out}")
    return 1 if unmeasured else 0


if __name__ == "__main__":
    sys.exit(main())
