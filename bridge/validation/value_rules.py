"""Value types and ranges: every number a job reads has a type and a range it is meaningful in, checked
before any other rule reads it (a wrong type or an impossible size would otherwise surface as an
exception in the middle of another rule, or in training)."""

import dataclasses
import math

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge.config.engines import ACTIVATIONS
from bridge.config.plain import plainly_typed
from bridge.config.releases import in_range
from bridge.config.schema import GraphBridgeConfig
from bridge.machine import PRESET_GPUS
from bridge.validation.environment_rules import PRECISION_CAPABILITY
from bridge.validation.registry import rule, violation

POSITIVE = (
    "model.num_layers", "model.hidden_size", "model.num_attention_heads", "model.vocab_size",
    "dataset.seq_length", "train.micro_batch_size", "train.global_batch_size", "train.train_iters",
    "train.num_gpus", "train.num_nodes", "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size", "model.context_parallel_size", "model.expert_model_parallel_size",
    "model.make_vocab_size_divisible_by", "model.seq_length",
)
INT32_MAX = 2**31 - 1
"""Counts and sizes beyond this overflow the int32 indices of megatron-core's and PyTorch's kernels."""


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


@rule("config_types", gate=True,
      rejects="a value of the wrong type for its field (e.g. a list field interpolated to a number); the other "
              "rules wait for it",
      fix="a value of the declared type")
