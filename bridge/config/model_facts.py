"""Structural facts about a model config: the vocabulary that the rules, the memory estimate, FLOPs,
translation and the torch engine all read, so it lives on the ground floor beside the schema."""

from typing import List

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


def moe_layer_count(model) -> int:
    """How many of the layers moe_layer_pattern marks MoE, counted without building the pattern: the rules and
    the memory estimate read it for any num_layers a user types, up to 2**31-1."""
    layers = max(model.num_layers, 0)
    if not is_moe_model(model):
        return 0
    freq = model.moe_layer_freq
    if not valid_moe_layer_freq(model):
        return layers
    if isinstance(freq, int):  # layers 0, freq, 2 freq, ...
        return -(-layers // freq)
    return sum(freq)


def last_layer_is_moe(model) -> bool:
    """Whether moe_layer_pattern's last layer is an MoE layer (the MTP layers follow its kind)."""
    freq = model.moe_layer_freq
    if not is_moe_model(model) or model.num_layers < 1:
        return False
    if not valid_moe_layer_freq(model):
        return True
    return (model.num_layers - 1) % freq == 0 if isinstance(freq, int) else bool(freq[-1])


def has_dense_layers(model) -> bool:
    return moe_layer_count(model) < max(model.num_layers, 0)


def has_moe_layers(model) -> bool:
    return moe_layer_count(model) > 0


def is_drop_and_pad(model) -> bool:
    return model.moe_expert_capacity_factor is not None and model.moe_pad_expert_input_to_capacity


def recompute_modules(model) -> List[str]:
    """megatron-core normalises an unset list to ["core_attn"], even without recompute."""
    return list(model.recompute_modules) if model.recompute_modules is not None else ["core_attn"]


def dense_ffn_hidden_size(model) -> int:
    """The dense MLP's width: ``ffn_hidden_size``, or four times the hidden size where it is unset (megatron-core's
    TransformerConfig default)."""
    return model.ffn_hidden_size or 4 * model.hidden_size
