"""Per-(gpu, precision) workload presets: every preset file against the reference table
(Bridge v0.3.1, V1 variants) and every preset x every cuda_graph choice against the expected
verdict (choosing a preset and weak scaling: test_preset_selection.py).

The expected table below is transcribed from the reference (megatron-cuda-graphs.md §3.3),
not read from the YAML: one row per reference row, precisions sharing a row comma-separated.
Columns: recipe gpu precisions | GPUs GBS | TP PP CP VP EP MBS | CG impl | CG scope |
recompute | other. "-" is unset. Effective dispatchers are written out (the v0.3.1 recipes
use alltoall where a preset's flex backend is unused; family settings, reference §3.2).
"""

import copy
import importlib.util
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

import pytest
import recipe_table
from omegaconf import OmegaConf
from sections import with_section

import bridge
from bridge.config.paths import config_dir
from bridge.planning import build_plan, describe_graphs
from bridge.prepare import prepare
from bridge.recipes import presets, recipe_names
from bridge.validation.memory_rules import MEMORY_RULES
from bridge.translate import build_megatron_configs

TABLE = """
llama/llama3_70b_lora  h100  bf16               | 8 32   | 1 4 1 20 1 1 | -  | -    | full/block 1 | -
llama/llama3_70b_lora  h100  fp8_cs             | 8 32   | 2 4 1 20 1 1 | -  | -    | -            | -
llama/llama3_70b_lora  b200  bf16,fp8_cs,fp8_mx | 8 32   | 1 2 1 - 1 1  | te | mlp  | -            | -
llama/llama3_70b_lora  b300  bf16               | 8 32   | 1 1 1 - 1 1  | te | mlp  | -            | -
llama/llama3_70b_lora  b300  fp8_cs,fp8_mx      | 8 32   | 1 2 1 - 1 1  | te | mlp  | -            | -
llama/llama3_70b_lora  gb200 bf16               | 8 64   | 1 1 1 - 1 1  | te | mlp  | -            | seq=2048
llama/llama3_70b_lora  gb200 fp8_cs,fp8_mx      | 8 32   | 1 2 1 - 1 1  | te | mlp  | -            | -
llama/llama3_70b_lora  gb300 bf16,fp8_cs        | 8 32   | 1 1 1 - 1 1  | te | mlp  | -            | -
llama/llama3_70b_lora  gb300 fp8_mx             | 8 32   | 1 2 1 - 1 1  | te | mlp  | -            | -
llama/llama3_70b       h100  bf16               | 64 128 | 4 4 2 5 1 1  | -  | -    | -            | -
llama/llama3_70b       h100  fp8_cs             | 64 128 | 4 8 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       b200  bf16               | 64 128 | 2 4 2 5 1 1  | local | full_iteration | - | -
llama/llama3_70b       b200  fp8_cs             | 64 128 | 1 1 1 - 1 1  | -  | -    | -            | offload=5
llama/llama3_70b       b200  fp8_mx,nvfp4       | 64 128 | 2 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       b300  bf16,fp8_cs        | 64 128 | 1 1 1 - 1 1  | -  | -    | -            | -
llama/llama3_70b       b300  fp8_mx             | 64 128 | 1 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       b300  nvfp4              | 64 128 | 1 4 1 5 1 1  | none | full_iteration | - | -
llama/llama3_70b       gb200 bf16               | 64 128 | 1 1 1 - 1 1  | -  | -    | -            | offload=20
llama/llama3_70b       gb200 fp8_cs             | 64 128 | 1 1 1 - 1 2  | -  | -    | -            | offload=40
llama/llama3_70b       gb200 fp8_mx             | 64 128 | 2 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       gb200 nvfp4              | 64 128 | 2 4 1 5 1 1  | none | full_iteration | - | -
llama/llama3_70b       gb300 bf16               | 64 128 | 1 1 1 - 1 2  | -  | -    | -            | offload=30
llama/llama3_70b       gb300 fp8_cs             | 64 128 | 1 1 1 - 1 2  | -  | -    | -            | offload=20
llama/llama3_70b       gb300 fp8_mx             | 64 128 | 1 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       gb300 nvfp4              | 64 128 | 1 4 1 5 1 1  | none | full_iteration | - | -
llama/llama3_70b_sft   h100  bf16               | 32 32  | 4 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b_sft   h100  fp8_cs             | 32 32  | 4 4 1 5 1 1  | te | mlp  | -            | expandable,nccl_graph_register
llama/llama3_70b_sft   gb200 bf16,fp8_mx        | 32 32  | 1 8 1 10 1 1 | te | mlp  | -            | -
llama/llama3_70b_sft   gb200 fp8_cs             | 32 32  | 1 4 1 10 1 1 | te | mlp  | -            | -
llama/llama3_70b_sft   gb300 bf16,fp8_cs,fp8_mx | 32 32  | 1 2 1 20 1 1 | te | mlp  | -            | -
llama/llama3_8b        h100  bf16               | 8 128  | 1 1 2 - 1 1  | -  | -    | -            | -
llama/llama3_8b        h100  fp8_cs             | 8 128  | 1 1 1 - 1 1  | -  | -    | full/block 5 | -
llama/llama3_8b        b200  bf16,fp8_cs,fp8_mx | 8 128  | 1 1 1 - 1 2  | local | full_iteration | - | -
llama/llama3_8b        b200  nvfp4              | 8 128  | 1 1 1 - 1 4  | -  | -    | -            | -
llama/llama3_8b        b300  bf16,fp8_cs,fp8_mx | 8 128  | 1 1 1 - 1 4  | local | full_iteration | - | -
llama/llama3_8b        b300  nvfp4              | 8 128  | 1 1 1 - 1 4  | -  | -    | -            | -
llama/llama3_8b        gb200 bf16,fp8_cs,fp8_mx | 8 128  | 1 1 1 - 1 2  | local | full_iteration | - | -
llama/llama3_8b        gb200 nvfp4              | 8 128  | 1 1 1 - 1 4  | none | full_iteration | - | -
llama/llama3_8b        gb300 bf16,fp8_cs,fp8_mx,nvfp4 | 8 128 | 1 1 1 - 1 4 | local | full_iteration | - | -
llama/llama3_8b_sft    h100  bf16               | 8 32   | 1 1 1 - 1 1  | -  | -    | -            | -
llama/llama3_8b_sft    h100  fp8_cs             | 8 32   | 1 1 1 - 1 1  | none | mlp | -            | -
llama/llama3_8b_sft    gb200 bf16,fp8_cs,fp8_mx | 8 8    | 1 1 1 - 1 1  | none | mlp | -            | seq=16384
llama/llama31_405b     h100  bf16,fp8_cs        | 1024 512 | 8 8 2 8 1 1 | - | -   | -            | -
llama/llama31_405b     b200  bf16,fp8_cs,fp8_mx | 128 64 | 4 8 2 8 1 1  | -  | -    | -            | -
llama/llama31_405b     b200  nvfp4              | 128 64 | 4 16 1 8 1 1 | -  | -    | full/block 1 | -
llama/llama31_405b     b300  bf16,fp8_cs,fp8_mx | 128 64 | 2 8 1 8 1 1  | -  | -    | -            | -
llama/llama31_405b     b300  nvfp4              | 128 64 | 4 8 2 4 1 1  | -  | -    | -            | -
llama/llama31_405b     gb200 bf16               | 128 64 | 4 8 2 8 1 1  | -  | -    | -            | -
llama/llama31_405b     gb200 fp8_mx             | 128 64 | 4 8 2 8 1 1  | -  | -    | -            | expandable
llama/llama31_405b     gb200 fp8_cs             | 128 64 | 2 1 1 - 1 1  | -  | -    | -            | offload=92,expandable
llama/llama31_405b     gb200 nvfp4              | 128 64 | 4 16 1 8 1 1 | none | full_iteration | full/block 1 | -
llama/llama31_405b     gb300 bf16               | 128 64 | 2 1 1 - 1 1  | -  | -    | -            | offload=40
llama/llama31_405b     gb300 fp8_cs             | 128 64 | 2 1 1 - 1 1  | -  | -    | -            | offload=10
llama/llama31_405b     gb300 fp8_mx             | 128 64 | 4 8 2 4 1 1  | -  | -    | -            | -
llama/llama31_405b     gb300 nvfp4              | 128 64 | 4 8 1 4 1 1  | local | full_iteration | - | -
deepseek/deepseek_v3   h100  bf16,fp8_cs,fp8_sc | 1024 8192 | 2 8 1 4 64 1 | - | - | sel mla_up_proj,mlp | hybridep,layout=Et|(tt|)*30mL,expandable
deepseek/deepseek_v3   b200  bf16,fp8_cs,fp8_mx | 256 2048 | 1 16 1 - 8 1 | -  | -    | sel mla_up_proj | hybridep,layout=Et*4|(t*4|)*14tmL
deepseek/deepseek_v3   b300  bf16,fp8_cs,fp8_mx | 256 2048 | 1 16 1 - 8 1 | -  | -    | sel mla_up_proj | hybridep,layout=Et*4|(t*4|)*14tmL
deepseek/deepseek_v3   gb200 bf16,fp8_cs,fp8_mx | 256 2048 | 1 4 1 4 64 1 | te | attn,moe_router,moe_preprocess | sel mla_up_proj | hybridep,layout=Et*4|(t*4|)*14tmL
deepseek/deepseek_v3   gb300 bf16               | 256 2048 | 1 4 1 4 64 1 | te | attn,moe_router,moe_preprocess | sel moe_act | hybridep,layout=Et*4|(t*4|)*14tmL
deepseek/deepseek_v3   gb300 fp8_cs,fp8_mx,nvfp4 | 256 2048 | 1 2 1 8 32 2 | - | - | sel mla_up_proj | hybridep,layout=Et*4|(t*4|)*14tmL
qwen/qwen3_235b_a22b   h100  bf16,fp8_cs        | 256 2048 | 2 8 1 4 32 1 | - | -  | -            | alltoall,a2a
qwen/qwen3_235b_a22b   b200  bf16               | 64 1024 | 1 8 1 4 8 1  | -  | -    | -            | alltoall
qwen/qwen3_235b_a22b   b200  fp8_cs,fp8_mx      | 64 1024 | 1 8 1 - 8 1  | -  | -    | -            | alltoall
qwen/qwen3_235b_a22b   b300  bf16,fp8_cs,fp8_mx | 64 1024 | 1 8 1 - 8 1  | -  | -    | -            | alltoall
qwen/qwen3_235b_a22b   gb200 bf16,fp8_cs,fp8_mx | 64 1024 | 1 8 1 - 8 1  | te | attn,moe_router,moe_preprocess | - | hybridep
qwen/qwen3_235b_a22b   gb300 bf16,fp8_cs,fp8_mx | 64 1024 | 1 1 1 - 64 2 | te | moe_router,moe_preprocess | - | hybridep
qwen/qwen3_30b_a3b     h100  bf16               | 16 1024 | 1 1 1 - 16 1 | te | moe_router,moe_preprocess | - | hybridep
qwen/qwen3_30b_a3b     h100  fp8_cs             | 16 1024 | 1 1 1 - 16 1 | -  | -    | -            | hybridep
qwen/qwen3_30b_a3b     b200  bf16,fp8_cs,fp8_mx | 8 512  | 1 1 1 - 8 4  | te | attn,moe_router,moe_preprocess | - | hybridep
qwen/qwen3_30b_a3b     b300  bf16,fp8_cs,fp8_mx | 8 512  | 1 1 1 - 8 8  | te | moe_router,moe_preprocess | - | hybridep
qwen/qwen3_30b_a3b     gb200 bf16,fp8_cs        | 8 512  | 1 1 1 - 8 4  | te | attn,moe_router,moe_preprocess | - | hybridep
qwen/qwen3_30b_a3b     gb200 fp8_mx             | 8 512  | 1 1 1 - 8 4  | te | moe_router,moe_preprocess | - | hybridep
qwen/qwen3_30b_a3b     gb300 bf16,fp8_cs,fp8_mx | 8 512  | 1 1 1 - 8 8  | te | moe_router,moe_preprocess | - | hybridep
qwen/qwen3_next_80b_a3b h100 bf16,fp8_cs        | 128 1024 | 1 1 1 - 128 1 | - | - | -            | alltoall
qwen/qwen3_next_80b_a3b b200 bf16,fp8_mx        | 64 1024 | 1 1 1 - 64 1 | -  | -    | -            | alltoall
qwen/qwen3_next_80b_a3b b300 bf16               | 64 1024 | 1 1 1 - 64 1 | -  | -    | -            | alltoall
qwen/qwen3_next_80b_a3b b300 fp8_mx             | 64 1024 | 1 1 1 - 64 2 | -  | -    | -            | alltoall
qwen/qwen3_next_80b_a3b gb200 bf16,fp8_mx       | 64 1024 | 1 1 1 - 64 1 | -  | -    | -            | alltoall
qwen/qwen3_next_80b_a3b gb300 bf16              | 64 1024 | 1 1 1 - 64 1 | -  | -    | -            | alltoall
qwen/qwen3_next_80b_a3b gb300 fp8_mx            | 64 1024 | 1 1 1 - 64 2 | -  | -    | -            | alltoall
gpt_oss/gpt_oss_120b   h100  bf16               | 64 512 | 1 4 1 - 8 1  | -  | -    | sel layernorm,moe_act | deepep
gpt_oss/gpt_oss_120b   b200  bf16               | 64 512 | 1 1 1 - 64 4 | -  | -    | sel layernorm,moe_act | deepep
gpt_oss/gpt_oss_120b   b300  bf16               | 64 512 | 1 1 1 - 64 4 | te | attn,moe_router,moe_preprocess | - | deepep
gpt_oss/gpt_oss_120b   gb200 bf16               | 64 512 | 1 1 1 - 64 4 | -  | -    | sel layernorm,moe_act | alltoall
gpt_oss/gpt_oss_120b   gb300 bf16               | 64 512 | 1 1 1 - 64 4 | te | attn,moe_router,moe_preprocess | - | alltoall
"""

