"""The flat cuda_graph group: each option composes, sets what Bridge's enablement block
sets, and gets the documented verdict on llama/tiny."""

from pathlib import Path

import pytest

import bridge
from bridge.config.paths import config_dir
from bridge.translate import build_megatron_configs

TE = "transformer_engine"
# choice -> (impl, modules)
EXPECTED = {
    "none": ("none", []),
    "auto": ("none", []),  # eager until the run measures the others (bridge.auto.candidates)
    "full_iteration": ("full_iteration", []),
    "local_layer": ("local", []),
    "te_layer": (TE, []),
    "te_attn": (TE, ["attn"]),
    "te_mlp": (TE, ["mlp"]),
    "te_attn_mlp": (TE, ["attn", "mlp"]),
    "te_moe_router": (TE, ["moe_router", "moe_preprocess"]),
    "te_attn_moe_router": (TE, ["attn", "moe_router", "moe_preprocess"]),
    "te_moe": (TE, ["moe"]),
    "te_mamba": (TE, ["mamba"]),
}
# Documented rejections on the dense llama/tiny recipe.
REJECTED_ON_DENSE = {
    "te_moe_router": "moe_modules_need_moe_model",
    "te_attn_moe_router": "moe_modules_need_moe_model",
    "te_moe": "moe_modules_need_moe_model",
    "te_mamba": "mamba_layers",
}


def test_group_is_flat_and_complete():
    group = config_dir() / "cuda_graph"
    assert sorted(p.stem for p in group.iterdir()) == sorted(EXPECTED)
    assert all(p.is_file() for p in Path(group).iterdir())


@pytest.mark.parametrize("choice", sorted(EXPECTED))
def test_choice_sets_the_enablement_block(choice):
    cfg = bridge.load(["recipe=llama/tiny", f"cuda_graph={choice}"])
    impl, modules = EXPECTED[choice]
    assert cfg.model.cuda_graph_impl.value == impl
    assert cfg.model.cuda_graph_modules == modules
    assert cfg.model.cuda_graph_warmup_steps == 3
    graphed = impl != "none"
    assert cfg.rng.te_rng_tracker is graphed and cfg.model.use_te_rng_tracker is graphed
    nan_checks = impl != "full_iteration"
    assert cfg.rerun_state_machine.check_for_nan_in_loss is nan_checks
    assert cfg.ddp.check_for_nan_in_grad is nan_checks


@pytest.mark.parametrize("choice", sorted(EXPECTED))
def test_choice_verdict_and_translation_on_llama_tiny(choice):
    plan = bridge.plan(["recipe=llama/tiny", f"cuda_graph={choice}"])
    rules = {v.rule for v in plan.config_violations}
    if choice in REJECTED_ON_DENSE:
        assert rules == {REJECTED_ON_DENSE[choice]}
        return
    assert plan.valid, plan.config_violations
    built = build_megatron_configs(plan.config)["transformer_config"]
    expected_impl = {"full_iteration": "local"}.get(plan.config.model.cuda_graph_impl.value, plan.config.model.cuda_graph_impl.value)
    assert built.cuda_graph_impl == expected_impl
