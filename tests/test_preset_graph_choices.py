"""Every workload preset x every cuda_graph choice: the verdict the rule catalogue reaches against the one the
preset's reference row implies (rows: tests/preset_reference.py), each choice it accepts built into megatron-core's
TransformerConfig, and the interesting combinations through the command line (the preset files and their own
verdicts: test_presets.py).
"""

import copy
import importlib.util
from typing import Tuple

import pytest
from omegaconf import OmegaConf

import bridge
from bridge.config.paths import config_dir
from bridge.validation.memory_rules import MEMORY_RULES
from bridge.translate import build_megatron_configs
from tests.preset_reference import ROWS, PresetRow, composed_presets, row_kind
from tests.sampling import one_per


# Session-scoped and composed once a session (shared with test_presets.py): see that module's fixture.
@pytest.fixture(scope="session")
def composed(across_workers):
    """Every recipe x preset composed once through Hydra (the CLI path)."""
    return across_workers("composed_presets", composed_presets)


CHOICES = {path.stem: OmegaConf.to_container(OmegaConf.load(path)["model"])
           for path in sorted((config_dir() / "cuda_graph").glob("*.yaml"))}


def expected_violations(row: PresetRow, impl: str, modules: Tuple[str, ...]) -> set:
    """The verdict the rule catalogue should reach, from facts of the reference row."""
    family = row.recipe.split("/")[0]
    dense, all_moe = family == "llama", family in ("qwen", "gpt_oss")
    rules = set()
    if row.parked == ("full_iteration",) and impl != "none":
        # the parked legacy scope: local takes it up (migration), TE conflicts with it
        if impl == "local":
            impl = "full_iteration"
        elif impl == "transformer_engine":
            rules.add("legacy_scope")
    if impl == "none":
        return rules
    mods = set(modules) if impl != "full_iteration" else set()
    if row.has("offload"):
        rules.add("cpu_offloading")
    if row.has("mfsdp"):
        rules.add("megatron_fsdp_graphs")
    if row.recompute.startswith("full") and impl != "full_iteration":
        rules.add("full_recompute")
    if dense and {"moe", "moe_router"} & mods:
        rules.add("moe_modules_need_moe_model")
    if all_moe and "mlp" in mods:
        rules.add("mlp_needs_dense_layers")
    if not dense and "moe" in mods:  # every preset is dropless
        rules.add("moe_needs_drop_and_pad")
    if not dense and (impl == "full_iteration" or not mods or "moe" in mods):
        rules.add("dropless_moe_capture")  # whole-layer or whole-iteration capture of the dispatch
    if "mamba" in mods:
        rules.add("mamba_layers")
    if row.recipe.endswith(("_sft", "_lora")) and (impl != "transformer_engine" or not mods or "attn" in mods):
        rules.add("packed_sequence_scope")
    if row.has("a2a") and (impl != "transformer_engine" or not mods or {"moe", "mlp"} & mods):
        rules.add("ep_overlap")
    if row.has("a2a") and impl == "transformer_engine" and (not mods or "attn" in mods):
        rules.add("delay_wgrad_graphed_attention")  # delayed wgrad is on with the overlap; no grad-accum fusion
    if row.has("expandable") and not row.has("nccl_graph_register"):
        if impl == "transformer_engine" or row.gpu == "h100":
            rules.add("nccl_graph_register")
    if row.recompute.startswith("sel") and impl in ("local", "transformer_engine"):
        # 0.16.1 checkpoints core_attn and a dense mlp reentrantly, which capture refuses (the presets recompute
        # no moe or shared_experts)
        graphed, recomputed = mods or {"attn", "mlp"}, set(row.recompute.split()[1].split(","))
        if ("attn" in graphed and "core_attn" in recomputed) or ("mlp" in graphed and "mlp" in recomputed
                                                                 and not all_moe):
            rules.add("recompute_in_layer_graphs")
        if family == "deepseek" and "attn" in graphed and {"mla_up_proj", "layernorm"} & recomputed:
            rules.add("mla_recompute_in_layer_graphs")  # MLA's recompute inside graphed attention
        router_graphs = {"moe_router", "moe_preprocess"} <= mods and (row.has("alltoall") or row.has("a2a"))
        if (not dense and impl == "transformer_engine" and "layernorm" in recomputed
                and (not mods or "moe" in mods or router_graphs)):
            rules.add("moe_norm_recompute_in_layer_graphs")  # the MoE layer's norm recomputed inside its graph
    return rules


def _with_choice(composed, choice: str):
    """``cuda_graph=<choice>`` on a composed preset, as the group option sets it. Returned unfinished:
    bridge.validate finishes it as the command line does (migration of a preset's legacy scope, derived
    values), and finishing it here as well would do that work twice for each choice of each preset."""
    values = CHOICES[choice]
    cfg = copy.deepcopy(composed)
    cfg.model.cuda_graph_impl, cfg.model.cuda_graph_modules = values["cuda_graph_impl"], values["cuda_graph_modules"]
    return cfg


