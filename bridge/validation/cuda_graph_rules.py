"""CUDA-graph rules: megatron-core 0.16.1's TransformerConfig checks (R4-R7 in the reference)
plus the training-level ones Bridge and Megatron-LM keep outside megatron-core. The MoE rules
(with EP overlap) are in moe_graph_rules.py, the recompute ones in recompute_rules.py. Messages
keep the upstream wording where there is one and add the override that fixes it.
"""

import difflib

from bridge.config.model_facts import has_dense_layers
from bridge.config.releases import in_range
from bridge.config.schema import CUDA_GRAPH_MODULES, PlanFormat
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
from bridge.validation.registry import rule, violation
from bridge.validation.training_rules import data_parallel_size, model_parallel_size


@rule("module_names",
      rejects='unknown, empty or repeated module names; `full` or `full_iteration` as a module',
      fix='names from attn, mlp, moe, moe_router, moe_preprocess, mamba; `[]` is the whole layer')
def module_names(cfg, target):
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
            f"model.cuda_graph_modules={names} holds an empty string; use "
            "model.cuda_graph_modules=[] for the whole layer",
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
            "module_names", [MODULES], f"model.cuda_graph_modules={names} repeats a name; drop the duplicate: set "
            f"model.cuda_graph_modules=[{','.join(dict.fromkeys(names))}]"
        )
    return None


@rule("full_iteration_modules",
      rejects='full_iteration with modules',
      fix='`model.cuda_graph_modules=[]`')
def full_iteration_modules(cfg, target):
    if impl_of(cfg) == FULL_ITERATION and modules_of(cfg):
        return violation(
            "full_iteration_modules", [IMPL, MODULES],
            "cuda_graph_modules must be empty when cuda_graph_impl=full_iteration; "
            "set model.cuda_graph_modules=[]",
        )
    return None


@rule("te_rng_tracker",
      rejects='per-layer graphs (local or TE) of Transformer Engine layers without the TE RNG tracker',
      fix='`rng.te_rng_tracker=true` (derived when unset)')
def te_rng_tracker(cfg, target):
    # Capturing TE layers, Transformer Engine accepts only its own tracker ("Unsupported RNG states tracker.",
    # local and TE graphs on an H100, megatron-core 0.16.1 and 0.19.2). A full-iteration graph registers
    # megatron-core's graph-safe generators itself and trained bit-identically without it, as do local graphs
    # of the local spec; the tracker stays derived on for every graph, as in Megatron-Bridge.
    per_layer_te = impl_of(cfg) in (LOCAL, TE) and cfg.model.transformer_impl == "transformer_engine"
    if per_layer_te and not (cfg.rng.te_rng_tracker or cfg.model.use_te_rng_tracker):
        return violation(
            "te_rng_tracker", ["rng.te_rng_tracker", "model.use_te_rng_tracker"],
            "Transformer engine's RNG tracker is required for cudagraphs; set "
            "rng.te_rng_tracker=true (bridge.overrides.set_cuda_graph_overrides does this)",
        )
    return None


@rule("full_iteration_nan_checks",
      rejects="full_iteration with megatron-core's grad NaN check on, or (for a Megatron-Bridge config, "
              "plan.format=bridge) the loss NaN check too",
      fix='`ddp.check_for_nan_in_grad=false` (and for Bridge `rerun_state_machine.check_for_nan_in_loss=false`); '
          "derived when unset")
def full_iteration_nan_checks(cfg, target):
    # megatron-core's grad check reads each bucket's norm on the host inside its gradient sync, which the
    # full-iteration graph captures. The loss check is graphbridge's trainer's, on the host after each step and
    # outside any graph: full_iteration trains with it (H100, 0.16.1: run 1428 of gpu_differential_e15f81f.json.gz,
    # trained with this rule unasked). Megatron-Bridge checks the loss inside its step and refuses it, so a
    # Bridge config (plan.format=bridge) must leave it off.
    if impl_of(cfg) != FULL_ITERATION:
        return None
    keys = ["ddp.check_for_nan_in_grad"] if cfg.ddp.check_for_nan_in_grad else []
    if cfg.rerun_state_machine.check_for_nan_in_loss and cfg.plan.format == PlanFormat.bridge:
        keys.append("rerun_state_machine.check_for_nan_in_loss")
    if not keys:
        return None
    fix = " ".join(f"{key}=false" for key in keys)
    return violation(
        "full_iteration_nan_checks", [IMPL] + keys,
        "these NaN checks read values on the host inside the step, which the full_iteration CUDA graph captures "
        f"and replays without them; set {fix} (perf.nan_check_interval keeps an in-graph check)",
    )


