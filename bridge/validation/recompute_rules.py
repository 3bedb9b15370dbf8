"""Activation recompute and offloading: what megatron-core 0.16.1 allows together with CUDA graphs
(R11 in the reference) and on its own (its checks outside the graph block)."""

from bridge.validation.graph_facts import FULL_ITERATION, IMPL, LOCAL, MODULES, TE, impl_of, is_graphed, modules_of
from bridge.config.model_facts import dense_ffn_hidden_size, has_dense_layers, is_moe_model, recompute_modules
from bridge.validation.registry import rule, violation


@rule("full_recompute",
      rejects='full recompute without full_iteration',
      fix='`cuda_graph=full_iteration` or selective recompute')
def full_recompute(cfg, target):
    if is_graphed(cfg) and cfg.model.recompute_granularity == "full" and impl_of(cfg) != FULL_ITERATION:
        return violation(
            "full_recompute", [IMPL, "model.recompute_granularity"],
            "full recompute is only supported with full iteration CUDA graph; use "
            "cuda_graph=full_iteration or model.recompute_granularity=selective",
        )
    return None


def _whole_layer_or_iteration(cfg) -> bool:
    return impl_of(cfg) == FULL_ITERATION or not modules_of(cfg)


def _graphs_module(cfg, name: str) -> bool:
    return is_graphed(cfg) and (_whole_layer_or_iteration(cfg) or name in modules_of(cfg))


@rule("recompute_attention_dropout",
      rejects='attention dropout with graphed selective recompute of core_attn',
      fix='`model.attention_dropout=0.0`, or recompute other modules')
def recompute_attention_dropout(cfg, target):
    model = cfg.model
    if (
        model.recompute_granularity == "selective"
        and model.attention_dropout != 0
        and "core_attn" in recompute_modules(model)
        and _graphs_module(cfg, "attn")
    ):
        return violation(
            "recompute_attention_dropout",
            ["model.attention_dropout", "model.recompute_modules", MODULES],
            "attention dropout is not supported with graphed attention recomputation; set "
            "model.attention_dropout=0.0 or remove core_attn from model.recompute_modules",
        )
    return None


@rule("recompute_hidden_dropout",
      rejects='hidden dropout with graphed selective recompute of mlp or moe',
      fix='`model.hidden_dropout=0.0`, or recompute other modules')
def recompute_hidden_dropout(cfg, target):
    model = cfg.model
    mods = recompute_modules(model)
    graphed_recompute = ("mlp" in mods and _graphs_module(cfg, "mlp")) or (
        "moe" in mods and _graphs_module(cfg, "moe")
    )
    if model.recompute_granularity == "selective" and model.hidden_dropout != 0 and graphed_recompute:
        return violation(
            "recompute_hidden_dropout",
            ["model.hidden_dropout", "model.recompute_modules", MODULES],
            "hidden dropout is not supported with graphed MLP/MoE recomputation; set "
            "model.hidden_dropout=0.0 or remove mlp/moe from model.recompute_modules",
        )
    return None


@rule("recompute_moe_jitter",
      rejects='MoE input jitter with graphed selective recompute of moe',
      fix='`model.moe_input_jitter_eps=null`, or recompute other modules')
def recompute_moe_jitter(cfg, target):
    model = cfg.model
    if (
        model.recompute_granularity == "selective"
        and model.moe_input_jitter_eps is not None
        and "moe" in recompute_modules(model)
        and _graphs_module(cfg, "moe")
    ):
        return violation(
            "recompute_moe_jitter",
            ["model.moe_input_jitter_eps", "model.recompute_modules", MODULES],
            "moe_input_jitter_eps is not supported with graphed moe recomputation; set "
            "model.moe_input_jitter_eps=null or remove moe from model.recompute_modules",
        )
    return None


@rule("recompute_settings",
      rejects="an unknown recompute granularity or module; full recompute without a method and layer count; a "
              "method or layer count without full recompute; moe_act without grouped GEMM, mla_up_proj without MLA",
      fix='as the message says')
def recompute_settings(cfg, target):
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
    if granularity == "selective":
        return recompute_modules_problem(model)
    return None


RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
"""What megatron-core 0.16.1 can recompute selectively."""


