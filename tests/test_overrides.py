"""Derived values and explicit ones: what the config leaves unset follows the graph impl, what the
user set (on the command line, in a recipe or preset, in Python) stays as set and a conflict is a
violation that names the fix. Then Bridge's override helper and the migration of the older
CUDA-graph spellings."""

import dataclasses

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

import bridge
from bridge.config.migration import legacy_conflict, migrate
from bridge.config.plain import is_finished, to_yaml
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.overrides import set_cuda_graph_overrides
from bridge.prepare import prepare
from bridge.translate import cuda_graph_arguments

DERIVED_BY_IMPL = ("rng.te_rng_tracker", "model.use_te_rng_tracker", "rerun_state_machine.check_for_nan_in_loss",
                   "ddp.check_for_nan_in_grad", "model.batch_p2p_sync")


def rules(cfg) -> set:
    return {v.rule for v in bridge.validate(cfg) if v.in_config}


@pytest.mark.parametrize("impl, tracker, host_checks", [("none", False, True), ("transformer_engine", True, True),
                                                         ("local", True, True), ("full_iteration", True, False)])
def test_unset_values_follow_the_impl(impl, tracker, host_checks):
    cfg = bridge.load([f"model.cuda_graph_impl={impl}"])
    assert cfg.rng.te_rng_tracker is cfg.model.use_te_rng_tracker is tracker
    assert (cfg.rerun_state_machine.check_for_nan_in_loss is cfg.ddp.check_for_nan_in_grad
            is cfg.model.batch_p2p_sync is host_checks)


