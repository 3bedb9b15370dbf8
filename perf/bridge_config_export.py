"""A finished graphbridge config as a Megatron-Bridge 0.3.1 ConfigContainer YAML, to replay the run in
Bridge: ``graphbridge <overrides> mode=plan plan.format=bridge > run_config.yaml``, then in Bridge
``pretrain(ConfigContainer.from_yaml("run_config.yaml"), forward_step)``.

Every key perf.bridge_config_import reads is written where Bridge reads it, so importing the export
gives the same config. The container says what graphbridge runs: the CUDA graphs in megatron-core
0.16.1's spelling (a full-iteration graph is ``local`` with scope ``[full_iteration]``), the
precision as a MixedPrecisionConfig (Bridge lays it over the model at setup), no ``comm_overlap``
(the overlap switches sit in the model, DDP and optimizer), mock data (no blend) with a
NullTokenizer of the model's vocabulary and ``model.vocab_size`` left null so that Bridge pads it as
graphbridge does (to make_vocab_size_divisible_by x TP), no evaluation, no checkpoint saving, and a
scheduler that warms up from zero, decays to min_lr at train_iters and keeps the weight decay
constant. Bridge 0.3.1 has no optimizer inside the full-iteration graph (optimizer.optimizer_in_graph):
the export cannot carry it.
"""

import dataclasses
from enum import Enum
from typing import Any, Dict, List, Optional

import yaml

from bridge.config.peft import lora_targets
from bridge.config.releases import RELEASES
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.translate.arguments import MLA_FIELDS
from perf.bridge_config_fields import (ACTIVATION_TARGETS, CONTAINER, LORA, LORA_FIELDS, PLANNED_FOR, PROVIDERS,
                                       SAME_NAME, YARN)

BRIDGE_MEGATRON_CORE = "0.16.1"
"""The megatron-core release Bridge 0.3.1 runs on: its CUDA-graph spelling is the export's."""
TARGETS = {
    "rng": "megatron.bridge.training.config.RNGConfig",
    "rerun_state_machine": "megatron.bridge.training.config.RerunStateMachineConfig",
    "ddp": "megatron.core.distributed.distributed_data_parallel_config.DistributedDataParallelConfig",
    "train": "megatron.bridge.training.config.TrainingConfig",
    "optimizer": "megatron.bridge.training.config.OptimizerConfig",
    "scheduler": "megatron.bridge.training.config.SchedulerConfig",
    "dataset": "megatron.bridge.training.config.GPTDatasetConfig",
    "mixed_precision": "megatron.bridge.training.mixed_precision.MixedPrecisionConfig",
    "tokenizer": "megatron.bridge.training.tokenizers.config.TokenizerConfig",
    "logger": "megatron.bridge.training.config.LoggerConfig",
    "checkpoint": "megatron.bridge.training.config.CheckpointConfig",
}
MLA_ONLY = tuple(name for name in MLA_FIELDS if name not in ("rotary_base", "rotary_percent", "rotary_scaling_factor"))
"""MLATransformerConfig's own fields; a GPT provider has the rotary ones too."""
DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}
HEADER = ("# Megatron-Bridge 0.3.1 ConfigContainer, written by graphbridge (mode=plan plan.format=bridge).\n"
          "# Replay in Bridge: pretrain(ConfigContainer.from_yaml(<this file>), forward_step).\n"
          "# A '# graphbridge:' line says what graphbridge planned it for; graphbridge bridge_config= reads it.\n")


def to_yaml(cfg: GraphBridgeConfig) -> str:
    notes = "".join(f"# {note}\n" for note in not_carried(cfg))
    return HEADER + planned_for(cfg) + notes + yaml.safe_dump(container(cfg), default_flow_style=False,
                                                              sort_keys=False)