@rule("full_iteration_p2p_sync",
      rejects="full_iteration under pipeline parallelism with megatron-core's device sync after batched send/recv",
      fix='`model.batch_p2p_sync=false` (derived when unset)')
def full_iteration_p2p_sync(cfg, target):
    if impl_of(cfg) != FULL_ITERATION or cfg.model.pipeline_model_parallel_size < 2 or not cfg.model.batch_p2p_sync:
        return None
    # Measured on two H200s: torch.cuda.synchronize() in megatron-core's p2p _communicate
    # invalidates the capture (cudaErrorStreamCaptureUnsupported).
    return violation(
        "full_iteration_p2p_sync", [IMPL, "model.batch_p2p_sync", "model.pipeline_model_parallel_size"],
        "with pipeline parallelism megatron-core synchronises the device after each batched send/recv, "
        "which the full_iteration CUDA graph cannot capture; set model.batch_p2p_sync=false",
    )


@rule("local_scoped_modules",
      rejects='local with attn or mlp (megatron-core 0.16.1 graphs the whole layer whatever the modules; '
              '0.19 would graph the parts, which Megatron-Bridge leaves to Transformer Engine and graphbridge '
              'has not run)',
      fix='`cuda_graph=local_layer` or a TE scope', engine="megatron")
def local_scoped_modules(cfg, target):
    scoped = sorted({"attn", "mlp"} & set(modules_of(cfg)))
    # The torch engine's local impl is make_graphed_callables, which does graph sub-modules.
    if impl_of(cfg) != LOCAL or not scoped:
        return None
    if in_range(target.megatron_core, "<0.19"):
        why = f"graphs the whole layer in megatron-core {target.megatron_core}, not {scoped}"
    else:
        why = (f"with {scoped} is scoped local capture, which Megatron-Bridge refuses (it leaves scoped capture to "
               "Transformer Engine) and graphbridge's megatron engine has not run")
    return violation(
        "local_scoped_modules", [IMPL, MODULES],
        f"cuda_graph_impl=local {why}; use cuda_graph=local_layer for whole layers or "
        "cuda_graph_impl=transformer_engine (e.g. cuda_graph=te_attn_mlp) for scoped capture")


@rule("cpu_offloading", megatron_core="<0.19",
      rejects='any graph with CPU offloading',
      fix='`model.cpu_offloading=false`')
def cpu_offloading(cfg, target):
    if is_graphed(cfg) and cfg.model.cpu_offloading:
        return violation(
            "cpu_offloading", [IMPL, "model.cpu_offloading"],
            "CUDA graphs not supported with CPU offloading; set model.cpu_offloading=false "
            "or cuda_graph=none",
        )
    return None


@rule("warmup_steps",
      rejects='graph warmup below 1 step, or not below train_iters',
      fix='`model.cuda_graph_warmup_steps=3`; raise `train.train_iters`')
def warmup_steps(cfg, target):
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
            f"train_iters={cfg.train.train_iters}; raise it: set train.train_iters={warmup + 2} or more",
        )
    return None


@rule("static_shapes",
      rejects='model and data sequence lengths that differ; unpadded packed sequences',
      fix='set only `dataset.seq_length`; `dataset.pad_to_max_length=true`')
def static_shapes(cfg, target):
    if not is_graphed(cfg):
        return None
    if cfg.model.seq_length != cfg.dataset.seq_length:
        return violation(
            "static_shapes", ["model.seq_length", "dataset.seq_length"],
            f"graphs need one static sequence length, got model.seq_length={cfg.model.seq_length} "
            f"and dataset.seq_length={cfg.dataset.seq_length}; set model.seq_length={cfg.dataset.seq_length} (or leave "
            "it unset: it follows dataset.seq_length)",
        )
    if cfg.dataset.packed_sequence and not cfg.dataset.pad_to_max_length:
        # te_mlp on unpadded rows failed at its first replay (a 224-token row against the 256 captured; witness
        # packed_unpadded_te_mlp, h100 gpu_witnesses.json at eae46ab)
        return violation(
            "static_shapes", ["dataset.packed_sequence", "dataset.pad_to_max_length"],
            "graphs need static shapes: packed sequences must be padded; set "
            "dataset.pad_to_max_length=true",
        )
    return None


@rule("te_graphs_bf16_params", engine="megatron",
      rejects="Transformer Engine per-layer graphs of attention, MLPs, MoE layers or whole layers with parameters "
              "that are not bf16 (`model.bf16=false`)",
      fix="`model.bf16=true`")