def recompute_modules_problem(model):
    modules = recompute_modules(model)
    unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
    if unknown:
        return violation("recompute_settings", ["model.recompute_modules"],
                         f"model.recompute_modules has {unknown}; use names from {list(RECOMPUTE_MODULES)}")
    if "moe_act" in modules and not model.moe_grouped_gemm:
        return violation("recompute_settings", ["model.recompute_modules", "model.moe_grouped_gemm"],
                         "moe_act in recompute_modules is only supported with moe_grouped_gemm; set "
                         "model.moe_grouped_gemm=true or drop moe_act")
    if "mla_up_proj" in modules and not model.multi_latent_attention:
        return violation("recompute_settings", ["model.recompute_modules", "model.multi_latent_attention"],
                         "mla_up_proj in recompute_modules is only supported with multi_latent_attention; drop "
                         "mla_up_proj from model.recompute_modules")
    return None


@rule("cpu_offloading_layers",
      rejects="CPU offloading (`model.cpu_offloading=true`) of `model.cpu_offloading_num_layers` not below the layer "
              "count",
      fix="`model.cpu_offloading_num_layers` below `model.num_layers`")
def cpu_offloading_layers(cfg, target):
    # TransformerConfig raises "CPU offloading can be done only for layers less than N" (0.16.1 and 0.19.2): a
    # one-layer model offloading one layer planned valid in the schema-wide draw and failed there.
    model = cfg.model
    if not model.cpu_offloading or model.cpu_offloading_num_layers < model.num_layers:
        return None
    return violation(
        "cpu_offloading_layers", ["model.cpu_offloading_num_layers", "model.num_layers"],
        f"megatron-core offloads fewer layers than the model has (model.cpu_offloading_num_layers="
        f"{model.cpu_offloading_num_layers}, model.num_layers={model.num_layers}); set "
        f"model.cpu_offloading_num_layers={model.num_layers - 1}",
    )


@rule("cpu_offloading_conflicts",
      rejects='CPU offloading with recompute or pipeline parallelism',
      fix='`model.cpu_offloading=false`')
def cpu_offloading_conflicts(cfg, target):
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


@rule("cpu_offloading_sequential_experts", engine="megatron",
      rejects="CPU offloading of an MoE model whose experts run one by one (`model.moe_grouped_gemm=false`) at an "
              "expert width other than the dense one (`model.moe_ffn_hidden_size`)",
      fix="`model.moe_grouped_gemm=true`, or `model.cpu_offloading=false`")
def cpu_offloading_sequential_experts(cfg, target):
    # The transformer block puts Transformer Engine's offload context, which holds CUDA streams, on the config, and
    # SequentialMLP deep-copies the config to give its experts their own width; a stream does not copy: qwen/tiny
    # with model.cpu_offloading=true failed so at build on an H100 (0.16.1, run 184 of
    # gpu_differential_schema_b0ccb80.json). Both releases copy the config there (moe/experts.py).
    model = cfg.model
    if not (model.cpu_offloading and is_moe_model(model)) or model.moe_grouped_gemm:
        return None
    dense = dense_ffn_hidden_size(model)
    if (model.moe_ffn_hidden_size or dense) == dense:
        return None
    return violation(
        "cpu_offloading_sequential_experts", ["model.cpu_offloading", "model.moe_grouped_gemm"],
        f"megatron-core copies the config for experts of their own width (model.moe_ffn_hidden_size="
        f"{model.moe_ffn_hidden_size}), and CPU offloading's streams on it do not copy; set model.moe_grouped_gemm=true, "
        "or model.cpu_offloading=false",
    )


def recompute_without(model, names) -> str:
    """The override that stops recomputing ``names``: the rest of the list, or no recompute where none is left."""
    kept = [name for name in recompute_modules(model) if name not in names]
    return f"model.recompute_modules=[{','.join(kept)}]" if kept else "model.recompute_granularity=null"


