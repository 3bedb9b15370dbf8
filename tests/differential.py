"""The differential of graphbridge's catalogue against megatron-core itself, on the CPU, at any parallel layout.

Seeded draws (tests/layout_draw.py: the shipped recipes and presets, shrunk, on a random layout of W ranks, a few
fields mutated) are judged twice:

- by graphbridge: the whole catalogue for W H100s with this process's megatron-core and Transformer Engine
  (the release's tested one: the GPU node a plan is made for);
- by megatron-core: ``build_megatron_configs`` (TransformerConfig's checks), then, where the CPU can build the
  configuration (the local layer spec, bf16: ``buildable_here``), one rank of each role built as the megatron
  engine builds it, with one training step where the CPU allows (tests/rank_build.py).

Each config lands in one class: both accept, both refuse, graphbridge alone refuses (a documented rule of ours:
graphs, engines, measured GPU failures) or megatron-core alone refuses (a bug: a rule is missing); ``built`` says
whether megatron-core's model, DDP wrapper and optimizer were built for every role. Run it in its own process:

    python -m tests.differential --seed 0 --count 100 --world-size 4 [--json]
    python -m tests.differential --seed 31 --count 300 --world-size 2 --gpu-draws  # a GPU block's own draws

GRAPHBRIDGE_MEGATRON_CORE_PATH=<site dirs> puts another megatron-core install first on the path (megatron-core
0.19.2 on this Python: its wheel unpacked, with triton beside it); the target then speaks that version.
"""

import argparse
import functools
import json
import os
import random
import re
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

if os.environ.get("GRAPHBRIDGE_MEGATRON_CORE_PATH"):
    sys.path[:0] = os.environ["GRAPHBRIDGE_MEGATRON_CORE_PATH"].split(os.pathsep)

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # differential_draw, for --gpu-draws
from tests.layout_draw import draw, finished  # noqa: E402
from tests.rank_build import REFUSALS, build_rank, first_line, roles  # noqa: E402

BOTH_ACCEPT, BOTH_REFUSE, OURS_ONLY, MEGATRON_ONLY = "both accept", "both refuse", "graphbridge refuses", \
    "megatron-core refuses"
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
TRANSFORMER_ENGINE = re.compile(r"\bTE\b|Transformer ?Engine|transformer_engine", re.IGNORECASE)


def target_machine(world_size: int):
    """W H100s with this process's packages and the release's tested Transformer Engine."""
    from bridge.config.releases import release
    from bridge.machine import GPU, probe

    here = probe()
    tested = release(here.version("megatron-core")).tested_transformer_engine[0]
    return type(here)(gpus=(GPU(*H100),) * world_size, packages={**here.packages, "transformer-engine": tested})


def graphbridge_verdict(cfg, machine) -> List[str]:
    """The rules that refuse ``cfg`` on ``machine``."""
    from bridge.validation import resolve_target, validate

    return sorted({v.rule for v in validate(cfg, resolve_target(cfg, machine))})


def buildable_here(cfg) -> Optional[str]:
    """Why this CPU cannot build ``cfg`` as a GPU node would (a package it lacks), or None."""
    model = cfg.model
    needs = [(model.transformer_impl == "transformer_engine", "the Transformer Engine layer spec"),
             (model.cuda_graph_impl == "transformer_engine", "Transformer Engine's graphs"),
             (bool(model.fp8 or model.fp4), "fp8/fp4 (Transformer Engine)"),
             (bool(model.num_moe_experts and (model.moe_permute_fusion or model.moe_router_fusion)),
              "fused MoE kernels (Transformer Engine)"),
             (bool(model.num_moe_experts) and model.moe_token_dispatcher_type == "flex", "DeepEP or HybridEP"),
             (bool(model.multi_latent_attention), "multi-latent attention (the Transformer Engine spec)"),
             (bool(model.cpu_offloading), "activation offloading (Transformer Engine)"),
             (bool(model.apply_rope_fusion), "fused RoPE (Transformer Engine's kernel, on either spec)")]
    return next((why for needed, why in needs if needed), None)


def megatron_verdict(cfg, role_ranks: List[int], machine) -> Tuple[Optional[str], bool, Optional[str]]:
    """(megatron-core's refusal or None, whether every role's model, wrapper and optimizer were built, what the CPU
    could not do: a build or a step that needs a GPU machine's CUDA or packages)."""
    import megatron.core.utils

    from bridge.translate import build_megatron_configs
    from bridge.translate.gate import caused_by_import, transformer_engine_of
    from bridge.validation import resolve_target

    unbuildable = buildable_here(cfg)
    try:
        # Checks that read Transformer Engine's version read the target node's, as the gate before a launch does.
        with warnings.catch_warnings(), transformer_engine_of(megatron.core.utils, resolve_target(cfg, machine)):
            warnings.simplefilter("ignore")
            build_megatron_configs(cfg)
    except REFUSALS as error:
        # A check that reaches for Transformer Engine itself (an import, or a kernel it asks for: "fused permutation
        # is not available. Please install TE >= 2.1.0") is the GPU node's to judge: no verdict from this CPU.
        if caused_by_import(error) or TRANSFORMER_ENGINE.search(str(error)):
            return None, False, unbuildable or f"{type(error).__name__}: {first_line(error)}"[:200]
        return f"{type(error).__name__}: {first_line(error)}"[:300], False, None
    if unbuildable:
        return None, False, unbuildable
    built, not_here = True, None
    for rank in role_ranks:
        result = build_rank(cfg, rank)
        if result.error:
            return result.error, False, None
        built, not_here = built and result.built, not_here or result.not_here
    return None, built, not_here


