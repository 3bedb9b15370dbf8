"""The plan: what would run, decided without touching CUDA.

It holds the catalogue's verdict in two parts: violations in the configuration (it can run
nowhere) and violations on this machine (it can run elsewhere: planning for a cluster from a
laptop still says VALID). When ``gpu=`` names a preset GPU this machine does not have, the
configuration is judged for one node of that GPU's cluster (bridge.machine.preset_machine: its
GPUs, megatron-core and Transformer Engine): the verdict is that node's, and what this machine
lacks is kept apart (one line; the JSON adds the rules a run here would refuse it by). Then the
migration notes, the derived values, what is graphed and when, the
engine and device it would train on here, and the arguments megatron-core would be given. A run
refuses exactly what the plan reports. The arguments are those of the target megatron-core release
(plan.megatron_core, else the installed one), in that release's spelling (bridge.config.releases).
A run also has megatron-core's own config classes judge them before its launch (bridge.translate.gate); a plan
asks them with plan.check_megatron=true.
"""

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from bridge.allocator import graph_allocator_settings
from bridge.config.graphs import graph_impl
from bridge.config.migration import scope_names
from bridge.config.peft import lora_targets
from bridge.config.releases import default_release, release
from bridge.config.schema import Device, GraphBridgeConfig
from bridge.machine import PRESET_GPUS, Machine, installed_version, preset_machine, probe
from bridge.memory import MemoryEstimate, estimate_memory
from bridge.prepare import Prepared
from bridge.translate import cuda_graph_arguments, megatron_arguments
from bridge.translate.gate import check_megatron_core
from bridge.validation import Target, resolve_target, validate
from bridge.validation.violation import CONFIG, Violation