IMPLS = {"-": "none", "none": "none", "local": "full_iteration", "te": "transformer_engine"}
MOE_FAMILIES = ("deepseek", "qwen", "gpt_oss")


@dataclass(frozen=True)
class PresetRow:
    recipe: str
    gpu: str
    precision: str
    gpus: int
    gbs: int
    tp: int
    pp: int
    cp: int
    vp: Optional[int]
    ep: int
    mbs: int
    impl: str                   # our canonical impl
    modules: Tuple[str, ...]    # active modules (empty for full_iteration and eager)
    parked: Tuple[str, ...]     # parked behind impl none
    recompute: str
    other: FrozenSet[str]

    @property
    def key(self):
        return (self.recipe, self.gpu, self.precision)

    def has(self, flag: str) -> bool:
        return any(item == flag or item.startswith(flag + "=") for item in self.other)

    def value(self, flag: str) -> Optional[str]:
        return next((item.split("=", 1)[1] for item in self.other if item.startswith(flag + "=")), None)


DEPARTURES = {
    ("deepseek/deepseek_v3", "gb200"): (
        "moe_router,moe_preprocess",
        "Bridge also graphs attn, holding the mla_up_proj recompute inside the graph: replay read freed memory on the "
        "GPU (gpu_witnesses_2gpu_cfa782d.json, deepseek_v3_gb200_recompute_attn_router_preprocess); the preset YAML "
        "says so"),
}
"""(recipe, gpu) -> (graph scope graphbridge ships instead of the reference's, why)."""


