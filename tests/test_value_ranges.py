"""Every size, count, step, interval and rate has a range, and every name field its choices, checked before any
other rule reads them: through the real command line, impossible values are named all at once (exit 2), and
integers that would overflow in training are refused before a job is written."""

import dataclasses
import typing
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import bridge
from bridge.config.schema import Device, GraphBridgeConfig, LoraTarget
from bridge.translate import build_megatron_configs
from bridge.config.plain import plainly_typed
from bridge.validation.value_rules import CHOICES, POSITIVE, RANGES

# Numbers that mean something at any value (or whose range another rule owns), so value_ranges leaves
# them open: every other number of the schema has a range.
OPEN = {
    "model.glu_linear_offset": "an offset: any sign",
    "model.activation_func_clamp_value": "a clamp bound: any sign",
    "model.beta_fast": "yarn_betas (only YaRN reads it)",
    "model.beta_slow": "yarn_betas (only YaRN reads it)",
    "model.mscale": "YaRN attention scale (megatron-core takes any value)",
    "model.mscale_all_dim": "YaRN attention scale, 0 turns it off",
    "model.window_size": "(left, right) attention window, -1 is unbounded",
    "model.expert_tensor_parallel_size": "positive_sizes",
    "workload.preset_num_gpus": "positive_sizes",
    "workload.gpus_per_node": "positive_sizes",
    "optimizer.lr": "lr_schedule",
    "optimizer.min_lr": "lr_schedule",
}


# Names whose values another rule owns, or that megatron-core parses itself: every other str field has CHOICES.
NAMED_ELSEWHERE = {
    "model.recompute_granularity": "recompute_settings",
    "model.recompute_method": "recompute_settings",
    "model.moe_flex_dispatcher_backend": "flex_dispatcher (under the flex dispatcher, the one that reads it)",
    "model.pipeline_model_parallel_layout": "pipeline_layout",
    "optimizer.lr_decay_style": "lr_schedule",
    "plan.megatron_core": "megatron_core_version",
    "torch_compile": "torch_compile",
}


def is_numeric(kind) -> bool:
    """int, float, and Optional or List of them (bool is a type of its own here)."""
    return kind in (int, float) or any(is_numeric(arg) for arg in typing.get_args(kind))


def numeric_leaves(node=GraphBridgeConfig, prefix=""):
    for item in dataclasses.fields(node):
        if dataclasses.is_dataclass(item.type):
            yield from numeric_leaves(item.type, f"{prefix}{item.name}.")
        elif is_numeric(item.type):
            yield prefix + item.name


def test_every_number_of_the_schema_has_a_range_or_a_reason_to_have_none():
    unranged = [key for key in numeric_leaves() if key not in POSITIVE and key not in RANGES and key not in OPEN]
    assert unranged == []
    assert set(OPEN) <= set(numeric_leaves())  # no stale entry


def one_block(result):
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == "invalid configuration:" and all(line.startswith("  [") for line in lines[1:]), result.stderr
    return result.stderr


# The plans below (mode=plan) run one after another in one `graphbridge` process a session (conftest.py's
# cli_batch): PLANNED, after them, lists their command lines.

ZERO_AND_NEGATIVE = {
    "model.kv_channels": "0", "model.ffn_hidden_size": "0", "model.num_moe_experts": "0", "model.moe_router_topk": "0",
    "perf.warmup_steps": "-1", "perf.nan_check_interval": "-1", "model.seq_length": "0",
    "model.window_attn_skip_freq": "0", "model.original_max_position_embeddings": "0", "perf.profile_start_step": "-1",
    "model.moe_expert_capacity_factor": "-1.0", "model.rope_scaling_factor": "0",
    "model.num_layers_in_last_pipeline_stage": "0", "model.mscale": "nan", "optimizer.lr": "inf"}
ALL_AT_ONCE = ("mode=plan", *(f"{key}={value}" for key, value in ZERO_AND_NEGATIVE.items()))


