"""What megatron-core's local layer spec cannot build or train, where it builds that spec: asked for
(`model.transformer_impl=local`), or on a machine without Transformer Engine. Its modules are torch's (or apex's,
where installed), and each refuses some settings at model build or at the first step."""

from bridge.config.model_facts import has_dense_layers, is_moe_model, recompute_modules
from bridge.validation.graph_facts import (IMPL, MODULES, TE, impl_of, modules_of, te_graphs_attention,
                                          te_graphs_router)
from bridge.validation.recompute_rules import recompute_without
from bridge.validation.registry import rule, violation


def builds_local_spec(cfg, target) -> bool:
    """megatron-core builds its local layer spec: asked for, or no Transformer Engine here."""
    return cfg.model.transformer_impl != "transformer_engine" or not target.machine.has("transformer-engine")


@rule("torch_norm", environment=True,
      rejects="what megatron-core's torch norm (WrappedTorchNorm) refuses: `model.persist_layer_norm`, "
              "`model.sequence_parallel` or `model.layernorm_zero_centered_gamma`, where megatron-core builds its local "
              "layer spec (model.transformer_impl=local, or no Transformer Engine here) with RMSNorm, or without apex",
      fix="the flag off, or Transformer Engine's norms (`model.transformer_impl=transformer_engine`, with Transformer "
          "Engine installed), or apex for LayerNorm")
def torch_norm(cfg, target):
    # The local spec's norm is apex's FusedLayerNorm where apex imports, and torch's otherwise; RMSNorm is always
    # torch's (LocalSpecProvider.layer_norm, 0.16.1 and 0.19.2). WrappedTorchNorm asserts each flag below at model
    # build: llama/tiny with model.transformer_impl=local at TP2 with sequence parallelism failed so on two GPUs.
    model = cfg.model
    if target.engine != "megatron" or not builds_local_spec(cfg, target):
        return None  # Transformer Engine's norm takes every flag
    rms_norm = model.normalization == "RMSNorm"
    if not rms_norm and target.machine.has("apex"):
        return None
    flags = [key for key, on in (("model.persist_layer_norm", model.persist_layer_norm),
                                 ("model.sequence_parallel", model.sequence_parallel),
                                 ("model.layernorm_zero_centered_gamma", model.layernorm_zero_centered_gamma)) if on]
    if not flags:
        return None
    norm = "RMSNorm, which it always takes from torch" if rms_norm else "LayerNorm from torch, apex not being installed"
    apex = "" if rms_norm else ", or install apex"
    return violation("torch_norm", [*flags, "model.transformer_impl"],
                     f"megatron-core builds its local layer spec here with {norm}, and torch's norm supports none of "
                     f"{', '.join(flags)} (it asserts at model build, e.g. \"sequence parallel not supported by torch "
                     f"LayerNorm\"); set {' '.join(f'{key}=false' for key in flags)}, or use Transformer Engine's norms "
                     f"(model.transformer_impl=transformer_engine where Transformer Engine is installed){apex}")


@rule("context_parallel_local_attention", environment=True,
      rejects="context parallelism (`model.context_parallel_size` > 1) where megatron-core builds its local layer "
              "spec, whose attention does not split the sequence",
      fix="`model.context_parallel_size=1`, or Transformer Engine's attention (`model.transformer_impl="
          "transformer_engine`, with Transformer Engine installed)")
def context_parallel_local_attention(cfg, target):
    # DotProductAttention asserts it at model build (0.16.1 and 0.19.2): llama/tiny at CP2 on the local spec failed
    # so in the CPU build at two ranks (tests/differential.py).
    if target.engine != "megatron" or cfg.model.context_parallel_size == 1 or not builds_local_spec(cfg, target):
        return None
    return violation("context_parallel_local_attention", ["model.context_parallel_size", "model.transformer_impl"],
                     "Context parallelism is only supported by TEDotProductAttention, and megatron-core builds its "
                     "local layer spec here; set model.context_parallel_size=1, or use Transformer Engine's attention "
                     "(model.transformer_impl=transformer_engine where Transformer Engine is installed)")


@rule("moe_router_without_transformer_engine", environment=True, megatron_core="<0.19",
      rejects="an MoE model on megatron-core 0.16.1 where Transformer Engine is not installed",
      fix="install Transformer Engine (`pip install 'graphbridge[te016]'`), or megatron-core 0.19.2")
