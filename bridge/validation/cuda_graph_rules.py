"""CUDA-graph rules: megatron-core 0.16.1's TransformerConfig checks (R4-R13 in the
reference) plus the training-level ones Bridge and Megatron-LM keep outside megatron-core.
The MoE-specific ones are in moe_graph_rules.py. Messages keep the upstream wording where
there is one and add the override that fixes it.
"""

import difflib

from bridge.config.schema import CUDA_GRAPH_MODULES, Engine
from bridge.validation.graph_facts import (
    FULL_ITERATION,
    IMPL,
    LOCAL,
    MODULES,
    TE,
    active_modules,
    impl_of,
    is_graphed,
    modules_of,
)
from bridge.validation.model_facts import recompute_modules
from bridge.validation.registry import rule, violation


@rule("module_names")
def module_names(cfg):
    if not isinstance(cfg.model.cuda_graph_modules, (list, tuple)):
        return violation(
            "module_names", [MODULES],
            f"model.cuda_graph_modules={cfg.model.cuda_graph_modules!r} must be a list of names; "
            "set model.cuda_graph_modules=[] for the whole layer",
        )
    names = modules_of(cfg)
    if "" in names:
        return violation(
            "module_names", [MODULES],
            f"model.cuda_graph_modules={names} holds an empty string; for the whole layer "
            "use model.cuda_graph_modules=[]",
        )
    if {"full", "full_iteration"} & set(names):
        return violation(
            "module_names", [MODULES],
            "'full' and 'full_iteration' are not modules: use model.cuda_graph_modules=[] for "
            "the whole layer, cuda_graph=full_iteration for the whole iteration",
        )
    unknown = [name for name in names if name not in CUDA_GRAPH_MODULES]
    if unknown:
        hints = [hint for name in unknown for hint in difflib.get_close_matches(name, CUDA_GRAPH_MODULES, n=1)]
        did_you_mean = f" (did you mean {hints}?)" if hints else ""
        return violation(
            "module_names", [MODULES],
            f"unknown module name(s) {unknown} in model.cuda_graph_modules{did_you_mean}; use names from "
            f"{list(CUDA_GRAPH_MODULES)}",
        )
    if len(set(names)) != len(names):
        return violation(
            "module_names", [MODULES], f"model.cuda_graph_modules={names} repeats a name; drop the duplicate"
        )
    return None


@rule("full_iteration_modules")
def full_iteration_modules(cfg):
    if impl_of(cfg) == FULL_ITERATION and modules_of(cfg):
        return violation(
            "full_iteration_modules", [IMPL, MODULES],
            "cuda_graph_modules must be empty when cuda_graph_impl=full_iteration; "
            "set model.cuda_graph_modules=[]",
        )
    return None


@rule("te_rng_tracker")
def te_rng_tracker(cfg):
    if is_graphed(cfg) and not (cfg.rng.te_rng_tracker or cfg.model.use_te_rng_tracker):
        return violation(
            "te_rng_tracker", ["rng.te_rng_tracker", "model.use_te_rng_tracker"],
            "Transformer engine's RNG tracker is required for cudagraphs; set "
            "rng.te_rng_tracker=true (bridge.overrides.set_cuda_graph_overrides does this)",
        )
    return None


@rule("full_iteration_nan_checks")
def full_iteration_nan_checks(cfg):
    if impl_of(cfg) != FULL_ITERATION:
        return None
    keys = []
    if cfg.rerun_state_machine.check_for_nan_in_loss:
        keys.append("rerun_state_machine.check_for_nan_in_loss")
    if cfg.ddp.check_for_nan_in_grad:
        keys.append("ddp.check_for_nan_in_grad")
    if not keys:
        return None
    fix = " ".join(f"{key}=false" for key in keys)
    return violation(
        "full_iteration_nan_checks", [IMPL] + keys,
        "NaN checks read values on the host and must be disabled with the full_iteration CUDA "
        f"graph; set {fix} (perf.nan_check_interval keeps an in-graph check)",
    )


