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


REFUSED_RUNS = {
    "full_iteration_nan_checks": ("cuda_graph=full_iteration", "ddp.check_for_nan_in_grad=true",
                                  "hydra.run.dir=nan_checks"),
    "cuda_device": ("engine=megatron", "hydra.run.dir=megatron"),
    "gpus_per_node": ("train.num_gpus=8", "train.global_batch_size=16", "hydra.run.dir=eight_gpus"),
}
"""Runs refused before their launch, each by the rule it names, each in a directory of its own: one process runs
them all (below), and a run holds its directory's lock until its process ends."""
# Two of its 48 layers, as the benchmark suite's proxy: all of it is beyond one H100's memory (memory_capacity).
ONE_GPU_MOE = ("mode=plan", "recipe=qwen/qwen3_30b_a3b", "gpu=h100", "train.num_gpus=1", "workload.preset_num_gpus=1",
               "model.num_layers=2")
ONE_GPU_FIX = "model.expert_model_parallel_size=1 model.moe_token_dispatcher_type=alltoall"
SCALED_MOE = (*ONE_GPU_MOE, "model.expert_model_parallel_size=1")
SCALED_FIX = "model.moe_token_dispatcher_type=alltoall"
COMMANDS = [*REFUSED_RUNS.values(), ONE_GPU_MOE, (*ONE_GPU_MOE, *ONE_GPU_FIX.split()), SCALED_MOE,
            (*SCALED_MOE, SCALED_FIX)]


@pytest.fixture(scope="session")
def commands(cli_batch) -> dict:
    """Each command of COMMANDS -> its result, all of them by one `graphbridge` process a session (conftest.py's
    cli_batch, which checks that they leave their directory empty: no job written, no process started)."""
    return cli_batch("plan_equals_run", COMMANDS)


@pytest.mark.parametrize("rule", REFUSED_RUNS)
def test_a_refused_run_stops_before_it_writes_a_job_or_starts_a_process(commands, rule):
    result = commands[REFUSED_RUNS[rule]]
    assert result.returncode == 2 and f"[{rule}]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_moe_preset_on_one_gpu_names_every_override_it_needs(commands):
    result = commands[ONE_GPU_MOE]
    assert result.returncode == 2 and "[gpu_count]" in result.stderr
    assert ONE_GPU_FIX in result.stderr
    fixed = commands[(*ONE_GPU_MOE, *ONE_GPU_FIX.split())]
    assert fixed.returncode == 0 and "graphbridge plan: VALID" in fixed.stdout, fixed.stderr


def test_a_scaled_down_moe_preset_names_the_dispatcher_that_works(commands):
    result = commands[SCALED_MOE]
    assert result.returncode == 2 and "[flex_dispatcher]" in result.stderr
    assert SCALED_FIX in result.stderr
    fixed = commands[(*SCALED_MOE, SCALED_FIX)]
    assert fixed.returncode == 0 and "graphbridge plan: VALID" in fixed.stdout, fixed.stderr