def _rows():
    for line in TABLE.strip().splitlines():
        head, sizes, parallel, impl, scope, recompute, other = (part.strip() for part in line.split("|", 6))
        recipe, gpu, precisions = head.split()
        scope = DEPARTURES.get((recipe, gpu), (scope,))[0]
        gpus, gbs = map(int, sizes.split())
        tp, pp, cp, vp, ep, mbs = (None if x == "-" else int(x) for x in parallel.split())
        names = () if scope == "-" else tuple(scope.split(","))
        ours = IMPLS[impl]
        active = names if ours == "transformer_engine" else ()
        parked = names if impl == "none" else ()
        flags = frozenset() if other == "-" else frozenset(_split_other(other))
        for precision in precisions.split(","):
            yield PresetRow(recipe, gpu, precision, gpus, gbs, tp, pp, cp, vp, ep, mbs, ours, active, parked,
                      recompute, flags)


def _split_other(other: str):
    # a layout holds "|" and "*" but no ","
    return other.split(",")


ROWS: Dict[tuple, PresetRow] = {row.key: row for row in _rows()}




# Session-scoped (still this module's own): pytest-xdist hands a worker this module's tests in several
# batches between other modules', and a module-scoped fixture is built again for each batch (~15 s).
@pytest.fixture(scope="session")
def composed():
    """Every recipe x preset composed once through Hydra (the CLI path) and prepared."""
    return recipe_table.compose_all()


