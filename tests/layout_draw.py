"""The CPU differential's draws (tests/differential.py): configurations that start from a shipped recipe (the tiny
ones, or a workload preset of a full-size one), shrunk in width and layers, placed on a random parallel layout over
W ranks, with a few fields mutated. Mutations are drawn independently, so some break a rule on purpose; most keep
what the CPU can build (the local layer spec, bf16), so that the build sees most of what the plan accepts.

A draw is the composed config's base overrides plus the dotted fields set on top (``Draw.changes``); ``finished``
turns it into the config every later step reads, without composing again (bases are composed once). The fields
mutated on top come from the schema (benchmarks/schema_draw.py), drawn as the GPU differential draws them."""

import copy
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Tuple

from omegaconf import OmegaConf

from bridge.config.load import override_value
from bridge.recipes import presets, recipe_names
from benchmarks.schema_draw import mutations

TINY = ("llama/tiny", "qwen/tiny", "deepseek/tiny", "gpt_oss/tiny")
DISPATCHERS = ("allgather", "alltoall", "flex")


@dataclass
class Draw:
    base: Tuple[str, ...]
    """The Hydra overrides the config is composed from: a recipe, and a preset's gpu and precision."""
    changes: Dict[str, object] = field(default_factory=dict)
    """Dotted fields set on the composed config, as a user's overrides would."""

    def varied(self) -> List[str]:
        """The fields whose value the draw changed from its base's."""
        node = composed(self.base)
        return [key for key, value in self.changes.items() if value != OmegaConf.select(node, key)]

    def overrides(self) -> List[str]:
        """The command line that gives the same config (every change, in the order drawn)."""
        return list(self.base) + [f"{key}={override_value(value)}" for key, value in self.changes.items()]


def bases() -> List[Tuple[str, ...]]:
    """The tiny recipes, and every workload preset of the full-size recipes."""
    full = [(f"recipe={recipe}", f"gpu={gpu}", f"precision={precision}")
            for recipe in recipe_names() for gpu, precision in presets(recipe)]
    return [(f"recipe={recipe}",) for recipe in TINY] + full


@lru_cache(maxsize=None)
def composed(base: Tuple[str, ...]):
    import bridge

    return bridge.compose(list(base))


def finished(draw: Draw):
    """The finished config of ``draw``: its base composed (once), the changes set, derived values resolved."""
    import bridge

    node = copy.deepcopy(composed(draw.base))
    for key, value in draw.changes.items():
        section, name = key.split(".", 1)
        setattr(node[section], name, value)
    return bridge.resolve(node)


def draw(rng: random.Random, world_size: int) -> Draw:
    """One configuration over ``world_size`` ranks."""
    every = bases()
    base = rng.choice(every[:len(TINY)]) if rng.random() < 0.4 else rng.choice(every[len(TINY):])
    node = composed(base)
    moe = bool(node.model.num_moe_experts)
    changes = shrunk(rng, node)
    changes.update(layout(rng, world_size, moe, changes))
    changes.update(buildable(rng, moe, node))
    changes.update(mutations(rng, lambda key: changes[key] if key in changes else OmegaConf.select(node, key)))
    return Draw(base, changes)


def shrunk(rng: random.Random, node) -> Dict[str, object]:
    """Widths a CPU builds in a second, keeping what the layouts below divide: 8 heads, 8 or no query groups,
    16 experts at most, layers set by the layout."""
    model = node.model
    changes: Dict[str, object] = {
        "model.hidden_size": 64, "model.num_attention_heads": 8, "model.kv_channels": 8, "model.ffn_hidden_size": 128,
        "model.vocab_size": 256, "dataset.seq_length": 64, "train.micro_batch_size": 1, "train.train_iters": 10,
        "model.pipeline_model_parallel_layout": None, "model.num_layers_in_first_pipeline_stage": None,
        "model.num_layers_in_last_pipeline_stage": None, "model.cpu_offloading_num_layers": 1,
        # a preset's embedding/loss accounting fits its own layer count; kept one draw in four
        **({} if rng.random() < 0.25 else {"model.account_for_embedding_in_pipeline_split": False,
                                               "model.account_for_loss_in_pipeline_split": False}),
    }
    if model.num_query_groups is not None:
        changes["model.num_query_groups"] = 8
    if model.num_moe_experts:
        changes.update({"model.num_moe_experts": min(model.num_moe_experts, 16), "model.moe_ffn_hidden_size": 32,
                        "model.moe_router_topk": min(model.moe_router_topk, 2)})
        if model.moe_shared_expert_intermediate_size:
            changes["model.moe_shared_expert_intermediate_size"] = 32
        if model.moe_router_num_groups:
            changes.update({"model.moe_router_num_groups": 4, "model.moe_router_group_topk": 2})
        if not isinstance(model.moe_layer_freq, int) and not OmegaConf.is_interpolation(model, "moe_layer_freq"):
            changes["model.moe_layer_freq"] = 1  # a preset's list fits its own layer count only
    if model.multi_latent_attention:
        changes.update({"model.q_lora_rank": 32 if model.q_lora_rank else None, "model.kv_lora_rank": 32,
                        "model.qk_head_dim": 16, "model.qk_pos_emb_head_dim": 8, "model.v_head_dim": 16})
    return changes


