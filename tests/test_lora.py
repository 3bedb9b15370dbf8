"""LoRA (peft=lora) as users run it: llama/tiny_lora trains on the CPU with adapters alone, both engines build the
adapters the memory estimate counts, and the base weights stay as they were drawn and frozen."""

import json
from pathlib import Path

import pytest
import torch

import bridge
from bridge.memory.params import lora_parameters
from tests.rank_build import build_rank


README_LINE = "graphbridge recipe=llama/tiny_lora train.train_iters=3"
"""The README's LoRA line, which its own test leaves to this one."""
BUILT_SMALL = ("recipe=llama/tiny_lora", "engine=megatron", "model.num_layers=2", "dataset.seq_length=64")
"""llama/tiny_lora on megatron-core, two of its layers over sequences of 64: a rank builds and steps in 2 to 3 s on the
CPU (5 to 12 s over its own 256)."""


def test_the_tiny_lora_recipe_trains_its_adapters_on_the_cpu(cli, tmp_path):
    assert README_LINE in (Path(__file__).resolve().parent.parent / "README.md").read_text()
    run = cli(*README_LINE.split()[1:], "hydra.run.dir=run", cwd=tmp_path)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert run.returncode == 0 and result["status"] == "completed", run.stderr[-2000:]
    parameters = result["parameters"]
    # What the memory estimate counts is what the engine trains: (input + output) x rank for each adapted layer.
    assert parameters["trainable"] == lora_parameters(bridge.load(["recipe=llama/tiny_lora"]))
    assert parameters["trainable"] < 0.1 * parameters["total"]
    assert "parameters trained" in run.stdout and result["loss"][-1] < result["loss"][0]


def torch_engine(*overrides):
    from bridge.engines.torch.engine import TorchEngine

    return TorchEngine(bridge.load(["recipe=llama/tiny", "model.num_layers=2", "train.train_iters=2", *overrides]),
                       device="cpu")


def test_the_torch_engine_starts_from_the_base_model_and_steps_the_adapters_only():
    base, adapted = torch_engine(), torch_engine("peft=lora")
    # B starts at zero: the first loss is the base model's, from the same base weights.
    assert adapted.train_step(0).item() == pytest.approx(base.train_step(0).item(), rel=1e-6)
    frozen = {name: parameter.clone() for name, parameter in adapted.model.named_parameters()
              if not parameter.requires_grad}
    adapters = {name: parameter.clone() for name, parameter in adapted.model.named_parameters()
                if parameter.requires_grad}
    adapted.train_step(1)
    now = dict(adapted.model.named_parameters())
    assert frozen and all(torch.equal(now[name], value) for name, value in frozen.items())
    assert adapters and all(".linear_" in name for name in adapters)
    assert any(not torch.equal(now[name], value) for name, value in adapters.items())
    assert {group_parameter for group in adapted.optimizer.param_groups for group_parameter in group["params"]} == {
        now[name] for name in adapters}


@pytest.mark.parametrize("layout", [
    pytest.param((), id="one-gpu"),
    pytest.param(("train.num_gpus=2", "model.tensor_model_parallel_size=2", "model.sequence_parallel=false"),
                 id="tp2"),
])
def test_the_megatron_engine_builds_the_counted_adapters_and_steps_them(layout):
    """One rank of the layout on the CPU (tests/rank_build.py): megatron-core's DDP buffers hold the adapters alone,
    as many as the memory estimate counts for one GPU, and a training step runs."""
    cfg = bridge.load([*BUILT_SMALL, *layout])
    built = build_rank(cfg, rank=0)
    assert built.stepped and built.gradient_sum > 0, built
    total, trainable = built.parameters
    assert trainable == built.gradient_buffer == lora_parameters(cfg) < 0.1 * total


def test_adapters_train_under_full_recompute_with_frozen_embeddings():
    """The first layer's input comes from a frozen embedding, so it needs no gradient; megatron-core's recompute
    (and its per-layer graphs: h100/mcore-0.19.2/gpu_tests.log at fb59268) call their backward only for an input that does.
    The engine makes the decoder's input require one under LoRA, so the step reaches the adapters."""
    cfg = bridge.load([*BUILT_SMALL, "model.recompute_granularity=full", "model.recompute_method=uniform",
                       "model.recompute_num_layers=1"])
    built = build_rank(cfg, rank=0)
    assert built.stepped and built.gradient_sum > 0, built


def test_bridges_finetune_recipes_keep_no_quantized_weight_copies_and_the_70b_lora_fits_its_b200():
    """Bridge's Llama 3 SFT and LoRA recipes set disable_parameter_transpose_cache; with it the engine holds no fp8
    copy of the frozen weights across micro-batches, which is what fits llama3_70b_lora's B200 MXFP8 preset."""
    from dataclasses import replace

    from bridge.memory.estimate import estimate_memory

    lora = bridge.load(["recipe=llama/llama3_70b_lora", "gpu=b200", "precision=fp8_mx"])
    cached = replace(lora, model=replace(lora.model, disable_parameter_transpose_cache=False))
    assert lora.model.disable_parameter_transpose_cache and bridge.plan(
        ["recipe=llama/llama3_70b_lora", "gpu=b200", "precision=fp8_mx"]).valid
    assert estimate_memory(cached).engine_verdict == "cannot fit" != estimate_memory(lora).engine_verdict
    assert not bridge.load(["recipe=llama/llama3_70b", "gpu=b200"]).model.disable_parameter_transpose_cache  # pretraining
