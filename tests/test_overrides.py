"""The override helper and the migration of older CUDA-graph spellings."""

import pytest

import bridge
from bridge.config.migration import migrate
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.overrides import set_cuda_graph_overrides
from bridge.translate import cuda_graph_arguments


def test_graph_impl_turns_on_both_rng_trackers():
    cfg = set_cuda_graph_overrides(GraphBridgeConfig(), impl="transformer_engine", modules=["attn", "mlp"])
    assert cfg.model.cuda_graph_impl == CudaGraphImpl.transformer_engine
    assert cfg.model.cuda_graph_modules == ["attn", "mlp"]
    assert cfg.rng.te_rng_tracker and cfg.model.use_te_rng_tracker
    assert cfg.rerun_state_machine.check_for_nan_in_loss and cfg.ddp.check_for_nan_in_grad


def test_impl_none_turns_trackers_off_and_parks_modules():
    cfg = set_cuda_graph_overrides(GraphBridgeConfig(), impl="transformer_engine", modules=["mlp"])
    set_cuda_graph_overrides(cfg, impl="none")
    assert not cfg.rng.te_rng_tracker and not cfg.model.use_te_rng_tracker
    assert cfg.model.cuda_graph_modules == ["mlp"]
    assert cuda_graph_arguments(cfg)["cuda_graph_scope"] == []


def test_full_iteration_turns_nan_checks_off_when_unset():
    cfg = set_cuda_graph_overrides(GraphBridgeConfig(), impl="full_iteration")
    assert cfg.rerun_state_machine.check_for_nan_in_loss is False
    assert cfg.ddp.check_for_nan_in_grad is False


def test_full_iteration_keeps_an_explicit_nan_check_for_validation_to_reject():
    cfg = GraphBridgeConfig()
    cfg.ddp.check_for_nan_in_grad = True
    set_cuda_graph_overrides(cfg, impl="full_iteration")
    assert cfg.ddp.check_for_nan_in_grad is True
    assert "full_iteration_nan_checks" in {v.rule for v in bridge.validate(cfg)}


def test_full_iteration_module_spelling_becomes_the_impl():
    cfg = set_cuda_graph_overrides(GraphBridgeConfig(), impl="local", modules="full_iteration")
    assert cfg.model.cuda_graph_impl == CudaGraphImpl.full_iteration
    assert cfg.model.cuda_graph_modules == []


@pytest.mark.parametrize("impl,modules", [("transformer_engine", "full_iteration"), ("local", "full_iteration,attn")])
def test_helper_rejects_impossible_arguments(impl, modules):
    with pytest.raises(ValueError, match="full_iteration"):
        set_cuda_graph_overrides(GraphBridgeConfig(), impl=impl, modules=modules)


def test_cli_impl_and_modules_alone_give_a_working_config():
    cfg = bridge.load(["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[attn]"])
    assert cfg.rng.te_rng_tracker and cfg.model.use_te_rng_tracker
    assert bridge.validate(cfg) == []


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
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": "attn,mlp"}, "transformer_engine", ["attn", "mlp"]),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": ["moe_router"]}, "transformer_engine", ["moe_router"]),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": "full"}, "transformer_engine", []),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": ["full_iteration"]}, "full_iteration", []),
        ({"external_cuda_graph": True, "cuda_graph_scope": "attn"}, "transformer_engine", ["attn"]),
    ],
)
def test_migration_maps_old_spellings(fields, impl, modules):
    cfg, report = _migrated(**fields)
    assert report.violations == []
    assert cfg.model.cuda_graph_impl == CudaGraphImpl(impl)
    assert cfg.model.cuda_graph_modules == modules
    assert len(report.notes) == sum(key in fields for key in ("enable_cuda_graph", "external_cuda_graph", "cuda_graph_scope"))
    assert cfg.model.cuda_graph_scope is None and not cfg.model.enable_cuda_graph


def test_migration_parks_a_legacy_scope_behind_impl_none():
    cfg, report = _migrated(cuda_graph_scope="full_iteration")
    assert report.notes == [] and report.violations == []
    assert cfg.model.cuda_graph_impl == CudaGraphImpl.none
    assert bridge.plan(["model.cuda_graph_scope=full_iteration"]).graphs()["parked"] == ["full_iteration"]


@pytest.mark.parametrize(
    "fields,rule",
    [
        ({"enable_cuda_graph": True, "external_cuda_graph": True}, "legacy_flags_conflict"),
        ({"enable_cuda_graph": True, "cuda_graph_impl": CudaGraphImpl.transformer_engine}, "legacy_flags_conflict"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "attn", "cuda_graph_modules": ["mlp"]}, "legacy_scope_conflict"),
        ({"cuda_graph_impl": CudaGraphImpl.transformer_engine, "cuda_graph_scope": "full_iteration"}, "legacy_scope_conflict"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "full,attn"}, "legacy_scope_names"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "full_iteration,attn"}, "legacy_scope_names"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": ""}, "legacy_scope_names"),
        ({"cuda_graph_impl": CudaGraphImpl.local, "cuda_graph_scope": "atn"}, "legacy_scope_names"),
    ],
)
def test_migration_rejects_conflicts(fields, rule):
    _, report = _migrated(**fields)
    assert [v.rule for v in report.violations] == [rule]


def test_migration_through_the_cli_prints_one_note():
    plan = bridge.plan(["model.enable_cuda_graph=true"])
    assert plan.valid and plan.config.model.cuda_graph_impl == CudaGraphImpl.local
    assert plan.notes == ["model.enable_cuda_graph=true is deprecated: migrated to model.cuda_graph_impl=local"]
