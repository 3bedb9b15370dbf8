"""What the shared trainer needs from an engine (megatron or torch)."""

from typing import Iterable, Optional, Protocol, Set, Tuple

import torch


class TrainingEngine(Protocol):
    name: str
    """"megatron" or "torch"."""
    device: torch.device
    effective_impl: str
    """The graph impl that actually runs (e.g. "none" when CUDA is absent)."""

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step over the global batch; returns the loss as a device scalar.

        Capture and replay run inside ``bridge.diagnosis.graph_region(region, phase)``, so their
        failures reach the trainer as GraphCaptureError naming the graph region."""

    def capture_steps(self) -> Set[int]:
        """Steps whose wall time includes graph capture (excluded from step-time stats)."""

    def graph_count(self) -> int:
        """Graphs currently captured."""

    def parameter_counts(self) -> Tuple[int, int]:
        """(parameters, trainable parameters) this rank holds (count_parameters)."""

    def close(self) -> None:
        """Delete every graph and release engine state; idempotent, safe on every exit path."""


class ChecksFinite(Protocol):
    """Optional for an engine (the trainer looks it up with getattr): the device-side NaN check
    that also works inside full-iteration graphs."""

    def finite_steps(self) -> Optional[torch.Tensor]:
        """An int64 device scalar that each step updates on the device, inside the graph under
        full-iteration graphs (see bridge.engines.finite_check.FiniteCheck): the number of steps
        before the first one with a non-finite loss or gradient norm, counted from the engine's
        first step. None when perf.nan_check_interval is 0."""


def count_parameters(modules: Iterable[torch.nn.Module]) -> Tuple[int, int]:
    """(every parameter, those that train) of ``modules``, each parameter once: under LoRA the trainable ones are
    the adapters."""
    seen = {id(parameter): parameter for module in modules for parameter in module.parameters()}
    return (sum(rank_numel(parameter) for parameter in seen.values()),
            sum(rank_numel(parameter) for parameter in seen.values() if parameter.requires_grad))


def rank_numel(parameter: torch.Tensor) -> int:
    """Elements of ``parameter`` as this model-parallel rank holds it before any data-parallel sharding: the global
    shape of a Megatron-FSDP DTensor spans the tensor-parallel ranks ("tp" in its device mesh) too, where megatron-core
    DDP's parameters are this rank's tensor-parallel shard."""
    mesh = getattr(parameter, "device_mesh", None)
    if mesh is None:
        return parameter.numel()
    split = 1
    for dim, (name, placement) in enumerate(zip(mesh.mesh_dim_names or (), parameter.placements)):
        if name == "tp" and placement.is_shard():
            split *= mesh.size(dim)
    return parameter.numel() // split
