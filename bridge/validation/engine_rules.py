"""What each engine implements. Torch rules judge the native PyTorch model (bridge.config.engines
lists its choices); megatron rules judge what the megatron engine builds on megatron-core beyond
megatron-core's own checks (its in-graph optimizer, its layer specs)."""

from bridge.config.engines import (
    PARALLEL_SIZES,
    TORCH_ACTIVATIONS,
    TORCH_GRAPH_MODULES,
    TORCH_LR_DECAY_STYLES,
    TORCH_NORMALIZATIONS,
    TORCH_NOT_MODELLED,
    TORCH_OPTIMIZERS,
    TORCH_POSITION_EMBEDDINGS,
    TORCH_ROUTER_SCORE_FUNCTIONS,
    TORCH_SOFTMAX_TYPES,
)
from bridge.config.graphs import graph_impl
from bridge.validation.graph_facts import FULL_ITERATION, IMPL, LOCAL, MODULES, impl_of, is_graphed, modules_of
from bridge.validation.registry import rule, violation

MEGATRON_WHERE_IT_RUNS = "`engine=megatron` where a CUDA GPU and megatron-core are"


def or_megatron(target) -> str:
    """The megatron engine as the other way out, offered only where it can train: on this machine when
    it has a CUDA device and megatron-core (engine=auto picked torch because it has not, or the user
    chose torch); else the way to it is another machine."""
    if target.device == "cuda" and target.machine.has("megatron-core"):
        return "or use engine=megatron"
    return "or run it where a CUDA GPU and megatron-core are (engine=auto trains on megatron-core there)"


@rule("engine_impl", engine="torch",
      rejects="a graph impl the torch engine has no mechanism for (Transformer Engine graphs)",
      fix=f"`cuda_graph=local_layer` / `full_iteration`, or {MEGATRON_WHERE_IT_RUNS}")
def engine_impl(cfg, target):
    if "torch" not in graph_impl(impl_of(cfg)).mechanisms:
        return violation(
            "engine_impl", ["engine", IMPL],
            f"the torch engine has no cuda_graph_impl={impl_of(cfg).value} (Transformer Engine graphs need "
            f"megatron-core); use cuda_graph=local_layer / cuda_graph=full_iteration, {or_megatron(target)}",
        )
    return None


@rule("torch_engine_parallelism", engine="torch",
      rejects="more than one GPU or any model parallelism on the torch engine",
      fix=f"`train.num_gpus=1` and parallel sizes 1, or {MEGATRON_WHERE_IT_RUNS}")
def torch_engine_parallelism(cfg, target):
    parallel = {f"model.{name}": getattr(cfg.model, name) for name in PARALLEL_SIZES if getattr(cfg.model, name) != 1}
    if cfg.train.num_gpus == 1 and not parallel:
        return None
    return violation(
        "torch_engine_parallelism", ["train.num_gpus", *parallel],
        f"the torch engine trains on one device (train.num_gpus={cfg.train.num_gpus}"
        f"{''.join(f', {key}={value}' for key, value in parallel.items())}); set train.num_gpus=1"
        f"{''.join(f' {key}=1' for key in parallel)}, {or_megatron(target)}",
    )


@rule("torch_engine_sequence", engine="torch",
      rejects="a model sequence length other than the data's on the torch engine (its masks and rotary tables "
              "are built for model.seq_length)",
      fix=f"set only `dataset.seq_length` (model.seq_length follows it), or {MEGATRON_WHERE_IT_RUNS}")
def torch_engine_sequence(cfg, target):
    if cfg.model.seq_length == cfg.dataset.seq_length:
        return None
    return violation(
        "torch_engine_sequence", ["model.seq_length", "dataset.seq_length"],
        f"the torch engine trains at model.seq_length={cfg.model.seq_length}, but the data has "
        f"dataset.seq_length={cfg.dataset.seq_length}; set model.seq_length={cfg.dataset.seq_length} (or leave it "
        "unset: it follows dataset.seq_length), "
        f"{or_megatron(target)}")