def moe_router_without_transformer_engine(cfg, target):
    # 0.16.1's router computes its logits with router_gating_linear, which names Transformer Engine's te_general_gemm
    # outside the import guard (transformer/moe/moe_utils.py): without TE the first forward raises NameError
    # (qwen/tiny on the local spec, CPU build, tests/differential.py). 0.19 binds the name to None there.
    if target.engine != "megatron" or not is_moe_model(cfg.model) or target.machine.has("transformer-engine"):
        return None
    return violation("moe_router_without_transformer_engine", ["model.num_moe_experts", "engine"],
                     f"megatron-core {target.megatron_core}'s MoE router calls Transformer Engine's GEMM, which is not "
                     "installed here (its first step fails with NameError: te_general_gemm); install Transformer "
                     "Engine (pip install 'graphbridge[te016]') or use megatron-core 0.19.2")


@rule("quantized_norm_recompute_local_spec", environment=True,
      rejects="selective recompute of layernorm under fp8 or fp4 where megatron-core builds its local layer spec",
      fix="drop layernorm from `model.recompute_modules`, `precision=bf16`, or Transformer Engine's layers "
          "(`model.transformer_impl=transformer_engine`)")
def quantized_norm_recompute_local_spec(cfg, target):
    # Under fp8 or fp4 a recomputed norm makes megatron-core ask the linear layer after it to keep its unquantized
    # input (set_save_original_input), which only Transformer Engine's linears can: the local spec's raises
    # ValueError at model build (transformer_layer.py, 0.16.1 and 0.19.2). Witness: llama/tiny, local spec,
    # fp8_sc, recompute [core_attn,layernorm], run 295 of gpu_differential_24488cb.json.gz on an H200, both releases.
    model = cfg.model
    if (target.engine != "megatron" or not (model.fp8 or model.fp4) or model.recompute_granularity != "selective"
            or "layernorm" not in recompute_modules(model) or not builds_local_spec(cfg, target)):
        return None
    return violation("quantized_norm_recompute_local_spec",
                     ["model.recompute_modules", "model.fp8", "model.fp4", "model.transformer_impl"],
                     "under fp8 or fp4, megatron-core recomputes a norm only before Transformer Engine linears (it "
                     "asks them to keep their unquantized input), and it builds its local layer spec here; drop "
                     "layernorm from model.recompute_modules, train in bf16, or use Transformer Engine's layers "
                     "(model.transformer_impl=transformer_engine where Transformer Engine is installed)")


def norms_recomputed_in_te_graphs(cfg, target) -> list:
    """The local spec's norms that selective recompute of layernorm frees inside Transformer Engine per-layer graphs:
    the input norm where a graph holds attention, and dense layers' pre-MLP norm where one holds their MLP. (The TE
    spec fuses both into the linear after them; an MoE layer's pre-MLP norm is moe_norm_recompute_in_layer_graphs'.)"""
    model = cfg.model
    if (target.engine != "megatron" or impl_of(cfg) != TE or model.recompute_granularity != "selective"
            or "layernorm" not in recompute_modules(model) or not builds_local_spec(cfg, target)):
        return []
    graphed = set(modules_of(cfg)) or {"attn", "mlp"}
    norms = ["the input norm"] if "attn" in graphed else []
    if "mlp" in graphed and has_dense_layers(model):
        norms.append("dense layers' pre-MLP norm")
    return norms


@rule("local_spec_norm_recompute_in_te_graphs", environment=True,
      rejects="selective recompute of layernorm inside Transformer Engine per-layer graphs of attention or a dense "
              "MLP, where megatron-core builds its local layer spec",
      fix="drop layernorm from `model.recompute_modules`, Transformer Engine's layers "
          "(`model.transformer_impl=transformer_engine`), or `cuda_graph=local_layer` or `full_iteration`")
def local_spec_norm_recompute_in_te_graphs(cfg, target):
    # The local spec's norms are modules of their own, so megatron-core recomputes them without reentry
    # (CheckpointWithoutOutput: the output is freed after its consumer and rebuilt by a backward hook), inside the
    # graph that holds them; the replay then reads the freed output. Witness: run 1068 of
    # gpu_differential_f0650f3.json.gz at f0650f3 on an H200, both releases (qwen/tiny, te_attn, cudaErrorIllegalAddress
    # at the first replay), and local_spec_norm_recompute_f0650f3.log there (0.19.2): llama/tiny's te_attn, te_mlp
    # and te_layer failed so; run 1068 with core_attn recomputed instead trained, and so did the norm recomputed under
    # te_attn on the TE spec and under local_layer on the local spec. The witness cases norm_recompute_* of the
    # differential at 8a7890f showed both sides again on both releases.
    norms = norms_recomputed_in_te_graphs(cfg, target)
    if not norms:
        return None
    fix = recompute_without(cfg.model, ("layernorm",))
    return violation("local_spec_norm_recompute_in_te_graphs",
                     ["model.recompute_modules", IMPL, MODULES, "model.transformer_impl"],
                     f"megatron-core builds its local layer spec here and recomputes {' and '.join(norms)} inside "
                     "the Transformer Engine per-layer graph: it frees the norm's output in the forward and rebuilds "
                     f"it in the backward, and the replay then reads freed memory (an illegal memory access); set {fix}, "
                     "use Transformer Engine's layers (model.transformer_impl=transformer_engine where Transformer "
                     "Engine is installed), or cuda_graph=local_layer or full_iteration")


