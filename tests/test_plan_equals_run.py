"""A run refuses exactly what the plan reports: for every recipe (with its first preset) under two of the
cuda_graph choices by default (every choice under -m slow), the verdict of `mode=plan` equals the one the training
process reaches from the job files the launcher writes; and `mode=train` refuses before it writes a job or starts a
process."""

import pytest

import bridge
from bridge import run
from bridge.config.paths import config_dir
from bridge.recipes import presets, recipe_names
from bridge.validation import resolve_target
from perf.launch import write_job
from tests.sampling import split

CHOICES = sorted(path.stem for path in (config_dir() / "cuda_graph").glob("*.yaml"))


def recipe_overrides(recipe: str) -> list:
    first = presets(recipe)[:1]
    return [f"recipe={recipe}"] + [f"gpu={gpu}" for gpu, _ in first] + [f"precision={p}" for _, p in first]


def sampled_choices(recipe: str) -> list:
    """A sixth of the choices for each recipe (two), another sixth for the next: every choice is planned and run
    against three recipes by default, every pair under -m slow."""
    offset = recipe_names().index(recipe) % 6
    return CHOICES[offset::6]


PAIRS = [(recipe, choice) for recipe in recipe_names() for choice in CHOICES]


# Every recipe, and every choice, by default (tests/test_default_coverage.py reads the pairs back from their ids).
@pytest.mark.parametrize("recipe,choice", split(PAIRS, lambda _, pair: pair[1] in sampled_choices(pair[0]),
                                                several=True))
def test_the_run_refuses_what_the_plan_reports(recipe, choice, tmp_path):
    plan = bridge.plan(recipe_overrides(recipe) + [f"cuda_graph={choice}"])
    job_dir = tmp_path / choice
    write_job(plan.config, job_dir, {"choices": {}, "overrides": []})
    # torchrun starts train.num_gpus processes; the machine is the same one.
    loaded = run.load_resolved(job_dir)
    refused = run.refusals(loaded, resolve_target(loaded, processes=plan.config.train.num_gpus))
    assert {(v.rule, v.where) for v in refused} == {(v.rule, v.where) for v in plan.refused_here}


@pytest.mark.parametrize("args, rule", [
    (("cuda_graph=full_iteration", "ddp.check_for_nan_in_grad=true"), "full_iteration_nan_checks"),
    (("engine=megatron",), "cuda_device"),
    (("train.num_gpus=8", "train.global_batch_size=16"), "gpus_per_node"),
])
def test_a_refused_run_stops_before_it_writes_a_job_or_starts_a_process(cli, tmp_path, args, rule):
    result = cli(*args, "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 2 and f"[{rule}]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


def test_a_moe_preset_on_one_gpu_names_every_override_it_needs(cli, tmp_path):
    # Two of its 48 layers, as the benchmark suite's proxy: all of it is beyond one H100's memory (memory_capacity).
    one_gpu = ("mode=plan", "recipe=qwen/qwen3_30b_a3b", "gpu=h100", "train.num_gpus=1", "workload.preset_num_gpus=1",
               "model.num_layers=2")
    result = cli(*one_gpu, cwd=tmp_path)
    assert result.returncode == 2 and "[gpu_count]" in result.stderr
    fix = "model.expert_model_parallel_size=1 model.moe_token_dispatcher_type=alltoall"
    assert fix in result.stderr
    fixed = cli(*one_gpu, *fix.split(), cwd=tmp_path)
    assert fixed.returncode == 0 and "graphbridge plan: VALID" in fixed.stdout, fixed.stderr


def test_a_scaled_down_moe_preset_names_the_dispatcher_that_works(cli, tmp_path):
    scaled = ("mode=plan", "recipe=qwen/qwen3_30b_a3b", "gpu=h100", "train.num_gpus=1", "workload.preset_num_gpus=1",
              "model.expert_model_parallel_size=1", "model.num_layers=2")
    result = cli(*scaled, cwd=tmp_path)
    assert result.returncode == 2 and "[flex_dispatcher]" in result.stderr
    assert "model.moe_token_dispatcher_type=alltoall" in result.stderr
    fixed = cli(*scaled, "model.moe_token_dispatcher_type=alltoall", cwd=tmp_path)
    assert fixed.returncode == 0 and "graphbridge plan: VALID" in fixed.stdout, fixed.stderr
