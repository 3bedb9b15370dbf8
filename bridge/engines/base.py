"""What the shared trainer needs from an engine (megatron or torch)."""

from typing import Protocol, Set

import torch


class Engine(Protocol):
    name: str
    """"megatron" or "torch"."""
    device: torch.device
    effective_impl: str
    """The graph impl that actually runs (e.g. "none" when CUDA is absent)."""

    def train_step(self, step: int) -> torch.Tensor:
        """One optimizer step over the global batch; returns the loss as a device scalar."""

    def capture_steps(self) -> Set[int]:
        """Steps whose wall time includes graph capture (excluded from step-time stats)."""

    def graph_count(self) -> int:
        """Graphs currently captured."""

    def close(self) -> None:
        """Delete every graph and release engine state; idempotent, safe on every exit path."""