def te_graphs_bf16_params(cfg, target):
    # megatron-core captures each layer with bf16 sample hidden states whatever the parameters' dtype
    # (GraphableMegatronModule.get_layer_static_inputs, 0.16.1 and 0.19.2), and a TE module outside autocast asserts
    # that its input and parameters share a dtype: qwen/tiny te_attn and llama/tiny te_attn_mlp with model.bf16=false
    # trained eagerly and failed at capture ("Data types for parameters must match when outside of autocasted
    # region"), both releases, on an H200 (runs 645 and 1126 of gpu_differential_schema_9901178.json).
    # Router graphs alone capture the norm and the router, which casts its input itself: qwen/tiny te_moe_router
    # with model.bf16=false completed on 0.16.1 (run 108 of 9901178).
    if impl_of(cfg) != TE or cfg.model.bf16 or (modules_of(cfg) and not set(modules_of(cfg)) & {"attn", "mlp", "moe"}):
        return None
    dtype = "fp16" if cfg.model.fp16 else "fp32"
    return violation(
        "te_graphs_bf16_params", [IMPL, "model.bf16", *(["model.fp16"] if cfg.model.fp16 else [])],
        f"Transformer Engine per-layer graphs are captured with bf16 sample inputs, which {dtype} parameters refuse; "
        "set model.bf16=true" + (" model.fp16=false" if cfg.model.fp16 else ""),
    )


@rule("packed_sequence_scope",
      rejects='packed sequences with attention, whole-layer or full-iteration graphs',
      fix='`cuda_graph=te_mlp`')
def packed_sequence_scope(cfg, target):
    # Witnessed on an H100, both releases (h100 gpu_witnesses.json at eae46ab): te_attn and te_layer fail at the
    # first replay ("CUDA graph accepts only Tensor inputs"), local_layer and full_iteration at capture; te_mlp
    # trains step for step as eager does.
    if not (is_graphed(cfg) and cfg.dataset.packed_sequence):
        return None
    if impl_of(cfg) != TE or not modules_of(cfg) or "attn" in modules_of(cfg):
        # The scope without attention that this model has layers for: its dense MLPs, else its MoE routers.
        scope = "te_mlp" if has_dense_layers(cfg.model) else "te_moe_router"
        return violation(
            "packed_sequence_scope", [IMPL, MODULES, "dataset.packed_sequence"],
            f"packed sequences carry packed_seq_params, which megatron-core {target.megatron_core} cannot pass "
            f"into a graph; only TE scopes without attention work: use cuda_graph={scope}",
        )
    return None


@rule("full_iteration_param_gather",
      rejects='full_iteration with the param gather overlapped with the optimizer step',
      fix='`optimizer.overlap_param_gather_with_optimizer_step=false`')
def full_iteration_param_gather(cfg, target):
    if impl_of(cfg) == FULL_ITERATION and cfg.optimizer.overlap_param_gather_with_optimizer_step:
        return violation(
            "full_iteration_param_gather",
            [IMPL, "optimizer.overlap_param_gather_with_optimizer_step"],
            "the full-iteration graph would wait on a param gather issued outside it; set "
            "optimizer.overlap_param_gather_with_optimizer_step=false",
        )
    return None


@rule("optimizer_in_graph",
      rejects='the optimizer step in a graph other than full_iteration',
      fix='`cuda_graph=full_iteration`, or `optimizer.optimizer_in_graph=false`')
def optimizer_in_graph(cfg, target):
    if not cfg.optimizer.optimizer_in_graph:
        return None
    if impl_of(cfg) != FULL_ITERATION:
        return violation(
            "optimizer_in_graph", ["optimizer.optimizer_in_graph", IMPL],
            "the optimizer step can only be captured inside the full-iteration graph; use "
            "cuda_graph=full_iteration or optimizer.optimizer_in_graph=false",
        )
    return None


@rule("mamba_layers",
      rejects="the mamba module (graphbridge's GPT models have no Mamba layers)",
      fix='drop mamba')
def mamba_layers(cfg, target):
    if "mamba" in active_modules(cfg):
        return violation(
            "mamba_layers", [MODULES],
            "the mamba module graphs MambaLayer only, and graphbridge's GPT models have none, so "
            "nothing would be captured; drop mamba (e.g. cuda_graph=te_attn)",
        )
    return None


# Compute-capability major per preset GPU; the local graph manager's check stops at sm_100.
GPU_SM_MAJOR = {"h100": 9, "h200": 9, "b200": 10, "b300": 10, "gb200": 10, "gb300": 10}


def sm_major(cfg, target) -> int:
    """The GPU generation a job runs on: its preset's, else this machine's; unknown counts as the
    stricter pre-Blackwell case."""
    if cfg.workload.gpu in GPU_SM_MAJOR:
        return GPU_SM_MAJOR[cfg.workload.gpu]
    return target.machine.gpus[0].capability[0] if target.machine.gpus else 9


