"""The plan's memory estimate (bridge.memory) against the peaks measured on GPUs, and what the plan
says with it."""

import json

import pytest

import bridge
from bridge.memory import GPU_MEMORY_GB, estimate_memory

H100_SUITE = "benchmarks/results/llama_tiny_te_h100_mcore0.16.1.json (python benchmarks/suite.py llama_tiny_te)"
H200_LOCAL = "docs/benchmarks.md, One H200: megatron engine (benchmarks/megatron_graphs.py), peak MiB / 1024"
# Measured torch.cuda.max_memory_allocated in GiB (result.json's memory.peak_allocated_gb), llama/tiny, one GPU:
# (overrides, measured, source). All rows the suite and docs/benchmarks.md hold are of this one shape.
MEASURED = [
    ([], 0.6156, H100_SUITE),
    (["cuda_graph=full_iteration"], 0.6835, H100_SUITE),
    (["cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true"], 0.7714, H100_SUITE),
    (["cuda_graph=te_layer"], 0.7094, H100_SUITE),
    (["cuda_graph=te_attn_mlp"], 0.7094, H100_SUITE),
    (["cuda_graph=te_attn"], 0.6456, H100_SUITE),
    (["cuda_graph=local_layer"], 0.69, "docs/benchmarks.md, H100 graph scopes through the CLI (peak alloc GB)"),
    (["model.transformer_impl=local"], 648 / 1024, H200_LOCAL),
    (["model.transformer_impl=local", "cuda_graph=local_layer"], 739 / 1024, H200_LOCAL),
    (["model.transformer_impl=local", "cuda_graph=full_iteration"], 711 / 1024, H200_LOCAL),
    (["model.transformer_impl=local", "cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true"],
     815 / 1024, H200_LOCAL),
    (["cuda_graph=full_iteration", "model.transformer_impl=transformer_engine"], 700 / 1024, H200_LOCAL),
]


@pytest.mark.parametrize("overrides, measured, source", MEASURED,
                         ids=[" ".join(row[0]) or "eager" for row in MEASURED])
def test_the_estimate_is_within_15_percent_of_the_measured_peak(overrides, measured, source):
    estimate = estimate_memory(bridge.load(["recipe=llama/tiny", *overrides])).total_gib
    assert abs(estimate - measured) <= 0.15 * measured, (
        f"{estimate:.3f} GiB estimated, {measured:.3f} measured ({source})")


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