@pytest.fixture(scope="session")
def prepared(composed):
    return {key: prepare(composed[key]).config for key in ROWS}


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
def test_effective_values_match_the_reference(prepared, key):
    row, cfg = ROWS[key], prepared[key]
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
def test_bridge_perf_defaults_apply(prepared, key):
    cfg = prepared[key]
    assert cfg.train.train_iters == 50
    assert cfg.rerun_state_machine.check_for_nan_in_loss is False
    assert cfg.ddp.check_for_nan_in_grad is False
    assert cfg.dataset.mock is True
    assert cfg.workload.task == ("sft" if key[0].endswith("_sft") else "lora" if key[0].endswith("_lora") else "pretrain")
    assert cfg.model.seq_length == cfg.dataset.seq_length


# --- every preset x every cuda_graph choice -------------------------------------------------

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
        alltoall = row.has("alltoall") or row.has("a2a")
        if (not dense and impl == "transformer_engine" and "layernorm" in recomputed
                and (not mods or "moe" in mods or ({"moe_router", "moe_preprocess"} <= mods and alltoall))):
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


ENGINE_LIMITS = {"engine_memory"}
"""Refusals of graphbridge's own engine, documented in the README and docs/recipes.md: it has no Megatron-FSDP and
trains every weight of a LoRA recipe, so the Llama 3 70B presets Bridge runs with FSDP on Blackwell and its 70B LoRA
presets do not fit it; their plans say so and name Megatron-Bridge."""
ESTIMATE_REFUSES = {("llama/llama31_405b", "b300", precision): "the memory estimate puts Bridge's TP2 PP8 VP8 layout "
                    "at ~391 GiB a GPU of the B300's 268 (it names full recompute, ~169 GiB); no GPU run has measured "
                    "it" for precision in ("bf16", "fp8_cs", "fp8_mx")}
