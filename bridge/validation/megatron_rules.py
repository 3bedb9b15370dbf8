"""megatron-core 0.16.1 checks outside the CUDA-graph block that a valid plan must not promise
past: each one would otherwise surface as a bare exception in the training process."""

from bridge.validation.model_facts import is_moe_model
from bridge.validation.registry import rule, violation


@rule("moe_padding_needs_capacity")
def moe_padding_needs_capacity(cfg):
    model = cfg.model
    if model.moe_pad_expert_input_to_capacity and model.moe_expert_capacity_factor is None:
        return violation(
            "moe_padding_needs_capacity",
            ["model.moe_pad_expert_input_to_capacity", "model.moe_expert_capacity_factor"],
            "moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity; set "
            "model.moe_expert_capacity_factor=1.0 or model.moe_pad_expert_input_to_capacity=false",
        )
    return None


@rule("expert_parallel_needs_experts")
def expert_parallel_needs_experts(cfg):
    if cfg.model.expert_model_parallel_size > 1 and not is_moe_model(cfg.model):
        return violation(
            "expert_parallel_needs_experts", ["model.expert_model_parallel_size", "model.num_moe_experts"],
            "expert parallelism needs an MoE model; set model.expert_model_parallel_size=1",
        )
    return None


@rule("recompute_settings")
def recompute_settings(cfg):
    model = cfg.model
    granularity = model.recompute_granularity
    if granularity not in (None, "full", "selective"):
        return violation(
            "recompute_settings", ["model.recompute_granularity"],
            f"model.recompute_granularity={granularity!r}: use null, full or selective",
        )
    if granularity == "full" and (model.recompute_method is None or model.recompute_num_layers is None):
        return violation(
            "recompute_settings",
            ["model.recompute_granularity", "model.recompute_method", "model.recompute_num_layers"],
            "full recompute needs a method and a layer count; set model.recompute_method=uniform "
            "model.recompute_num_layers=1",
        )
    if granularity != "full" and (model.recompute_method is not None or model.recompute_num_layers is not None):
        return violation(
            "recompute_settings", ["model.recompute_method", "model.recompute_num_layers"],
            "recompute_method and recompute_num_layers apply to full recompute only; set "
            "model.recompute_granularity=full or drop them (=null)",
        )
    return None


@rule("ep_overlap_prerequisites")
def ep_overlap_prerequisites(cfg):
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


@rule("cpu_offloading_conflicts")
def cpu_offloading_conflicts(cfg):
    model = cfg.model
    if not model.cpu_offloading:
        return None
    if model.recompute_granularity is not None:
        return violation(
            "cpu_offloading_conflicts", ["model.cpu_offloading", "model.recompute_granularity"],
            "CPU offloading does not work when activation recomputation is enabled; set "
            "model.recompute_granularity=null or model.cpu_offloading=false",
        )
    if model.pipeline_model_parallel_size > 1:
        return violation(
            "cpu_offloading_conflicts", ["model.cpu_offloading", "model.pipeline_model_parallel_size"],
            "there is no CPU offloading with pipeline parallelism; set model.cpu_offloading=false",
        )
    return None
