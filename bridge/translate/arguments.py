"""What megatron-core is given, as plain data, in the spelling of one supported release.

``megatron_arguments(cfg, version)`` computes the keyword arguments of TransformerConfig (or
MLATransformerConfig), GPTModel, DistributedDataParallelConfig and OptimizerConfig without
importing megatron-core (that import costs seconds). Callables and dtypes are named by strings;
bridge.translate.build turns the data into the real objects.

The release's row in bridge.config.releases decides the spelling: on 0.16.1 a full-iteration
graph is ``cuda_graph_impl=local`` with ``cuda_graph_scope=[full_iteration]`` and the modules
travel as ``cuda_graph_scope``; on 0.19.2 it is ``cuda_graph_impl=full_iteration``, the modules
travel as ``cuda_graph_modules`` and the inference scope is given explicitly. A field the release
does not have is not passed (the catalogue's version_fields rule refuses a value set for it).
Modules parked behind impl none are not passed on.
"""

import dataclasses
from enum import Enum
from typing import Any, Dict, Optional

from bridge.config.model_facts import padded_vocab_size
from bridge.config.releases import MegatronCoreRelease, default_release, megatron_optimizer_graph, release
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.machine import probe

# Our fields that GPTModel takes (TransformerConfig does not know them).
GPT_MODEL_FIELDS = ("position_embedding_type", "rotary_base", "rotary_percent", "rope_scaling",
                    "rope_scaling_factor", "share_embeddings_and_output_weights")
# Fields that exist only on MLATransformerConfig.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
              "rotary_base", "rotary_percent", "rotary_scaling_factor", "original_max_position_embeddings",
              "beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# Ours alone, or emitted by translation below rather than copied.
NOT_PASSED = ("vocab_size", "make_vocab_size_divisible_by", "seq_length", "cuda_graph_impl",
              "cuda_graph_modules", "cuda_graph_scope", "inference_cuda_graph_scope", "cuda_graph_use_single_mempool",
              "enable_cuda_graph", "external_cuda_graph", "use_te_rng_tracker", "window_size", "rope_scaling", "rope_scaling_factor",
              "position_embedding_type", "share_embeddings_and_output_weights",
              "yarn_correction_range_round_to_int")  # a GPTModel config attribute, below
OPTIMIZER_ONLY_OURS = ("lr_warmup_iters", "lr_decay_style", "optimizer_in_graph")


def release_for(version: Optional[str] = None) -> MegatronCoreRelease:
    """The table's row for ``version``; by default the release this machine's training would use."""
    if version is None:
        return default_release(probe())
    row = release(version)
    if row is None:
        raise ValueError(f"megatron-core {version} is not supported by graphbridge")
    return row


def cuda_graph_arguments(cfg: GraphBridgeConfig, version: Optional[str] = None) -> Dict[str, Any]:
    """The CUDA-graph part of TransformerConfig in the release's spelling."""
    row = release_for(version)
    impl = CudaGraphImpl(cfg.model.cuda_graph_impl)
    if impl == CudaGraphImpl.full_iteration:
        mcore_impl, modules = row.full_iteration[0], list(row.full_iteration[1])
    else:
        mcore_impl = impl.value
        modules = list(cfg.model.cuda_graph_modules) if impl != CudaGraphImpl.none else []
    arguments = {
        "cuda_graph_impl": mcore_impl,
        row.modules_field: modules,
        "cuda_graph_warmup_steps": cfg.model.cuda_graph_warmup_steps,
        "cuda_graph_use_single_mempool": cfg.model.cuda_graph_use_single_mempool,
        "use_te_rng_tracker": bool(cfg.rng.te_rng_tracker or cfg.model.use_te_rng_tracker),
    }
    if row.inference_scopes:
        scope = cfg.model.inference_cuda_graph_scope
        # Given explicitly, so the plan shows what megatron-core would otherwise derive from the impl.
        arguments[row.carrier("model.inference_cuda_graph_scope")] = (
            getattr(scope, "value", scope) if scope is not None else row.inference_scopes[mcore_impl][0])
    return arguments


def transformer_config_arguments(cfg: GraphBridgeConfig, version: Optional[str] = None) -> Dict[str, Any]:
    row = release_for(version)
    model = cfg.model
    skip = set(NOT_PASSED) | (set() if model.multi_latent_attention else set(MLA_FIELDS))
    args = {}
    for field in dataclasses.fields(model):
        carrier = row.carrier(f"model.{field.name}")
        if field.name not in skip and carrier is not None:
            args[carrier] = getattr(model, field.name)
    args["moe_layer_freq"] = model.moe_layer_freq if isinstance(model.moe_layer_freq, int) else list(model.moe_layer_freq)
    args["recompute_modules"] = None if model.recompute_modules is None else list(model.recompute_modules)
    args["window_size"] = None if model.window_size is None else tuple(model.window_size)
    args["params_dtype"] = "bfloat16" if model.bf16 else "float16" if model.fp16 else "float32"
    if model.pipeline_model_parallel_size > 1:
        args["pipeline_dtype"] = args["params_dtype"]
    if model.multi_latent_attention:
        args["rope_type"] = "yarn" if model.position_embedding_type == "yarn" else "rope"
    args.update(cuda_graph_arguments(cfg, row.version))
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
        "yarn_correction_range_round_to_int": model.yarn_correction_range_round_to_int,
    }


def fsdp_graph_arguments(cfg: GraphBridgeConfig, version: Optional[str] = None) -> Dict[str, Any]:
    """Megatron-FSDP under CUDA graphs, as Megatron-LM's training sets it where the release has the mode (0.19):
    the sharded gradients keep their references across the optimizer step (replay writes into them), and a
    full-iteration graph's first parameter all-gather is not started outside the graph. The rule
    megatron_fsdp_graphs decides whether such a run trains; its witness cases run these arguments."""
    impl = CudaGraphImpl(cfg.model.cuda_graph_impl)
    if not (cfg.ddp.use_megatron_fsdp and impl != CudaGraphImpl.none and release_for(version).fsdp_graph_mode):
        return {}
    return {"megatron_fsdp_cuda_graph_mode": True,
            "fsdp_all_gather_in_start_param_sync": impl != CudaGraphImpl.full_iteration}


def megatron_arguments(cfg: GraphBridgeConfig, version: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
    """Everything megatron-core ``version`` is given, as plain data (no megatron-core import); by
    default for the release this machine's training would use."""
    optimizer = {f.name: getattr(cfg.optimizer, f.name) for f in dataclasses.fields(cfg.optimizer)
                 if f.name not in OPTIMIZER_ONLY_OURS}
    optimizer.update(bf16=cfg.model.bf16, fp16=cfg.model.fp16,
                     use_distributed_optimizer=cfg.ddp.use_distributed_optimizer)
    if megatron_optimizer_graph(cfg, release_for(version).version):
        # A capturable Adam (learning rate and step count as device tensors) for OptimizerCudaGraphWrapper;
        # given only then, so that every other configuration is spelled as before.
        optimizer["optimizer_cuda_graph"] = True
    # megatron-core takes the sharding strategy as a plain string
    ddp = {name: value.value if isinstance(value, Enum) else value for name, value in dataclasses.asdict(cfg.ddp).items()}
    ddp.update(fsdp_graph_arguments(cfg, version))
    return {
        "transformer_config": transformer_config_arguments(cfg, version),
        "gpt_model": gpt_model_arguments(cfg),
        "config_attributes": yarn_attributes(cfg),
        "ddp_config": ddp,
        "optimizer_config": optimizer,
    }
