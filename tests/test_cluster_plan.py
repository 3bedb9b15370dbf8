"""Planning a cluster job from a laptop: the node count of a GPU preset's machine, the workload
command without Slurm, and the tips a refused plan gives (issue 31)."""

import json
import os
import re

import pytest
import torch


def plan_json(cli, tmp_path, *overrides):
    result = cli("mode=plan", "plan.format=json", *overrides, cwd=tmp_path)
    return result, json.loads(result.stdout)


@pytest.mark.parametrize("gpu, nodes", [("h100", 8), ("h200", 8), ("b200", 8), ("gb200", 16), ("gb300", 16)])
def test_a_multi_node_preset_spans_the_nodes_of_its_gpus_machine(cli, tmp_path, gpu, nodes):
    result, plan = plan_json(cli, tmp_path, "recipe=llama/llama3_70b", f"gpu={gpu}")
    assert plan["config"]["train"]["num_gpus"] == 64
    assert plan["config"]["train"]["num_nodes"] == nodes
    assert plan["derived"]["train.num_nodes"] == nodes
    # The GB200 and GB300 presets run with Megatron-FSDP, which graphbridge's engine lacks (engine_memory).
    assert {v["rule"] for v in plan["violations"]} <= {"engine_memory"}, result.stderr


def test_the_node_count_follows_num_gpus(cli, tmp_path):
    _, plan = plan_json(cli, tmp_path, "recipe=llama/llama3_8b", "gpu=h100", "train.num_gpus=16")
    assert plan["config"]["train"]["num_nodes"] == 2


def test_an_explicit_node_count_wins(cli, tmp_path):
    _, plan = plan_json(cli, tmp_path, "recipe=llama/llama3_70b", "gpu=h100", "train.num_nodes=16")
    assert plan["config"]["train"]["num_nodes"] == 16
    assert "train.num_nodes" not in plan["derived"]


def test_an_explicit_node_count_too_small_for_the_gpus_machine_is_refused_with_the_fix(cli, tmp_path):
    result = cli("mode=plan", "recipe=llama/llama3_70b", "gpu=h100", "train.num_nodes=1", cwd=tmp_path)
    assert result.returncode == 2
    assert "[node_size]" in result.stderr and "set train.num_nodes=8" in result.stderr


TORCH_ENGINE_RULES = {"engine_impl", "torch_engine_parallelism"}
LAPTOP_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU says")


@LAPTOP_ONLY
def test_a_cluster_plan_judges_the_cluster_and_keeps_this_machines_facts_apart(cli, tmp_path):
    result, plan = plan_json(cli, tmp_path, "recipe=qwen/qwen3_30b_a3b", "gpu=h100")
    assert result.returncode == 0 and plan["valid"] and not plan["runnable_here"]
    judged = {v["rule"] for v in plan["violations"] + plan["machine_violations"]}
    assert not judged & TORCH_ENGINE_RULES and plan["target"]["engine"] == "megatron"
    assert TORCH_ENGINE_RULES <= set(plan["here_refused_by"]) and "run it on h100 nodes" in plan["here"]
    text = cli("mode=plan", "recipe=qwen/qwen3_30b_a3b", "gpu=h100", cwd=tmp_path).stdout
    assert "[engine_impl]" not in text and "cannot run on this machine (it can elsewhere)" not in text
    assert "  judged:    for the megatron engine on a gpu=h100 node" in text and "  here:      this machine" in text


@LAPTOP_ONLY
def test_a_run_here_of_a_cluster_job_is_refused_naming_what_this_machine_lacks(cli, tmp_path):
    refused = cli("recipe=qwen/qwen3_30b_a3b", "gpu=h100", cwd=tmp_path)
    assert refused.returncode == 2 and "cannot run on this machine:\n  [engine_impl]" in refused.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("job.json"))


@LAPTOP_ONLY
def test_a_laptop_is_never_told_to_use_the_megatron_engine_it_cannot_run(cli, tmp_path):
    plan = cli("mode=plan", "cuda_graph=te_attn_mlp", "train.num_gpus=2", cwd=tmp_path).stdout
    assert "[engine_impl]" in plan and "[torch_engine_parallelism]" in plan
    assert "engine=megatron" not in plan and "run it where a CUDA GPU and megatron-core are" in plan


SLURM_JOB = ("-m", "llama", "-mr", "llama3_8b", "-g", "h100", "-ng", "16", "-gn", "8", "-a", "my_account", "-p", "batch",
             "-t", "01:00:00")


@pytest.fixture
def no_slurm(tmp_path):
    """The environment of a laptop: no srun on the PATH."""
    (tmp_path / "bin").mkdir()
    return {**os.environ, "PATH": str(tmp_path / "bin")}


def test_a_slurm_job_plans_on_a_laptop(workload_cli, tmp_path, no_slurm):
    result = workload_cli(*SLURM_JOB, "mode=plan", cwd=tmp_path, env=no_slurm)
    assert result.returncode == 0, result.stderr
    assert "graphbridge plan: VALID" in result.stdout and "num_gpus=16 num_nodes=2" in result.stdout
    assert "MULTIRUN" not in result.stderr and not (tmp_path / "multirun").exists()


def test_submitting_without_slurm_is_one_line_naming_the_fix(workload_cli, cli, tmp_path, no_slurm):
    submitted = workload_cli(*SLURM_JOB, cwd=tmp_path, env=no_slurm)
    assert submitted.returncode == 2
    [echo, error] = submitted.stderr.splitlines()
    assert echo.startswith("graphbridge recipe=llama/llama3_8b") and "hydra.mode=MULTIRUN" in echo
    assert "no srun" in error and "graphbridge-workload: -d" in error
    swept = cli("-m", "mode=plan", "hydra/launcher=submitit_slurm", cwd=tmp_path, env=no_slurm)
    assert swept.returncode == 2 and swept.stderr.count("\n") == 1 and "mode=plan without -m" in swept.stderr


@pytest.mark.parametrize("recipe", ["llama/tiny", "llama/llama3_8b"])
def test_the_tip_for_a_gpu_set_to_null_works_when_followed(cli, tmp_path, recipe):
    refused = cli("mode=plan", f"recipe={recipe}", "gpu=null", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    tip = re.search(r"write (~gpu)|one of: (gpu=\w+ precision=\w+)", refused.stderr)
    followed = cli("mode=plan", f"recipe={recipe}", *(tip[1] or tip[2]).split(), cwd=tmp_path)
    assert followed.returncode == 0 and "graphbridge plan: VALID" in followed.stdout, followed.stderr
