"""CUDA-graph rules for MoE models: which module scopes an MoE layer can graph in
megatron-core 0.16.1 (R7-R13 in the reference: scopes, EP A2A overlap, delayed wgrad), plus the
dropless-dispatch limit measured on the GPU."""

from bridge.validation.graph_facts import (
    IMPL,
    LOCAL,
    MODULES,
    TE,
    active_modules,
    graphs_moe_dispatch,
    graphs_moe_preprocess,
    impl_of,
    is_graphed,
    modules_of,
    te_graphs_attention,
)
from bridge.config.model_facts import (has_dense_layers, has_moe_layers, is_drop_and_pad, is_moe_model,
                                      recompute_modules)
from bridge.validation.registry import rule, violation


@rule("moe_with_moe_router",
      rejects='moe and moe_router together',
      fix='keep one')
def moe_with_moe_router(cfg, target):
    if {"moe", "moe_router"} <= active_modules(cfg):
        return violation(
            "moe_with_moe_router", [MODULES],
            "cuda_graph_scope must not contain both moe and moe_router; keep one "
            "(cuda_graph=te_moe or cuda_graph=te_moe_router)",
        )
    return None


@rule("moe_preprocess_needs_router",
      rejects='TE moe_preprocess without moe_router',
      fix='add moe_router')
def moe_preprocess_needs_router(cfg, target):
    active = active_modules(cfg)
    if impl_of(cfg) == TE and "moe_preprocess" in active and "moe_router" not in active:
        return violation(
            "moe_preprocess_needs_router", [MODULES],
            "moe_preprocess cuda graph is only supported with moe_router cuda graph; add "
            "moe_router to model.cuda_graph_modules",
        )
    return None


@rule("moe_modules_need_moe_model",
      rejects='moe or moe_router on a model without an MoE layer (a dense model, or MoE fields with every layer dense)',
      fix='`cuda_graph=te_attn_mlp`')
def moe_modules_need_moe_model(cfg, target):
    # local graphs add moe_router to moe_preprocess (R7a), so moe_preprocess alone names MoE layers too.
    # Experts alone make no MoE layer: deepseek/tiny at model.num_layers=1 keeps only its dense first layer, and
    # cuda_graph=te_moe_router there planned valid and failed at build, the engine finding no layer to capture.
    moe_scopes = {"moe", "moe_router"} | ({"moe_preprocess"} if impl_of(cfg) == LOCAL else set())
    if not moe_scopes & active_modules(cfg) or has_moe_layers(cfg.model):
        return None
    dense = ("this model is dense" if not is_moe_model(cfg.model)
             else f"none of its {cfg.model.num_layers} layers is MoE (model.moe_layer_freq)")
    return violation(
        "moe_modules_need_moe_model", [MODULES, "model.num_moe_experts", "model.moe_layer_freq"],
        f"moe cuda graph is only supported for MoE layers, and {dense}; use cuda_graph=te_attn_mlp",
    )


@rule("mlp_needs_dense_layers",
      rejects='mlp when every layer is MoE',
      fix='`cuda_graph=te_attn_moe_router`')
def mlp_needs_dense_layers(cfg, target):
    model = cfg.model
    if is_moe_model(model) and not has_dense_layers(model) and "mlp" in active_modules(cfg):
        return violation(
            "mlp_needs_dense_layers", [MODULES, "model.moe_layer_freq"],
            "mlp cuda graph is only supported for dense layers, but not found in the model; "
            "every layer is MoE, use cuda_graph=te_attn_moe_router",
        )
    return None


@rule("moe_needs_drop_and_pad",
      rejects='moe on dropless MoE',
      fix='a capacity factor with padding, or `cuda_graph=te_moe_router`')