@dataclass
class Plan:
    config: GraphBridgeConfig
    target: Target
    violations: List[Violation]
    notes: List[str] = field(default_factory=list)
    """What migration and derivation did to the config."""
    derived: Dict[str, Any] = field(default_factory=dict)
    machine_notes: List[str] = field(default_factory=list)
    """How this machine changes the way the job runs, short of refusing it."""
    here: Optional[str] = None
    """When the target is a preset GPU's machine: whether this one can run the job too, in one line."""
    auto: Optional[Any] = None
    """cuda_graph=auto's section (bridge.auto.candidates.AutoPlan): its candidates, probe and cache."""
    here_violations: List[Violation] = field(default_factory=list)
    """When the target is a preset GPU's machine: what a run on this machine would refuse on top of the
    target's verdict. Facts about here, never part of it."""
    megatron_check: Optional[str] = None
    """megatron-core's own config classes' verdict, or why they were not asked (bridge.translate.gate), in
    one line; None when the check was not wanted."""

    @property
    def config_violations(self) -> List[Violation]:
        return [v for v in self.violations if v.in_config]

    @property
    def machine_violations(self) -> List[Violation]:
        """Why the target machine cannot run it: this one, unless the plan judges a preset GPU's node."""
        return [v for v in self.violations if not v.in_config]

    @property
    def refused_here(self) -> List[Violation]:
        """Everything a run on this machine refuses."""
        return self.violations + self.here_violations

    @property
    def valid(self) -> bool:
        """The configuration can run somewhere."""
        return not self.config_violations

    @property
    def runnable_here(self) -> bool:
        return not self.refused_here

    def graphs(self) -> Dict[str, Any]:
        return describe_graphs(self.config, "megatron" if self.target.written_for_megatron else "torch")

    def megatron(self) -> Dict[str, Any]:
        return megatron_arguments(self.config, self.target.megatron_core)

    def memory(self) -> Optional[MemoryEstimate]:
        """Peak memory per GPU (bridge.memory), on workload.gpu or else this machine's GPU; none for an
        invalid config."""
        if not self.valid:
            return None
        gpus = self.target.machine.gpus
        here = gpus[0] if gpus and gpus[0].memory_bytes else None
        return estimate_memory(self.config, here.memory_bytes / 2**30 if here else None, here.name if here else None)

    def verdict_with_memory(self) -> str:
        """VALID, and loudly so when the memory estimate leaves the GPU no headroom or is likely beyond it
        (certainly beyond it: the memory_capacity rules refuse it)."""
        warning = self.memory().warning()
        return f"VALID, BUT {warning}" if warning else "VALID"

    def environment(self) -> Dict[str, str]:
        """The job's environment variables: its env_vars, with the allocator options a graphed job gets where the
        user set none (bridge.allocator; for the PyTorch of the target machine, else of this one)."""
        torch_version = self.target.machine.version("torch")
        if torch_version in (None, "unknown"):
            torch_version = installed_version("torch") or "unknown"
        settings = {key: str(value) for key, value in self.config.env_vars.items()}
        if torch_version != "unknown":
            settings.update(graph_allocator_settings(self.config, os.environ, torch_version))
        return settings

    def megatron_core_source(self) -> str:
        """Where the target release comes from, in words."""
        installed = self.target.machine.version("megatron-core")
        if self.config.plan.megatron_core is not None:
            return f"plan.megatron_core; installed here: {installed or 'none'}"
        if installed == self.target.megatron_core:
            return "installed here"
        if installed in (None, "unknown"):
            return "not installed here: the newest release this Python installs"
        return f"megatron-core {installed} is installed here, which graphbridge does not support"

    def as_dict(self) -> Dict[str, Any]:
        return {
            "valid": self.valid,
            "violations": [v.as_dict() for v in self.config_violations],
            "runnable_here": self.runnable_here,
            "machine_violations": [v.as_dict() for v in self.machine_violations],
            "here": self.here,
            "here_refused_by": sorted({v.rule for v in self.here_violations}),
            "target": {"engine": self.target.engine, "device": self.target.device,
                       "megatron_core": self.target.megatron_core, "megatron_core_source": self.megatron_core_source(),
                       "machine": self.target.machine.describe()},
            "notes": self.notes,
            "machine_notes": self.machine_notes,
            "derived": _jsonable(self.derived),
            "graphs": self.graphs(),
            "memory": self.memory().as_dict() if self.valid else None,
            # asdict, not OmegaConf: an invalid config may hold values its schema would refuse.
            "config": _jsonable(dataclasses.asdict(self.config)),
            # An invalid config is never handed to megatron-core, so there is nothing to show.
            "megatron": _jsonable(self.megatron()) if self.valid else None,
            "env": self.environment(),
            "auto": self.auto.as_dict() if self.auto is not None else None,
            "megatron_core_check": self.megatron_check,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)

    def to_text(self) -> str:
        graphs, cfg, model = self.graphs(), self.config, self.config.model
        count = len(self.config_violations)
        verdict = self.verdict_with_memory() if self.valid else (
            f"INVALID ({count} violation{'' if count == 1 else 's'}, on stderr)")
        graphed = self.auto.graphed_summary() if self.auto is not None else graphs["summary"]
        lines = [f"graphbridge plan: {verdict}", f"  graphed:   {graphed}"]
        if graphs["parked"]:
            lines.append(f"  parked:    {graphs['parked']} (inert while cuda_graph_impl=none)")
        lines += [
            f"  workload:  task={cfg.workload.task} gpu={cfg.workload.gpu} precision={cfg.workload.precision} "
            f"num_gpus={cfg.train.num_gpus} num_nodes={cfg.train.num_nodes}",
            *([f"  peft:      lora rank {cfg.peft.dim} (alpha {cfg.peft.alpha}) on "
               f"{', '.join(lora_targets(cfg.peft))}; every other weight frozen"] if lora_targets(cfg.peft) else []),
            f"  model:     layers={model.num_layers} hidden={model.hidden_size} heads={model.num_attention_heads} "
            f"experts={model.num_moe_experts} seq={cfg.dataset.seq_length}",
            f"  parallel:  TP={model.tensor_model_parallel_size} PP={model.pipeline_model_parallel_size} "
            f"CP={model.context_parallel_size} VP={model.virtual_pipeline_model_parallel_size} "
            f"EP={model.expert_model_parallel_size}",
            f"  batches:   micro={cfg.train.micro_batch_size} global={cfg.train.global_batch_size} "
            f"iters={cfg.train.train_iters}",
        ]
        if self.derived:
            lines += wrapped("  derived:   ", [f"{key}={value}" for key, value in self.derived.items()])
        if self.valid:
            lines.append(f"  memory:    {self.memory().to_text()}")
        lines.append(f"  target:    megatron-core {self.target.megatron_core} ({self.megatron_core_source()})")
        if self.megatron_check is not None:
            lines.append(f"  checked:   {self.megatron_check}")
        if self.valid:
            graph_fields = cuda_graph_arguments(cfg, self.target.megatron_core)
            lines.append(f"  megatron-core {self.target.megatron_core} TransformerConfig (CUDA-graph fields):")
            lines += [f"    {key} = {value!r}" for key, value in graph_fields.items()]
        lines.append(f"  env:       {self.environment() or '{}'}")
        if self.here is not None:
            lines.append(f"  judged:    for the {self.target.engine} engine on a gpu={cfg.workload.gpu} node "
                         f"({self.target.machine.describe()})")
            lines.append(f"  here:      {self.here}")
        else:
            lines.append(f"  here:      {self.target.engine} engine on {self.target.device} "
                         f"({self.target.machine.describe()})")
        if self.machine_violations:
            lines.append("  cannot run on this machine (it can elsewhere):")
            lines += [f"    {v}" for v in self.machine_violations]
        if self.auto is not None:
            lines += self.auto.lines()
        lines += [f"  note: {note}" for note in self.notes + self.machine_notes]
        return "\n".join(lines)


