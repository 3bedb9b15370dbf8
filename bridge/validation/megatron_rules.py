"""megatron-core 0.16.1 checks outside the CUDA-graph block that a valid plan must not promise
past: each one would otherwise surface as a bare exception in the training process."""

from bridge.config.releases import in_range
from bridge.config.model_facts import expert_tensor_parallel_size, has_dense_layers, is_moe_model
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


@rule("expert_bias", engine="megatron",
      rejects="MoE experts with biases (`model.add_bias_linear=true`) other than Transformer Engine's grouped experts "
              "without bias-dropout fusion",
      fix="`model.moe_grouped_gemm=true` on the TE spec, `model.bias_dropout_fusion=false`; or "
          "`model.add_bias_linear=false`")
def expert_bias(cfg, target):
    # One-by-one experts add their bias in place to a linear layer's output, which autograd refuses in the
    # first forward pass (measured on 0.19.2 with the TE and the local spec, gpt_oss/tiny; 0.16.1's MLP has
    # the same in-place add). The local spec's grouped experts are one-by-one on 0.19 and refuse biases
    # on 0.16.1, as do the legacy grouped experts; TE's grouped experts refuse bias-dropout fusion.
    model = cfg.model
    if not (is_moe_model(model) and model.add_bias_linear):
        return None
    unmet = [key for key, ok in (
        ("model.moe_grouped_gemm=true", model.moe_grouped_gemm),
        ("model.transformer_impl=transformer_engine", model.transformer_impl == "transformer_engine"),
        ("model.moe_use_legacy_grouped_gemm=false", not model.moe_use_legacy_grouped_gemm),
        ("model.bias_dropout_fusion=false", not model.bias_dropout_fusion),
    ) if not ok]
    if not unmet:
        return None
    return violation(
        "expert_bias", ["model.add_bias_linear"] + [key.split("=")[0] for key in unmet],
        "megatron-core trains MoE experts with biases only as Transformer Engine's grouped experts without "
        f"bias-dropout fusion (one-by-one experts fail at the first step); set {' '.join(unmet)}, or "
        "model.add_bias_linear=false",
    )


@rule("expert_bias_tensor_parallel",
      rejects="MoE experts with biases (`model.add_bias_linear=true`) split by expert tensor parallelism (ETP, which "
              "follows TP when unset) above 1",
      fix="`model.expert_tensor_parallel_size=1`, or `model.add_bias_linear=false`")
def expert_bias_tensor_parallel(cfg, target):
    # TransformerConfig asserts it once ModelParallelConfig has filled ETP from TP (0.16.1 and 0.19.2): GPT-OSS's
    # biased experts at TP2 failed so at model build. Megatron-Bridge's GPT-OSS recipes set ETP=1 for this.
    model = cfg.model
    expert_tp = expert_tensor_parallel_size(model)
    if is_moe_model(model) and model.add_bias_linear and expert_tp != 1:
        unset = "" if model.expert_tensor_parallel_size else f" (unset, it follows TP={expert_tp})"
        return violation(
            "expert_bias_tensor_parallel",
            ["model.add_bias_linear", "model.expert_tensor_parallel_size", "model.tensor_model_parallel_size"],
            f"Bias in Moe is only supported when ETP==1, and expert tensor parallelism is {expert_tp} here{unset}; "
            "set model.expert_tensor_parallel_size=1 (the experts stay whole on each GPU while attention keeps its "
            "TP), or model.add_bias_linear=false",
        )
    return None


@rule("moe_tensor_parallel_needs_sequence_parallel", engine="megatron",
      rejects="an MoE model with tensor parallelism (`model.tensor_model_parallel_size` > 1) and no sequence "
              "parallelism",
      fix="`model.sequence_parallel=true`")
def moe_tensor_parallel_needs_sequence_parallel(cfg, target):
    # MoELayer.forward raises it in every training step (0.16.1 and 0.19.2), after the model was built: deepseek/tiny
    # at TP2 failed so at the first step on two GPUs.
    model = cfg.model
    if is_moe_model(model) and model.tensor_model_parallel_size > 1 and not model.sequence_parallel:
        return violation(
            "moe_tensor_parallel_needs_sequence_parallel",
            ["model.sequence_parallel", "model.tensor_model_parallel_size"],
            "During training, performance may degrade if MoE and tensor parallelism are enabled without also "
            f"enabling sequence parallelism (megatron-core's MoE layer refuses to train at TP="
            f"{model.tensor_model_parallel_size} without it); set model.sequence_parallel=true",
        )
    return None