def moe_needs_drop_and_pad(cfg, target):
    model = cfg.model
    if is_moe_model(model) and not is_drop_and_pad(model) and "moe" in active_modules(cfg):
        return violation(
            "moe_needs_drop_and_pad",
            [MODULES, "model.moe_expert_capacity_factor", "model.moe_pad_expert_input_to_capacity"],
            "moe cuda graph is only supported with drop-padding MoE; set "
            "model.moe_expert_capacity_factor=1.0 model.moe_pad_expert_input_to_capacity=true, "
            "or use cuda_graph=te_moe_router",
        )
    return None


@rule("moe_preprocess_host_sync",
      rejects='moe_preprocess with the alltoall dispatcher and a capacity factor or fp8 router padding (host syncs)',
      fix='drop moe_preprocess')
def moe_preprocess_host_sync(cfg, target):
    model = cfg.model
    syncs = model.moe_expert_capacity_factor is not None or model.moe_router_padding_for_fp8
    if (
        is_moe_model(model)
        and not is_drop_and_pad(model)
        and model.moe_token_dispatcher_type == "alltoall"
        and syncs
        and "moe_preprocess" in active_modules(cfg)
    ):
        # The sync's own source: a capacity factor, router padding, or both.
        sources = {key: value for key, value, on in (
            ("model.moe_expert_capacity_factor", "null", model.moe_expert_capacity_factor is not None),
            ("model.moe_router_padding_for_fp8", "false", model.moe_router_padding_for_fp8)) if on}
        unsync = "set " + " ".join(f"{key}={value}" for key, value in sources.items())
        kept = [module for module in modules_of(cfg) if module != "moe_preprocess"]
        # Local graphs add moe_preprocess back to moe_router (R7a), and an empty list is the whole layer.
        drop = (f"drop moe_preprocess (model.cuda_graph_modules=[{','.join(kept)}])"
                if impl_of(cfg) == TE and kept else "")
        return violation(
            "moe_preprocess_host_sync", [MODULES, "model.moe_token_dispatcher_type", *sources],
            "moe_preprocess cuda graph is not supported when there are DtoH copies and "
            f"synchronizations in the preprocess step; {drop + ', or ' + unsync if drop else unsync}",
        )
    return None


@rule("moe_recompute_with_router",
      rejects='TE moe_router graphs with moe in recompute_modules',
      fix='remove one of them')
def moe_recompute_with_router(cfg, target):
    model = cfg.model
    if (
        model.recompute_granularity == "selective"
        and impl_of(cfg) == TE
        and "moe" in recompute_modules(model)
        and "moe_router" in active_modules(cfg)
    ):
        return violation(
            "moe_recompute_with_router", [MODULES, "model.recompute_modules"],
            "moe recompute is not supported with moe_router CUDA graph; remove moe from "
            "model.recompute_modules or moe_router from model.cuda_graph_modules",
        )
    return None


@rule("dropless_moe_capture",
      rejects='whole-layer or full-iteration graphs of dropless MoE on megatron-core (host reads of expert counts)',
      fix='`cuda_graph=te_attn_moe_router`, or drop-and-pad routing', engine="megatron")
def dropless_moe_capture(cfg, target):
    model = cfg.model
    if is_moe_model(model) and not is_drop_and_pad(model) and graphs_moe_dispatch(cfg):
        return violation(
            "dropless_moe_capture",
            [IMPL, MODULES, "model.moe_expert_capacity_factor", "model.moe_pad_expert_input_to_capacity"],
            "dropless MoE dispatch reads per-expert token counts on the host, which cannot be "
            "captured; use router graphs (cuda_graph=te_attn_moe_router) or set drop-and-pad "
            "routing: model.moe_token_dispatcher_type=alltoall "
            "model.moe_expert_capacity_factor=1.0 model.moe_pad_expert_input_to_capacity=true",
        )
    return None


@rule("allgather_dispatch_capture", engine="megatron",
      rejects="graphs that capture the MoE token dispatch (full_iteration, whole-layer or moe graphs) with the "
              "allgather dispatcher",
      fix="`model.moe_token_dispatcher_type=alltoall`, or router graphs (`cuda_graph=te_attn_moe_router`)")
