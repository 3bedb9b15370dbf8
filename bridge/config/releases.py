"""The megatron-core releases graphbridge supports, and how each one is spoken to.

One row per supported release: which megatron-core field carries each graphbridge setting whose
carrier differs between releases (None: that release has no such field), how it spells a
full-iteration graph and the inference scope it derives per impl, the Transformer Engine
releases it accepts, the lowest Python its wheel installs on, and graphbridge's pip extras that
install it. Translation, the rule catalogue, the plan and the README's version matrix read this
table; the engine's API differences live in bridge/engines/megatron/compat.py.

Pure data (no megatron-core import): planning for a version that is not installed works. It lives on the
ground floor because every layer reads it: translation, the rules, the machine description and the engine.
"""

import re
import sys
from dataclasses import dataclass
from typing import Dict, Optional, Tuple


def version_tuple(version: Optional[str]) -> Tuple[int, ...]:
    """``0.19.2`` -> (0, 19, 2); unknown or missing versions compare as ()."""
    if not version or version == "unknown":
        return ()
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


@dataclass(frozen=True)
class MegatronCoreRelease:
    version: str
    python: Tuple[int, int]
    """The lowest Python its wheel installs on."""
    extra: str
    """graphbridge's pip extra that pins this release (``pip install 'graphbridge[<extra>]'``)."""
    te_extra: str
    """The extra that pins it together with the Transformer Engine releases it accepts."""
    transformer_engine: Tuple[str, str]
    """The Transformer Engine releases it accepts: (lowest, first one too new)."""
    tested_transformer_engine: Tuple[str, ...]
    """The Transformer Engine releases the GPU suite and the benchmarks ran with; empty: not measured yet."""
    carriers: Dict[str, Optional[str]]
    """graphbridge key -> the megatron-core field that carries it; None: this release has none."""
    full_iteration: Tuple[str, Tuple[str, ...]]
    """(cuda_graph_impl, modules) that spell a full-iteration graph here."""
    inference_scopes: Dict[str, Tuple[str, ...]]
    """impl -> the inference CUDA-graph scopes it allows, the default (what None means) first;
    empty when this release has no inference scope."""
    differences: Tuple[str, ...] = ()
    """What else a user of both releases should know, one line each (the README's matrix)."""
    optimizer_graph: bool = False
    """megatron-core has its own optimizer CUDA graph (OptimizerConfig.optimizer_cuda_graph and
    OptimizerCudaGraphWrapper): optimizer.optimizer_in_graph with the distributed optimizer is that graph."""
    fsdp_graph_mode: bool = False
    """DistributedDataParallelConfig has Megatron-FSDP's CUDA-graph mode (megatron_fsdp_cuda_graph_mode, and
    fsdp_all_gather_in_start_param_sync to keep the first all-gather inside a full-iteration graph)."""

    def carrier(self, key: str) -> Optional[str]:
        """The megatron-core field that carries graphbridge's ``key`` here (its own name by default)."""
        return self.carriers.get(key, key.split(".")[-1])

    @property
    def modules_field(self) -> str:
        return self.carrier("model.cuda_graph_modules")

    def accepts_transformer_engine(self, version: str) -> bool:
        lowest, too_new = (version_tuple(bound) for bound in self.transformer_engine)
        return lowest <= version_tuple(version)[:len(lowest)] and version_tuple(version)[:len(too_new)] < too_new

    @property
    def transformer_engine_range(self) -> str:
        lowest, too_new = self.transformer_engine
        return f">={lowest},<{too_new}"


INFERENCE_SCOPE = "model.inference_cuda_graph_scope"
INFERENCE_EXPERT_PADDING = "model.moe_pad_experts_for_cuda_graph_inference"
LEGACY_GROUPED_GEMM = "model.moe_use_legacy_grouped_gemm"

RELEASES: Dict[str, MegatronCoreRelease] = {release.version: release for release in (
    MegatronCoreRelease(
        version="0.16.1", python=(3, 11), extra="mcore016", te_extra="te016", transformer_engine=("2.9", "2.12"),
        tested_transformer_engine=("2.10.0",),
        carriers={"model.cuda_graph_modules": "cuda_graph_scope", INFERENCE_SCOPE: None,
                  INFERENCE_EXPERT_PADDING: None},
        full_iteration=("local", ("full_iteration",)),
        inference_scopes={},
        differences=(
            "cuda_graph_use_single_mempool: local per-layer graphs share one memory pool",
            "EP A2A overlap only with Transformer Engine graphs; CPU offloading with no graph at all",
        )),
    MegatronCoreRelease(
        version="0.19.2", python=(3, 12), extra="mcore019", te_extra="te019", transformer_engine=("2.10", "2.21"),
        tested_transformer_engine=("2.10.0", "2.20.2"),  # 2.20.2: the newest release 0.19.2 accepts
        carriers={LEGACY_GROUPED_GEMM: None},
        full_iteration=("full_iteration", ()),
        inference_scopes={"none": ("none",), "local": ("layer", "block"), "transformer_engine": ("none",),
                          "full_iteration": ("none",)},
        differences=(
            "cuda_graph_use_single_mempool: full-iteration training, evaluation and optimizer graphs share one "
            "pool (megatron-core's default is true; graphbridge passes its own, false)",
            "EP A2A overlap also with full_iteration graphs, and it refuses moe recompute; CPU offloading with "
            "full_iteration",
            "optimizer.optimizer_in_graph also with the distributed optimizer: megatron-core's own optimizer graph",
        ),
        optimizer_graph=True, fsdp_graph_mode=True),
)}
SUPPORTED = tuple(RELEASES)


def release(version: Optional[str]) -> Optional[MegatronCoreRelease]:
    """The table's row for ``version``, or None when graphbridge does not support it."""
    return RELEASES.get(version) if version else None


def default_release(machine) -> MegatronCoreRelease:
    """The release translation speaks to ``machine`` (a bridge.machine.Machine) when plan.megatron_core is
    unset: the installed one when graphbridge supports it, else the newest one this Python can install
    (what a fresh ``pip install graphbridge`` brings)."""
    installed = release(machine.version("megatron-core"))
    if installed is not None:
        return installed
    installable = [row for row in RELEASES.values() if sys.version_info[:2] >= row.python]
    return installable[-1]


def megatron_optimizer_graph(cfg, version: str) -> bool:
    """Whether optimizer.optimizer_in_graph is megatron-core's own optimizer graph on ``version``: with the
    distributed optimizer, where the release has one. Otherwise graphbridge's capturable AdamW steps inside
    the full-iteration graph (bridge.engines.megatron.capturable_optimizer)."""
    row = release(version)
    return bool(row and row.optimizer_graph and cfg.optimizer.optimizer_in_graph and cfg.ddp.use_distributed_optimizer)


def in_range(version: str, spec: Optional[str]) -> bool:
    """Whether ``version`` is in ``spec``: None (every release), or comma-joined clauses of ``>=X``
    and ``<X`` (e.g. ``<0.19``, ``>=0.19``), compared on as many parts as the bound names."""
    if spec is None:
        return True
    for clause in (part.strip() for part in spec.split(",")):
        at_least = clause.startswith(">=")
        if not (at_least or clause.startswith("<")):
            raise ValueError(f"version range clause {clause!r}: use >=X or <X")
        bound = version_tuple(clause.lstrip("<>="))
        if (version_tuple(version)[:len(bound)] >= bound) != at_least:
            return False
    return True