def config_types(cfg, target):
    """Interpolations are resolved after composition, so a value can reach here with a type
    its field refuses (a list field set to ${model.hidden_size}); the job could not be written."""
    if plainly_typed(cfg, type(cfg)):
        return None  # OmegaConf's conversion, 30 ms, was nearly all of validate's time; it would accept this
    try:  # the whole config at once, then the section that refuses it, for the key's full path
        OmegaConf.structured(cfg)
        return None
    except OmegaConfBaseException:
        pass
    nodes = [(f"{f.name}.", getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
             if dataclasses.is_dataclass(getattr(cfg, f.name))] + [("", cfg)]
    for prefix, node in nodes:  # per section first, so the key gets its full path
        try:
            OmegaConf.structured(node)
        except OmegaConfBaseException as error:
            key = prefix + str(getattr(error, "full_key", None) or "")
            return violation(
                "config_types", [key],
                f"{key} has a value of the wrong type ({str(error).splitlines()[0]}); set it to a value "
                "of its declared type (graphbridge --cfg job shows the schema's types)",
            )
    return None


@rule("positive_sizes",
      rejects='a size, count, length or step count below 1',
      fix='1 or more')
def positive_sizes(cfg, target):
    keys = [key for key in POSITIVE if _get(cfg, key) < 1]
    optional = ("model.expert_tensor_parallel_size", "workload.preset_num_gpus", "workload.gpus_per_node")
    keys += [key for key in optional if _get(cfg, key) is not None and _get(cfg, key) < 1]
    return [
        violation("positive_sizes", [key], f"{key}={_get(cfg, key)} must be at least 1; set {key}=1 or more")
        for key in keys
    ]


# key -> (lowest, highest, what the range means); None is open. Optional keys may also be null.
RANGES = {
    "model.ffn_hidden_size": (1, None), "model.kv_channels": (1, None), "model.num_query_groups": (1, None),
    "model.num_moe_experts": (1, None), "model.moe_ffn_hidden_size": (1, None), "model.moe_router_topk": (1, None),
    "model.moe_shared_expert_intermediate_size": (1, None), "model.moe_router_num_groups": (1, None),
    "model.moe_router_group_topk": (1, None), "model.mtp_num_layers": (1, None),
    "model.virtual_pipeline_model_parallel_size": (1, None), "model.recompute_num_layers": (1, None),
    "model.cpu_offloading_num_layers": (0, None), "model.q_lora_rank": (1, None), "model.kv_lora_rank": (1, None),
    "model.qk_head_dim": (1, None), "model.qk_pos_emb_head_dim": (0, None), "model.v_head_dim": (1, None),
    "model.linear_conv_kernel_dim": (1, None), "model.linear_key_head_dim": (1, None),
    "model.linear_value_head_dim": (1, None), "model.linear_num_key_heads": (1, None),
    "model.linear_num_value_heads": (1, None), "model.cuda_graph_warmup_steps": (0, None),
    "model.window_attn_skip_freq": (1, None), "model.original_max_position_embeddings": (1, None),
    "model.num_layers_in_first_pipeline_stage": (1, None), "model.num_layers_in_last_pipeline_stage": (1, None),
    "perf.profile_start_step": (0, None),
    "perf.warmup_steps": (0, None), "perf.nan_check_interval": (0, None), "perf.profile_steps": (1, None),
    "perf.inject_nan_at_step": (0, None), "rng.seed": (0, None), "optimizer.lr_warmup_iters": (0, None),
    "workload.preset_global_batch_size": (1, None),
    "model.attention_dropout": (0.0, 1.0), "model.hidden_dropout": (0.0, 1.0),
    "model.layernorm_epsilon": (0.0, None), "model.init_method_std": (0.0, None), "model.rotary_base": (1.0, None),
    "model.rotary_percent": (0.0, 1.0), "model.moe_aux_loss_coeff": (0.0, None),
    "model.mtp_loss_scaling_factor": (0.0, None), "model.moe_input_jitter_eps": (0.0, None),
    "optimizer.weight_decay": (0.0, None), "optimizer.adam_beta1": (0.0, 1.0), "optimizer.adam_beta2": (0.0, 1.0),
    "optimizer.adam_eps": (0.0, None), "optimizer.clip_grad": (0.0, None),
    "model.moe_expert_capacity_factor": (0.0, None), "model.rope_scaling_factor": (0.0, None),
    "model.rotary_scaling_factor": (0.0, None), "model.moe_router_topk_scaling_factor": (0.0, None),
    "peft.dim": (1, None), "peft.alpha": (1, None), "peft.dropout": (0.0, 1.0),
}
EXCLUSIVE_LOW = {"model.layernorm_epsilon", "model.init_method_std", "model.rotary_base", "model.rotary_percent",
                 "model.moe_input_jitter_eps", "optimizer.adam_eps", "model.moe_expert_capacity_factor",
                 "model.rope_scaling_factor", "model.rotary_scaling_factor", "model.moe_router_topk_scaling_factor"}
"""Floats that must be above their lowest value, not equal to it (an epsilon of 0 divides by zero, a
scaling factor of 0 zeroes what it scales, a capacity factor of 0 drops every token, a rotary base of 1 gives every
channel one frequency and YaRN divides by its logarithm: deepseek/tiny with model.rotary_base=1.0 failed at build;
YaRN's ramp bounds, which only YaRN reads, are engine_rules.yarn_betas's)."""
EXCLUSIVE_HIGH = {"model.attention_dropout", "model.hidden_dropout", "optimizer.adam_beta1", "optimizer.adam_beta2",
                  "peft.dropout"}
"""Floats that must stay below their highest value (a dropout of 1 drops everything)."""


def out_of_range(key: str, value) -> bool:
    low, high = RANGES[key]
    if isinstance(value, float) and not math.isfinite(value):
        return True
    below = value <= low if key in EXCLUSIVE_LOW else value < low
    above = high is not None and (value >= high if key in EXCLUSIVE_HIGH else value > high)
    return below or above


def range_text(key: str) -> str:
    low, high = RANGES[key]
    left = f"above {low}" if key in EXCLUSIVE_LOW else f"at least {low}"
    if high is None:
        return left
    return f"{left} and {'below' if key in EXCLUSIVE_HIGH else 'at most'} {high}"


def nullable(key: str) -> bool:
    """Whether the schema lets ``key`` be null (its default is None)."""
    section, name = key.split(".")
    node = next(item for item in dataclasses.fields(GraphBridgeConfig) if item.name == section).default_factory
    return next(item for item in dataclasses.fields(node) if item.name == name).default is None


def number_leaves(node, kind: type, prefix: str = ""):
    """(dotted key, value) of every ``kind`` (int or float) the config holds, in lists too (bools are
    not counted)."""
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value):
            yield from number_leaves(value, kind, f"{prefix}{item.name}.")
            continue
        for index, element in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(element, kind) and not isinstance(element, bool):
                yield prefix + item.name + (f"[{index}]" if isinstance(value, (list, tuple)) else ""), element


@rule("int32_values", gate=True,
      rejects="an integer beyond the int32 range (below -2**31 or above 2**31-1); the other rules wait for it",
      fix="a value between -2147483648 and 2147483647 (in the range the field means something in)")
def int32_values(cfg, target):
    # A gate: the other rules and the memory estimate do arithmetic, sizing and searches on these numbers, and a
    # value beyond any GPU job (2**63, 10**20) made them raise OverflowError or run for minutes before this refusal.
    return [violation("int32_values", [key], f"{key}={value} overflows the int32 indices of the kernels that read "
                                             f"it; set {key} to a value between {-INT32_MAX - 1} and {INT32_MAX}")
            for key, value in number_leaves(cfg, int) if not -INT32_MAX - 1 <= value <= INT32_MAX]


