"""The memory verdict on a real GPU, both sides of memory_capacity_here: Llama 3.2 1B's widths at seq 8192 with as
many layers as this GPU's capacity allows. The deepest the plan estimates to fit trains; the shallowest the plan
refuses is refused in one line before anything is built. The model grows by whole layers, so the two sit one
layer-step either side of what the plan calls the GPU's limit."""

import json

import pytest
import torch

import bridge
from bridge.memory import estimate_memory

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

MODEL = ("recipe=llama/llama32_1b", "cuda_graph=none", "train.train_iters=6")
TRAIN_TIMEOUT_S = 600


def plan_of(layers: int):
    return bridge.plan([*MODEL, f"model.num_layers={layers}"])


def refused_for_memory(layers: int) -> bool:
    return any(violation.rule == "memory_capacity_here" for violation in plan_of(layers).violations)


def deepest_that_fits() -> int:
    """The most layers whose plan on this GPU says "fits" (an estimate inside the usable share)."""
    layers = 1
    while plan_of(layers + 1).memory().verdict == "fits":
        layers += 1
    return layers


def test_what_plan_estimates_to_fit_trains_and_what_it_refuses_is_refused(cli, tmp_path):
    fits = deepest_that_fits()
    refused = fits + 1
    while not refused_for_memory(refused):
        refused += 1
    capacity_gib = torch.cuda.get_device_properties(0).total_memory / 2 ** 30

    run = cli(*MODEL, f"model.num_layers={fits}", "hydra.run.dir=fits", cwd=tmp_path, timeout=TRAIN_TIMEOUT_S)
    result = json.loads((tmp_path / "fits" / "result.json").read_text())
    assert run.returncode == 0 and result["status"] == "completed", run.stdout[-2000:] + run.stderr[-2000:]
    estimate = estimate_memory(bridge.load([*MODEL, f"model.num_layers={fits}"])).total_gib
    reserved = result["memory"]["peak_reserved_gb"]
    assert reserved <= capacity_gib
    assert abs(estimate - reserved) <= 0.10 * reserved, f"{fits} layers: {estimate:.1f} GiB estimated, {reserved:.1f} reserved"

    refusal = cli(*MODEL, f"model.num_layers={refused}", "hydra.run.dir=refused", cwd=tmp_path, timeout=60)
    assert refusal.returncode == 2
    assert "memory_capacity_here" in refusal.stderr + refusal.stdout
    assert not (tmp_path / "refused" / "result.json").exists()