def test_the_composed_config_shows_where_derived_values_come_from(cli, tmp_path):
    shown = cli("--cfg", "job", "cuda_graph=te_attn", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "te_rng_tracker: ${graphbridge.graphed:${model.cuda_graph_impl}}" in shown.stdout
    resolved = cli("--cfg", "job", "--resolve", "cuda_graph=te_attn", cwd=tmp_path)
    assert "te_rng_tracker: true" in resolved.stdout


def test_an_explicit_tracker_off_is_kept_and_refused_not_flipped(cli, tmp_path):
    cfg = bridge.load(["cuda_graph=te_attn", "rng.te_rng_tracker=false"])
    assert cfg.rng.te_rng_tracker is False and "te_rng_tracker" in rules(cfg)
    result = cli("mode=plan", "cuda_graph=te_attn", "rng.te_rng_tracker=false", cwd=tmp_path)
    assert result.returncode == 2 and "[te_rng_tracker]" in result.stderr and "rng.te_rng_tracker=true" in result.stderr


def test_an_explicit_nan_check_under_full_iteration_is_kept_and_refused():
    cfg = bridge.load(["cuda_graph=full_iteration", "ddp.check_for_nan_in_grad=true"])
    assert cfg.ddp.check_for_nan_in_grad is True and "full_iteration_nan_checks" in rules(cfg)


def test_a_preset_value_counts_as_set():
    # Bridge's perf presets turn both NaN checks off; with no graph the derivation would turn them on.
    cfg = bridge.load(["recipe=llama/llama3_8b", "gpu=h100", "cuda_graph=none"])
    assert cfg.rerun_state_machine.check_for_nan_in_loss is False and cfg.ddp.check_for_nan_in_grad is False


def test_python_helper_on_a_composed_config_derives_the_rest():
    cfg = bridge.compose(["recipe=llama/tiny"])
    set_cuda_graph_overrides(cfg, impl="local", modules="full_iteration")   # Bridge's spelling
    finished = bridge.resolve(cfg)
    assert finished.model.cuda_graph_impl == CudaGraphImpl.full_iteration and finished.model.cuda_graph_modules == []
    assert finished.rerun_state_machine.check_for_nan_in_loss is False and finished.rng.te_rng_tracker is True
    assert bridge.plan(cfg).valid


def test_python_helper_on_a_fresh_config_keeps_what_python_set():
    cfg = GraphBridgeConfig()
    cfg.ddp.check_for_nan_in_grad = True
    set_cuda_graph_overrides(cfg, impl="full_iteration")
    finished = bridge.resolve(cfg)
    assert finished.ddp.check_for_nan_in_grad is True and finished.rerun_state_machine.check_for_nan_in_loss is False
    assert "full_iteration_nan_checks" in rules(cfg)


def test_helper_sets_only_what_it_is_given():
    cfg = bridge.compose(["cuda_graph=te_attn_mlp"])
    set_cuda_graph_overrides(cfg, impl="none")
    assert list(cfg.model.cuda_graph_modules) == ["attn", "mlp"]  # parked, not passed on
    finished = bridge.resolve(cfg)
    assert not finished.rng.te_rng_tracker and cuda_graph_arguments(finished)["cuda_graph_scope"] == []
    for dotted in DERIVED_BY_IMPL:
        section, key = dotted.split(".")
        assert OmegaConf.is_interpolation(cfg[section], key), dotted


@pytest.mark.parametrize("impl,modules", [("transformer_engine", "full_iteration"), ("local", "full_iteration,attn")])
def test_helper_rejects_impossible_arguments(impl, modules):
    with pytest.raises(ValueError, match="full_iteration"):
        set_cuda_graph_overrides(GraphBridgeConfig(), impl=impl, modules=modules)


def test_cli_impl_and_modules_alone_give_a_working_config():
    cfg = bridge.load(["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[attn]"])
    assert cfg.rng.te_rng_tracker and cfg.model.use_te_rng_tracker
    assert rules(cfg) == set()


# --- migration of the older spellings ----------------------------------------------------------


def _migrated(**model_fields):
    cfg = GraphBridgeConfig()
    for key, value in model_fields.items():
        setattr(cfg.model, key, value)
    return cfg, migrate(cfg.model)


@pytest.mark.parametrize(
    "fields,impl,modules",
    [
        ({"enable_cuda_graph": True}, "local", []),
        ({"external_cuda_graph": True}, "transformer_engine", []),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": "attn,mlp"},
         "transformer_engine", ["attn", "mlp"]),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": ["moe_router"]},
         "transformer_engine", ["moe_router"]),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": "full"}, "transformer_engine", []),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": ["full_iteration"]}, "full_iteration", []),
        ({"external_cuda_graph": True, "cuda_graph_scope": "attn"}, "transformer_engine", ["attn"]),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_modules": ["full_iteration"]}, "full_iteration", []),
        ({"cuda_graph_modules": ["full_iteration"]}, "full_iteration", []),
    ],
)
def test_migration_maps_old_spellings(fields, impl, modules):
    cfg, report = _migrated(**fields)
    assert legacy_conflict(cfg.model) is None
    assert cfg.model.cuda_graph_impl == CudaGraphImpl(impl)
    assert cfg.model.cuda_graph_modules == modules
    old = sum(key in fields for key in ("enable_cuda_graph", "external_cuda_graph", "cuda_graph_scope"))
    assert len(report.notes) == old + (fields.get("cuda_graph_modules") == ["full_iteration"])
    assert cfg.model.cuda_graph_scope is None and not cfg.model.enable_cuda_graph


def test_migration_parks_a_legacy_scope_behind_impl_none():
    cfg, report = _migrated(cuda_graph_scope="full_iteration")
    assert report.notes == [] and legacy_conflict(cfg.model) is None
    assert cfg.model.cuda_graph_impl == CudaGraphImpl.none
    assert bridge.plan(["model.cuda_graph_scope=full_iteration"]).graphs()["parked"] == ["full_iteration"]


@pytest.mark.parametrize(
    "fields,rule",
    [
        ({"enable_cuda_graph": True, "external_cuda_graph": True}, "legacy_flags"),
        ({"enable_cuda_graph": True, "cuda_graph_impl": CudaGraphImpl.transformer_engine}, "legacy_flags"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "attn", "cuda_graph_modules": ["mlp"]},
         "legacy_scope"),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": "full_iteration"}, "legacy_scope"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "full,attn"}, "legacy_scope"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "full_iteration,attn"}, "legacy_scope"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": ""}, "legacy_scope"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "atn"}, "legacy_scope"),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_modules": ["full_iteration"]},
         "legacy_scope"),
    ],
)
def test_what_cannot_be_migrated_is_left_for_the_catalogue(fields, rule):
    cfg, report = _migrated(**fields)
    assert report.notes == []
    assert legacy_conflict(cfg.model).rule == rule and rule in rules(cfg)