def test_zero_and_negative_values_are_named_all_at_once(planned):
    stderr = one_block(planned[ALL_AT_ONCE])
    assert [key for key in ZERO_AND_NEGATIVE if f"] {key}: {key}=" not in stderr] == []


@pytest.mark.parametrize("override, key", [
    ("train.train_iters=9223372036854775807", "train.train_iters"),
    ("model.hidden_size=9223372036854775808", "model.hidden_size"),
    ("model.window_size=[-9223372036854775808,0]", "model.window_size[0]"),
    ("model.cuda_graph_warmup_steps=4294967296", "model.cuda_graph_warmup_steps"),
])
def test_integers_that_overflow_in_training_are_refused_before_a_job(cli, tmp_path, override, key):
    stderr = one_block(cli("engine=torch", override, "hydra.run.dir=run", cwd=tmp_path))
    assert f"{key}: {key}=" in stderr and "overflows the int32 indices" in stderr
    assert not (tmp_path / "run").exists()  # no job was written, nothing trained


BEYOND_INT32_WITH_OTHERS = ("mode=plan", "model.num_layers=9223372036854775808", "cuda_graph=te_attn",
                            "model.cpu_offloading=true")


def test_an_integer_beyond_int32_is_named_alone_while_the_other_rules_wait(planned):
    """int32_values is a gate: before it, the CPU-offloading rule read 2**63 layers here and ended in an
    OverflowError traceback."""
    stderr = one_block(planned[BEYOND_INT32_WITH_OTHERS])
    assert stderr.splitlines()[1:] == [
        "  [int32_values] model.num_layers: model.num_layers=9223372036854775808 overflows the int32 indices of the "
        "kernels that read it; set model.num_layers to a value between -2147483648 and 2147483647"]


NESTED_LIST = ("mode=plan", "model.cuda_graph_modules=[[attn]]")


def test_a_nested_list_is_a_wrong_type_not_a_traceback_in_a_rule(planned):
    stderr = one_block(planned[NESTED_LIST])
    assert ("[config_types] model.cuda_graph_modules[0]: model.cuda_graph_modules[0] has a value of the wrong type"
            in stderr)


SAMPLE_VALUES = (None, True, 3, 2.5, "attn", ["attn"], [3], [["attn"]], {"key": "value"}, {"key": 3},
                 Device.cpu, LoraTarget.linear_qkv, [LoraTarget.linear_qkv])
"""A value of each kind the schema's fields declare, and a few that none declares."""


def sections(cfg):
    """``cfg`` and each dataclass node below it."""
    yield cfg
    for item in dataclasses.fields(cfg):
        if dataclasses.is_dataclass(getattr(cfg, item.name)):
            yield from sections(getattr(cfg, item.name))


def test_what_config_types_passes_without_omegaconf_omegaconf_accepts():
    """config_types leaves OmegaConf's conversion out where every value is plainly of its declared type: put each
    sample value in each field, and wherever that shortcut passes the section, OmegaConf must accept it too."""
    cfg = bridge.load(["recipe=llama/tiny_lora"])
    shortcuts = 0
    for section in sections(cfg):
        for item in dataclasses.fields(section):
            if dataclasses.is_dataclass(getattr(section, item.name)):
                continue
            for value in SAMPLE_VALUES:
                changed = dataclasses.replace(section, **{item.name: value})
                if plainly_typed(changed, type(changed)):
                    shortcuts += 1
                    OmegaConf.structured(changed)  # raises where the shortcut passed a wrong type
    assert plainly_typed(cfg, GraphBridgeConfig) and shortcuts >= 200


def string_leaves(node=GraphBridgeConfig, prefix=""):
    for item in dataclasses.fields(node):
        if dataclasses.is_dataclass(item.type):
            yield from string_leaves(item.type, f"{prefix}{item.name}.")
        elif item.type in (str, typing.Optional[str]):
            yield prefix + item.name


