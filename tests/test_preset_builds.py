"""Every shipped preset builds at its own layout on the CPU (test_presets.py checks that it plans valid on its own
GPU): its world size, TP, PP, VP, EP, ETP and DP, its layer count and pipeline layout, its experts and MTP layers, one
rank of a role built as the megatron engine builds it (tests/rank_build.py) with the widths shrunk.

What this CPU cannot build is stood in, each named in ``CPU_STAND_INS``: megatron-core's local layer spec for
Transformer Engine's (and so no TE graphs, fp8, fused MoE kernels, sequence parallelism on torch's norms, context
parallelism, zero-centred or persistent norms, or multi-latent attention, which need TE's modules; context-parallel
ranks become data-parallel ones),
alltoall for the flex dispatcher (DeepEP/HybridEP), and no step (at TP > 1 an MoE layer refuses to train without the
sequence parallelism the local spec lacks). What the build still checks is the layout: megatron-core's parallel
state over the preset's GPUs, each stage's layers and virtual stages, the experts per rank, DDP's buckets and the
(distributed) optimizer. By default the first rank of one preset a recipe is built; under -m slow every role of
every preset."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import bridge
from bridge.recipes import presets, recipe_names

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[1]
PRESETS = [(recipe, gpu, precision) for recipe in recipe_names() for gpu, precision in presets(recipe)]
SHRUNK = {"model.hidden_size": 64, "model.num_attention_heads": 8, "model.kv_channels": 8,
          "model.ffn_hidden_size": 128, "model.vocab_size": 256, "dataset.seq_length": 64,
          "train.micro_batch_size": 1}
CPU_STAND_INS = {"model.transformer_impl": "local", "model.fp8": None, "model.fp4": None,
                 "model.cuda_graph_impl": "none", "model.cuda_graph_modules": [], "model.sequence_parallel": False,
                 "model.multi_latent_attention": False, "model.moe_permute_fusion": False,
                 "model.moe_router_fusion": False, "model.moe_grouped_gemm": False,
                 "model.gradient_accumulation_fusion": False, "model.masked_softmax_fusion": False,
                 "model.cpu_offloading": False, "model.experimental_attention_variant": None,
                 "model.layernorm_zero_centered_gamma": False, "model.persist_layer_norm": False}


def plan_of(recipe: str, gpu: str, precision: str):
    return bridge.plan([f"recipe={recipe}", f"gpu={gpu}", f"precision={precision}"])


def build_overrides(recipe: str, gpu: str, precision: str):
    """The preset's composed config with the CPU's stand-ins and shrunk widths, as dotted fields."""
    cfg = plan_of(recipe, gpu, precision).config
    model = cfg.model
    changes = {**SHRUNK, **CPU_STAND_INS,
               "train.global_batch_size": cfg.train.global_batch_size,  # the weak-scaled batch stays as planned
               "model.context_parallel_size": 1}
    if model.num_query_groups is not None:
        changes["model.num_query_groups"] = 8
    if model.num_moe_experts:
        changes["model.moe_ffn_hidden_size"] = 16
        if model.moe_shared_expert_intermediate_size:
            changes["model.moe_shared_expert_intermediate_size"] = 16
    if model.recompute_modules:  # what recomputes a stood-in module goes with it
        changes["model.recompute_modules"] = [name for name in model.recompute_modules
                                              if name not in ("mla_up_proj", "moe_act")] or ["core_attn"]
    if model.moe_token_dispatcher_type == "flex":
        changes["model.moe_token_dispatcher_type"] = "alltoall"
    return [f"recipe={recipe}", f"gpu={gpu}", f"precision={precision}"], changes


def build_in_a_process(presets_to_build, every_role: bool) -> str:
    script = "\n".join([
        "import sys, warnings; warnings.simplefilter('ignore')",
        "import bridge",
        "from tests.layout_draw import Draw, finished",
        "from tests.rank_build import build_rank, roles",
        "from tests.test_preset_builds import build_overrides",
        "failed = []",
        f"for preset in {presets_to_build!r}:",
        "    base, changes = build_overrides(*preset)",
        "    cfg = finished(Draw(tuple(base), changes))",
        f"    for rank in (roles(cfg) if {every_role} else roles(cfg)[:1]):",
        "        result = build_rank(cfg, rank, step=False)",
        "        if not result.built:",
        "            failed.append((preset, rank, result.error or result.not_here))",
        "print('FAILED', failed)",
    ])
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()[-1]


def test_a_preset_of_every_recipe_builds_at_its_layout():
    first_of_each = list({recipe: (recipe, gpu, precision) for recipe, gpu, precision in reversed(PRESETS)}.values())
    assert build_in_a_process(first_of_each, every_role=False) == "FAILED []"


@pytest.mark.slow
def test_every_preset_builds_at_its_layout():
    assert build_in_a_process(PRESETS, every_role=True) == "FAILED []"
