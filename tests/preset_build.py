"""Every shipped preset built at its own layout on the CPU (tests/test_preset_builds.py; tests/test_presets.py checks
that it plans valid on its own GPU): its world size, TP, PP, VP, EP, ETP and DP, its layer count and pipeline layout,
its experts and MTP layers, one rank of a role built as the megatron engine builds it (tests/rank_build.py) with the
widths shrunk.

What this CPU cannot build is stood in, each named in ``CPU_STAND_INS``: megatron-core's local layer spec for
Transformer Engine's (and so no TE graphs, fp8, fused MoE kernels, sequence parallelism on torch's norms, context
parallelism, zero-centred or persistent norms, or multi-latent attention, which need TE's modules; context-parallel
ranks become data-parallel ones), alltoall for the flex dispatcher (DeepEP/HybridEP), and no step (at TP > 1 an MoE
layer refuses to train without the sequence parallelism the local spec lacks). What the build still checks is the
layout: megatron-core's parallel state over the preset's GPUs, each stage's layers and virtual stages, the experts
per rank, DDP's buckets and the (distributed) optimizer. Run it in its own process (megatron-core keeps global state):

    python -m tests.preset_build [--one-a-recipe] [--every-role]    # prints the presets that failed, as JSON
"""

import argparse
import json
import sys
import warnings
from typing import Dict, List, Tuple

from bridge.recipes import presets, recipe_names
from tests.layout_draw import Draw, finished
from tests.rank_build import build_rank, roles

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


def build_draw(recipe: str, gpu: str, precision: str) -> Draw:
    """The preset with the CPU's stand-ins and shrunk widths, composed once (tests.layout_draw caches it)."""
    base = (f"recipe={recipe}", f"gpu={gpu}", f"precision={precision}")
    cfg = finished(Draw(base))
    model = cfg.model
    changes: Dict[str, object] = {**SHRUNK, **CPU_STAND_INS,
                                  "train.global_batch_size": cfg.train.global_batch_size,  # the weak-scaled batch
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
    return Draw(base, changes)


def failures(to_build: List[Tuple[str, str, str]], every_role: bool) -> List[list]:
    """[preset, rank, why] for each rank that was not built."""
    failed = []
    for preset in to_build:
        cfg = finished(build_draw(*preset))
        for rank in roles(cfg) if every_role else roles(cfg)[:1]:
            result = build_rank(cfg, rank, step=False)
            if not result.built:
                failed.append([list(preset), rank, result.error or result.not_here])
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--one-a-recipe", action="store_true", help="the first preset of each recipe only")
    parser.add_argument("--every-role", action="store_true", help="one rank of each role, not only the first rank")
    args = parser.parse_args()
    to_build = list({preset[0]: preset for preset in reversed(PRESETS)}.values()) if args.one_a_recipe else PRESETS
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print(json.dumps(failures(to_build, args.every_role)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