"""Presets the memory estimate refuses (memory_capacity), each with what a measurement would have to settle."""


PRESET_KEYS = [key for key in recipe_table.keys() if key[1] is not None]


@pytest.mark.parametrize("key", PRESET_KEYS, ids="-".join)
def test_every_preset_plans_valid_on_its_own_gpu(composed, key):
    refusing = {violation.rule for violation in build_plan(prepare(composed[key])).config_violations}
    expected = ENGINE_LIMITS | ({"memory_capacity"} if key in ESTIMATE_REFUSES else set())
    assert refusing <= expected, refusing


@pytest.mark.parametrize("key", sorted(ROWS), ids="-".join)
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


def test_deepseek_takes_the_mlp_scope_through_the_cli():
    # te_mlp: graphed attention would hold the preset's mla_up_proj recompute (mla_recompute_in_layer_graphs)
    plan = bridge.plan(["recipe=deepseek/deepseek_v3", "gpu=b200", "cuda_graph=te_mlp"])
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


# --- the recipe table of docs/recipes.md ---------------------------------------------------------

def test_the_recipe_table_is_up_to_date(composed):
    page = recipe_table.RECIPES_PAGE.read_text()
    assert with_section(page, "recipes", recipe_table.markdown(composed)) == page, (
        "docs/recipes.md's recipe table is out of date: run python scripts/recipe_table.py")