@rule("local_spec_attention_dropout_in_te_graphs", environment=True,
      rejects="attention dropout inside Transformer Engine per-layer graphs of attention without the TE RNG tracker, "
              "where megatron-core builds its local layer spec (outside sequence parallelism)",
      fix="`rng.te_rng_tracker=true` (derived when unset), `model.attention_dropout=0.0`, or `cuda_graph=local_layer` "
          "or `full_iteration`")
def local_spec_attention_dropout_in_te_graphs(cfg, target):
    # The local spec's attention draws its dropout inside megatron-core's RNG tracker fork (outside sequence
    # parallelism), which swaps the default generator to the tracker's model-parallel state. Transformer Engine's
    # make_graphed_callables registers only the default generator and TE's own tracker states with the graph, so
    # megatron-core's tracker (rng.te_rng_tracker=false) fails the capture. Local graphs and full_iteration register
    # megatron-core's tracker states, and the TE spec needs the TE tracker anyway (te_rng_tracker). Witness: run 594
    # of gpu_differential_2gpu.json at 6c7a53d on two H200s, both releases (qwen/tiny, te_attn, attention dropout
    # 0.1: "Attempt to increase offset for a CUDA generator not in capture mode" at the capture step).
    model = cfg.model
    if (target.engine != "megatron" or not te_graphs_attention(cfg) or model.attention_dropout == 0
            or model.sequence_parallel or cfg.rng.te_rng_tracker or model.use_te_rng_tracker
            or not builds_local_spec(cfg, target)):
        return None
    return violation("local_spec_attention_dropout_in_te_graphs",
                     ["rng.te_rng_tracker", "model.attention_dropout", IMPL, MODULES, "model.transformer_impl"],
                     "megatron-core builds its local layer spec here, whose attention draws its dropout from "
                     "megatron-core's RNG tracker (rng.te_rng_tracker=false); Transformer Engine's graphs do not "
                     "register that tracker's generators, so the capture fails ('Attempt to increase offset for a CUDA "
                     "generator not in capture mode'); set rng.te_rng_tracker=true, model.attention_dropout=0.0, or "
                     "cuda_graph=local_layer or full_iteration")


@rule("local_spec_forced_balance_in_te_graphs", environment=True,
      rejects="the router's forced load balancing (`model.moe_router_force_load_balancing`) inside Transformer Engine "
              "per-layer graphs of the router without the TE RNG tracker, where megatron-core builds its local layer "
              "spec",
      fix="`rng.te_rng_tracker=true` (derived when unset), `model.moe_router_force_load_balancing=false`, or "
          "`cuda_graph=local_layer` or `full_iteration`")
def local_spec_forced_balance_in_te_graphs(cfg, target):
    # Forced load balancing replaces the router's logits with random ones drawn inside megatron-core's RNG tracker
    # fork of the expert-parallel state (moe_utils.RandomSTE), on either spec and with or without sequence
    # parallelism; Transformer Engine's graphs do not register megatron-core's tracker generators, as with the local
    # spec's attention dropout above. The TE spec needs the TE tracker already (te_rng_tracker). Witness: run 1733
    # (forced_balance_local_spec_te_moe_router_megatron_tracker) of the H200 gpu_differential.json at 0dcdb17, both
    # releases: "Attempt to increase offset for a CUDA generator not in capture mode" at the capture step.
    model = cfg.model
    if (target.engine != "megatron" or not is_moe_model(model) or not model.moe_router_force_load_balancing
            or not te_graphs_router(cfg) or cfg.rng.te_rng_tracker or model.use_te_rng_tracker
            or not builds_local_spec(cfg, target)):
        return None
    return violation("local_spec_forced_balance_in_te_graphs",
                     ["rng.te_rng_tracker", "model.moe_router_force_load_balancing", IMPL, MODULES,
                      "model.transformer_impl"],
                     "megatron-core builds its local layer spec here, and the router's forced load balancing draws "
                     "its random logits from megatron-core's RNG tracker (rng.te_rng_tracker=false); Transformer "
                     "Engine's graphs of the router do not register that tracker's generators, so the capture fails "
                     "('Attempt to increase offset for a CUDA generator not in capture mode'); set "
                     "rng.te_rng_tracker=true, model.moe_router_force_load_balancing=false, or cuda_graph=local_layer "
                     "or full_iteration")
