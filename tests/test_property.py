"""Random override sets give a valid plan or a clean list of violations, never another
exception; and a plan we call valid is one megatron-core 0.16.1 accepts too."""

import json
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bridge
from bridge.config.paths import config_dir
from bridge.translate import build_megatron_configs

CUDA_GRAPH_CHOICES = sorted(path.stem for path in (config_dir() / "cuda_graph").glob("*.yaml"))
MODULE_NAMES = ["attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "", "full", "atn"]

OVERRIDE_POOL = {
    "cuda_graph": st.sampled_from(CUDA_GRAPH_CHOICES),
    "model.cuda_graph_impl": st.sampled_from(["none", "local", "transformer_engine", "full_iteration"]),
    "model.cuda_graph_modules": st.lists(st.sampled_from(MODULE_NAMES), max_size=3).map(
        lambda names: "[" + ",".join(f"'{n}'" for n in names) + "]"),
    "model.cuda_graph_scope": st.sampled_from(["full", "full_iteration", "'attn,mlp'", "moe_router", "''", "bogus"]),
    "model.enable_cuda_graph": st.booleans(),
    "model.external_cuda_graph": st.booleans(),
    "model.cuda_graph_warmup_steps": st.integers(-1, 60),
    "rerun_state_machine.check_for_nan_in_loss": st.sampled_from(["true", "false"]),
    "ddp.check_for_nan_in_grad": st.sampled_from(["true", "false"]),
    "model.cpu_offloading": st.booleans(),
    "model.recompute_granularity": st.sampled_from(["null", "full", "selective"]),
    "model.recompute_method": st.sampled_from(["null", "uniform"]),
    "model.recompute_num_layers": st.sampled_from(["null", "1"]),
    "model.recompute_modules": st.sampled_from(["null", "[core_attn]", "[mlp]", "[moe]", "[layernorm]"]),
    "model.attention_dropout": st.sampled_from([0.0, 0.1]),
    "model.hidden_dropout": st.sampled_from([0.0, 0.1]),
    "model.num_moe_experts": st.sampled_from(["null", "4", "8"]),
    "model.moe_layer_freq": st.sampled_from(["1", "2", "[0,1,1,1,1,1,1,1]"]),
    "model.moe_expert_capacity_factor": st.sampled_from(["null", "1.0"]),
    "model.moe_pad_expert_input_to_capacity": st.booleans(),
    "model.moe_token_dispatcher_type": st.sampled_from(["alltoall", "allgather"]),
    "model.overlap_moe_expert_parallel_comm": st.booleans(),
    "model.delay_wgrad_compute": st.booleans(),
    "model.tensor_model_parallel_size": st.integers(0, 2),
    "model.sequence_parallel": st.booleans(),
    "train.num_gpus": st.integers(1, 4),
    "train.train_iters": st.integers(0, 60),
    "train.global_batch_size": st.integers(1, 8),
    "dataset.packed_sequence": st.booleans(),
    "+env_vars.PYTORCH_CUDA_ALLOC_CONF": st.just("expandable_segments:True"),
    "engine": st.sampled_from(["auto", "torch", "megatron"]),
}


@st.composite
def override_sets(draw):
    keys = draw(st.lists(st.sampled_from(sorted(OVERRIDE_POOL)), unique=True, max_size=8))
    return [f"{key}={draw(OVERRIDE_POOL[key])}" for key in keys]


@settings(max_examples=80, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(override_sets())
def test_random_overrides_plan_cleanly(overrides):
    plan = bridge.plan(overrides)
    report = json.loads(plan.to_json())
    assert report["valid"] == (report["violations"] == [])
    assert all(v["keys"] and v["message"] for v in report["violations"])
    if plan.valid:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build_megatron_configs(plan.config)