def recomputed_inside_layer_graphs(cfg, modules) -> list:
    """Of ``modules``, those selective recompute would checkpoint inside a per-layer graph (local or TE): the
    attention's core, norms and MLA up-projections for attn graphs, a dense MLP for mlp graphs, the MoE layer
    and its shared expert for moe graphs, the shared expert for router graphs that run it (not overlapped);
    whole-layer graphs hold them all."""
    model = cfg.model
    if model.recompute_granularity != "selective" or impl_of(cfg) not in (LOCAL, TE):
        return []
    graphed = set(modules_of(cfg)) or {"attn", "mlp", "moe", "moe_router"}
    inside = {"core_attn": "attn" in graphed, "layernorm": "attn" in graphed, "mla_up_proj": "attn" in graphed,
              "mlp": "mlp" in graphed and has_dense_layers(model),
              "moe": "moe" in graphed and is_moe_model(model),
              "shared_experts": bool(model.moe_shared_expert_intermediate_size) and (
                  "moe" in graphed or ("moe_router" in graphed and not model.moe_shared_expert_overlap))}
    return [name for name in recompute_modules(model) if name in modules and inside.get(name)]


@rule("recompute_in_layer_graphs", megatron_core="<0.18",
      rejects="selective recompute of core_attn, mlp, moe or shared_experts inside per-layer graphs (local or TE), "
              "before megatron-core 0.18",
      fix="drop those modules from `model.recompute_modules`, graph a scope without them, or "
          "`cuda_graph=full_iteration`")
def recompute_in_layer_graphs(cfg, target):
    # These four are checkpointed reentrantly (tensor_parallel.checkpoint), whose backward refuses the
    # torch.autograd.grad that capture runs ("Checkpointing is not compatible with .grad()", seen on an H100
    # with te_attn, te_attn_mlp, te_layer and te_moe); 0.18 runs them uncheckpointed while capturing
    # (Megatron-LM PR 3919). layernorm, moe_act and mla_up_proj recompute without reentry and train.
    inside = recomputed_inside_layer_graphs(cfg, ("core_attn", "mlp", "moe", "shared_experts"))
    if not inside:
        return None
    fix = recompute_without(cfg.model, inside)
    return violation(
        "recompute_in_layer_graphs", [IMPL, MODULES, "model.recompute_modules"],
        f"megatron-core {target.megatron_core} recomputes {', '.join(inside)} with reentrant checkpointing, which "
        f"fails when a per-layer graph holding it is captured; set {fix}, graph a scope without them, or use "
        "cuda_graph=full_iteration (megatron-core 0.19 trains it, without recomputing the graphed part)",
    )


@rule("recompute_quantized_in_layer_graphs", megatron_core=">=0.18",
      rejects="selective recompute of mlp, moe or shared_experts inside per-layer graphs with fp8/fp4",
      fix="drop those modules from `model.recompute_modules`, `precision=bf16`, or `cuda_graph=full_iteration`")
def recompute_quantized_in_layer_graphs(cfg, target):
    # With fp8/fp4 these are checkpointed by Transformer Engine's own reentrant checkpoint, which refuses
    # torch.autograd.grad as megatron-core's did before 0.18 (TE 2.10 distributed.py); megatron-core's capture
    # bypass covers its own checkpoint only.
    if not (cfg.model.fp8 or cfg.model.fp4):
        return None
    inside = recomputed_inside_layer_graphs(cfg, ("mlp", "moe", "shared_experts"))
    if not inside:
        return None
    return violation(
        "recompute_quantized_in_layer_graphs", [IMPL, MODULES, "model.recompute_modules", "model.fp8"],
        f"with fp8/fp4, Transformer Engine recomputes {', '.join(inside)} with a reentrant checkpoint, which fails "
        f"when a per-layer graph holding it is captured; set {recompute_without(cfg.model, inside)}, train in bf16, or "
        "use cuda_graph=full_iteration",
    )


@rule("mla_recompute_in_layer_graphs",
      rejects="selective recompute of layernorm or mla_up_proj inside per-layer graphs of multi-latent attention",
      fix="drop layernorm and mla_up_proj from `model.recompute_modules`, graph a scope without attention, or "
          "`cuda_graph=full_iteration`")
def mla_recompute_in_layer_graphs(cfg, target):
    # MLA recomputes its up-projections and its input norm without reentry; replaying a per-layer graph that
    # holds them touched freed memory (cudaErrorIllegalAddress) on an H100, deepseek/tiny with te_attn,
    # te_attn_moe_router and te_layer on 0.16.1 and 0.19.2. Dense attention's layernorm recompute trains because
    # there is none: the TE spec fuses that norm into linear_qkv (input_layernorm is an IdentityOp). The MoE
    # layer's own norm is moe_norm_recompute_in_layer_graphs.
    if not cfg.model.multi_latent_attention:
        return None
    inside = recomputed_inside_layer_graphs(cfg, ("layernorm", "mla_up_proj"))
    if not inside:
        return None
    return violation(
        "mla_recompute_in_layer_graphs", [IMPL, MODULES, "model.recompute_modules", "model.multi_latent_attention"],
        f"recomputing {', '.join(inside)} of multi-latent attention inside a per-layer graph reads freed memory "
        f"when the graph replays; set {recompute_without(cfg.model, inside)}, graph a scope without attention "
        "(cuda_graph=te_mlp or te_moe_router), or use cuda_graph=full_iteration",
    )