@rule("shared_expert_bias",
      rejects="a shared expert (`model.moe_shared_expert_intermediate_size`) with biases (`model.add_bias_linear=true`)",
      fix="`model.moe_shared_expert_intermediate_size=null`, or `model.add_bias_linear=false`")
def shared_expert_bias(cfg, target):
    # megatron-core's SharedExpertMLP asserts add_bias_linear is off when it is built (0.16.1 and 0.19.2):
    # gpt_oss/tiny with a shared expert failed so at model build on an H100.
    model = cfg.model
    if is_moe_model(model) and model.moe_shared_expert_intermediate_size and model.add_bias_linear:
        return violation(
            "shared_expert_bias", ["model.moe_shared_expert_intermediate_size", "model.add_bias_linear"],
            "megatron-core builds shared experts without biases only (it asserts \"bias is not supported in the "
            "shared experts\"); set model.moe_shared_expert_intermediate_size=null, or model.add_bias_linear=false",
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


@rule("flex_dispatcher",
      rejects="the flex dispatcher without a backend (deepep or hybridep), with deepep and padding to capacity, or "
              "with TP x EP = 1 (megatron-core's MoEFlexTokenDispatcher asserts TPxEP > 1)",
      fix="`model.moe_token_dispatcher_type=alltoall`, or the backend / parallel sizes the message names")
def flex_dispatcher(cfg, target):
    model = cfg.model
    if not is_moe_model(model) or model.moe_token_dispatcher_type != "flex":
        return None
    keys = ["model.moe_token_dispatcher_type"]
    if model.moe_flex_dispatcher_backend not in ("deepep", "hybridep"):
        return violation("flex_dispatcher", keys + ["model.moe_flex_dispatcher_backend"],
                         f"the flex dispatcher needs a backend, got {model.moe_flex_dispatcher_backend!r}; set "
                         "model.moe_flex_dispatcher_backend=deepep or hybridep, or model.moe_token_dispatcher_type=alltoall")
    if model.moe_flex_dispatcher_backend == "deepep" and model.moe_pad_expert_input_to_capacity:
        return violation("flex_dispatcher", keys + ["model.moe_pad_expert_input_to_capacity"],
                         "Flex token dispatcher with deepep backend does not support moe_pad_expert_input_to_capacity; "
                         "use model.moe_token_dispatcher_type=alltoall for drop-and-pad routing")
    tp_ep = model.tensor_model_parallel_size * model.expert_model_parallel_size
    if tp_ep < 2:  # token_dispatcher.py: MoEFlexTokenDispatcher.__init__ asserts it at model build
        return violation("flex_dispatcher", keys + ["model.tensor_model_parallel_size", "model.expert_model_parallel_size"],
                         f"Flex token dispatcher requires TPxEP > 1 (TP x EP = {tp_ep} here, e.g. a preset scaled down "
                         "to one GPU); set model.moe_token_dispatcher_type=alltoall, or raise "
                         "model.expert_model_parallel_size")
    return None


@rule("shared_expert_overlap",
      rejects="overlapping the shared expert with a dispatcher other than alltoall (from megatron-core 0.19 on: "
              "alltoall or flex)",
      fix="`model.moe_token_dispatcher_type=alltoall` or `model.moe_shared_expert_overlap=false`")
def shared_expert_overlap(cfg, target):
    model = cfg.model
    overlapping = ["alltoall", "flex"] if in_range(target.megatron_core, ">=0.19") else ["alltoall"]
    if (is_moe_model(model) and model.moe_shared_expert_intermediate_size is not None
            and model.moe_shared_expert_overlap and model.moe_token_dispatcher_type not in overlapping):
        return violation("shared_expert_overlap", ["model.moe_shared_expert_overlap", "model.moe_token_dispatcher_type"],
                         f"moe_shared_expert_overlap only works with the {' or '.join(overlapping)} token dispatcher "
                         f"in megatron-core {target.megatron_core}; set model.moe_token_dispatcher_type=alltoall or "
                         "model.moe_shared_expert_overlap=false")
    return None


@rule("router_padding_for_quantization",
      rejects="padding the routing map for fp8 without fp8 or fp4, or with the allgather dispatcher",
      fix="`model.moe_router_padding_for_fp8=false`, or fp8 with the alltoall or flex dispatcher")
def router_padding_for_quantization(cfg, target):
    # TransformerConfig checks both for dense models too (0.16.1 and 0.19.2): the schema-wide draw planned llama with
    # the padding and no fp8 valid, and megatron-core refused it.
    model = cfg.model
    if not model.moe_router_padding_for_fp8:
        return None
    if model.fp8 is None and model.fp4 is None:
        return violation("router_padding_for_quantization", ["model.moe_router_padding_for_fp8", "model.fp8"],
                         "fp8/fp4 must be specified when moe_router_padding_for_quantization is True; set "
                         "model.moe_router_padding_for_fp8=false or a precision with fp8 (precision=fp8_cs)")
    if model.moe_token_dispatcher_type == "allgather":
        return violation("router_padding_for_quantization",
                         ["model.moe_router_padding_for_fp8", "model.moe_token_dispatcher_type"],
                         "allgather and alltoall_seq dispatcher does not support moe_router_padding_for_quantization; "
                         "set model.moe_token_dispatcher_type=alltoall or model.moe_router_padding_for_fp8=false")
    return None


@rule("router_padding_saved_map", engine="megatron",
      rejects="padding the routing map for fp8 or fp4 with the alltoall dispatcher when the router's backward keeps "
              "that map: a capacity factor, the fused router, or sinkhorn routing",
      fix="`model.moe_router_padding_for_fp8=false`, or dropless (`model.moe_expert_capacity_factor=null`) with the "
          "unfused router")
def router_padding_saved_map(cfg, target):
    # The alltoall dispatcher pads the router's routing map in place (moe_utils.pad_routing_map: `routing_map[mask]
    # = 1`, token_dispatcher.py dispatch_preprocess; the out-of-place fused_pad_routing_map needs megatron-core's
    # experimental flag, which graphbridge never sets). Autograd kept that very bool map for the router's backward
    # where a capacity factor applies (apply_router_token_dropping: `routing_probs * final_map`, both branches), where
    # Transformer Engine's fused top-k saves its output map (FusedTopkScoreFunction), and in sinkhorn routing
    # (`logits * map`), so the backward fails on the bumped version: "modified by an inplace operation:
    # [CUDABoolType [tokens, experts]]", eager steps included (0.16.1 and 0.19.2 on an H100, fp8 drop-and-pad).
    # flex pads the dispatched map, which no backward keeps.
    model = cfg.model
    if not (is_moe_model(model) and model.moe_router_padding_for_fp8 and (model.fp8 or model.fp4)
            and model.moe_token_dispatcher_type == "alltoall"):
        return None
    if model.moe_expert_capacity_factor is not None:
        key, why = "model.moe_expert_capacity_factor", "the capacity factor masks the probs with it"
    elif model.moe_router_load_balancing_type == "sinkhorn":
        key, why = "model.moe_router_load_balancing_type", "sinkhorn routing masks the scores with it"
    elif model.moe_router_fusion:
        key, why = "model.moe_router_fusion", "Transformer Engine's fused router saves it"
    else:
        return None
    return violation(
        "router_padding_saved_map", ["model.moe_router_padding_for_fp8", key],
        "the alltoall dispatcher pads the routing map for fp8 in place, and the router's backward still needs that "
        f"map ({why}): training fails at the first backward; set model.moe_router_padding_for_fp8=false, or train "
        "dropless (model.moe_expert_capacity_factor=null) with the unfused, non-sinkhorn router",
    )


@rule("router_topk_one",
      rejects="top-1 routing with a softmax router that applies softmax after the top-k (a zero gradient)",
      fix="`model.moe_router_pre_softmax=true`")
def router_topk_one(cfg, target):
    # TransformerConfig checks it for dense models too (0.16.1 and 0.19.2), where a drawn top-1 planned valid.
    model = cfg.model
    if (model.moe_router_topk == 1 and model.moe_router_score_function == "softmax"
            and not model.moe_router_pre_softmax and model.moe_router_load_balancing_type != "sinkhorn"):
        return violation("router_topk_one", ["model.moe_router_topk", "model.moe_router_pre_softmax"],
                         "Please use --moe-router-pre-softmax when topk is 1 (softmax over one expert has no gradient); "
                         "set model.moe_router_pre_softmax=true")
    return None


@rule("router_fusion_fp64", engine="megatron",
      rejects="the fused router (`model.moe_router_fusion=true`) with fp64 router logits (`model.moe_router_dtype=fp64`)",
      fix="`model.moe_router_dtype=fp32`, or `model.moe_router_fusion=false`")
def router_fusion_fp64(cfg, target):
    # Transformer Engine's fused top-k raises "Current TE does not support float64 router type" at the first forward
    # (every release up to 2.20; qwen/tiny on an H100, eager steps included), and megatron-core does not check it.
    model = cfg.model
    if is_moe_model(model) and model.moe_router_fusion and model.moe_router_dtype == "fp64":
        return violation("router_fusion_fp64", ["model.moe_router_fusion", "model.moe_router_dtype"],
                         "Transformer Engine's fused router takes no fp64 logits; set model.moe_router_dtype=fp32, or "
                         "model.moe_router_fusion=false")
    return None


@rule("pipeline_split",
      rejects="an uneven pipeline split (layers of the first/last stage) that megatron-core refuses: together with a "
              "layout or the embedding/loss accounting, not divisible by VP, or middle layers that do not split evenly; "
              "layers that the embedding/loss accounting leaves uneven over the stages or their virtual stages; the "
              "accounting beside a layout",
      fix="as the message says")
def pipeline_split(cfg, target):
    model = cfg.model
    first, last = model.num_layers_in_first_pipeline_stage, model.num_layers_in_last_pipeline_stage
    if first is None and last is None:
        return accounted_split(model)
    keys = ["model.num_layers_in_first_pipeline_stage", "model.num_layers_in_last_pipeline_stage"]
    if model.pipeline_model_parallel_layout or model.account_for_embedding_in_pipeline_split \
            or model.account_for_loss_in_pipeline_split:
        return violation("pipeline_split", keys, "an uneven split cannot be combined with "
                         "model.pipeline_model_parallel_layout or the embedding/loss accounting; drop one of them")
    vp = model.virtual_pipeline_model_parallel_size
    stages, layers = model.pipeline_model_parallel_size, model.num_layers
    for count in (first, last):
        if count is None:
            continue
        if vp and count % vp:
            return violation("pipeline_split", keys + ["model.virtual_pipeline_model_parallel_size"],
                             f"a stage of {count} layers must split into {vp} virtual stages; set a multiple of {vp}")
        stages, layers = stages - 1, layers - count
    if stages < 0 or bool(layers) != bool(stages) or (stages and layers % stages):
        return violation("pipeline_split", keys + ["model.num_layers", "model.pipeline_model_parallel_size"],
                         f"{max(layers, 0)} layers remain for {max(stages, 0)} middle stage(s), which must split them "
                         "evenly; change the first/last stage layers")
    return None


def accounted_split(model):
    """megatron-core's even split (TransformerConfig, and the transformer block at build), which counts the embedding
    and/or the loss as a layer each where the accounting asks: llama/tiny's 2 layers over PP4 planned valid and
    failed at build ("num_layers should be divisible by pipeline_model_parallel_size") before it was checked here."""
    accounted = int(model.account_for_embedding_in_pipeline_split) + int(model.account_for_loss_in_pipeline_split)
    stages, vp = model.pipeline_model_parallel_size, model.virtual_pipeline_model_parallel_size
    if model.pipeline_model_parallel_layout and accounted:
        # TransformerConfig refuses the pair at any pipeline size (a schema-wide differential draw at PP1 found it).
        return violation("pipeline_split", ["model.pipeline_model_parallel_layout",
                                            "model.account_for_embedding_in_pipeline_split",
                                            "model.account_for_loss_in_pipeline_split"],
                         "a pipeline layout places the embedding (E) and the loss (L) itself, which megatron-core "
                         "refuses beside the embedding/loss accounting; set model.account_for_embedding_in_pipeline_"
                         "split=false model.account_for_loss_in_pipeline_split=false, or drop the layout (=null)")
    if model.pipeline_model_parallel_layout or stages <= 1:
        return None
    layers = model.num_layers + accounted
    keys = ["model.num_layers", "model.pipeline_model_parallel_size", "model.account_for_embedding_in_pipeline_split",
            "model.account_for_loss_in_pipeline_split"]
    counted = " (the embedding and/or loss counted as one each)" if accounted else ""
    if layers % stages:
        problem = f"{layers} layers{counted} over {stages} stages"
    elif vp and (layers // stages) % vp:
        problem = f"{layers // stages} layers a stage{counted} over {vp} virtual stages"
        keys.append("model.virtual_pipeline_model_parallel_size")
    else:
        return None
    even = stages * (vp or 1)
    fix = f"set model.num_layers={max(even, -(-layers // even) * even) - accounted}"
    if accounted:
        fix += (", or model.account_for_embedding_in_pipeline_split=false and "
                "model.account_for_loss_in_pipeline_split=false")
    return violation("pipeline_split", keys, f"megatron-core splits the pipeline evenly, and {problem} do not split "
                     f"evenly; {fix}")


@rule("gated_delta_net_layout",
      rejects="gated delta net attention without `model.linear_attention_freq`",
      fix="`model.linear_attention_freq=4` (every 4th layer full attention, as Qwen3-Next)")
def gated_delta_net_layout(cfg, target):
    model = cfg.model
    if model.experimental_attention_variant == "gated_delta_net" and model.linear_attention_freq is None:
        return violation(
            "gated_delta_net_layout", ["model.experimental_attention_variant", "model.linear_attention_freq"],
            "model.experimental_attention_variant=gated_delta_net needs model.linear_attention_freq, which layers "
            "keep full attention; set model.linear_attention_freq=4 (every 4th layer, as Qwen3-Next) or a 0/1 list",
        )
    return None


@rule("bias_activation_fusion", engine="megatron",
      rejects="`model.bias_activation_fusion=true` with an activation megatron-core has no fused kernel for: other "
              "than gelu, swiglu (gated silu) and gated quick_gelu; non-gated gelu without biases; a GLU offset "
              "without quick_gelu; quick_gelu in a dense MLP or shared expert",
      fix="`model.bias_activation_fusion=false`")
def bias_activation_fusion(cfg, target):
    model = cfg.model
    if not model.bias_activation_fusion:
        return None
    activation, gated = model.activation_func, model.gated_linear_unit
    problems = []
    # TransformerConfig's own checks (0.16.1 and 0.19.2).
    if activation not in ("gelu", "silu", "quick_gelu"):
        problems.append(f"it fuses gelu, swiglu and quick_geglu, not {activation}")
    if activation == "gelu" and not gated and not model.add_bias_linear:
        problems.append("non-gated gelu fuses only with biases (model.add_bias_linear=true)")
    if activation == "quick_gelu" and not gated:
        problems.append("quick_gelu fuses only gated (model.gated_linear_unit=true)")
    if model.glu_linear_offset and activation != "quick_gelu":
        problems.append("a GLU offset (model.glu_linear_offset) fuses only with quick_gelu")
    # What the MLP's forward pass raises: non-gated silu, and quick_gelu outside the experts (the experts pass
    # their routing probabilities to the fused quick_geglu; a dense MLP or a shared expert has none).
    if activation == "silu" and not gated:
        problems.append("silu fuses only gated (swiglu)")
    dense_mlp = not is_moe_model(model) or has_dense_layers(model) or model.moe_shared_expert_intermediate_size
    if activation == "quick_gelu" and gated and dense_mlp:
        problems.append("quick_geglu fuses only inside MoE experts, and this model has a dense MLP or shared expert")
    if not problems:
        return None
    return violation("bias_activation_fusion", ["model.bias_activation_fusion", "model.activation_func"],
                     f"megatron-core cannot fuse this bias and activation: {'; '.join(problems)}; set "
                     "model.bias_activation_fusion=false")
