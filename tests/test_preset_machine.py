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
