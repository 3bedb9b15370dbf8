"""Per-(gpu, precision) workload presets: every preset file against the reference table (Bridge v0.3.1, V1
variants; transcribed in tests/preset_reference.py), the values each preset takes effect with, every preset
planning valid on its own GPU, and docs/recipes.md's table of them (every preset x every cuda_graph choice:
test_preset_graph_choices.py; choosing a preset and weak scaling: test_preset_selection.py).
"""

import pytest
import recipe_table
from omegaconf import OmegaConf
from sections import with_section

from bridge.config.paths import config_dir
from bridge.planning import build_plan, describe_graphs
from bridge.prepare import prepare
from bridge.recipes import presets, recipe_names
from tests.preset_reference import ROWS, composed_presets

MOE_FAMILIES = ("deepseek", "qwen", "gpt_oss")


# Session-scoped (shared with test_preset_graph_choices.py): pytest-xdist hands a worker this module's tests in
# several batches between other modules', and a module-scoped fixture is built again for each batch (~15 s); composed
# by one worker, read back by the others (conftest.py's across_workers).
@pytest.fixture(scope="session")
def composed(across_workers):
    """Every recipe x preset composed once through Hydra (the CLI path)."""
    return across_workers("composed_presets", composed_presets)


def test_preset_files_are_exactly_the_reference_rows():
    found = {(recipe, gpu, precision) for recipe in recipe_names() for gpu, precision in presets(recipe)
             if gpu != "h200"}
    assert found == set(ROWS)


def test_every_h100_preset_has_an_h200_twin_that_is_exactly_it():
    """Bridge v0.3.1 has no H200 presets: gpu=h200 takes the recipe's H100 preset as it is (one composes
    through the CLI in tests/test_memory.py; docs/recipes.md's h100 rows give their verdicts)."""
    by_gpu = {gpu: {(recipe, precision) for recipe in recipe_names() for g, precision in presets(recipe) if g == gpu}
              for gpu in ("h100", "h200")}
    assert by_gpu["h100"] and by_gpu["h200"] == by_gpu["h100"]
    for recipe, precision in by_gpu["h200"]:
        twin = OmegaConf.load(config_dir() / "preset" / recipe / f"h200_{precision}.yaml")
        assert OmegaConf.to_container(twin) == {"defaults": [f"h100_{precision}"]}, recipe
    # And the gpu options differ only in the name they record.
    gpus = {gpu: OmegaConf.to_container(OmegaConf.load(config_dir() / "gpu" / f"{gpu}.yaml")) for gpu in by_gpu}
    assert gpus["h200"] == {"workload": {"gpu": "h200", "gpus_per_node": 8}}
    assert gpus["h100"] == {"workload": {"gpu": "h100", "gpus_per_node": 8}}


@pytest.mark.parametrize("key, connections", [
    (("llama/llama3_8b", "h100", "bf16"), "1"),   # CP 2: communication kernels in issue order
    (("qwen/qwen3_30b_a3b", "h100", "bf16"), "32"),   # the flex dispatcher's streams
    (("llama/llama3_70b", "b200", "bf16"), "32"),   # Blackwell: always 32
])
def test_a_presets_stream_connections_win_over_the_gpus(composed, key, connections):
    assert composed[key].env_vars.CUDA_DEVICE_MAX_CONNECTIONS == connections