def divisors(number: int) -> List[int]:
    return [size for size in range(1, number + 1) if number % size == 0]


def layout(rng: random.Random, world_size: int, moe: bool, changes: Dict[str, object]) -> Dict[str, object]:
    """Tensor (with or without sequence), context, pipeline (with or without virtual stages), expert (with its
    tensor size and dispatcher) and data parallelism (with or without the distributed optimizer and its overlaps)
    over ``world_size`` ranks; layers follow the stages."""
    sizes = divisors(world_size)
    # Tensor parallelism one draw in two: the local spec trains it only without sequence parallelism (torch's norms),
    # so not with experts (their layer refuses TP without SP), and each layout the others leave is drawn as often.
    tensor = 1 if rng.random() < (0.8 if moe else 0.5) else rng.choice(sizes)
    context = 2 if world_size % (2 * tensor) == 0 and rng.random() < 0.05 else 1
    pipeline = rng.choice(divisors(world_size // (tensor * context)))
    virtual = 2 if pipeline > 1 and rng.random() < 0.5 else None
    data = world_size // (tensor * context * pipeline)
    picked: Dict[str, object] = {
        "train.num_gpus": world_size, "model.tensor_model_parallel_size": tensor,
        "model.context_parallel_size": context, "model.pipeline_model_parallel_size": pipeline,
        "model.virtual_pipeline_model_parallel_size": virtual, "model.sequence_parallel": tensor > 1 and rng.random() < 0.8,
        "model.num_layers": pipeline * (virtual or 1) * rng.choice([1, 2]),
        # mostly a whole number of the interleaved schedule's micro-batch groups (PP) where stages are virtual
        "train.global_batch_size": data * (pipeline if virtual and rng.random() < 0.9 else 1) * rng.choice([1, 2]),
        "model.expert_model_parallel_size": 1, "model.expert_tensor_parallel_size": None,
    }
    if moe:
        experts = changes["model.num_moe_experts"]
        per_stage = world_size // pipeline
        expert = rng.choice([size for size in divisors(per_stage) if experts % size == 0])
        expert_tensor = rng.choice([1, tensor]) if per_stage % (expert * tensor) == 0 else 1
        picked.update({"model.expert_model_parallel_size": expert, "model.expert_tensor_parallel_size": expert_tensor,
                       "model.moe_token_dispatcher_type": rng.choices(DISPATCHERS, [4.5, 4.5, 1])[0]})
    distributed = rng.random() < 0.5
    overlap = rng.random() < 0.5
    picked.update({"ddp.use_distributed_optimizer": distributed, "ddp.overlap_grad_reduce": overlap,
                   # mostly where it can work: the distributed optimizer with an overlapped reduce
                   "ddp.overlap_param_gather": rng.random() < (0.5 if distributed and overlap else 0.05)})
    return picked


def buildable(rng: random.Random, moe: bool, node) -> Dict[str, object]:
    """Mostly what the CPU builds (the local spec, bf16), so that the build sees most of what the plan accepts."""
    changes: Dict[str, object] = {}
    if rng.random() < 0.92:
        changes["model.transformer_impl"] = "local"
        # what the local spec needs apex or compiled kernels for, which the CPU machine lacks: mostly off
        if rng.random() < 0.9:
            changes.update({"model.gradient_accumulation_fusion": False, "model.masked_softmax_fusion": False})
        if rng.random() < 0.95:
            changes.update({"model.sequence_parallel": False, "model.moe_grouped_gemm": False,
                            "model.moe_permute_fusion": False, "model.moe_router_fusion": False})
        if moe and node.model.add_bias_linear and rng.random() < 0.6:
            changes["model.add_bias_linear"] = False  # biased experts are Transformer Engine's grouped ones only
    if rng.random() < 0.85:
        changes.update({"model.fp8": None, "model.fp4": None})
    if node.model.multi_latent_attention and changes.get("model.transformer_impl") == "local" and rng.random() < 0.7:
        changes["model.multi_latent_attention"] = False  # the local spec builds standard attention only
    return changes