def test_every_name_field_of_the_schema_has_its_choices_or_a_rule_that_owns_it():
    assert [key for key in string_leaves() if key not in CHOICES and key not in NAMED_ELSEWHERE] == []
    assert set(CHOICES) | set(NAMED_ELSEWHERE) <= set(string_leaves())  # no stale entry


UNKNOWN_NAMES = {"model.moe_token_dispatcher_type": "all2all", "model.cross_entropy_fusion_impl": "fused",
                 "model.activation_func": "swiglu", "model.moe_router_load_balancing_type": "aux-loss",
                 "model.transformer_impl": "te", "workload.gpu": "a100"}
WITH_UNKNOWN_NAMES = ("mode=plan", "recipe=qwen/tiny", "model.cross_entropy_loss_fusion=true",
                      *(f"{key}={value}" for key, value in UNKNOWN_NAMES.items()))


def test_a_name_its_field_does_not_know_is_refused_with_the_names_it_does(planned):
    """megatron-core's dataclasses take any string: each of these planned VALID before config_choices and then
    failed on the GPU (a dispatcher at model build, a loss kernel at the first step) or trained something else."""
    bad = UNKNOWN_NAMES
    stderr = one_block(planned[WITH_UNKNOWN_NAMES])
    assert [key for key in bad if f"[config_choices] {key}: {key}='{bad[key]}' is not a choice" not in stderr] == []
    assert "use one of allgather, alltoall, flex" in stderr and "use one of h100, h200" in stderr


RELEASE_NAMES = [("0.16.1", True), ("0.19.2", False)]


def release_name_plan(release: str) -> tuple:
    return ("mode=plan", "recipe=qwen/tiny", "model.moe_router_score_function=sqrtsoftplus",
            f"plan.megatron_core={release}")


@pytest.mark.parametrize("release, refused", RELEASE_NAMES)
def test_a_name_one_release_has_is_refused_for_the_other(planned, release, refused):
    result = planned[release_name_plan(release)]
    if refused:
        assert "model.moe_router_score_function='sqrtsoftplus' is not a choice of its field on megatron-core " \
               "0.16.1; use one of softmax, sigmoid" in one_block(result)
    else:
        assert result.returncode == 0 and result.stdout.startswith("graphbridge plan: VALID"), result.stderr


@pytest.mark.parametrize("activation", CHOICES["model.activation_func"])
def test_every_activation_it_accepts_translates_to_megatron_cores_own_function(activation):
    configs = build_megatron_configs(bridge.load(["recipe=llama/tiny", f"model.activation_func={activation}"]))
    assert configs["transformer_config"].activation_func.__name__ == activation


@pytest.mark.parametrize("key, group", [("workload.precision", "precision"), ("workload.gpu", "gpu")])
def test_the_workload_names_are_the_config_groups_choices(key, group):
    """The precision and gpu groups set these (conf/<group>/<choice>.yaml); an override may set them apart."""
    choices = sorted(path.stem for path in (Path(__file__).resolve().parents[1] / "conf" / group).glob("*.yaml"))
    assert sorted(CHOICES[key]) == choices


ABSURD_LAYOUT = ("mode=plan", "recipe=llama/tiny", "model.pipeline_model_parallel_layout='Et*2000000000|L'")


def test_a_layout_that_repeats_absurdly_is_refused_in_one_line_without_writing_it_out(planned):
    result = planned[ABSURD_LAYOUT]
    assert result.returncode == 2 and "a repeat count above 4096" in one_block(result), result.stderr


PLANNED = [ALL_AT_ONCE, BEYOND_INT32_WITH_OTHERS, NESTED_LIST, WITH_UNKNOWN_NAMES,
           *(release_name_plan(release) for release, _ in RELEASE_NAMES), ABSURD_LAYOUT]


@pytest.fixture(scope="session")
def planned(cli_batch) -> dict:
    """Each command line of PLANNED -> its `graphbridge` result, all of them by one process a session (cli_batch)."""
    return cli_batch("value_ranges", PLANNED)