@rule("full_iteration_p2p_sync")
def full_iteration_p2p_sync(cfg):
    if impl_of(cfg) != FULL_ITERATION or cfg.model.pipeline_model_parallel_size < 2 or not cfg.model.batch_p2p_sync:
        return None
    # Measured on two H200s: torch.cuda.synchronize() in megatron-core's p2p _communicate
    # invalidates the capture (cudaErrorStreamCaptureUnsupported).
    return violation(
        "full_iteration_p2p_sync", [IMPL, "model.batch_p2p_sync", "model.pipeline_model_parallel_size"],
        "with pipeline parallelism megatron-core synchronises the device after each batched send/recv, "
        "which the full_iteration CUDA graph cannot capture; set model.batch_p2p_sync=false",
    )


@rule("local_scoped_modules")
def local_scoped_modules(cfg):
    scoped = sorted({"attn", "mlp"} & set(modules_of(cfg)))
    # The torch engine's local impl is make_graphed_callables, which does graph sub-modules.
    if impl_of(cfg) == LOCAL and scoped and Engine(cfg.engine) != Engine.torch:
        return violation(
            "local_scoped_modules", [IMPL, MODULES],
            f"cuda_graph_impl=local graphs the whole layer in megatron-core 0.16.1, not {scoped}; "
            f"use cuda_graph=local_layer for whole layers or cuda_graph_impl=transformer_engine "
            f"(e.g. cuda_graph=te_attn_mlp) for scoped capture",
        )
    return None


@rule("cpu_offloading")
def cpu_offloading(cfg):
    if is_graphed(cfg) and cfg.model.cpu_offloading:
        return violation(
            "cpu_offloading", [IMPL, "model.cpu_offloading"],
            "CUDA graphs not supported with CPU offloading; set model.cpu_offloading=false "
            "or cuda_graph=none",
        )
    return None


@rule("full_recompute")
def full_recompute(cfg):
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


@rule("recompute_attention_dropout")
def recompute_attention_dropout(cfg):
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


@rule("recompute_hidden_dropout")
def recompute_hidden_dropout(cfg):
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


@rule("recompute_moe_jitter")
def recompute_moe_jitter(cfg):
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


@rule("ep_overlap")
def ep_overlap(cfg):
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


@rule("delay_wgrad")
def delay_wgrad(cfg):
    model = cfg.model
    if not model.delay_wgrad_compute:
        return None
    if not model.overlap_moe_expert_parallel_comm:
        return violation(
            "delay_wgrad", ["model.delay_wgrad_compute", "model.overlap_moe_expert_parallel_comm"],
            "overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute; "
            "set model.overlap_moe_expert_parallel_comm=true or model.delay_wgrad_compute=false",
        )
    if model.moe_use_legacy_grouped_gemm:
        return violation(
            "delay_wgrad", ["model.delay_wgrad_compute", "model.moe_use_legacy_grouped_gemm"],
            "delay_wgrad_compute is not supported with legacy groupedgemm implementation; set "
            "model.moe_use_legacy_grouped_gemm=false",
        )
    return None


@rule("warmup_steps")
def warmup_steps(cfg):
    warmup = cfg.model.cuda_graph_warmup_steps
    if not is_graphed(cfg):
        return None
    if warmup < 1:
        return violation(
            "warmup_steps", ["model.cuda_graph_warmup_steps"],
            f"cuda_graph_warmup_steps={warmup}: capture needs at least one eager step first "
            "(allocator, NCCL and autotuning settle); set model.cuda_graph_warmup_steps=3",
        )
    if warmup >= cfg.train.train_iters:
        return violation(
            "warmup_steps", ["model.cuda_graph_warmup_steps", "train.train_iters"],
            f"the graph would never replay: cuda_graph_warmup_steps={warmup} >= "
            f"train_iters={cfg.train.train_iters}; raise train.train_iters",
        )
    return None