def allgather_dispatch_capture(cfg, target):
    # The allgather dispatcher copies its per-expert token counts to the host and selects tokens by mask, drop-
    # and-pad or not (0.16.1 and 0.19.2 token_dispatcher.py); alltoall's drop-and-pad path has no host copy.
    # qwen/tiny, gpt_oss/tiny and deepseek/tiny with drop-and-pad failed capture so on an H100 ("Cannot copy
    # between CPU and CUDA tensors during CUDA graph capture"); the same with alltoall trains.
    model = cfg.model
    if is_moe_model(model) and model.moe_token_dispatcher_type == "allgather" and graphs_moe_dispatch(cfg):
        return violation(
            "allgather_dispatch_capture", [IMPL, MODULES, "model.moe_token_dispatcher_type"],
            "the allgather MoE dispatcher copies per-expert token counts to the host, which a graph of the "
            "dispatch cannot capture; set model.moe_token_dispatcher_type=alltoall (with drop-and-pad routing), "
            "or graph the router only (cuda_graph=te_attn_moe_router)",
        )
    return None


@rule("fused_quick_geglu_capture", engine="megatron",
      rejects="`model.bias_activation_fusion=true` with gated quick_gelu (GPT-OSS's activation) in graphs that capture "
              "the MoE experts (full_iteration, whole-layer or moe graphs)",
      fix="`model.bias_activation_fusion=false`, or a scope without the experts (`cuda_graph=te_attn_moe_router`)")
def fused_quick_geglu_capture(cfg, target):
    # The experts' fused quick_geglu turns the GLU offset into a device tensor at every call
    # (fused_bias_geglu.weighted_bias_quick_geglu_impl: torch.tensor(linear_offset, device=...), 0.16.1 and 0.19.2),
    # a copy from pageable host memory, which capture refuses. Witness: gpt_oss/tiny with drop-and-pad alltoall
    # under te_moe and local_layer, runs 63 and 1361 of gpu_differential_24488cb.json.gz on an H200, both releases
    # ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"). Unfused, the offset is a Python float.
    model = cfg.model
    if not (is_moe_model(model) and model.bias_activation_fusion and model.activation_func == "quick_gelu"
            and model.gated_linear_unit and graphs_moe_dispatch(cfg)):
        return None
    return violation(
        "fused_quick_geglu_capture", [IMPL, MODULES, "model.bias_activation_fusion"],
        "megatron-core's fused quick_geglu in the MoE experts copies the GLU offset from the host at every call, "
        "which a graph of the experts cannot capture; set model.bias_activation_fusion=false, or graph a scope "
        "without the experts (cuda_graph=te_attn_moe_router)",
    )


@rule("dropless_permute_capture", engine="megatron", megatron_core="<0.17",
      rejects="graphs of the MoE dispatch preprocessing (moe_preprocess, local router graphs) with dropless "
              "alltoall routing and the unfused token permutation, before megatron-core 0.17",
      fix="`model.moe_permute_fusion=true`, or `model.moe_token_dispatcher_type=allgather`")
def dropless_permute_capture(cfg, target):
    # 0.16.1's unfused permutation selects dropless tokens by mask (masked_select: its output size depends on
    # the data); TE's fused permutation and 0.17's argsort permutation have a static size. qwen/tiny,
    # gpt_oss/tiny and deepseek/tiny with te_moe_router or te_attn_moe_router and alltoall failed capture so
    # on an H100 (cudaErrorStreamCaptureUnsupported).
    model = cfg.model
    if (is_moe_model(model) and model.moe_token_dispatcher_type == "alltoall" and not is_drop_and_pad(model)
            and not model.moe_permute_fusion and graphs_moe_preprocess(cfg)):
        return violation(
            "dropless_permute_capture", [MODULES, "model.moe_permute_fusion", "model.moe_token_dispatcher_type"],
            "megatron-core 0.16.1 permutes dropless alltoall tokens with masked_select, whose output size depends "
            "on the data, inside the moe_preprocess graph; set model.moe_permute_fusion=true (Transformer "
            "Engine's permutation has a static size), or model.moe_token_dispatcher_type=allgather",
        )
    return None