@rule("nccl_graph_register",
      rejects="`expandable_segments:True` without `NCCL_GRAPH_REGISTER=0` (TE graphs on every GPU, local "
              "graphs before sm_100)",
      fix="`+env_vars.NCCL_GRAPH_REGISTER=0`")
def nccl_graph_register(cfg, target):
    impl = impl_of(cfg)
    if not is_graphed(cfg):
        return None
    alloc_conf = cfg.env_vars.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "")
    if "expandable_segments:True" not in alloc_conf or cfg.env_vars.get("NCCL_GRAPH_REGISTER") == "0":
        return None
    if impl == TE or sm_major(cfg, target) < 10:
        where = "with TE graphs on every GPU" if impl == TE else (
            f"with {impl.value} graphs before sm_100 (gpu={cfg.workload.gpu or 'this machine'})"
        )
        return violation(
            "nccl_graph_register",
            ["env_vars.PYTORCH_CUDA_ALLOC_CONF", "env_vars.NCCL_GRAPH_REGISTER"],
            f"expandable_segments:True needs NCCL_GRAPH_REGISTER=0 {where} to avoid illegal "
            "memory access; set +env_vars.NCCL_GRAPH_REGISTER=0",
        )
    return None


@rule("retained_backward_compiled_fusion",
      rejects="Transformer Engine graphs that retain their backward graph (`model.cuda_graph_retain_backward_graph`) "
              "with bias-dropout fusion and hidden dropout",
      fix="`model.cuda_graph_retain_backward_graph=false`, `model.bias_dropout_fusion=false`, or "
          "`model.hidden_dropout=0.0`")
def retained_backward_compiled_fusion(cfg, target):
    # megatron-core fuses bias-dropout-add with torch.compile. With dropout its backward keeps the dropout mask as a
    # donated buffer, and a backward compiled by the eager warm-up steps then refuses the capture's retain_graph=True:
    # te_mlp at hidden_dropout=0.1 failed so on an H100 (0.19.2, "compiled with non-empty donated buffers"). Without
    # dropout nothing is kept: qwen/tiny's te_attn with both trained on one H200 on both releases (7d4567f, the
    # differential's sample with this rule unasked). The CPU shows the same split at p=0 and 0.1 (tests/test_rules.py,
    # through megatron-core's own fused function).
    # full_iteration with both trained.
    model = cfg.model
    if (impl_of(cfg) == TE and model.cuda_graph_retain_backward_graph and model.bias_dropout_fusion
            and model.hidden_dropout > 0):
        return violation(
            "retained_backward_compiled_fusion",
            [IMPL, "model.cuda_graph_retain_backward_graph", "model.bias_dropout_fusion", "model.hidden_dropout"],
            "the compiled bias-dropout-add keeps its dropout mask for backward, which refuses a retained backward "
            "graph when Transformer Engine captures it; set model.cuda_graph_retain_backward_graph=false, "
            "model.bias_dropout_fusion=false, or model.hidden_dropout=0.0",
        )
    return None


@rule("local_graphs_pipeline_microbatches", engine="megatron", megatron_core=">=0.19",
      rejects="local per-layer graphs (`cuda_graph=local_layer`) under pipeline parallelism with more than one "
              "micro-batch a step, on megatron-core 0.19",
      fix="one micro-batch a step (`train.global_batch_size` = micro-batch size x data-parallel size), "
          "`cuda_graph=full_iteration`, or megatron-core 0.16.1")
def local_graphs_pipeline_microbatches(cfg, target):
    # llama/tiny at PP2 on two H200s (TE 2.10.0): 0.19.2's CudaGraphManager failed capture with a bare AssertionError
    # at four micro-batches and its process exited at two, where one trained; 0.16.1 trained all three.
    model, train = cfg.model, cfg.train
    if impl_of(cfg) != LOCAL or model.pipeline_model_parallel_size <= 1 or model_parallel_size(cfg) < 1:
        return None  # positive_sizes reports sizes below 1
    per_step = train.micro_batch_size * data_parallel_size(cfg)
    if per_step < 1 or train.global_batch_size <= per_step:
        return None  # gpu_count and global_batch report a layout or batch that does not divide
    return violation(
        "local_graphs_pipeline_microbatches",
        [IMPL, "model.pipeline_model_parallel_size", "train.global_batch_size"],
        f"megatron-core {target.megatron_core}'s local per-layer graphs fail capture under pipeline parallelism with "
        f"{train.global_batch_size // per_step} micro-batches a step; set train.global_batch_size={per_step} (one "
        "micro-batch), or use cuda_graph=full_iteration, or megatron-core 0.16.1",
    )
