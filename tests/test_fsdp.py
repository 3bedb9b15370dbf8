"""Megatron-FSDP (ddp.use_megatron_fsdp) in the megatron engine, one rank built and stepped on the CPU
(tests/rank_build.py); its rules' cases are in tests/rule_cases.py, its GPU runs in
benchmarks/results/h100/megatron_fsdp_probe_83411eb.log."""

import pytest

import bridge
from bridge.translate import megatron_arguments
from tests.rank_build import build_rank

DP2 = ("recipe=llama/tiny", "engine=megatron", "model.num_layers=2", "train.num_gpus=2", "train.global_batch_size=4",
       "ddp.use_distributed_optimizer=true", "cuda_graph=none")


@pytest.mark.parametrize("layout", [
    pytest.param((), id="dp2"),
    pytest.param(("train.num_gpus=4", "model.tensor_model_parallel_size=2", "model.sequence_parallel=false"),
                 id="tp2-dp2"),
])
def test_megatron_fsdp_shards_the_gradients_that_ddp_keeps_whole(layout):
    """Built only: FSDP's gradient hooks allocate their buckets on the device outside the CPU's CUDA stand-in."""
    fsdp = build_rank(bridge.load([*DP2, *layout, "ddp.use_megatron_fsdp=true"]), rank=1, step=False)
    ddp = build_rank(bridge.load([*DP2, *layout]), rank=1, step=False)
    assert fsdp.built and fsdp.parameters == ddp.parameters, fsdp
    # each of the two data-parallel ranks holds half of every gradient buffer (padded to FSDP's alignment)
    assert ddp.gradient_buffer / 2 <= fsdp.gradient_buffer < 0.51 * ddp.gradient_buffer


def test_megatron_fsdp_steps_one_rank():
    small = ("dataset.seq_length=64", "model.hidden_size=128", "model.ffn_hidden_size=256", "model.vocab_size=256")
    one = build_rank(bridge.load([*DP2, *small, "train.num_gpus=1", "ddp.use_megatron_fsdp=true"]), rank=0)
    assert one.stepped and one.gradient_sum > 0, one
    assert one.parameters[1] <= one.gradient_buffer < 1.01 * one.parameters[1]


def test_the_bridge_fsdp_presets_compose_megatron_fsdp_as_bridge_sets_it():
    cfg = bridge.load(["recipe=llama/llama3_70b", "gpu=gb200", "precision=fp8_cs"])
    ddp = cfg.ddp
    assert (ddp.use_megatron_fsdp, ddp.data_parallel_sharding_strategy, ddp.fsdp_double_buffer) == (
        True, "optim_grads_params", True)
    assert ddp.use_distributed_optimizer and not ddp.average_in_collective
    assert not cfg.model.gradient_accumulation_fusion and cfg.model.cuda_graph_impl == "none"


@pytest.mark.parametrize("graph,version,mode", [
    ("full_iteration", "0.19.2", {"megatron_fsdp_cuda_graph_mode": True, "fsdp_all_gather_in_start_param_sync": False}),
    ("te_mlp", "0.19.2", {"megatron_fsdp_cuda_graph_mode": True, "fsdp_all_gather_in_start_param_sync": True}),
    ("none", "0.19.2", {}),
    ("full_iteration", "0.16.1", {}),  # 0.16.1 has no such mode
])
def test_megatron_fsdp_under_graphs_gets_the_releases_graph_mode(graph, version, mode):
    """What megatron_fsdp_graphs' witness cases run with: Megatron-LM's settings for FSDP under graphs."""
    cfg = bridge.load([*DP2, "ddp.use_megatron_fsdp=true", f"cuda_graph={graph}"])
    ddp = megatron_arguments(cfg, version)["ddp_config"]
    assert {name: value for name, value in ddp.items()
            if name in ("megatron_fsdp_cuda_graph_mode", "fsdp_all_gather_in_start_param_sync")} == mode
