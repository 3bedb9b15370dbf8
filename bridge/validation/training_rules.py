"""Rules on batches, parallel layouts, the learning-rate schedule and other training settings: what
megatron-core would reject later, or what would only show once a job is running at scale. Value
types and ranges are in value_rules.py."""

import math
from typing import List

from bridge.config.model_facts import expert_tensor_parallel_size, is_moe_model, valid_moe_layer_freq
from bridge.validation.local_spec_rules import builds_local_spec
from bridge.validation.registry import rule, violation

def model_parallel_size(cfg) -> int:
    model = cfg.model
    return model.tensor_model_parallel_size * model.pipeline_model_parallel_size * model.context_parallel_size


def data_parallel_size(cfg) -> int:
    return cfg.train.num_gpus // model_parallel_size(cfg)


def divisors(number: int) -> List[int]:
    """The divisors of ``number`` (1 or more), ascending, found in sqrt(number) steps: a fix names a parallel size
    that divides another, and a size may be any value up to 2**31-1 (a walk up to it took minutes)."""
    low = [divisor for divisor in range(1, math.isqrt(number) + 1) if number % divisor == 0]
    return sorted(set(low + [number // divisor for divisor in low]))


@rule("attention_heads",
      rejects='a hidden size not divisible by the heads (without kv_channels); heads not a multiple of the query groups',
      fix='as the message says')
def attention_heads(cfg, target):
    model = cfg.model
    if model.num_attention_heads < 1:
        return None  # positive_sizes reports it
    if model.kv_channels is None and model.hidden_size % model.num_attention_heads:
        return violation(
            "attention_heads", ["model.hidden_size", "model.num_attention_heads"],
            f"hidden_size={model.hidden_size} is not divisible by num_attention_heads="
            f"{model.num_attention_heads}; change one or set model.kv_channels",
        )
    groups = model.num_query_groups
    if groups is not None and (groups < 1 or model.num_attention_heads % groups):
        return violation(
            "attention_heads", ["model.num_attention_heads", "model.num_query_groups"],
            f"num_attention_heads={model.num_attention_heads} must be a multiple of "
            f"num_query_groups={groups}",
        )
    return None


@rule("moe_layer_freq",
      rejects='a malformed `model.moe_layer_freq`; a top-k above the expert count',
      fix='as the message says')
def moe_layer_freq(cfg, target):
    model = cfg.model
    freq = model.moe_layer_freq
    ok = valid_moe_layer_freq(model)
    if ok and is_moe_model(model) and model.moe_router_topk > model.num_moe_experts:
        return violation(
            "moe_layer_freq", ["model.moe_router_topk", "model.num_moe_experts"],
            f"moe_router_topk={model.moe_router_topk} exceeds num_moe_experts={model.num_moe_experts}; "
            "lower model.moe_router_topk",
        )
    if ok:
        return None
    return violation(
        "moe_layer_freq", ["model.moe_layer_freq"],
        f"model.moe_layer_freq={freq!r} must be an int >= 1 or a 0/1 list of length "
        f"num_layers={model.num_layers}; set model.moe_layer_freq=1 for an all-MoE model",
    )


@rule("gpu_count",
      rejects='GPUs that are not a multiple of TP x PP x CP, or that EP x ETP does not divide per stage',
      fix='change `train.num_gpus` or the parallel sizes')
def gpu_count(cfg, target):
    model = cfg.model
    size = model_parallel_size(cfg)
    if size < 1 or cfg.train.num_gpus % size:
        return violation(
            "gpu_count",
            ["train.num_gpus", "model.tensor_model_parallel_size", "model.pipeline_model_parallel_size",
             "model.context_parallel_size"],
            f"train.num_gpus={cfg.train.num_gpus} is not a multiple of TP x PP x CP = {size}; "
            "change train.num_gpus or the parallel sizes",
        )
    expert_tp = expert_tensor_parallel_size(model)
    if model.expert_model_parallel_size < 1 or expert_tp < 1:
        return None  # positive_sizes reports it
    expert_world = cfg.train.num_gpus // model.pipeline_model_parallel_size
    if expert_world % (model.expert_model_parallel_size * expert_tp):
        return violation(
            "gpu_count", ["train.num_gpus", "model.expert_model_parallel_size"],
            f"EP x ETP = {model.expert_model_parallel_size * expert_tp} must divide the "
            f"{expert_world} GPUs of a pipeline stage; {expert_parallel_fix(model, expert_world, expert_tp)}",
        )
    return None


def expert_parallel_fix(model, expert_world: int, expert_tp: int) -> str:
    """The override(s) that fit the experts onto a pipeline stage's GPUs: the largest expert-parallel size
    that divides them and the experts, and the dispatcher that works there (flex needs TP x EP > 1)."""
    experts = max(model.num_moe_experts or 1, 1)  # value_ranges reports fewer than 1
    fitting = [ep for ep in reversed(divisors(experts))
               if ep <= model.expert_model_parallel_size and expert_world % (ep * expert_tp) == 0]
    if not fitting:
        return "change model.expert_model_parallel_size or model.expert_tensor_parallel_size"
    fix = f"set model.expert_model_parallel_size={fitting[0]}"
    if model.moe_token_dispatcher_type == "flex" and fitting[0] * model.tensor_model_parallel_size < 2:
        fix += " model.moe_token_dispatcher_type=alltoall (the flex dispatcher needs TP x EP > 1)"
    return fix


@rule("node_count",
      rejects='`train.num_gpus` not divisible by `train.num_nodes`',
      fix='a multiple of `train.num_nodes`')
def node_count(cfg, target):
    gpus, nodes = cfg.train.num_gpus, cfg.train.num_nodes
    if nodes < 1 or gpus % nodes == 0:
        return None  # positive_sizes reports nodes < 1
    return violation(
        "node_count", ["train.num_gpus", "train.num_nodes"],
        f"train.num_gpus={gpus} is not divisible by train.num_nodes={nodes}: every node runs the same "
        f"number of GPUs; set train.num_gpus to a multiple of {nodes} or change train.num_nodes",
    )


@rule("node_size",
      rejects="more GPUs per node (`train.num_gpus` / `train.num_nodes`) than a node of the `gpu=` preset's machine "
              "has (`workload.gpus_per_node`)",
      fix='the `train.num_nodes` the message names (derived when unset)')
def node_size(cfg, target):
    gpus, nodes, per_node = cfg.train.num_gpus, cfg.train.num_nodes, cfg.workload.gpus_per_node
    if per_node is None or nodes < 1 or per_node < 1 or gpus <= nodes * per_node:
        return None  # positive_sizes reports sizes below 1
    return violation(
        "node_size", ["train.num_nodes", "train.num_gpus"],
        f"train.num_gpus={gpus} over train.num_nodes={nodes} puts {-(-gpus // nodes)} GPUs on a node and a "
        f"{cfg.workload.gpu} node has {per_node}; set train.num_nodes={-(-gpus // per_node)}, or leave it "
        "unset: it follows train.num_gpus",
    )


@rule("global_batch",
      rejects='a global batch that is not a multiple of micro-batch x data-parallel size (weak scaling included)',
      fix='the multiple the message names')
def global_batch(cfg, target):
    size = model_parallel_size(cfg)
    if size < 1 or cfg.train.num_gpus % size or cfg.train.micro_batch_size < 1:
        return None  # gpu_count / positive_sizes report it
    step = cfg.train.micro_batch_size * data_parallel_size(cfg)
    if step and cfg.train.global_batch_size % step:
        return violation(
            "global_batch", ["train.global_batch_size", "train.micro_batch_size", "train.num_gpus"],
            f"train.global_batch_size={cfg.train.global_batch_size} must be a multiple of "
            f"micro_batch_size x data_parallel_size = {step}; set train.global_batch_size="
            f"{max(step, cfg.train.global_batch_size // step * step)}",
        )
    return None


LR_DECAY_STYLES = ("constant", "linear", "cosine")
"""The decay styles both engines implement (megatron-core's WSD needs decay keys this schema lacks)."""


@rule("lr_schedule",
      rejects='`optimizer.lr_warmup_iters` below 0 or not below `train.train_iters`; `optimizer.min_lr` outside 0..lr; a decay style other than constant, linear, cosine',
      fix='as the message says')
def lr_schedule(cfg, target):
    """What megatron-core's OptimizerParamScheduler asserts, without a message, when the engine builds it."""
    opt, train_iters = cfg.optimizer, cfg.train.train_iters
    if opt.lr_decay_style not in LR_DECAY_STYLES:
        return violation(
            "lr_schedule", ["optimizer.lr_decay_style"],
            f"optimizer.lr_decay_style={opt.lr_decay_style!r} is not one of {', '.join(LR_DECAY_STYLES)}; "
            "set optimizer.lr_decay_style=cosine",
        )
    if opt.lr < 0:
        return violation("lr_schedule", ["optimizer.lr"],
                         f"optimizer.lr={opt.lr} must be at least 0; set optimizer.lr=3e-4")
    if not 0 <= opt.min_lr <= opt.lr:
        return violation(
            "lr_schedule", ["optimizer.min_lr", "optimizer.lr"],
            f"the learning rate decays from optimizer.lr={opt.lr} to optimizer.min_lr={opt.min_lr}, which must be "
            f"between 0 and lr; set optimizer.min_lr={opt.lr / 10:g}",
        )
    warmup = opt.lr_warmup_iters
    if warmup is not None and train_iters >= 1 and not 0 <= warmup < train_iters:
        return violation(
            "lr_schedule", ["optimizer.lr_warmup_iters", "train.train_iters"],
            f"optimizer.lr_warmup_iters={warmup} must be at least 0 and below train.train_iters={train_iters}, "
            f"over which the learning rate decays; set optimizer.lr_warmup_iters={train_iters // 10}, "
            "or raise train.train_iters",
        )
    return None


@rule("virtual_pipeline",
      rejects='virtual pipeline stages without pipeline parallelism',
      fix='`model.virtual_pipeline_model_parallel_size=null`')
def virtual_pipeline(cfg, target):
    model = cfg.model
    if model.virtual_pipeline_model_parallel_size is not None and model.pipeline_model_parallel_size <= 1:
        return violation(
            "virtual_pipeline",
            ["model.virtual_pipeline_model_parallel_size", "model.pipeline_model_parallel_size"],
            "virtual pipeline stages need pipeline parallelism; set "
            "model.virtual_pipeline_model_parallel_size=null or raise model.pipeline_model_parallel_size",
        )
    return None


@rule("virtual_pipeline_microbatches",
      rejects="virtual pipeline stages with a micro-batch count (`train.global_batch_size` / micro-batch size / "
              "data-parallel size) that is not a multiple of `model.pipeline_model_parallel_size`",
      fix="the `train.global_batch_size` the message names")
def virtual_pipeline_microbatches(cfg, target):
    # The interleaved schedule runs micro-batches in groups of PP (microbatch_group_size_per_vp_stage, which
    # graphbridge leaves at megatron-core's default) and refuses a count below a group or one that leaves a
    # smaller group (schedules.py, ValueError / RuntimeError at the first step); found by the CPU build at PP2 VP2.
    model, train = cfg.model, cfg.train
    stages = model.pipeline_model_parallel_size
    if model.virtual_pipeline_model_parallel_size is None or stages <= 1 or model_parallel_size(cfg) < 1:
        return None  # virtual_pipeline and positive_sizes report the rest
    per_step = train.micro_batch_size * data_parallel_size(cfg)
    if per_step < 1 or train.global_batch_size % per_step:
        return None  # global_batch reports it
    microbatches = train.global_batch_size // per_step
    if microbatches % stages == 0:
        return None
    batch = per_step * stages * max(1, -(-microbatches // stages))
    return violation(
        "virtual_pipeline_microbatches",
        ["train.global_batch_size", "model.virtual_pipeline_model_parallel_size", "model.pipeline_model_parallel_size"],
        f"the interleaved pipeline schedule takes micro-batches in groups of {stages} (the pipeline stages), and this "
        f"step has {microbatches}; set train.global_batch_size={batch} ({batch // per_step} micro-batches), or "
        "model.virtual_pipeline_model_parallel_size=null",
    )


@rule("sequence_parallel",
      rejects='sequence parallelism without tensor parallelism',
      fix='`model.sequence_parallel=false`')
def sequence_parallel(cfg, target):
    if cfg.model.sequence_parallel and cfg.model.tensor_model_parallel_size <= 1:
        return violation(
            "sequence_parallel", ["model.sequence_parallel", "model.tensor_model_parallel_size"],
            "Can not use sequence parallelism without tensor parallelism; set "
            "model.sequence_parallel=false",
        )
    return None


@rule("precision",
      rejects='bf16 and fp16 together',
      fix='`model.fp16=false`')
def precision(cfg, target):
    if cfg.model.bf16 and cfg.model.fp16:
        return violation(
            "precision", ["model.bf16", "model.fp16"],
            "bf16 and fp16 cannot both be on; set model.fp16=false",
        )
    return None


@rule("torch_compile",
      rejects='an unknown `torch_compile` mode',
      fix='none, default or reduce-overhead')
def torch_compile(cfg, target):
    if cfg.torch_compile not in ("none", "default", "reduce-overhead"):
        return violation(
            "torch_compile", ["torch_compile"],
            f"torch_compile={cfg.torch_compile!r} is none of none, default or reduce-overhead; set torch_compile=none",
        )
    return None


@rule("overlap_param_gather", megatron_core=">=0.19",
      rejects="`ddp.overlap_param_gather=true` without the distributed optimizer (`ddp.use_distributed_optimizer`) on "
              "megatron-core 0.19",
      fix="`ddp.use_distributed_optimizer=true`, or `ddp.overlap_param_gather=false`")
def overlap_param_gather(cfg, target):
    # Only the distributed optimizer gathers parameters. llama/tiny at DP2 on two H200s with the overlap and without
    # it: 0.19.2's DDP died in the first step with "TypeError: 'NoneType' object is not iterable", while 0.16.1
    # ignored the flag and trained. (Megatron-LM's argument checks refuse it on every release.)
    ddp = cfg.ddp
    if not ddp.overlap_param_gather or ddp.use_distributed_optimizer:
        return None
    return violation(
        "overlap_param_gather", ["ddp.overlap_param_gather", "ddp.use_distributed_optimizer"],
        f"overlapping the parameter all-gather needs the distributed optimizer, which alone gathers parameters "
        f"(megatron-core {target.megatron_core}'s DDP fails the first step without it); set "
        "ddp.use_distributed_optimizer=true, or ddp.overlap_param_gather=false",
    )


@rule("context_parallel_attention_variants", engine="megatron",
      rejects="context parallelism with attention sinks (`model.softmax_type` other than vanilla) or sliding-window "
              "attention (`model.window_size`)",
      fix="`model.context_parallel_size=1`")
def context_parallel_attention_variants(cfg, target):
    # Transformer Engine 2.10's attention has no context-parallel backend for either: GPT-OSS at CP2 on two H200s
    # (0.16.1 and 0.19.2) failed its first step with "Context parallelism does not support sliding window attention"
    # with the window alone, and "No dot product attention backend is available" with the sinks.
    model = cfg.model
    variants = [key for key, used in (("model.softmax_type", model.softmax_type != "vanilla"),
                                      ("model.window_size", model.window_size is not None)) if used]
    if model.context_parallel_size == 1 or not variants:
        return None
    return violation(
        "context_parallel_attention_variants", ["model.context_parallel_size", *variants],
        "Transformer Engine's attention splits neither attention sinks nor a sliding window over context-parallel "
        f"ranks ({', '.join(variants)} set here); set model.context_parallel_size=1",
    )


@rule("rotary_dim_even",
      rejects="rotary position embeddings over an odd number of channels that fill the head: `model.kv_channels` (hidden "
              "size over heads when unset) at `model.rotary_percent=1`, or multi-latent attention's `model.qk_pos_emb_head_dim`",
      fix="an even rotary width (the message names the key), or `model.position_embedding_type=learned_absolute`")
def rotary_dim_even(cfg, target):
    # RoPE rotates channel pairs: its table has ceil(dim / 2) frequencies twice over, one more than an odd dim holds,
    # and the first forward fails ("The size of tensor a (9) must match the size of tensor b (10)": llama/tiny with
    # model.kv_channels=9 built on the CPU, both releases; deepseek/tiny's qk_pos_emb_head_dim=15 likewise). A part of
    # the head (rotary_percent below 1) rotates with one channel more, which the head holds.
    model = cfg.model
    if model.multi_latent_attention:  # MLA rotates its own positional channels whatever the embedding type
        key, width, other = "model.qk_pos_emb_head_dim", model.qk_pos_emb_head_dim, ""
    elif model.position_embedding_type in ("rope", "yarn") and model.num_attention_heads > 0:
        key, other = "model.kv_channels", ", or model.position_embedding_type=learned_absolute"
        head = model.kv_channels or model.hidden_size // model.num_attention_heads
        width = int(head * model.rotary_percent)
        if width < head:  # the table's extra channel still fits the head: qwen/tiny at rotary_percent=0.1 trained
            return None
    else:
        return None
    if width % 2 == 0:
        return None
    example = f" (e.g. {key}={width + 1})"
    return violation(
        "rotary_dim_even", [key, "model.position_embedding_type"],
        f"rotary embeddings rotate channel pairs, and {key} gives them {width} channels; set {key} to an even "
        f"width{example}{other}",
    )


@rule("single_token_attention", engine="megatron", environment=True,
      rejects="a sequence of one token through Transformer Engine's attention (`dataset.seq_length=1`)",
      fix="`dataset.seq_length=2` or longer")
def single_token_attention(cfg, target):
    # TE picks cuDNN's fused attention for a bf16 sequence of one token, and cuDNN refuses it in the first forward
    # ("s_q = s_kv = 1 is not supported"): qwen/tiny with dataset.seq_length=1 on an H200, both releases, eager
    # (run 555 of gpu_differential_schema_9901178.json).
    if cfg.dataset.seq_length != 1 or builds_local_spec(cfg, target):  # the data's length is the attention's
        return None
    return violation(
        "single_token_attention", ["dataset.seq_length"],
        "Transformer Engine's fused attention refuses a sequence of one token (cuDNN: s_q = s_kv = 1 is not "
        "supported); set dataset.seq_length=2 or longer",
    )
