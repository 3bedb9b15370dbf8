"""The plan's memory estimate (bridge.memory) against the peaks measured on GPUs, and what the plan
says with it."""

import json
import shlex
from pathlib import Path

import pytest

import bridge
from bridge.memory import GPU_MEMORY_GB, estimate_memory

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
H200_LOCAL = "docs/benchmarks.md, One H200: megatron engine (benchmarks/megatron_graphs.py), peak MiB / 1024"


def suite_rows():
    """(overrides, measured peak GiB, source) of every completed row the benchmark suite committed."""
    for path in sorted(RESULTS.glob("*.json")):
        for name, row in json.loads(path.read_text())["variants"].items():
            if row["status"] == "completed" and row["peak_allocated_gb"]:
                yield shlex.split(row["command"])[1:], row["peak_allocated_gb"], f"{path.name} {name}"


def side_by_side_rows():
    """(overrides, measured peak GiB, source) of graphbridge's side of every completed row
    benchmarks/vs_bridge.py committed: its job's recipe and overrides as it ran them."""
    for path in sorted((RESULTS / "vs_bridge").glob("*.json")):
        for row in json.loads(path.read_text())["rows"]:
            ours = row["graphbridge"]
            if ours["status"] == "completed":
                overrides = [f"recipe={ours['job']['choices']['recipe']}", *ours["job"]["overrides"]]
                yield overrides, ours["memory"]["peak_allocated_gb"], f"vs_bridge/{path.name} {row['row']}"


# Measured torch.cuda.max_memory_allocated in GiB (result.json's memory.peak_allocated_gb), one GPU:
# (overrides, measured, source): the suite's rows as committed, and the rows docs/benchmarks.md holds.
ROWS = [
    *suite_rows(),
    *side_by_side_rows(),
    (["recipe=llama/tiny", "cuda_graph=local_layer"], 0.69,
     "docs/benchmarks.md, H100 graph scopes through the CLI (peak alloc GB)"),
    (["recipe=llama/tiny", "model.transformer_impl=local"], 648 / 1024, H200_LOCAL),
    (["recipe=llama/tiny", "model.transformer_impl=local", "cuda_graph=local_layer"], 739 / 1024, H200_LOCAL),
    (["recipe=llama/tiny", "model.transformer_impl=local", "cuda_graph=full_iteration"], 711 / 1024, H200_LOCAL),
    (["recipe=llama/tiny", "model.transformer_impl=local", "cuda_graph=full_iteration",
      "optimizer.optimizer_in_graph=true"], 815 / 1024, H200_LOCAL),
    (["recipe=llama/tiny", "cuda_graph=full_iteration", "model.transformer_impl=transformer_engine"], 700 / 1024,
     H200_LOCAL),
]


MEASURED = [pytest.param(*row, id=row[2]) for row in ROWS]


def test_the_suite_has_rows_to_check():
    assert len(list(suite_rows())) >= 12 and len(list(side_by_side_rows())) >= 8


@pytest.mark.parametrize("overrides, measured, source", MEASURED)
def test_the_estimate_is_within_15_percent_of_the_measured_peak(overrides, measured, source):
    estimate = estimate_memory(bridge.load(overrides)).total_gib
    assert abs(estimate - measured) <= 0.15 * measured, (
        f"{estimate:.3f} GiB estimated, {measured:.3f} measured ({source})")


def test_a_full_iteration_graph_holds_the_activations_once():
    """Its pool holds the step's activations; they are not allocated twice (Qwen3 proxy on an H100:
    35.11 GiB full_iteration against 35.05 eager)."""
    def total(*overrides):
        return estimate_memory(bridge.load(["recipe=llama/llama3_8b", "gpu=h100", *overrides])).total_gib

    assert total("cuda_graph=full_iteration") - total("cuda_graph=none") < 0.1


def test_graphs_cost_memory_and_the_optimizer_in_the_graph_costs_more():
    def graphs(*overrides):
        return estimate_memory(bridge.load(["recipe=llama/tiny", *overrides])).graphs_gib

    assert graphs() == 0
    assert 0 < graphs("cuda_graph=te_attn") < graphs("cuda_graph=te_attn_mlp") == graphs("cuda_graph=te_layer")
    assert graphs("cuda_graph=full_iteration") < graphs("cuda_graph=full_iteration",
                                                        "optimizer.optimizer_in_graph=true")


def test_parallelism_and_recompute_shrink_what_one_gpu_holds():
    base = ["recipe=llama/tiny", "train.num_gpus=4"]

    def estimate(*overrides):
        return estimate_memory(bridge.load([*base, *overrides]))

    plain = estimate()
    assert estimate("ddp.use_distributed_optimizer=true").optimizer_gib == pytest.approx(plain.optimizer_gib / 4)
    tp = estimate("model.tensor_model_parallel_size=4", "model.sequence_parallel=true")
    assert tp.weights_gib < plain.weights_gib / 3 and tp.activations_gib < plain.activations_gib / 3
    full = estimate("model.recompute_granularity=full", "model.recompute_method=uniform",
                    "model.recompute_num_layers=1")
    assert full.activations_gib < plain.activations_gib / 2


def test_the_plan_says_whether_it_fits(cli, tmp_path):
    result = cli("mode=plan", "gpu=h100", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("  memory:"))
    assert "GiB per GPU" in line and "fits in 75 GiB (h100" in line and "does not fit" not in line
    squeezed = cli("mode=plan", "plan.format=json", "gpu=h100", "model.num_layers=400", "model.hidden_size=4096",
                   "model.ffn_hidden_size=11008", "model.num_attention_heads=32", "model.num_query_groups=8",
                   cwd=tmp_path)
    assert squeezed.returncode == 0, squeezed.stderr
    memory = json.loads(squeezed.stdout)["memory"]
    assert memory["fits"] is False and memory["capacity_gib"] == pytest.approx(GPU_MEMORY_GB["h100"] * 1e9 / 2**30)
    assert memory["total_gib"] > 0.9 * memory["capacity_gib"]


def test_h200_plans_a_recipe_with_its_h100_preset_against_141_gb(cli, tmp_path):
    result = cli("mode=plan", "plan.format=json", "recipe=llama/llama3_70b", "gpu=h200", "precision=fp8_cs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["valid"] and plan["config"]["workload"]["gpu"] == "h200"
    assert plan["config"]["model"]["pipeline_model_parallel_size"] == 8   # the H100 FP8 preset's layout
    assert plan["memory"]["gpu"] == "h200" and plan["memory"]["capacity_gib"] == pytest.approx(141e9 / 2**30)


@pytest.mark.parametrize("recipe, precision", [("llama/llama3_8b", "bf16"), ("llama/llama3_70b", "bf16"),
                                               ("llama/llama3_70b", "fp8_cs")])
def test_bridges_h100_presets_are_not_judged_too_big_for_the_h100s_they_run_on(recipe, precision):
    cfg = bridge.load([f"recipe={recipe}", "gpu=h100", f"precision={precision}"])
    assert cfg.ddp.use_distributed_optimizer  # as in every Bridge recipe: the Adam state sharded over DP
    estimate = estimate_memory(cfg)
    assert estimate.verdict in ("fits", "tight"), estimate.to_text()


def test_an_estimate_inside_the_headroom_is_tight(cli, tmp_path):
    result = cli("mode=plan", "recipe=llama/llama3_8b", "gpu=h100", "dataset.seq_length=12288", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("  memory:"))
    assert ": tight in 75 GiB (h100): above the 90% a job can count on" in line