@rule("static_shapes")
def static_shapes(cfg):
    if not is_graphed(cfg):
        return None
    if cfg.model.seq_length != cfg.dataset.seq_length:
        return violation(
            "static_shapes", ["model.seq_length", "dataset.seq_length"],
            f"graphs need one static sequence length, got model.seq_length={cfg.model.seq_length} "
            f"and dataset.seq_length={cfg.dataset.seq_length}; set only dataset.seq_length",
        )
    if cfg.dataset.packed_sequence and not cfg.dataset.pad_to_max_length:
        return violation(
            "static_shapes", ["dataset.packed_sequence", "dataset.pad_to_max_length"],
            "graphs need static shapes: packed sequences must be padded; set "
            "dataset.pad_to_max_length=true",
        )
    return None


@rule("packed_sequence_scope")
def packed_sequence_scope(cfg):
    if not (is_graphed(cfg) and cfg.dataset.packed_sequence):
        return None
    if impl_of(cfg) != TE or not modules_of(cfg) or "attn" in modules_of(cfg):
        return violation(
            "packed_sequence_scope", [IMPL, MODULES, "dataset.packed_sequence"],
            "packed sequences carry packed_seq_params, which megatron-core 0.16.1 cannot pass "
            "into a graph; only TE scopes without attention work: use cuda_graph=te_mlp",
        )
    return None


@rule("engine_impl")
def engine_impl(cfg):
    if Engine(cfg.engine) == Engine.torch and impl_of(cfg) == TE:
        return violation(
            "engine_impl", ["engine", IMPL],
            "the torch engine has no Transformer Engine graphs; use engine=megatron, or "
            "cuda_graph=local_layer / cuda_graph=full_iteration (PyTorch's own graph APIs)",
        )
    return None


@rule("full_iteration_param_gather")
def full_iteration_param_gather(cfg):
    if impl_of(cfg) == FULL_ITERATION and cfg.optimizer.overlap_param_gather_with_optimizer_step:
        return violation(
            "full_iteration_param_gather",
            [IMPL, "optimizer.overlap_param_gather_with_optimizer_step"],
            "the full-iteration graph would wait on a param gather issued outside it; set "
            "optimizer.overlap_param_gather_with_optimizer_step=false",
        )
    return None


@rule("optimizer_in_graph")
def optimizer_in_graph(cfg):
    if not cfg.optimizer.optimizer_in_graph:
        return None
    if impl_of(cfg) != FULL_ITERATION:
        return violation(
            "optimizer_in_graph", ["optimizer.optimizer_in_graph", IMPL],
            "the optimizer step can only be captured inside the full-iteration graph; use "
            "cuda_graph=full_iteration or optimizer.optimizer_in_graph=false",
        )
    if Engine(cfg.engine) == Engine.torch:
        return None
    # The megatron engine's in-graph step is a capturable AdamW over fp32 master weights.
    unmet = [key for key, ok in (
        ("optimizer.optimizer=adam", cfg.optimizer.optimizer == "adam"),
        ("model.bf16=true", cfg.model.bf16),
        ("ddp.use_distributed_optimizer=false", not cfg.ddp.use_distributed_optimizer),
        ("model.expert_model_parallel_size=1", cfg.model.expert_model_parallel_size == 1),
    ) if not ok]
    if unmet:
        return violation(
            "optimizer_in_graph", ["optimizer.optimizer_in_graph"] + [key.split("=")[0] for key in unmet],
            f"the in-graph optimizer step needs {' '.join(unmet)}; set those or "
            "optimizer.optimizer_in_graph=false",
        )
    return None


@rule("mamba_layers")
def mamba_layers(cfg):
    if "mamba" in active_modules(cfg):
        return violation(
            "mamba_layers", [MODULES],
            "the mamba module graphs MambaLayer only, and graphbridge's GPT models have none, so "
            "nothing would be captured; drop mamba (e.g. cuda_graph=te_attn)",
        )
    return None
