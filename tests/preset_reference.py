"""The reference table of Bridge v0.3.1's per-(gpu, precision) workload presets (V1 variants), as rows that
tests/test_presets.py checks the preset files against and tests/test_preset_graph_choices.py derives each
cuda_graph choice's verdict from; and every recipe x preset composed once a process, for both.

The expected table below is transcribed from the reference (megatron-cuda-graphs.md §3.3),
not read from the YAML: one row per reference row, precisions sharing a row comma-separated.
Columns: recipe gpu precisions | GPUs GBS | TP PP CP VP EP MBS | CG impl | CG scope |
recompute | other ("mfsdp": Megatron-FSDP). "-" is unset. Effective dispatchers are written out (the v0.3.1 recipes
use alltoall where a preset's flex backend is unused; family settings, reference §3.2).
"""

import functools
from dataclasses import dataclass
from typing import Dict, FrozenSet, Optional, Tuple

import recipe_table
from omegaconf import DictConfig

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
llama/llama3_70b       b200  fp8_cs             | 64 128 | 1 1 1 - 1 1  | -  | -    | -            | mfsdp,offload=5
llama/llama3_70b       b200  fp8_mx,nvfp4       | 64 128 | 2 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       b300  bf16,fp8_cs        | 64 128 | 1 1 1 - 1 1  | -  | -    | -            | mfsdp
llama/llama3_70b       b300  fp8_mx             | 64 128 | 1 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       b300  nvfp4              | 64 128 | 1 4 1 5 1 1  | none | full_iteration | - | -
llama/llama3_70b       gb200 bf16               | 64 128 | 1 1 1 - 1 1  | -  | -    | -            | mfsdp,offload=20
llama/llama3_70b       gb200 fp8_cs             | 64 128 | 1 1 1 - 1 2  | -  | -    | -            | mfsdp,offload=40
llama/llama3_70b       gb200 fp8_mx             | 64 128 | 2 4 1 5 1 1  | -  | -    | -            | -
llama/llama3_70b       gb200 nvfp4              | 64 128 | 2 4 1 5 1 1  | none | full_iteration | - | -
llama/llama3_70b       gb300 bf16               | 64 128 | 1 1 1 - 1 2  | -  | -    | -            | mfsdp,offload=30
llama/llama3_70b       gb300 fp8_cs             | 64 128 | 1 1 1 - 1 2  | -  | -    | -            | mfsdp,offload=20
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
llama/llama31_405b     gb200 fp8_cs             | 128 64 | 2 1 1 - 1 1  | -  | -    | -            | mfsdp,offload=92,expandable
llama/llama31_405b     gb200 nvfp4              | 128 64 | 4 16 1 8 1 1 | none | full_iteration | full/block 1 | -
llama/llama31_405b     gb300 bf16               | 128 64 | 2 1 1 - 1 1  | -  | -    | -            | mfsdp,offload=40
llama/llama31_405b     gb300 fp8_cs             | 128 64 | 2 1 1 - 1 1  | -  | -    | -            | mfsdp,offload=10
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
RECOMPUTE_DEPARTURES = {
    ("llama/llama31_405b", "b300", precision): (
        "selective core_attn,mlp",
        "as Bridge ships them (no recompute) the first stage holds all 8 micro-batches' activations, ~405 GiB reserved "
        "of the B300's 268 (memory_capacity refuses them); the preset YAML says so")
    for precision in ("bf16", "fp8_cs", "fp8_mx")}
"""(recipe, gpu, precision) -> (recompute graphbridge ships instead of the reference's, why)."""


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
            ships = RECOMPUTE_DEPARTURES.get((recipe, gpu, precision), (recompute,))[0]
            yield PresetRow(recipe, gpu, precision, gpus, gbs, tp, pp, cp, vp, ep, mbs, ours, active, parked,
                      ships, flags)


def _split_other(other: str):
    # a layout holds "|" and "*" but no ","
    return other.split(",")


ROWS: Dict[tuple, PresetRow] = {row.key: row for row in _rows()}


def row_kind(key) -> tuple:
    """The facts of a preset's row that test_preset_graph_choices.py's expected verdicts read: rows alike in all of
    them take every cuda_graph choice along the same rules (its default sample is one row of each kind, and
    tests/test_default_coverage.py holds it to that)."""
    row = ROWS[key]
    return (row.recipe.split("/")[0], row.recipe.endswith(("_sft", "_lora")), row.parked, row.recompute,
            row.gpu == "h100", *(row.has(fact) for fact in ("offload", "a2a", "expandable", "nccl_graph_register",
                                                            "alltoall")))


@functools.lru_cache(maxsize=None)
def composed_presets() -> Dict[tuple, DictConfig]:
    """Every recipe x preset composed through Hydra (the CLI path), once a process: pytest-xdist hands a worker
    the preset modules' tests in several batches between other modules', and composing takes ~15 s. Shared:
    callers change only copies."""
    return recipe_table.compose_all()