@rule("torch_engine_precision", engine="torch",
      rejects="fp16, fp8 or fp4 on the torch engine (it trains in fp32 or bf16 autocast)",
      fix=f"`model.fp16=false model.fp8=null model.fp4=null`, or {MEGATRON_WHERE_IT_RUNS}")
def torch_engine_precision(cfg, target):
    model = cfg.model
    keys = [key for key, on in (("model.fp16", model.fp16), ("model.fp8", model.fp8), ("model.fp4", model.fp4)) if on]
    if not keys:
        return None
    return violation(
        "torch_engine_precision", keys,
        f"the torch engine trains in fp32 or bf16 autocast, not {', '.join(keys)}; set model.fp16=false "
        f"model.fp8=null model.fp4=null, {or_megatron(target)}",
    )


@rule("torch_engine_features", engine="torch",
      rejects="architecture or optimizer choices the native model does not implement",
      fix=f"a choice the message lists, or {MEGATRON_WHERE_IT_RUNS}")
def torch_engine_features(cfg, target):
    model, found = cfg.model, []
    for name in TORCH_NOT_MODELLED:
        if getattr(model, name):
            found.append(violation("torch_engine_features", [f"model.{name}"],
                                   f"the native model does not implement model.{name}; turn it off, "
                                   f"{or_megatron(target)}"))
    choices = (("model.normalization", model.normalization, TORCH_NORMALIZATIONS),
               ("model.activation_func", model.activation_func, TORCH_ACTIVATIONS),
               ("model.position_embedding_type", model.position_embedding_type, TORCH_POSITION_EMBEDDINGS),
               ("model.softmax_type", model.softmax_type, TORCH_SOFTMAX_TYPES),
               ("model.moe_router_score_function", model.moe_router_score_function, TORCH_ROUTER_SCORE_FUNCTIONS),
               ("optimizer.optimizer", cfg.optimizer.optimizer, TORCH_OPTIMIZERS),
               ("optimizer.lr_decay_style", cfg.optimizer.lr_decay_style, TORCH_LR_DECAY_STYLES))
    found += [violation("torch_engine_features", [key],
                        f"{key}={value!r} is not implemented by the torch engine; use one of {list(allowed)}, "
                        f"{or_megatron(target)}")
              for key, value, allowed in choices if value not in allowed]
    return found


@rule("torch_engine_modules", engine="torch",
      rejects="local graphs of modules the native model cannot wrap (moe_preprocess, mamba)",
      fix="modules from attn, mlp, moe, moe_router")
def torch_engine_modules(cfg, target):
    unknown = [name for name in modules_of(cfg) if name not in TORCH_GRAPH_MODULES]
    if impl_of(cfg) == LOCAL and unknown:
        return violation(
            "torch_engine_modules", [MODULES],
            f"the torch engine's local graphs wrap {list(TORCH_GRAPH_MODULES)}, not {unknown}; drop {unknown} "
            "from model.cuda_graph_modules",
        )
    return None


@rule("torch_compile_graphs", engine="torch",
      rejects="`torch_compile` together with a graph impl (both capture the step)",
      fix="`torch_compile=none` or `cuda_graph=none`")
def torch_compile_graphs(cfg, target):
    if cfg.torch_compile != "none" and is_graphed(cfg):
        return violation(
            "torch_compile_graphs", ["torch_compile", IMPL],
            f"torch_compile={cfg.torch_compile} and cuda_graph_impl={impl_of(cfg).value} both capture the step; "
            "set torch_compile=none or cuda_graph=none",
        )
    return None


@rule("torch_compile_megatron", engine="megatron",
      rejects="`torch_compile` on the megatron engine (it compiles nothing)",
      fix="`torch_compile=none`, or `engine=torch`")
