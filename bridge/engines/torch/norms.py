"""The native model's normalisations, by ``model.normalization``."""

from torch import nn

from bridge.config.schema import ModelConfig

NORMS = {"RMSNorm": nn.RMSNorm, "LayerNorm": nn.LayerNorm}


def make_norm(model: ModelConfig, dim: int) -> nn.Module:
    return NORMS[model.normalization](dim, eps=model.layernorm_epsilon)