def classify(ours: List[str], theirs: Optional[str]) -> str:
    if not ours:
        return BOTH_ACCEPT if theirs is None else MEGATRON_ONLY
    return BOTH_REFUSE if theirs is not None else OURS_ONLY


def judge(finish: Callable[[], object], machine, all_roles: bool) -> Dict[str, object]:
    """Both verdicts on the config ``finish`` makes."""
    try:
        cfg = finish()
    except Exception as error:  # a draw the schema refuses (a type or a missing value), as the CLI would in one line
        return {"class": "unresolvable", "error": f"{type(error).__name__}: {first_line(error)}"}
    ours = graphbridge_verdict(cfg, machine)
    # What graphbridge accepts is built at every role; what it refuses, at the first (enough to agree it fails).
    ranks = roles(cfg) if all_roles and not ours else roles(cfg)[:1]
    theirs, built, unbuilt = megatron_verdict(cfg, ranks, machine)
    return {"class": classify(ours, theirs), "ours": ours, "megatron": theirs, "built": built, "not_built": unbuilt,
            "roles": ranks}


def run(seed: int, count: int, world_size: int, all_roles: bool = True, gpu_draws: bool = False) -> List[dict]:
    """``gpu_draws``: the GPU differential's own draws (benchmarks/differential_draw.py: the tiny recipes with every
    graph choice, precision and layout it trains) instead of tests/layout_draw.py's, to judge a GPU block's draws
    here before the GPU trains them."""
    rng = random.Random(seed)
    machine = target_machine(world_size)
    records = []
    for index in range(count):
        overrides, varied, finish = gpu_drawn(rng, world_size) if gpu_draws else layout_drawn(rng, world_size)
        records.append({"index": index, "overrides": overrides, "varied": varied,
                        **judge(finish, machine, all_roles)})
    return records


def layout_drawn(rng: random.Random, world_size: int) -> Tuple[List[str], List[str], Callable[[], object]]:
    """A draw of tests/layout_draw.py: its command line, the fields it varied, and what makes its config."""
    drawn = draw(rng, world_size)
    return drawn.overrides(), drawn.varied(), functools.partial(finished, drawn)


def gpu_drawn(rng: random.Random, world_size: int) -> Tuple[List[str], List[str], Callable[[], object]]:
    """A draw of the GPU differential: its command line, the fields it set, and what makes its config (as the CLI
    does)."""
    import bridge
    from differential_draw import draw as gpu_draw, varied

    overrides = gpu_draw(rng, world_size)
    return overrides, varied(overrides), functools.partial(bridge.load, overrides)


def summary(records: List[dict]) -> Dict[str, object]:
    counts = Counter(record["class"] for record in records)
    accepted = [record for record in records if not record.get("ours") and record["class"] != "unresolvable"]
    return {"classes": dict(counts), "accepted": len(accepted), "built": sum(record["built"] for record in accepted),
            "not_built": dict(Counter(record["not_built"] for record in accepted if record["not_built"])),
            "graphbridge_alone": dict(Counter(rule for record in records if record["class"] == OURS_ONLY
                                              for rule in record["ours"])),
            "missing_rules": dict(Counter(record["megatron"] for record in records
                                          if record["class"] == MEGATRON_ONLY)),
            "fields": field_coverage(records)}


def field_coverage(records: List[dict]) -> Dict[str, object]:
    """Per schema field, how many draws varied it and how many of those graphbridge accepted (fields_varied: the
    fields varied at least five times and accepted once)."""
    from benchmarks.schema_draw import coverage

    return coverage((record["varied"], record["class"] in (BOTH_ACCEPT, MEGATRON_ONLY)) for record in records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--world-size", type=int, default=1, help="ranks the drawn layouts span")
    parser.add_argument("--first-role-only", action="store_true",
                        help="build one rank of each accepted config instead of one of each role")
    parser.add_argument("--gpu-draws", action="store_true",
                        help="draw as the GPU differential does (benchmarks/differential_draw.py), with its seeds")
    parser.add_argument("--json", action="store_true", help="every record as JSON on stdout")
    args = parser.parse_args()
    records = run(args.seed, args.count, args.world_size, all_roles=not args.first_role_only, gpu_draws=args.gpu_draws)
    if args.json:
        print(json.dumps(records))
        return 0
    overview = summary(records)
    per_field = overview["fields"].pop("per_field")
    print(json.dumps(overview, indent=1))
    print("fields never accepted when varied:", sorted(key for key, seen in per_field.items() if not seen["accepted"]))
    for record in records:
        if record["class"] == MEGATRON_ONLY:
            print(f"MISSING RULE: {record['megatron']}\n  {' '.join(record['overrides'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
