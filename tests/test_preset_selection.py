"""Choosing a recipe's preset by gpu and precision, what is said when none fits, and the weak scaling
of its global batch to another GPU count."""

import pytest
from hydra.errors import MissingConfigException

import bridge
from bridge.recipes import presets


# --- missing combinations -------------------------------------------------------------------

def test_a_missing_preset_lists_the_available_ones():
    with pytest.raises(MissingConfigException) as error:
        bridge.load(["recipe=llama/llama3_8b", "gpu=h100", "precision=nvfp4"])
    message = str(error.value)
    assert "preset/llama/llama3_8b/h100_nvfp4" in message
    for gpu, precision in presets("llama/llama3_8b"):
        assert f"{gpu}_{precision}" in message


def test_a_recipe_with_presets_needs_a_gpu():
    with pytest.raises(MissingConfigException, match="None_bf16"):
        bridge.load(["recipe=qwen/qwen3_30b_a3b"])


@pytest.mark.parametrize("argv, message", [
    (["recipe=gpt_oss/gpt_oss_120b", "gpu=b200", "precision=fp8_mx"],
     "recipe=gpt_oss/gpt_oss_120b has no preset for gpu=b200 precision=fp8_mx; its presets: gpu=b200 precision=bf16;"),
    (["recipe=llama/llama3_8b"], "recipe=llama/llama3_8b runs Bridge's per-GPU presets: add gpu= and precision="),
    (["recipe=llama/llama3_8b", "gpu=h100", "~gpu"], "gpu=h100 precision=bf16|fp8_cs; gpu=h200 precision=bf16|fp8_cs"),
    (["recipe=llama/llama3_8b", "gpu=h100", "~precision"], "runs Bridge's per-GPU presets: add gpu= and precision="),
    (["-m", "recipe=llama/llama3_8b", "gpu=h100,b200"], "gpu=h100,b200 cannot be swept, a preset is picked before"),
])
def test_the_cli_reports_a_missing_preset_in_one_line(cli, tmp_path, argv, message):
    """Not Hydra's None_bf16 interpolation error or its config search path: the pairs that exist."""
    done = cli(*argv, "mode=plan", cwd=tmp_path)  # -m, a flag, goes first
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("graphbridge: ") and message in done.stderr and done.stderr.count("\n") == 1


# --- weak scaling ---------------------------------------------------------------------------

def test_weak_scaling_keeps_the_global_batch_per_gpu():
    plan = bridge.plan(["recipe=llama/llama3_70b", "gpu=b200", "train.num_gpus=128"])
    assert plan.config.train.global_batch_size == 256      # 128 on 64 GPUs -> 2 per GPU x 128
    assert any("weak scaling: train.global_batch_size=256" in note for note in plan.notes)
    assert plan.derived["train.global_batch_size"] == 256
    assert bridge.load(["recipe=llama/llama3_70b", "gpu=b200", "train.num_gpus=16"]).train.global_batch_size == 32


def test_weak_scaling_leaves_the_preset_size_and_tiny_recipes_alone():
    assert bridge.load(["recipe=qwen/qwen3_30b_a3b", "gpu=gb200"]).train.global_batch_size == 512
    tiny = bridge.plan(["recipe=llama/tiny", "train.num_gpus=4"])
    assert tiny.config.train.global_batch_size == 2 and not any("weak scaling" in note for note in tiny.notes)


def test_an_explicit_global_batch_is_never_weak_scaled():
    plan = bridge.plan(["recipe=llama/llama31_405b", "gpu=h100", "train.num_gpus=1", "train.global_batch_size=1"])
    assert plan.config.train.global_batch_size == 1 and "train.global_batch_size" not in plan.derived
    assert not any("weak scaling" in note for note in plan.notes)


def test_weak_scaling_to_zero_is_a_violation_not_a_silent_zero():
    plan = bridge.plan(["recipe=llama/llama31_405b", "gpu=h100", "train.num_gpus=1"])   # 512 on 1024 GPUs
    assert plan.config.train.global_batch_size == 0
    assert "positive_sizes" in {v.rule for v in plan.config_violations}


def test_weak_scaling_follows_the_preset_gpu_count():
    pinned = bridge.load(["recipe=llama/llama31_405b", "gpu=h100", "workload.preset_num_gpus=256"])
    assert pinned.train.num_gpus == 256 and pinned.train.global_batch_size == 512