def torch_compile_megatron(cfg, target):
    if cfg.torch_compile != "none":
        return violation(
            "torch_compile_megatron", ["torch_compile", "engine"],
            f"torch_compile={cfg.torch_compile} is the torch engine's; megatron-core would train uncompiled: set "
            "torch_compile=none, or engine=torch",
        )
    return None


@rule("optimizer_in_graph_megatron", engine="megatron",
      rejects="the megatron engine's in-graph optimizer with a non-Adam optimizer or fp16, or graphbridge's capturable "
              "AdamW (the in-graph optimizer without the distributed optimizer) with expert parallelism",
      fix="as the message says, or `optimizer.optimizer_in_graph=false`")
def optimizer_in_graph_megatron(cfg, target):
    if not (cfg.optimizer.optimizer_in_graph and impl_of(cfg) == FULL_ITERATION):
        return None
    # Either optimizer steps Adam over fp32 master weights without a loss scaler: fp16's reads its overflow
    # flag on the host. graphbridge's capturable AdamW (bridge.engines.megatron.capturable_optimizer) reduces
    # the grad norm over the model-parallel group only, not across expert-parallel ranks.
    unmet = [key for key, ok in (
        ("optimizer.optimizer=adam", cfg.optimizer.optimizer == "adam"),
        ("model.fp16=false", not cfg.model.fp16),
        ("model.expert_model_parallel_size=1",
         cfg.model.expert_model_parallel_size == 1 or cfg.ddp.use_distributed_optimizer),
    ) if not ok]
    if not unmet:
        return None
    return violation(
        "optimizer_in_graph_megatron", ["optimizer.optimizer_in_graph"] + [key.split("=")[0] for key in unmet],
        f"the in-graph optimizer step needs {' '.join(unmet)}; set those or optimizer.optimizer_in_graph=false",
    )


@rule("optimizer_graph_distributed", engine="megatron", megatron_core="<0.19",
      rejects="the in-graph optimizer with the distributed optimizer before megatron-core 0.19, which has no optimizer "
              "graph of its own (graphbridge's capturable AdamW keeps whole, unsharded state)",
      fix="`plan.megatron_core=0.19.2` (megatron-core 0.19's optimizer graph), `ddp.use_distributed_optimizer=false`, "
          "or `optimizer.optimizer_in_graph=false`")
def optimizer_graph_distributed(cfg, target):
    optimizer = cfg.optimizer
    if not (optimizer.optimizer_in_graph and cfg.ddp.use_distributed_optimizer and impl_of(cfg) == FULL_ITERATION):
        return None
    return violation(
        "optimizer_graph_distributed",
        ["optimizer.optimizer_in_graph", "ddp.use_distributed_optimizer", "plan.megatron_core"],
        f"megatron-core {target.megatron_core} cannot step the distributed optimizer inside a graph (its own optimizer "
        "graph, OptimizerCudaGraphWrapper, came with megatron-core 0.19); use megatron-core 0.19: set "
        "plan.megatron_core=0.19.2 and install it (pip install 'graphbridge[te019]'), or set "
        "ddp.use_distributed_optimizer=false, or optimizer.optimizer_in_graph=false")


@rule("attention_variant_needs_te_spec", engine="megatron",
      rejects="`model.experimental_attention_variant` with megatron-core's local layer spec",
      fix="`model.transformer_impl=transformer_engine`")
def attention_variant_needs_te_spec(cfg, target):
    if cfg.model.experimental_attention_variant is not None and cfg.model.transformer_impl != "transformer_engine":
        return violation(
            "attention_variant_needs_te_spec", ["model.experimental_attention_variant", "model.transformer_impl"],
            f"model.experimental_attention_variant={cfg.model.experimental_attention_variant} exists only in "
            "megatron-core's Transformer Engine spec; set model.transformer_impl=transformer_engine",
        )
    return None


@rule("mla_needs_te_spec", engine="megatron",
      rejects="multi-latent attention (`model.multi_latent_attention=true`) with megatron-core's local layer spec",
      fix="`model.transformer_impl=transformer_engine`")