def planned_for(cfg: GraphBridgeConfig) -> str:
    """The GPU preset and count the plan was for, which bridge_config= reads back (PLANNED_FOR)."""
    overrides = [f"gpu={cfg.workload.gpu}"] if cfg.workload.gpu else []
    if cfg.train.num_gpus > 1:
        overrides.append(f"train.num_gpus={cfg.train.num_gpus}")
    return f"{PLANNED_FOR}{' '.join(overrides)}\n" if overrides else ""


def not_carried(cfg: GraphBridgeConfig) -> List[str]:
    """What the run has that a ConfigContainer cannot say, as comment lines for the file's reader."""
    notes = []
    if cfg.train.num_gpus > 1:
        notes.append(f"Launch it on {cfg.train.num_gpus} GPUs over {cfg.train.num_nodes} node(s): Bridge takes the "
                     "GPU count from torchrun or Slurm, not from this file.")
    if cfg.env_vars:
        settings = " ".join(f"{key}={value}" for key, value in cfg.env_vars.items())
        notes.append(f"Set in Bridge's environment: {settings}")
    if cfg.optimizer.optimizer_in_graph and CudaGraphImpl(cfg.model.cuda_graph_impl) == CudaGraphImpl.full_iteration:
        notes.append("Not carried: optimizer.optimizer_in_graph=true (Bridge 0.3.1 steps the optimizer outside "
                     "the full-iteration graph).")
    if lora_targets(cfg.peft):
        notes.append("Set checkpoint.pretrained_checkpoint: Bridge's LoRA loads its frozen base weights from a "
                     "checkpoint, where graphbridge draws them from the seed.")
    if cfg.dataset.packed_sequence:
        notes.append("Not carried: dataset.packed_sequence=true (Bridge packs only its fine-tuning datasets; this "
                     "container trains on unpacked mock data, as graphbridge does).")
    return notes


