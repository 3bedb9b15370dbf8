"""Planning a cluster job from a laptop: the node count of a GPU preset's machine, the workload
command without Slurm, and the tips a refused plan gives (issue 31)."""

import json
import os
import re

import pytest
import torch


PRESET_NODES = {"h100": 8, "h200": 8, "b200": 8, "gb200": 16, "gb300": 16}
"""The nodes llama3_70b's 64 GPUs span on each preset GPU's machine (8 GPUs a node; 4 for GB200 and GB300)."""
JSON_PLAN = ("mode=plan", "plan.format=json")
PRESETS = {gpu: (*JSON_PLAN, "recipe=llama/llama3_70b", f"gpu={gpu}") for gpu in PRESET_NODES}
MORE_GPUS = (*JSON_PLAN, "recipe=llama/llama3_8b", "gpu=h100", "train.num_gpus=16")
MORE_NODES = (*JSON_PLAN, "recipe=llama/llama3_70b", "gpu=h100", "train.num_nodes=16")
TOO_FEW_NODES = ("mode=plan", "recipe=llama/llama3_70b", "gpu=h100", "train.num_nodes=1")
CLUSTER = ("recipe=qwen/qwen3_30b_a3b", "gpu=h100")
CLUSTER_JSON, CLUSTER_TEXT = (*JSON_PLAN, *CLUSTER), ("mode=plan", *CLUSTER)
RUN_HERE = CLUSTER  # a run, refused before it writes anything
LAPTOP_PLAN = ("mode=plan", "cuda_graph=te_attn_mlp", "train.num_gpus=2")
GPU_NULL = {recipe: ("mode=plan", f"recipe={recipe}", "gpu=null") for recipe in ("llama/tiny", "llama/llama3_8b")}
COMMANDS = [*PRESETS.values(), MORE_GPUS, MORE_NODES, TOO_FEW_NODES, CLUSTER_JSON, CLUSTER_TEXT, RUN_HERE,
            LAPTOP_PLAN, *GPU_NULL.values()]


@pytest.fixture(scope="session")
def planned(cli_batch) -> dict:
    """Each command of COMMANDS -> its `graphbridge` result, all of them planned by one process a session
    (conftest.py's cli_batch, which also checks that they leave nothing behind): a process each took ~1 s more."""
    return cli_batch("cluster_plans", COMMANDS)


def plan_json(planned, command):
    result = planned[command]
    return result, json.loads(result.stdout)


@pytest.mark.parametrize("gpu", PRESET_NODES)
def test_a_multi_node_preset_spans_the_nodes_of_its_gpus_machine(planned, gpu):
    result, plan = plan_json(planned, PRESETS[gpu])
    assert plan["config"]["train"]["num_gpus"] == 64
    assert plan["config"]["train"]["num_nodes"] == PRESET_NODES[gpu]
    assert plan["derived"]["train.num_nodes"] == PRESET_NODES[gpu]
    # The GB200 and GB300 presets run with Megatron-FSDP, which graphbridge's engine lacks (engine_memory).
    assert {v["rule"] for v in plan["violations"]} <= {"engine_memory"}, result.stderr


def test_the_node_count_follows_num_gpus(planned):
    _, plan = plan_json(planned, MORE_GPUS)
    assert plan["config"]["train"]["num_nodes"] == 2


def test_an_explicit_node_count_wins(planned):
    _, plan = plan_json(planned, MORE_NODES)
    assert plan["config"]["train"]["num_nodes"] == 16
    assert "train.num_nodes" not in plan["derived"]


def test_an_explicit_node_count_too_small_for_the_gpus_machine_is_refused_with_the_fix(planned):
    result = planned[TOO_FEW_NODES]
    assert result.returncode == 2
    assert "[node_size]" in result.stderr and "set train.num_nodes=8" in result.stderr


TORCH_ENGINE_RULES = {"engine_impl", "torch_engine_parallelism"}
LAPTOP_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU says")


@LAPTOP_ONLY
def test_a_cluster_plan_judges_the_cluster_and_keeps_this_machines_facts_apart(planned):
    result, plan = plan_json(planned, CLUSTER_JSON)
    assert result.returncode == 0 and plan["valid"] and not plan["runnable_here"]
    judged = {v["rule"] for v in plan["violations"] + plan["machine_violations"]}
    assert not judged & TORCH_ENGINE_RULES and plan["target"]["engine"] == "megatron"
    assert TORCH_ENGINE_RULES <= set(plan["here_refused_by"]) and "run it on h100 nodes" in plan["here"]
    text = planned[CLUSTER_TEXT].stdout
    assert "[engine_impl]" not in text and "cannot run on this machine (it can elsewhere)" not in text
    assert "  judged:    for the megatron engine on a gpu=h100 node" in text and "  here:      this machine" in text


@LAPTOP_ONLY
def test_a_run_here_of_a_cluster_job_is_refused_naming_what_this_machine_lacks(planned):
    refused = planned[RUN_HERE]  # and it left nothing behind: cli_batch checked its directory
    assert refused.returncode == 2 and "cannot run on this machine:\n  [engine_impl]" in refused.stderr


@LAPTOP_ONLY
def test_a_laptop_is_never_told_to_use_the_megatron_engine_it_cannot_run(planned):
    plan = planned[LAPTOP_PLAN].stdout
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


@pytest.mark.parametrize("recipe", GPU_NULL)
def test_the_tip_for_a_gpu_set_to_null_works_when_followed(planned, cli, tmp_path, recipe):
    refused = planned[GPU_NULL[recipe]]
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    tip = re.search(r"write (~gpu)|one of: (gpu=\w+ precision=\w+)", refused.stderr)
    followed = cli("mode=plan", f"recipe={recipe}", *(tip[1] or tip[2]).split(), cwd=tmp_path)
    assert followed.returncode == 0 and "graphbridge plan: VALID" in followed.stdout, followed.stderr