def wrapped(head: str, items: List[str], width: int = 100) -> List[str]:
    """``items`` joined by ", " after ``head``, continued on indented lines at ``width`` columns."""
    lines, line = [], head
    for item in items:
        if line.strip() and len(line) + len(item) + 2 > width:
            lines.append(line.rstrip(", ") + ",")
            line = " " * len(head)
        line += item + ", "
    return lines + [line.rstrip(", ")]


def build_plan(prepared: Prepared, machine: Optional[Machine] = None, graphs_measured: bool = False,
               check_megatron: bool = False) -> Plan:
    """The plan of ``prepared`` on ``machine`` (default: this one); ``graphs_measured``: the job composed
    cuda_graph=auto, whose rules (bridge/validation/auto_rules.py) judge it too; ``check_megatron``: megatron-core's
    own config classes judge it as well (seconds: bridge.translate.gate), their refusal one more violation."""
    plan = judged_plan(prepared, machine, graphs_measured)
    if check_megatron:
        check = check_megatron_core(plan.config, plan.target, plan.refused_here)
        plan.megatron_check = check.summary
        plan.violations += check.violations
    return plan


def judged_plan(prepared: Prepared, machine: Optional[Machine], graphs_measured: bool) -> Plan:
    """The plan with the catalogue's verdict."""
    cfg = prepared.config
    here = machine or probe()
    cluster = cluster_machine(cfg, here)
    if cluster is None:
        target = resolve_target(cfg, here, graphs_measured=graphs_measured)
        violations = validate(cfg, target)
        notes = [] if violations else machine_notes(cfg, target)  # how it would run here, when it can
        return Plan(cfg, target, violations, prepared.notes, prepared.derived, notes)
    target = resolve_target(cfg, cluster, graphs_measured=graphs_measured)
    # On the GPU the config names, what its node lacks is the config's fault, not this machine's.
    violations = [dataclasses.replace(v, where=CONFIG) for v in validate(cfg, target)]
    # What a run here refuses on top: facts about this machine, kept apart from the node's verdict.
    here_target = resolve_target(cfg, here)
    here_violations = [v for v in validate(cfg, here_target) if not v.in_config]
    return Plan(cfg, target, violations, prepared.notes, prepared.derived, [],
                here_line(cfg, here_target, here_violations), here_violations=here_violations)