@pytest.mark.parametrize("key", sorted(ROWS), ids="-".join)
def test_effective_values_match_the_reference(prepared_presets, key):
    row, cfg = ROWS[key], prepared_presets[key]
    model, train = cfg.model, cfg.train
    assert (model.tensor_model_parallel_size, model.pipeline_model_parallel_size, model.context_parallel_size,
            model.virtual_pipeline_model_parallel_size, model.expert_model_parallel_size) == (
        row.tp, row.pp, row.cp, row.vp, row.ep)
    assert model.sequence_parallel == (row.tp > 1)
    assert (train.micro_batch_size, train.global_batch_size) == (row.mbs, row.gbs)
    assert train.num_gpus == cfg.workload.preset_num_gpus == row.gpus
    assert (cfg.workload.gpu, cfg.workload.precision) == (row.gpu, row.precision)
    if row.recipe.split("/")[0] in MOE_FAMILIES:
        assert model.expert_tensor_parallel_size == 1

    graphs = describe_graphs(cfg)
    assert graphs["impl"] == row.impl
    assert tuple(graphs["modules"] if row.impl != "none" else ()) == row.modules
    assert tuple(graphs["parked"] or ()) == row.parked

    if row.recompute == "-":
        assert model.recompute_granularity is None
    elif row.recompute.startswith("full/block"):
        assert (model.recompute_granularity, model.recompute_method, model.recompute_num_layers) == (
            "full", "block", int(row.recompute.split()[1]))
    else:
        assert model.recompute_granularity == "selective"
        assert model.recompute_modules == row.recompute.split()[1].split(",")

    offload = row.value("offload")
    assert model.cpu_offloading == (offload is not None)
    assert model.cpu_offloading_num_layers == (int(offload) if offload else 0)
    assert cfg.ddp.use_megatron_fsdp == row.has("mfsdp")
    assert model.overlap_moe_expert_parallel_comm == model.delay_wgrad_compute == row.has("a2a")
    assert model.pipeline_model_parallel_layout == row.value("layout")
    for backend in ("hybridep", "deepep"):
        if row.has(backend):
            assert (model.moe_token_dispatcher_type, model.moe_flex_dispatcher_backend) == ("flex", backend)
    if row.has("alltoall"):
        assert model.moe_token_dispatcher_type == "alltoall"
    assert ("PYTORCH_CUDA_ALLOC_CONF" in cfg.env_vars) == row.has("expandable")
    assert (cfg.env_vars.get("NCCL_GRAPH_REGISTER") == "0") == row.has("nccl_graph_register")
    if row.value("seq"):
        assert cfg.dataset.seq_length == int(row.value("seq"))


@pytest.mark.parametrize("key", sorted(ROWS), ids="-".join)
def test_bridge_perf_defaults_apply(prepared_presets, key):
    cfg = prepared_presets[key]
    assert cfg.train.train_iters == 50
    assert cfg.rerun_state_machine.check_for_nan_in_loss is False
    assert cfg.ddp.check_for_nan_in_grad is False
    assert cfg.dataset.mock is True
    assert cfg.workload.task == ("sft" if key[0].endswith("_sft") else "lora" if key[0].endswith("_lora") else "pretrain")
    assert cfg.model.seq_length == cfg.dataset.seq_length


# --- every preset as shipped, on its own GPU ----------------------------------------------------

ENGINE_LIMITS = {"engine_memory"}
"""Refusals of graphbridge's own engine, documented in the README and docs/recipes.md: it has no fp8 primary weights,
so the 70B LoRA B200 MXFP8 preset (Bridge keeps its frozen base in MXFP8) does not fit it; its plan says so and names
Megatron-Bridge. (The Llama 3 70B and 405B presets Bridge runs with Megatron-FSDP train with it here too.)"""
ESTIMATE_REFUSES = {("llama/llama31_405b", "b300", precision): "the memory estimate puts Bridge's TP2 PP8 VP8 layout "
                    "at ~391 GiB a GPU of the B300's 268 (it names full recompute, ~169 GiB); no GPU run has measured "
                    "it, Bridge 0.3.1's performance summary lists no B300 405B run, and Bridge's later B300 405B "
                    "recipe trains with Megatron-FSDP and 40 layers' activations offloaded to the host instead"
                    for precision in ("bf16", "fp8_cs", "fp8_mx")}
"""Presets the memory estimate refuses (memory_capacity), each with what a measurement would have to settle."""


PRESET_KEYS = [key for key in recipe_table.keys() if key[1] is not None]


@pytest.mark.parametrize("key", PRESET_KEYS, ids="-".join)
def test_every_preset_plans_valid_on_its_own_gpu(composed, key):
    refusing = {violation.rule for violation in build_plan(prepare(composed[key])).config_violations}
    expected = ENGINE_LIMITS | ({"memory_capacity"} if key in ESTIMATE_REFUSES else set())
    assert refusing <= expected, refusing


# --- the recipe table of docs/recipes.md ---------------------------------------------------------

def test_the_recipe_table_is_up_to_date(composed):
    page = recipe_table.RECIPES_PAGE.read_text()
    assert with_section(page, "recipes", recipe_table.markdown(composed)) == page, (
        "docs/recipes.md's recipe table is out of date: run python scripts/recipe_table.py")
