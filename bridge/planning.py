"""The plan: what would run, decided without touching CUDA.

It holds the verdict (violations), the migration notes, what is graphed and when, the
arguments megatron-core would be given, and the environment of the job.
"""

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Dict, List


from bridge.config.load import Prepared
from bridge.config.migration import scope_names
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.translate import megatron_arguments
from bridge.validation import validate
from bridge.validation.violation import Violation


@dataclass
class Plan:
    config: GraphBridgeConfig
    violations: List[Violation]
    notes: List[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.violations

    def graphs(self) -> Dict[str, Any]:
        return describe_graphs(self.config)

    def megatron(self) -> Dict[str, Any]:
        return megatron_arguments(self.config)

    def as_dict(self) -> Dict[str, Any]:
        return {
            "valid": self.valid,
            "violations": [v.as_dict() for v in self.violations],
            "notes": self.notes,
            "graphs": self.graphs(),
            # asdict, not OmegaConf: an invalid config may hold values its schema would refuse.
            "config": _jsonable(dataclasses.asdict(self.config)),
            # An invalid config is never handed to megatron-core, so there is nothing to show.
            "megatron": _jsonable(self.megatron()) if self.valid else None,
            "env": dict(self.config.env_vars),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)

    def to_text(self) -> str:
        graphs = self.graphs()
        cfg = self.config
        lines = [
            "graphbridge plan: " + ("VALID" if self.valid else f"INVALID ({len(self.violations)} violations, on stderr)"),
            f"  graphed:   {graphs['summary']}",
        ]
        if graphs["parked"]:
            lines.append(f"  parked:    {graphs['parked']} (inert while cuda_graph_impl=none)")
        lines += [
            f"  workload:  task={cfg.workload.task} gpu={cfg.workload.gpu} precision={cfg.workload.precision} "
            f"num_gpus={cfg.train.num_gpus}",
            f"  model:     layers={cfg.model.num_layers} hidden={cfg.model.hidden_size} "
            f"heads={cfg.model.num_attention_heads} experts={cfg.model.num_moe_experts} "
            f"seq={cfg.dataset.seq_length}",
            f"  parallel:  TP={cfg.model.tensor_model_parallel_size} PP={cfg.model.pipeline_model_parallel_size} "
            f"CP={cfg.model.context_parallel_size} VP={cfg.model.virtual_pipeline_model_parallel_size} "
            f"EP={cfg.model.expert_model_parallel_size}",
            f"  batches:   micro={cfg.train.micro_batch_size} global={cfg.train.global_batch_size} "
            f"iters={cfg.train.train_iters}",
        ]
        if self.valid:
            tc = self.megatron()["transformer_config"]
            lines.append("  megatron-core TransformerConfig (CUDA-graph fields):")
            lines += [f"    {key} = {tc[key]!r}" for key in
                      ("cuda_graph_impl", "cuda_graph_scope", "cuda_graph_warmup_steps", "use_te_rng_tracker")]
        lines.append(f"  env:       {dict(cfg.env_vars) or '{}'}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def build_plan(prepared: Prepared) -> Plan:
    return Plan(prepared.config, prepared.violations + validate(prepared.config), prepared.notes)


def describe_graphs(cfg: GraphBridgeConfig) -> Dict[str, Any]:
    model = cfg.model
    impl = CudaGraphImpl(model.cuda_graph_impl)
    modules = list(model.cuda_graph_modules) if isinstance(model.cuda_graph_modules, (list, tuple)) else []
    warmup = model.cuda_graph_warmup_steps
    parked = None
    if impl == CudaGraphImpl.none:
        legacy = scope_names(model.cuda_graph_scope) if isinstance(model.cuda_graph_scope, (str, list, tuple)) else []
        parked = modules or legacy or None
        summary = "nothing (eager)"
    elif impl == CudaGraphImpl.full_iteration:
        where = "inside" if cfg.optimizer.optimizer_in_graph else "outside"
        summary = (f"the whole forward+backward iteration, one graph captured at step {warmup} "
                   f"(optimizer step {where} the graph)")
    elif impl == CudaGraphImpl.local:
        what = "MoE router/preprocess parts" if modules else "every whole layer"
        summary = f"{what}, megatron-core CudaGraphManager graphs built after the first step"
    else:
        what = ", ".join(modules) if modules else "whole layers"
        summary = f"{what} per layer, Transformer Engine graphs captured before step {warmup}"
    return {"impl": impl.value, "modules": modules, "warmup_steps": warmup,
            "summary": summary, "parked": parked}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value"):  # Enums
        return value.value
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
