"""The GPU differential's draw: seeded random configurations of the tiny recipes, as the Hydra overrides a user
types: a recipe, a graph choice (mostly one its layers have modules for) and a precision, then 1 to 6 fields of the
schema changed as benchmarks/schema_draw.py draws them (the CPU differential's draw, tests/layout_draw.py, shares it),
so every field that reaches the model, DDP, the optimizer, the training loop, the data or the RNG is drawn.

Values are drawn independently, so many draws break a rule on purpose: the differential counts what the plan
refuses as well as what the GPU does with what it accepts. On several GPUs (``gpus``) a draw also takes one
parallel layout over them: tensor (with or without sequence parallelism), pipeline (with or without virtual
stages), context, expert (each dispatcher) or data parallelism (with or without the distributed optimizer and
its overlaps); on four GPUs mostly two of them at two GPUs each.
"""

import random
from functools import lru_cache
from typing import Dict, List

from omegaconf import OmegaConf

from bridge.config.load import override_value
from schema_draw import mutations

TINY_RECIPES = ("llama/tiny", "qwen/tiny", "deepseek/tiny", "gpt_oss/tiny")
MOE_RECIPES = ("qwen/tiny", "deepseek/tiny", "gpt_oss/tiny")
CUDA_GRAPHS = ("none", "full_iteration", "local_layer", "te_attn", "te_attn_mlp", "te_mlp", "te_layer", "te_moe",
               "te_moe_router", "te_attn_moe_router")
"""Every choice of conf/cuda_graph/ but te_mamba (no tiny recipe has Mamba layers)."""
MOE_GRAPHS = ("none", "full_iteration", "local_layer", "te_attn", "te_layer", "te_moe", "te_moe_router",
              "te_attn_moe_router")
FITTING_GRAPHS = {"llama/tiny": ("none", "full_iteration", "local_layer", "te_attn", "te_attn_mlp", "te_mlp", "te_layer"),
                  "qwen/tiny": MOE_GRAPHS, "gpt_oss/tiny": MOE_GRAPHS, "deepseek/tiny": CUDA_GRAPHS}
"""The choices a recipe's layers have modules for (DeepSeek's dense first layer takes te_mlp too): drawn four
times in five, so that most draws test what the GPU does rather than a module-name rule."""
PRECISIONS = ("bf16",) * 5 + ("fp8_cs", "fp8_sc", "fp8_mx", "nvfp4")
LAYOUTS = ("tensor", "pipeline", "virtual_pipeline", "context", "expert", "data")
PIPELINE_KINDS = {"pipeline", "virtual_pipeline"}
DISPATCHERS = ("allgather", "alltoall", "flex")
DROPOUTS = ("model.attention_dropout", "model.hidden_dropout")
DROP_AND_PAD = {"model.moe_expert_capacity_factor": 1.0, "model.moe_pad_expert_input_to_capacity": True}


def draw(rng: random.Random, gpus: int = 1) -> List[str]:
    """One configuration on ``gpus`` GPUs: ``recipe=...`` first, then its overrides."""
    recipe = rng.choice(TINY_RECIPES)
    graphs = FITTING_GRAPHS[recipe] if rng.random() < 0.8 else CUDA_GRAPHS
    groups = [f"recipe={recipe}", f"cuda_graph={rng.choice(graphs)}", f"precision={rng.choice(PRECISIONS)}"]
    node = composed(tuple(groups))
    changes: Dict[str, object] = {}
    if recipe in MOE_RECIPES and rng.random() < 0.4:
        changes.update(DROP_AND_PAD)  # what most graphs of MoE layers need: dropless routing syncs with the host
    if gpus > 1:
        changes.update(layout(rng, recipe, gpus)[0])
    changes.update(mutations(rng, lambda key: changes[key] if key in changes else OmegaConf.select(node, key)))
    return groups + [f"{key}={override_value(value)}" for key, value in changes.items()]


@lru_cache(maxsize=None)
def composed(groups):
    """The config the draw's groups compose (each combination once): the values the mutations start from."""
    import bridge

    return bridge.compose(list(groups))


def varied(overrides: List[str]) -> List[str]:
    """The schema fields a draw sets (the dotted keys of its overrides)."""
    return [item.split("=", 1)[0] for item in overrides if "." in item.split("=", 1)[0]]


def layout(rng: random.Random, recipe: str, gpus: int):
    """The overrides of one parallel layout over ``gpus`` GPUs, and its data-parallel size. On four GPUs, three
    draws in four combine two parallelisms of two GPUs each (TP2xPP2, TP2xEP2, PP2xDP2, CP2xTP2, ...)."""
    names = [name for name in LAYOUTS if name != "expert" or recipe in MOE_RECIPES]
    kinds = [rng.choice(names)]
    if gpus == 4 and rng.random() < 0.75:
        kinds.append(rng.choice([name for name in names
                                 if name not in kinds and not PIPELINE_KINDS.issuperset({name, kinds[0]})]))
    size = gpus // len(kinds)
    changes: Dict[str, object] = {"train.num_gpus": gpus}
    for kind in kinds:
        changes.update(parallelism(rng, kind, size))
    model_parallel = 1
    for key in ("model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
                "model.context_parallel_size"):
        model_parallel *= changes.get(key, 1)
    data_parallel = gpus // model_parallel  # expert parallelism splits the experts over data-parallel ranks
    for key, chance in (("ddp.use_distributed_optimizer", 0.5), ("ddp.overlap_grad_reduce", 0.4),
                        ("ddp.overlap_param_gather", 0.3)):
        if data_parallel > 1 and rng.random() < chance:
            changes[key] = True
    return changes, data_parallel


def parallelism(rng: random.Random, kind: str, size: int) -> Dict[str, object]:
    """One parallelism of ``size`` GPUs (data parallelism: what the others leave)."""
    if kind == "tensor":
        return {"model.tensor_model_parallel_size": size, **({"model.sequence_parallel": True}
                                                             if rng.random() < 0.5 else {})}
    if kind in PIPELINE_KINDS:  # virtual stages: the tiny recipes' layers split into twice as many chunks
        return {"model.pipeline_model_parallel_size": size,
                **({"model.virtual_pipeline_model_parallel_size": 2} if kind == "virtual_pipeline" else {})}
    if kind == "context":
        return {"model.context_parallel_size": size}
    if kind == "expert":  # experts split over the GPUs, which are data parallel for the rest
        return {"model.expert_model_parallel_size": size, "model.moe_token_dispatcher_type": rng.choice(DISPATCHERS)}
    return {}
