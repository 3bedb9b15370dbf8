"""megatron-core 0.16.1 checks outside the CUDA-graph block that a valid plan must not promise
past: each one would otherwise surface as a bare exception in the training process."""

from bridge.validation.model_facts import is_moe_model
from bridge.validation.registry import rule, violation


@rule("moe_padding_needs_capacity",
      rejects='padding expert input to capacity without a capacity factor',
      fix='`model.moe_expert_capacity_factor=1.0`')
def moe_padding_needs_capacity(cfg, target):
    model = cfg.model
    if model.moe_pad_expert_input_to_capacity and model.moe_expert_capacity_factor is None:
        return violation(
            "moe_padding_needs_capacity",
            ["model.moe_pad_expert_input_to_capacity", "model.moe_expert_capacity_factor"],
            "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity; set "
            "model.moe_expert_capacity_factor=1.0 or model.moe_pad_expert_input_to_capacity=false",
        )
    return None


@rule("expert_parallel_needs_experts",
      rejects='expert parallelism on a dense model',
      fix='`model.expert_model_parallel_size=1`')
def expert_parallel_needs_experts(cfg, target):
    if cfg.model.expert_model_parallel_size > 1 and not is_moe_model(cfg.model):
        return violation(
            "expert_parallel_needs_experts", ["model.expert_model_parallel_size", "model.num_moe_experts"],
            "expert parallelism needs an MoE model; set model.expert_model_parallel_size=1",
        )
    return None


@rule("ep_overlap_prerequisites",
      rejects='EP A2A overlap without its prerequisites (EP > 1, alltoall or flex, VP with PP, no full recompute, bf16 or fp16, no shared-expert overlap, MTP of at most one layer)',
      fix='as the message says')
def ep_overlap_prerequisites(cfg, target):
    model = cfg.model
    if not model.overlap_moe_expert_parallel_comm:
        return None
    unmet = []
    if model.expert_model_parallel_size <= 1:
        unmet.append("expert parallelism (model.expert_model_parallel_size > 1)")
    if model.moe_token_dispatcher_type not in ("alltoall", "flex"):
        unmet.append("model.moe_token_dispatcher_type=alltoall or flex")
    if model.pipeline_model_parallel_size > 1 and model.virtual_pipeline_model_parallel_size is None:
        unmet.append("model.virtual_pipeline_model_parallel_size when pipeline parallel")
    if model.recompute_granularity == "full" or model.recompute_method or model.recompute_num_layers:
        unmet.append("no full recompute (recompute_method/num_layers unset)")
    if not (model.bf16 or model.fp16):
        unmet.append("bf16 or fp16")
    if model.moe_shared_expert_overlap:
        unmet.append("model.moe_shared_expert_overlap=false")
    if model.mtp_num_layers not in (None, 1) or (model.mtp_num_layers == 1 and model.pipeline_model_parallel_size == 1):
        unmet.append("MTP of at most 1 layer, and then pipeline parallelism")
    if not unmet:
        return None
    return violation(
        "ep_overlap_prerequisites", ["model.overlap_moe_expert_parallel_comm"],
        f"EP A2A overlap needs {'; '.join(unmet)}; provide them or set "
        "model.overlap_moe_expert_parallel_comm=false",
    )