def test_migration_through_the_cli_prints_one_note():
    plan = bridge.plan(["model.enable_cuda_graph=true"])
    assert plan.valid and plan.config.model.cuda_graph_impl == CudaGraphImpl.local
    assert plan.notes == ["model.enable_cuda_graph=true is deprecated: migrated to model.cuda_graph_impl=local"]


def test_the_0_19_module_spelling_of_the_whole_iteration_is_migrated_on_the_cli(cli, tmp_path):
    result = cli("mode=plan", "model.cuda_graph_modules=[full_iteration]", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "note: model.cuda_graph_modules=[full_iteration] is megatron-core 0.19" in result.stdout
    assert "cuda_graph_scope = ['full_iteration']" in result.stdout
    plan = bridge.plan(["model.cuda_graph_modules=[full_iteration]"])
    assert plan.config.rerun_state_machine.check_for_nan_in_loss is False  # derived from the migrated impl


def test_the_0_16_scope_field_is_named_for_what_it_is():
    plan = bridge.plan(["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope='attn,mlp'"])
    assert plan.notes == ["model.cuda_graph_scope=['attn', 'mlp'] (megatron-core 0.16.1's field) is "
                          "model.cuda_graph_modules=['attn', 'mlp'] here: migrated"]


@pytest.mark.parametrize("fields", [
    {}, {"enable_cuda_graph": True}, {"external_cuda_graph": True, "cuda_graph_scope": "attn"},
    {"cuda_graph_scope": "full_iteration"}, {"cuda_graph_modules": ["full_iteration"]},
    {"enable_cuda_graph": True, "external_cuda_graph": True},
    {"num_layers": "4"}, {"hidden_size": "${model.ffn_hidden_size}"}, {"cuda_graph_scope": "???"}])
def test_a_config_object_is_finished_as_its_omegaconf_twin_is(fields):
    """prepare() leaves OmegaConf out for an object with nothing to convert or resolve (bridge.config.plain): it
    migrates, notes and derives exactly as through OmegaConf, and a value to convert, an interpolation or a missing
    value still goes through it."""
    loaded = bridge.load(["recipe=llama/tiny"])
    cfg = dataclasses.replace(loaded, model=dataclasses.replace(loaded.model, **fields))
    assert is_finished(cfg) == (not set(fields) & {"num_layers", "hidden_size"} and "???" not in fields.values())
    try:
        twin = prepare(OmegaConf.structured(cfg))
    except MissingMandatoryValue:
        with pytest.raises(MissingMandatoryValue):
            prepare(cfg)
        return
    prepared = prepare(cfg)
    assert (prepared.config, prepared.notes, prepared.derived) == (twin.config, twin.notes, twin.derived)


@pytest.mark.parametrize("overrides", [
    ("recipe=llama/tiny",), ("recipe=deepseek/tiny", "cuda_graph=te_attn_moe_router"),
    ("recipe=llama/llama3_70b_lora", "gpu=h100", "precision=fp8_cs"), ("recipe=gpt_oss/tiny", "model.window_size=null")])
def test_a_run_writes_the_resolved_yaml_omegaconf_would(overrides):
    """perf.launch writes resolved.yaml with bridge.config.plain.to_yaml, which skips OmegaConf's typed tree for a
    finished config: the text is OmegaConf's, enums, lists, nulls and field order alike; an unfinished one goes
    through OmegaConf itself."""
    cfg = bridge.load(list(overrides))
    assert is_finished(cfg) and to_yaml(cfg) == OmegaConf.to_yaml(OmegaConf.structured(cfg))
    unfinished = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, num_layers="4"))
    assert to_yaml(unfinished) == OmegaConf.to_yaml(OmegaConf.structured(unfinished))
