"""The machine a gpu= preset is written for (bridge.machine.preset_machine), and the plan made for
it on a machine without that GPU."""

import pytest

import bridge
from bridge.machine import PRESET_GPUS, gpu_kind, preset_machine


@pytest.mark.parametrize("gpu, capability, per_node", [("h100", (9, 0), 8), ("h200", (9, 0), 8), ("b200", (10, 0), 8),
                                                       ("b300", (10, 0), 8), ("gb200", (10, 0), 4),
                                                       ("gb300", (10, 0), 4)])
def test_a_preset_machine_is_one_node_of_that_gpu(gpu, capability, per_node):
    machine = preset_machine(gpu, "0.16.1")
    assert machine.gpu_count == per_node and machine.has_gpu_kind(gpu)
    assert {device.capability for device in machine.gpus} == {capability}
    assert machine.gpus[0].memory_bytes == PRESET_GPUS[gpu].memory_gb * 10 ** 9


@pytest.mark.parametrize("release, engine", [("0.16.1", "2.10.0"), ("0.19.2", "2.20.2")])
def test_a_preset_machine_has_the_release_and_its_transformer_engine(release, engine):
    machine = preset_machine("h100", release)
    assert machine.version("megatron-core") == release and machine.version("transformer-engine") == engine
    assert machine.has("torch")


def test_driver_names_map_to_preset_kinds():
    assert gpu_kind("NVIDIA H100 80GB HBM3") == "h100" and gpu_kind("NVIDIA GB200") == "gb200"
    assert gpu_kind("NVIDIA B200") == "b200" and gpu_kind("Tesla V100-SXM2-32GB") is None


def test_validate_judges_a_config_for_an_h100_node():
    cfg = bridge.load(["recipe=llama/llama3_8b", "gpu=h100"])
    assert bridge.validate(cfg, machine=preset_machine("h100", "0.16.1")) == []


def test_a_plan_for_an_h100_on_this_cpu_judges_the_h100_node_and_says_in_one_line_why_not_here(cli, tmp_path):
    result = cli("mode=plan", "recipe=llama/llama3_8b", "gpu=h100", cwd=tmp_path)
    assert result.returncode == 0, result.stderr  # valid; this machine cannot run it (README: exit 0)
    lines = result.stdout.splitlines()
    assert lines[0] == "graphbridge plan: VALID"
    assert "torch_engine" not in result.stdout and "cuda_device" not in result.stdout
    assert "cannot run on this machine" not in result.stdout  # no list of this machine's rules
    judged = next(line for line in lines if line.startswith("  judged:"))
    assert "megatron engine on a gpu=h100 node (8 x NVIDIA H100" in judged
    here = [line for line in lines if line.startswith("  here:")]
    assert len(here) == 1 and "this machine cannot run it: no H100 here" in here[0]


def test_the_verdict_line_says_when_the_memory_does_not_fit(cli, tmp_path):
    result = cli("mode=plan", "recipe=llama/llama3_8b", "gpu=h100", "train.micro_batch_size=2", cwd=tmp_path)
    assert result.stdout.splitlines()[0].startswith("graphbridge plan: VALID, BUT MEMORY DOES NOT FIT: ~")
    assert "lower train.micro_batch_size" in result.stdout.splitlines()[0]