def cluster_machine(cfg: GraphBridgeConfig, here: Machine) -> Optional[Machine]:
    """One node of the preset GPU's cluster when ``gpu=`` names a GPU this machine does not have."""
    gpu = cfg.workload.gpu
    if gpu not in PRESET_GPUS or here.has_gpu_kind(gpu):
        return None
    return preset_machine(gpu, cfg.plan.megatron_core or default_release(here).version)


def here_line(cfg: GraphBridgeConfig, here: Target, violations: List[Violation]) -> str:
    """This machine, for a plan judged on a preset GPU's node: one line, not its rules."""
    gpu = cfg.workload.gpu
    if not violations:
        return f"this machine can run it too: {here.engine} engine on {here.device} ({here.machine.describe()})"
    return (f"this machine cannot run it: no {PRESET_GPUS[gpu].name.split()[-1]} here ({here.machine.describe()}); "
            f"run it on {gpu} nodes (mode=train here lists what it lacks)")


def machine_notes(cfg: GraphBridgeConfig, target: Target) -> List[str]:
    """What this machine changes about how the job runs, short of refusing it."""
    notes = []
    if target.device == "cpu":
        notes += eager_on_cpu(cfg)
    if target.device == "cpu" and cfg.model.bf16:
        notes.append("no CUDA device here: model.bf16 trains in fp32 on the CPU")
    installed = target.machine.version("megatron-core")
    if installed not in (None, "unknown") and release(installed) is None:
        notes.append(f"megatron-core {installed} is installed here, which graphbridge does not support: the plan "
                     f"speaks megatron-core {target.megatron_core}")
    if (target.engine == "megatron" and cfg.model.transformer_impl == "transformer_engine"
            and not target.machine.has("transformer-engine")):
        notes.append("Transformer Engine is not installed here: the megatron engine builds megatron-core's local "
                     "layer spec (model.transformer_impl=local)")
    return notes


def eager_on_cpu(cfg: GraphBridgeConfig) -> List[str]:
    """What a CPU run drops, in one note: the torch engine trains eagerly there and says nothing itself."""
    impl = cfg.model.cuda_graph_impl
    dropped = [f"cuda_graph_impl={impl.value}"] if graph_impl(impl).graphed else []
    if cfg.torch_compile != "none":
        dropped.append(f"torch_compile={cfg.torch_compile}")
    if not dropped:
        return []
    why = "device=cpu" if cfg.device == Device.cpu else "no CUDA device here"
    return [f"{why}: {' and '.join(dropped)} not applied, the job trains eagerly (result.json records "
            "effective_impl: none)"]


def describe_graphs(cfg: GraphBridgeConfig, engine: str = "megatron") -> Dict[str, Any]:
    """What ``engine`` would graph for ``cfg``, and when (the megatron engine's view by default)."""
    model = cfg.model
    graph = graph_impl(model.cuda_graph_impl)
    # str(): an invalid config (config_types) may hold other values; its plan still prints.
    modules = [str(name) for name in model.cuda_graph_modules] if isinstance(model.cuda_graph_modules, (list, tuple)) else []
    warmup = model.cuda_graph_warmup_steps
    parked = None
    if not graph.graphed:
        legacy = scope_names(model.cuda_graph_scope) if isinstance(model.cuda_graph_scope, (str, list, tuple)) else []
        parked = modules or legacy or None
    summary = graph.describe(modules, warmup, engine)
    if graph.unit == "iteration":
        # The torch engine's full-iteration graph always holds its optimizer step; megatron-core's distributed
        # optimizer steps in megatron-core's own optimizer graph (0.19), captured beside it.
        if cfg.optimizer.optimizer_in_graph and cfg.ddp.use_distributed_optimizer and engine != "torch":
            summary += " (optimizer step in megatron-core's optimizer graph, captured beside it)"
        else:
            where = "inside" if cfg.optimizer.optimizer_in_graph or engine == "torch" else "outside"
            summary += f" (optimizer step {where} the graph)"
    return {"impl": graph.impl.value, "modules": modules, "warmup_steps": warmup,
            "capture_step": graph.capture_step(warmup), "summary": summary, "parked": parked}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "value"):  # Enums
        return value.value
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)
