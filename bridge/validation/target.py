"""What a configuration is judged for: the engine and device it would run on, this machine's
facts, and the megatron-core version the translation speaks.

``engine=auto`` trains on megatron-core where a CUDA device and megatron-core are present, else on
the torch engine. A configuration is valid when the engine it is written for can run it (the
megatron engine for auto and megatron); it can run on this machine when, in addition, the engine
and device picked here can.
"""

from dataclasses import dataclass
from typing import Optional

from bridge.config.releases import default_release
from bridge.config.schema import Device, EngineChoice
from bridge.machine import Machine, probe


@dataclass(frozen=True)
class Target:
    engine: str
    """"megatron" or "torch": the engine that would train here."""
    device: str
    """"cuda" or "cpu"."""
    machine: Machine
    megatron_core: str
    """The megatron-core release the arguments are translated for and the rules judged by:
    plan.megatron_core, else bridge.config.releases.default_release (the installed one when
    supported)."""
    engine_is_auto: bool
    """engine=auto: the config is written for megatron-core; this machine may pick torch."""
    processes: Optional[int] = None
    """In a training process, how many were started for the job (torchrun's WORLD_SIZE); None
    while planning, where graphbridge itself starts the right number."""
    graphs_measured: bool = False
    """cuda_graph=auto: the graph choice is measured before training, the configuration is eager until then
    (bridge.validation.auto_rules judge what auto cannot decide for)."""

    @property
    def written_for_megatron(self) -> bool:
        """The engine whose capabilities make the config valid: megatron unless engine=torch."""
        return self.engine_is_auto or self.engine == "megatron"


def resolve_target(cfg, machine: Optional[Machine] = None, processes: Optional[int] = None,
                   graphs_measured: bool = False) -> Target:
    machine = machine or probe()
    device = Device(cfg.device)
    on_cuda = device == Device.cuda or (device == Device.auto and machine.gpu_count > 0)
    choice = EngineChoice(cfg.engine)
    if choice == EngineChoice.auto:
        engine = "megatron" if on_cuda and machine.has("megatron-core") else "torch"
    else:
        engine = choice.value
    version = cfg.plan.megatron_core or default_release(machine).version
    return Target(engine=engine, device="cuda" if on_cuda else "cpu", machine=machine, megatron_core=version,
                  engine_is_auto=choice == EngineChoice.auto, processes=processes,
                  graphs_measured=graphs_measured)