def _megatron_buildable(cfg):
    """Without Transformer Engine megatron-core 0.16.1's TransformerConfig refuses FP8, the
    fused MoE permute and delayed wgrad (a TE version check); those are environment checks,
    not config ones, so they are dropped on such machines."""
    if importlib.util.find_spec("transformer_engine") is None:
        cfg.model.fp8 = None
        cfg.model.moe_permute_fusion = False
        cfg.model.delay_wgrad_compute = False
    return cfg


# One preset of each kind of row (row_kind) by default: every family, recompute, offload, overlap and allocator
# setting the verdicts depend on; every preset under -m slow.
@pytest.mark.parametrize("key", one_per(sorted(ROWS), row_kind, ids="-".join))
def test_every_cuda_graph_choice_gets_the_expected_verdict(composed, key):
    row = ROWS[key]
    for choice, values in CHOICES.items():
        cfg = _with_choice(composed[key], choice)
        # Whether a choice fits the GPU is the memory estimate's verdict, not a fact of the row (tests/test_memory.py).
        found = {v.rule for v in bridge.validate(cfg) if v.in_config and v.rule not in MEMORY_RULES}
        expected = expected_violations(row, values["cuda_graph_impl"], tuple(values["cuda_graph_modules"]))
        assert found == expected, choice
        if not found:
            finished = bridge.resolve(cfg)
            tc = build_megatron_configs(_megatron_buildable(finished))["transformer_config"]
            assert tc.num_layers == finished.model.num_layers


def test_full_iteration_under_pipeline_parallelism_drops_the_p2p_sync_on_the_cli():
    plan = bridge.plan(["recipe=deepseek/deepseek_v3", "gpu=b200", "cuda_graph=full_iteration"])
    assert plan.config.model.pipeline_model_parallel_size > 1 and plan.config.model.batch_p2p_sync is False
    assert "full_iteration_p2p_sync" not in {v.rule for v in plan.violations}


@pytest.mark.parametrize("overrides, rule", [
    # the CLI path agrees with _with_choice on the interesting cases
    (["recipe=qwen/qwen3_30b_a3b", "gpu=gb200", "cuda_graph=te_mlp"], "mlp_needs_dense_layers"),
    (["recipe=gpt_oss/gpt_oss_120b", "gpu=b300", "cuda_graph=te_attn_mlp"], "mlp_needs_dense_layers"),
    (["recipe=qwen/qwen3_235b_a22b", "gpu=gb300", "cuda_graph=te_moe"], "moe_needs_drop_and_pad"),
    (["recipe=llama/llama3_70b", "gpu=gb200", "cuda_graph=full_iteration"], "cpu_offloading"),
    (["recipe=qwen/qwen3_235b_a22b", "gpu=h100", "cuda_graph=full_iteration"], "ep_overlap"),
    (["recipe=llama/llama3_8b", "gpu=gb200", "precision=nvfp4", "cuda_graph=te_attn"], "legacy_scope"),
    (["recipe=deepseek/deepseek_v3", "gpu=h100", "cuda_graph=te_attn_moe_router"], "nccl_graph_register"),
])
def test_illegal_combinations_compose_and_the_plan_reports_them(overrides, rule):
    plan = bridge.plan(overrides)
    assert not plan.valid
    assert rule in {v.rule for v in plan.violations}


def test_deepseek_under_pipeline_parallelism_takes_the_mlp_scope_through_the_cli():
    # te_mlp keeps the preset's mla_up_proj recompute out of graphed attention (mla_recompute_in_layer_graphs).
    # DeepSeek-V3's three dense layers all sit on the first stage: the other stages graph nothing and meet its capture.
    plan = bridge.plan(["recipe=deepseek/deepseek_v3", "gpu=b200", "cuda_graph=te_mlp"])
    assert plan.config.model.pipeline_model_parallel_size > 1
    assert plan.valid, plan.violations


def test_a_cuda_graph_choice_on_the_command_line_beats_the_preset():
    plan = bridge.plan(["recipe=llama/llama3_8b", "gpu=b200", "cuda_graph=te_attn"])
    assert plan.graphs()["impl"] == "transformer_engine" and plan.graphs()["modules"] == ["attn"]
    eager = bridge.plan(["recipe=qwen/qwen3_30b_a3b", "gpu=gb200", "cuda_graph=none"])
    assert eager.graphs()["impl"] == "none"


def test_local_takes_up_a_parked_full_iteration_scope():
    plan = bridge.plan(["recipe=llama/llama3_8b", "gpu=gb200", "precision=nvfp4", "model.cuda_graph_impl=local"])
    assert plan.valid, plan.violations
    assert plan.graphs()["impl"] == "full_iteration"