def moe_norm_recomputed_in_layer_graphs(cfg) -> bool:
    """megatron-core recomputes the pre-MLP norm of MoE layers inside their Transformer Engine per-layer graphs:
    selective recompute of layernorm (the TE spec gives MoE layers a TENorm of their own; dense layers fuse theirs
    into linear_fc1) where the graph holds that norm: whole layers, the moe module, or the router with its
    preprocessing under the alltoall dispatcher. transformer_layer.py's can_recompute_pre_mlp_layernorm_for_cudagraph
    (0.16.1 and 0.19.2) turns the recompute off for router graphs otherwise (no preprocessing, another dispatcher,
    or an overlapped shared expert), and a graph of attention alone leaves the norm eager."""
    model = cfg.model
    if not (impl_of(cfg) == TE and is_moe_model(model) and model.recompute_granularity == "selective"
            and "layernorm" in recompute_modules(model)):
        return False
    modules = set(modules_of(cfg))
    if not modules or "moe" in modules:
        return True
    return ("moe_router" in modules and "moe_preprocess" in modules and model.moe_token_dispatcher_type == "alltoall"
            and not (model.moe_shared_expert_intermediate_size and model.moe_shared_expert_overlap))


@rule("moe_norm_recompute_in_layer_graphs",
      rejects="selective recompute of layernorm where a Transformer Engine per-layer graph holds an MoE layer's "
              "pre-MLP norm (whole layers, moe, or moe_router with moe_preprocess under the alltoall dispatcher)",
      fix="drop layernorm from `model.recompute_modules`, graph a scope without the MoE layer (`cuda_graph=te_attn`), "
          "or `cuda_graph=full_iteration`")
def moe_norm_recompute_in_layer_graphs(cfg, target):
    # The norm's output is freed inside the forward graph and rebuilt by a backward hook
    # (CheckpointWithoutOutput.discard_output_and_register_recompute, tensor_parallel/random.py), as MLA's input
    # norm is (mla_recompute_in_layer_graphs). On an H100 (TE 2.10) qwen/tiny with fp8 blockwise, alltoall and
    # grouped GEMM failed so at the first replay: te_attn_moe_router on 0.16.1 (cudaErrorIllegalAddress, surfacing
    # at the dispatcher's device-to-host sync) and te_moe_router with a shared expert on 0.19.2 (illegal address,
    # NCCL watchdog abort); the same router graphs without the recompute, or with the allgather dispatcher (where
    # megatron-core turns it off), trained. In bf16 too at two GPUs (0.19.2 on two H200s,
    # gpu_differential_2gpu_c236fc3): te_attn_moe_router at PP2 (run 364, illegal address, NCCL watchdog abort) and
    # te_moe_router at DP2 with the distributed optimizer's overlapped reduce (run 619: "Communication call has not
    # been issued for this bucket (91/95 params have grad available)", gradients that never arrived). The bf16
    # router graphs trained at one GPU (witness moe_norm_recompute_bf16_te_moe_router, 24488cb and c236fc3, both
    # releases), where nothing checks that every gradient came; the bf16 moe graph failed there too
    # (moe_norm_recompute_bf16_te_moe).
    if not moe_norm_recomputed_in_layer_graphs(cfg):
        return None
    fix = recompute_without(cfg.model, ("layernorm",))
    return violation(
        "moe_norm_recompute_in_layer_graphs", [IMPL, MODULES, "model.recompute_modules"],
        "megatron-core frees the MoE layer's pre-MLP norm output inside the per-layer graph and recomputes it in "
        f"the backward, and the replay then touches freed memory (an illegal memory access); set {fix}, graph a "
        "scope without the MoE layer (cuda_graph=te_attn), or use cuda_graph=full_iteration",
    )
