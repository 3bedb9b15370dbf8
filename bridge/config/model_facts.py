"""Structural facts about a model config: the vocabulary that the rules, the memory estimate, FLOPs,
translation and the torch engine all read, so it lives on the ground floor beside the schema."""

import re
from dataclasses import dataclass
from typing import List, Tuple

from bridge.config.schema import GraphBridgeConfig


def padded_vocab_size(cfg: GraphBridgeConfig) -> int:
    """The vocabulary megatron-core allocates: padded to make_vocab_size_divisible_by times TP."""
    multiple = cfg.model.make_vocab_size_divisible_by * cfg.model.tensor_model_parallel_size
    return -(-cfg.model.vocab_size // multiple) * multiple


def is_moe_model(model) -> bool:
    return model.num_moe_experts is not None and model.num_moe_experts > 1


def expert_tensor_parallel_size(model) -> int:
    """The experts' tensor parallelism: model.expert_tensor_parallel_size, which follows TP when unset (as
    megatron-core's ModelParallelConfig fills it)."""
    return model.expert_tensor_parallel_size or model.tensor_model_parallel_size


def valid_moe_layer_freq(model) -> bool:
    freq = model.moe_layer_freq
    if isinstance(freq, bool):
        return False
    if isinstance(freq, int):
        return freq >= 1
    return isinstance(freq, (list, tuple)) and len(freq) == model.num_layers and set(freq) <= {0, 1}


def moe_layer_pattern(model) -> List[int]:
    """1 for an MoE layer, 0 for a dense one, per layer (megatron-core's moe_layer_freq).
    A malformed freq counts as all-MoE here; the moe_layer_freq rule reports it."""
    if not is_moe_model(model):
        return [0] * model.num_layers
    freq = model.moe_layer_freq
    if not valid_moe_layer_freq(model):
        return [1] * model.num_layers
    if isinstance(freq, int):
        return [1 if layer % freq == 0 else 0 for layer in range(model.num_layers)]
    return [int(bit) for bit in freq]


def has_dense_layers(model) -> bool:
    return 0 in moe_layer_pattern(model)


def is_drop_and_pad(model) -> bool:
    return model.moe_expert_capacity_factor is not None and model.moe_pad_expert_input_to_capacity


def recompute_modules(model) -> List[str]:
    """megatron-core normalises an unset list to ["core_attn"], even without recompute."""
    return list(model.recompute_modules) if model.recompute_modules is not None else ["core_attn"]


@dataclass(frozen=True)
class RankLayers:
    """What one pipeline rank builds over its virtual stages: its decoder layers by their index in the model, and
    how many multi-token-prediction layers (each repeats the model's last decoder layer)."""
    decoder: Tuple[int, ...]
    mtp: int


def pipeline_rank_layers(model) -> List[RankLayers]:
    """Each pipeline rank's layers as megatron-core places them (0.16.1 and 0.19.2 alike): from
    model.pipeline_model_parallel_layout where set, else split as transformer_block.get_num_layers_to_build does,
    virtual stage v of rank r being the (v * PP + r)-th run of consecutive layers; the MTP block on the last virtual
    stage of the last rank. A split megatron-core refuses (the pipeline_split rule) gives what its arithmetic gives."""
    ranks = model.pipeline_model_parallel_size
    stages = virtual_stage_contents(model)
    decoder: List[List[int]] = [[] for _ in range(ranks)]
    mtp = [0] * ranks
    first = 0
    for index, (layers, mtp_layers) in enumerate(stages):
        decoder[index % ranks].extend(range(first, first + layers))
        mtp[index % ranks] += mtp_layers
        first += layers
    return [RankLayers(tuple(layers), count) for layers, count in zip(decoder, mtp)]


def virtual_stage_contents(model) -> List[Tuple[int, int]]:
    """(decoder layers, MTP layers) of each virtual pipeline stage, in the order megatron-core numbers layers."""
    if model.pipeline_model_parallel_layout:
        return [(stage.count("t"), stage.count("m")) for stage in layout_stages(model.pipeline_model_parallel_layout)]
    ranks = model.pipeline_model_parallel_size
    chunks = (model.virtual_pipeline_model_parallel_size or 1) if ranks > 1 else 1
    first, last = model.num_layers_in_first_pipeline_stage, model.num_layers_in_last_pipeline_stage
    if first is not None or last is not None:
        middle_ranks = ranks - (first is not None) - (last is not None)
        middle = (model.num_layers - (first or 0) - (last or 0)) // middle_ranks if middle_ranks > 0 else 0
        per_rank = [middle] * ranks
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        accounted = int(model.account_for_embedding_in_pipeline_split) + int(model.account_for_loss_in_pipeline_split)
        per_rank = [(model.num_layers + accounted) // ranks] * ranks
    counts = [[per_rank[rank] // chunks for rank in range(ranks)] for _ in range(chunks)]
    counts[0][0] -= int(model.account_for_embedding_in_pipeline_split)
    counts[-1][-1] -= int(model.account_for_loss_in_pipeline_split)
    stages = [(layers, 0) for chunk in counts for layers in chunk]
    stages[-1] = (stages[-1][0], model.mtp_num_layers or 0)
    return stages


def layout_stages(layout: str) -> List[str]:
    """A pipeline layout's virtual stages, as megatron-core's PipelineParallelLayerLayout.parse_str_to_list reads it:
    commas dropped, "(...)*n" then "x*n" unrolled, stages split at "|"; each a string of E, t, m and L."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda match: match.group(1) * int(match.group(2)), text)
    text = re.sub(r"(.)\*(\d+)", lambda match: match.group(1) * int(match.group(2)), text)
    return text.split("|")