@rule("ep_overlap", megatron_core="<0.19",
      rejects='EP A2A overlap with local or full_iteration graphs, or with moe, mlp or whole-layer TE graphs',
      fix='`cuda_graph=te_attn_moe_router`')
def ep_overlap(cfg, target):
    if not (cfg.model.overlap_moe_expert_parallel_comm and is_graphed(cfg)):
        return None
    if impl_of(cfg) != TE:
        return violation(
            "ep_overlap", [IMPL, "model.overlap_moe_expert_parallel_comm"],
            f"megatron-core 0.16.1 cannot combine cuda_graph_impl={impl_of(cfg).value} with EP "
            "A2A overlap; use a TE scope such as cuda_graph=te_attn_moe_router or set "
            "model.overlap_moe_expert_parallel_comm=false",
        )
    if {"moe", "mlp"} & set(modules_of(cfg)) or not modules_of(cfg):
        return violation(
            "ep_overlap", [MODULES, "model.overlap_moe_expert_parallel_comm"],
            "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm; "
            "use cuda_graph=te_attn_moe_router",
        )
    return None


@rule("delay_wgrad",
      rejects='delay_wgrad without EP A2A overlap',
      fix='`model.overlap_moe_expert_parallel_comm=true`')
def delay_wgrad(cfg, target):
    model = cfg.model
    # The legacy grouped GEMM conflict is 0.16.1's alone: version_rules.delay_wgrad_legacy_gemm.
    if model.delay_wgrad_compute and not model.overlap_moe_expert_parallel_comm:
        return violation(
            "delay_wgrad", ["model.delay_wgrad_compute", "model.overlap_moe_expert_parallel_comm"],
            "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute; "
            "set model.overlap_moe_expert_parallel_comm=true or model.delay_wgrad_compute=false",
        )
    return None


@rule("delay_wgrad_graphed_attention",
      rejects="delayed wgrad with TE graphs that capture attention, without gradient-accumulation fusion or with "
              "attention biases (Megatron-Bridge's check)",
      fix="`model.gradient_accumulation_fusion=true` and no attention bias, or `cuda_graph=te_moe_router`")
def delay_wgrad_graphed_attention(cfg, target):
    model = cfg.model
    if not (model.delay_wgrad_compute and te_graphs_attention(cfg)):
        return None
    unmet = [key for key, ok in (("model.gradient_accumulation_fusion=true", model.gradient_accumulation_fusion),
                                 ("model.add_bias_linear=false", not model.add_bias_linear),
                                 ("model.add_qkv_bias=false", not model.add_qkv_bias)) if not ok]
    if unmet:
        return violation(
            "delay_wgrad_graphed_attention", ["model.delay_wgrad_compute", MODULES] + [k.split("=")[0] for k in unmet],
            f"delayed wgrad with graphed attention needs {' '.join(unmet)}; set those, or graph the MoE router only "
            "(cuda_graph=te_moe_router)")
    return None


@rule("router_fp64_graphs", engine="megatron",
      rejects="`model.moe_router_dtype=fp64` with the router graphed as its own module (moe_router)",
      fix="`model.moe_router_dtype=fp32`, or a scope without moe_router")
def router_fp64_graphs(cfg, target):
    # The fp64 router's output does not pass the graph's output buffers ("Could not infer dtype of
    # _WeakRefTensor" at capture on an H100: te_attn_moe_router on 0.16.1, te_moe_router on 0.19.2); fp32 trains,
    # and so does fp64 under te_layer, te_attn and full_iteration.
    if cfg.model.moe_router_dtype == "fp64" and "moe_router" in active_modules(cfg) and is_moe_model(cfg.model):
        return violation(
            "router_fp64_graphs", [MODULES, "model.moe_router_dtype"],
            "a moe_router graph cannot capture the fp64 router's outputs; set model.moe_router_dtype=fp32, or "
            "graph a scope without moe_router",
        )
    return None
