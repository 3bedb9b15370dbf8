"""The real megatron-core config objects (imports torch and megatron-core), in the spelling of the
release that is installed: what the training process and the agreement tests use.

TransformerConfig's ``__post_init__`` runs here, so every megatron-core rule of that release fires.
"""

from typing import Any, Dict

from bridge.config.schema import GraphBridgeConfig
from bridge.machine import release as release_of
from bridge.translate.arguments import megatron_arguments


def installed_megatron_core() -> str:
    """The version of the megatron-core this process imports (a source checkout too)."""
    import megatron.core

    return release_of(megatron.core.__version__)


def build_megatron_configs(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    """TransformerConfig (or MLATransformerConfig), GPTModel arguments, DDP and optimizer configs."""
    import torch
    import torch.nn.functional as F
    from megatron.core.activations import squared_relu
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    # megatron-core's own functions: its config checks and fused paths compare activation_func by identity
    # (bias_activation_fusion with GPT-OSS's quick_gelu was refused at model build with a copy of it).
    activations = {"silu": F.silu, "gelu": F.gelu, "quick_gelu": quick_gelu, "squared_relu": squared_relu}
    arguments = megatron_arguments(cfg, installed_megatron_core())
    tc_args = dict(arguments["transformer_config"])
    tc_args["activation_func"] = activations[tc_args["activation_func"]]
    for key in ("params_dtype", "pipeline_dtype"):
        if key in tc_args:
            tc_args[key] = getattr(torch, tc_args[key])
    config_class = MLATransformerConfig if cfg.model.multi_latent_attention else TransformerConfig
    transformer_config = config_class(**tc_args)
    for name, value in arguments["config_attributes"].items():
        setattr(transformer_config, name, value)
    return {
        "transformer_config": transformer_config,
        "gpt_model": arguments["gpt_model"],
        "ddp_config": DistributedDataParallelConfig(**arguments["ddp_config"]),
        "optimizer_config": OptimizerConfig(**arguments["optimizer_config"]),
    }