def container(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    model, optimizer, train = cfg.model, cfg.optimizer, cfg.train
    dtype = "bf16" if model.bf16 else "fp16" if model.fp16 else "fp32"
    precision = {"bf16": model.bf16, "fp16": model.fp16, "fp8": model.fp8, "fp8_recipe": model.fp8_recipe,
                 "fp4": model.fp4, "params_dtype": _dtype(dtype), "pipeline_dtype": _dtype(dtype),
                 "grad_reduce_in_fp32": cfg.ddp.grad_reduce_in_fp32}
    return {
        "_target_": CONTAINER,
        "model": _model(cfg, precision),
        "rng": _section("rng", seed=cfg.rng.seed, te_rng_tracker=cfg.rng.te_rng_tracker,
                        inference_rng_tracker=cfg.rng.inference_rng_tracker),
        "rerun_state_machine": _section("rerun_state_machine",
                                        check_for_nan_in_loss=cfg.rerun_state_machine.check_for_nan_in_loss),
        "ddp": _section("ddp", **_plain(dataclasses.asdict(cfg.ddp))),
        "train": _section("train", micro_batch_size=train.micro_batch_size, global_batch_size=train.global_batch_size,
                          train_iters=train.train_iters, exit_signal_handler=train.exit_signal_handler, eval_iters=0),
        "optimizer": _section("optimizer", **{name: getattr(optimizer, name) for name in SAME_NAME["optimizer"]},
                              weight_decay=optimizer.weight_decay,
                              overlap_param_gather_with_optimizer_step=(
                                  optimizer.overlap_param_gather_with_optimizer_step),
                              use_distributed_optimizer=cfg.ddp.use_distributed_optimizer, bf16=model.bf16,
                              fp16=model.fp16),
        "scheduler": _section("scheduler", lr_warmup_iters=optimizer.lr_warmup_iters, lr_warmup_init=0.0,
                              lr_decay_iters=train.train_iters, lr_decay_style=optimizer.lr_decay_style,
                              start_weight_decay=optimizer.weight_decay, end_weight_decay=optimizer.weight_decay,
                              weight_decay_incr_style="constant"),
        "dataset": _section("dataset", sequence_length=cfg.dataset.seq_length, random_seed=cfg.rng.seed,
                            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False),
        "mixed_precision": _section("mixed_precision", **precision),
        "tokenizer": _section("tokenizer", tokenizer_type="NullTokenizer", vocab_size=model.vocab_size),
        "logger": _section("logger", log_interval=1),
        "checkpoint": _section("checkpoint"),
        "comm_overlap": None,
        "peft": _peft(cfg),
    }


def _model(cfg: GraphBridgeConfig, precision: Dict[str, Any]) -> Dict[str, Any]:
    model = cfg.model
    mla, yarn = model.multi_latent_attention, model.position_embedding_type == "yarn"
    fields = {name: _plain(getattr(model, name)) for name in SAME_NAME["model"] if mla or name not in MLA_ONLY}
    fields.update(
        activation_func={"_target_": ACTIVATION_TARGETS[model.activation_func], "_call_": False},
        seq_length=model.seq_length, vocab_size=None,  # Bridge takes it from the tokenizer and pads it
        pipeline_model_parallel_layout=model.pipeline_model_parallel_layout,
        moe_layer_freq=_plain(model.moe_layer_freq),
        position_embedding_type="rope" if mla else model.position_embedding_type,
        tp_comm_overlap=model.tp_comm_overlap, overlap_moe_expert_parallel_comm=model.overlap_moe_expert_parallel_comm,
        delay_wgrad_compute=model.delay_wgrad_compute, batch_p2p_sync=model.batch_p2p_sync,
        **{name: precision[name] for name in ("bf16", "fp16", "fp8", "fp8_recipe", "fp4")},
        **_graphs(cfg))
    if mla:
        fields["rope_type"] = "yarn" if yarn else "rope"
    elif yarn:
        fields.update({name: getattr(model, key) for name, key in YARN.items()})
    provider = PROVIDERS["mla" if mla else "yarn" if yarn else "gpt"]
    return {"_target_": provider, **fields}


def _graphs(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    """The impl and its scope as megatron-core 0.16.1 spells them; behind impl none, what is parked."""
    model, row = cfg.model, RELEASES[BRIDGE_MEGATRON_CORE]
    impl = CudaGraphImpl(model.cuda_graph_impl)
    if impl == CudaGraphImpl.full_iteration:
        mcore_impl, scope = row.full_iteration[0], list(row.full_iteration[1])
    elif impl == CudaGraphImpl.none and model.cuda_graph_scope is not None:
        mcore_impl, scope = impl.value, _plain(model.cuda_graph_scope)
    else:
        mcore_impl, scope = impl.value, list(model.cuda_graph_modules)
    return {"cuda_graph_impl": mcore_impl, "cuda_graph_scope": scope or "full",
            "cuda_graph_warmup_steps": model.cuda_graph_warmup_steps,
            "cuda_graph_use_single_mempool": model.cuda_graph_use_single_mempool,
            "cuda_graph_retain_backward_graph": model.cuda_graph_retain_backward_graph,
            "use_te_rng_tracker": bool(cfg.rng.te_rng_tracker or model.use_te_rng_tracker),
            "enable_cuda_graph": False, "external_cuda_graph": False}


def _peft(cfg: GraphBridgeConfig) -> Optional[Dict[str, Any]]:
    if lora_targets(cfg.peft) is None:
        return None
    return {"_target_": LORA, **{name: _plain(getattr(cfg.peft, name)) for name in LORA_FIELDS}}


def _section(name: str, **fields) -> Dict[str, Any]:
    return {"_target_": TARGETS[name], **fields}


def _dtype(name: str) -> Dict[str, Any]:
    """A torch dtype as Bridge's YAML writes it (Bridge's instantiate returns the object itself)."""
    return {"_target_": DTYPES[name], "_call_": False}


def _plain(value: Any) -> Any:
    """Plain YAML data: enums by their value, tuples as lists."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value.value if isinstance(value, Enum) else value