@rule("value_ranges",
      rejects="a value outside the range it means something in (zero sizes and counts, negative steps and "
              "intervals, dropout of 1, non-finite floats)",
      fix="a value in the range the message names")
def value_ranges(cfg, target):
    found = [violation("value_ranges", [key], f"{key}={_get(cfg, key)} must be {range_text(key)}; set a value "
                                              f"{range_text(key)}{' (or null: unset)' if nullable(key) else ''}")
             for key in RANGES if _get(cfg, key) is not None and out_of_range(key, _get(cfg, key))]
    found += [violation("value_ranges", [key], f"{key}={value} is not a finite number; set a finite value")
              for key, value in number_leaves(cfg, float) if not math.isfinite(value) and key not in RANGES]
    return found


# key -> the values it takes. The model's are megatron-core's Literal annotations (TransformerConfig, GPTModel,
# OptimizerConfig's branches), which its dataclasses never check: another value trains silently as something else
# (a load-balancing type it does not know trains without balancing; any transformer_impl but transformer_engine
# builds the local spec) or fails on the GPU (an unknown dispatcher at model build, an unknown loss kernel at the
# first step with `loss` unbound, an unknown activation in graphbridge's translation). Narrower where graphbridge
# has no way to build a value: position_embedding_type=mrope wants 3-D position ids its data does not make,
# fp8_recipe=custom a quantizer factory it has no field for, transformer_impl=inference_optimized is an inference
# spec, and 0.19's lion optimizer and quantile_balancing router are outside the catalogue so far. DeepSeek sparse
# attention (experimental_attention_variant=dsa) needs its indexer's fields, which graphbridge has not: on an H200
# (9901178) 0.16.1 refused the name at build, and 0.19.2 asserted without MLA and failed in the indexer with it.
CHOICES = {
    "model.normalization": ("LayerNorm", "RMSNorm"),
    "model.activation_func": ACTIVATIONS,
    "model.position_embedding_type": ("learned_absolute", "rope", "yarn", "none"),
    "model.softmax_type": ("vanilla", "off-by-one", "learnable"),
    "model.experimental_attention_variant": ("gated_delta_net",),
    "model.moe_router_score_function": ("softmax", "sigmoid", "sqrtsoftplus"),
    "model.moe_router_dtype": ("fp32", "fp64"),
    "model.moe_router_load_balancing_type": ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"),
    "model.moe_token_dispatcher_type": ("allgather", "alltoall", "flex"),
    "model.fp8": ("e4m3", "hybrid"),
    "model.fp8_recipe": ("tensorwise", "delayed", "mxfp8", "blockwise"),
    "model.fp4": ("e2m1",),
    "model.transformer_impl": ("transformer_engine", "local"),
    "model.cross_entropy_fusion_impl": ("native", "te"),
    "optimizer.optimizer": ("adam", "sgd"),
    "workload.task": ("pretrain", "sft", "lora"),
    "peft.dropout_position": ("pre", "post"),
    "workload.gpu": tuple(PRESET_GPUS),
    "workload.precision": ("bf16", *PRECISION_CAPABILITY),
}
RELEASES_OF_CHOICE = {("model.moe_router_score_function", "sqrtsoftplus"): ">=0.19"}
"""Values only some megatron-core releases have (0.16.1's router raises "Invalid score_function" in training)."""


def choices_on(key: str, release: str):
    """The values ``key`` takes when translated for megatron-core ``release``."""
    return [value for value in CHOICES[key] if in_range(release, RELEASES_OF_CHOICE.get((key, value)))]


@rule("config_choices", gate=True,
      rejects="a name that its field does not know (e.g. `model.moe_token_dispatcher_type=all2all`, "
              "`model.cross_entropy_fusion_impl=fused`), or one that the target megatron-core release does not have",
      fix="one of the names the message lists (null where the field may be unset)")
def config_choices(cfg, target):
    found = []
    for key, allowed in ((key, choices_on(key, target.megatron_core)) for key in CHOICES):
        value = _get(cfg, key)
        if value in allowed or (value is None and nullable(key)):
            continue
        where = (f" on megatron-core {target.megatron_core}" if value in CHOICES[key] else "")
        unset = " (or null: unset)" if nullable(key) else ""
        found.append(violation("config_choices", [key], f"{key}={value!r} is not a choice of its field{where}; use "
                                                        f"one of {', '.join(allowed)}{unset}"))
    return found