def mla_needs_te_spec(cfg, target):
    # MLA hands its core attention k_channels, which only TE's attention takes (0.16.1 and 0.19.2): deepseek/tiny
    # with model.transformer_impl=local failed so at model build on an H100 (TypeError ... 'k_channels').
    if cfg.model.multi_latent_attention and cfg.model.transformer_impl != "transformer_engine":
        return violation(
            "mla_needs_te_spec", ["model.multi_latent_attention", "model.transformer_impl"],
            "megatron-core builds multi-latent attention only with Transformer Engine's core attention (its local "
            "one takes no k_channels); set model.transformer_impl=transformer_engine",
        )
    return None


@rule("mla_query_groups", engine="megatron",
      rejects="`model.num_query_groups` other than the head count with multi-latent attention, whose keys and values "
              "have every head",
      fix="`model.num_query_groups=null`")
def mla_query_groups(cfg, target):
    # MLA projects keys and values for every head, but Transformer Engine's attention is built with
    # num_query_groups: deepseek/tiny with model.num_query_groups=2 failed at the first forward on an H100, on both
    # releases ("Keys and values must have num_gqa_group = 2 heads! Found 8."). Null means one group a head.
    model = cfg.model
    if not model.multi_latent_attention or model.num_query_groups in (None, model.num_attention_heads):
        return None
    return violation(
        "mla_query_groups", ["model.num_query_groups", "model.multi_latent_attention"],
        f"multi-latent attention projects keys and values for all {model.num_attention_heads} heads, so it has no "
        f"query groups (model.num_query_groups={model.num_query_groups}); set model.num_query_groups=null",
    )


@rule("yarn_rounding_mla", engine="megatron",
      rejects="`model.yarn_correction_range_round_to_int=false` with multi-latent attention, whose YaRN always rounds",
      fix="`model.yarn_correction_range_round_to_int=true`, or a model without MLA")
def yarn_rounding_mla(cfg, target):
    model = cfg.model
    if model.multi_latent_attention and not model.yarn_correction_range_round_to_int:
        return violation(
            "yarn_rounding_mla", ["model.yarn_correction_range_round_to_int", "model.multi_latent_attention"],
            "megatron-core's multi-latent attention builds its YaRN table with the ramp bounds rounded and has no "
            "setting for it; set model.yarn_correction_range_round_to_int=true",
        )
    return None


YARN_BETAS = {"model.beta_fast": 32.0, "model.beta_slow": 1.0}
"""YaRN's ramp bounds and the values DeepSeek's and gpt-oss's recipes give them."""


@rule("yarn_betas", engine="megatron",
      rejects="YaRN rotary embeddings (`model.position_embedding_type=yarn`) with a ramp bound "
              "(`model.beta_fast`, `model.beta_slow`) of 0 or below",
      fix="ramp bounds above 0 (the recipes' 32 and 1)")
def yarn_betas(cfg, target):
    # YaRN's correction range divides by each bound's rotations (megatron-core _yarn_find_correction_dim):
    # deepseek/tiny with model.beta_fast=0.0 (9901178, H200) or model.beta_slow=0.0 (e6aa918, H100) failed at build
    # with a ZeroDivisionError in MLASelfAttention, while llama/tiny (rope) trained with beta_slow=0.0 (run 482 of
    # 9901178, run 1366 of e6aa918): only YaRN reads them.
    if cfg.model.position_embedding_type != "yarn":
        return None
    bounds = {key: getattr(cfg.model, key.removeprefix("model.")) for key in YARN_BETAS}
    low = {key: value for key, value in bounds.items() if value <= 0}
    if not low:
        return None
    return violation(
        "yarn_betas", [*low, "model.position_embedding_type"],
        f"YaRN divides by its ramp bounds, and {' and '.join(f'{key}={value}' for key, value in low.items())} "
        f"{'is' if len(low) == 1 else 'are'} not above 0; set {' '.join(f'{key}={YARN_BETAS[key]}' for key in low)}",
    )
