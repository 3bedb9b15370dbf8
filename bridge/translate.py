"""Translation to megatron-core 0.16.1.

``megatron_arguments`` computes the keyword arguments of TransformerConfig (or
MLATransformerConfig), GPTModel, DistributedDataParallelConfig and OptimizerConfig as plain
data, without importing megatron-core (that import costs seconds). Callables and dtypes are
named by strings there; ``build_megatron_configs`` imports megatron-core and turns the data
into the real objects, which is what the training process and the agreement tests use.

The CUDA-graph fields are emitted in 0.16.1's API: full_iteration is ``cuda_graph_impl=local``
with ``cuda_graph_scope=[full_iteration]``; modules parked behind impl none are not passed on.
"""

import dataclasses
from typing import Any, Dict

from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig

# Our fields that GPTModel takes (TransformerConfig does not know them).
GPT_MODEL_FIELDS = ("position_embedding_type", "rotary_base", "rotary_percent", "rope_scaling",
                    "rope_scaling_factor", "share_embeddings_and_output_weights")
# Fields that exist only on MLATransformerConfig.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
              "rotary_base", "rotary_percent", "rotary_scaling_factor", "original_max_position_embeddings",
              "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# Ours alone, or emitted by translation below rather than copied.
NOT_PASSED = ("vocab_size", "make_vocab_size_divisible_by", "seq_length", "cuda_graph_impl",
              "cuda_graph_modules", "cuda_graph_scope", "enable_cuda_graph", "external_cuda_graph",
              "use_te_rng_tracker", "window_size", "rope_scaling", "rope_scaling_factor",
              "position_embedding_type", "share_embeddings_and_output_weights")
OPTIMIZER_ONLY_OURS = ("lr_warmup_iters", "lr_decay_style", "optimizer_in_graph")


def padded_vocab_size(cfg: GraphBridgeConfig) -> int:
    multiple = cfg.model.make_vocab_size_divisible_by * cfg.model.tensor_model_parallel_size
    return -(-cfg.model.vocab_size // multiple) * multiple


def cuda_graph_arguments(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    """The CUDA-graph part of TransformerConfig in megatron-core 0.16.1's spelling."""
    impl = CudaGraphImpl(cfg.model.cuda_graph_impl)
    if impl == CudaGraphImpl.none:
        mcore_impl, scope = "none", []
    elif impl == CudaGraphImpl.full_iteration:
        mcore_impl, scope = "local", ["full_iteration"]
    else:
        mcore_impl, scope = impl.value, list(cfg.model.cuda_graph_modules)
    return {
        "cuda_graph_impl": mcore_impl,
        "cuda_graph_scope": scope,
        "cuda_graph_warmup_steps": cfg.model.cuda_graph_warmup_steps,
        "use_te_rng_tracker": bool(cfg.rng.te_rng_tracker or cfg.model.use_te_rng_tracker),
    }


def transformer_config_arguments(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    model = cfg.model
    skip = set(NOT_PASSED) | (set() if model.multi_latent_attention else set(MLA_FIELDS))
    args = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in skip}
    args["moe_layer_freq"] = model.moe_layer_freq if isinstance(model.moe_layer_freq, int) else list(model.moe_layer_freq)
    args["recompute_modules"] = None if model.recompute_modules is None else list(model.recompute_modules)
    args["window_size"] = None if model.window_size is None else tuple(model.window_size)
    args["params_dtype"] = "bfloat16" if model.bf16 else "float16" if model.fp16 else "float32"
    if model.pipeline_model_parallel_size > 1:
        args["pipeline_dtype"] = args["params_dtype"]
    if model.multi_latent_attention:
        args["rope_type"] = "yarn" if model.position_embedding_type == "yarn" else "rope"
    args.update(cuda_graph_arguments(cfg))
    return args


def gpt_model_arguments(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    model = cfg.model
    args = {name: getattr(model, name) for name in GPT_MODEL_FIELDS}
    if model.multi_latent_attention:
        # MLA carries its own rotary settings (YaRN included, as rope_type) in the config;
        # GPTModel must neither see them nor build a second rotary embedding.
        args.pop("rotary_base")
        args.pop("rotary_percent")
        args["position_embedding_type"] = "rope"
    args.update(vocab_size=padded_vocab_size(cfg), max_sequence_length=cfg.dataset.seq_length)
    return args


def yarn_attributes(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    """GPTModel's YaRN rotary reads ``yarn_*`` attributes that TransformerConfig does not
    declare (Bridge's providers set them); MLA configs carry YaRN as fields instead."""
    model = cfg.model
    if model.position_embedding_type != "yarn" or model.multi_latent_attention:
        return {}
    return {
        "yarn_rotary_scaling_factor": model.rotary_scaling_factor,
        "yarn_original_max_position_embeddings": model.original_max_position_embeddings,
        "yarn_beta_fast": model.beta_fast,
        "yarn_beta_slow": model.beta_slow,
        "yarn_mscale": model.mscale,
        "yarn_mscale_all_dim": model.mscale_all_dim,
        "yarn_correction_range_round_to_int": True,
    }


def megatron_arguments(cfg: GraphBridgeConfig) -> Dict[str, Dict[str, Any]]:
    """Everything megatron-core is given, as plain data (no megatron-core import)."""
    optimizer = {f.name: getattr(cfg.optimizer, f.name) for f in dataclasses.fields(cfg.optimizer)
                 if f.name not in OPTIMIZER_ONLY_OURS}
    optimizer.update(bf16=cfg.model.bf16, fp16=cfg.model.fp16,
                     use_distributed_optimizer=cfg.ddp.use_distributed_optimizer)
    ddp = dataclasses.asdict(cfg.ddp)
    return {
        "transformer_config": transformer_config_arguments(cfg),
        "gpt_model": gpt_model_arguments(cfg),
        "config_attributes": yarn_attributes(cfg),
        "ddp_config": ddp,
        "optimizer_config": optimizer,
    }


def build_megatron_configs(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    """Construct the real megatron-core config objects (imports torch and megatron-core).

    TransformerConfig's ``__post_init__`` runs here, so every megatron-core rule fires.
    """
    import torch
    import torch.nn.functional as F
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    activations = {"silu": F.silu, "gelu": F.gelu, "quick_gelu": _quick_gelu, "squared_relu": _squared_relu}
    arguments = megatron_arguments(cfg)
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


def _quick_gelu(x):
    import torch

    return x * torch.sigmoid(1.702 * x)


def _squared_relu(x):
    import torch

    return torch.pow(torch.nn.functional.relu(x), 2)
