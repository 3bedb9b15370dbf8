"""What the megatron engine asks of a CUDA-graph lifecycle.

megatron-core 0.16.1 has three graph mechanisms, each with its own moment of capture and its
own process-global state; one small module drives each of them (full_iteration, local,
transformer_engine) behind this protocol, so the engine's step is the same for all impls.

A "graph" in ``graph_count`` is one captured unit: the whole iteration for full_iteration, a
layer's forward+backward pair (per microbatch) for the per-layer mechanisms.
"""

from typing import Callable, Optional, Protocol, Set


class GraphLifecycle(Protocol):
    region: str
    """The graphs, as a capture or replay failure names them (bridge.diagnosis.graph_region)."""

    def wrap(self, forward_backward_func: Callable) -> Callable:
        """The forward-backward function the engine calls each step (kwargs only)."""

    def before_step(self, step: int) -> None:
        """Runs before the step's gradients are zeroed; may capture."""

    def phase(self, step: int) -> Optional[str]:
        """"capture" or "replay" when the step's forward-backward captures or replays, else None."""

    def capture_steps(self) -> Set[int]:
        """Steps whose wall time includes capture (known once the first step began)."""

    def graph_count(self) -> int:
        """Graphs currently captured."""

    def delete(self) -> None:
        """Delete every graph and reset megatron-core's class-level graph state; idempotent."""


class NoGraphs:
    """cuda_graph_impl=none: eager steps."""

    region = "no graphs"

    def wrap(self, forward_backward_func: Callable) -> Callable:
        return forward_backward_func

    def before_step(self, step: int) -> None:
        pass

    def phase(self, step: int) -> Optional[str]:
        return None

    def capture_steps(self) -> Set[int]:
        return set()

    def graph_count(self) -> int:
        return 0

    def delete(self) -> None:
        pass


class FirstStep:
    """Remembers the first step index, from which every capture step is counted."""

    def __init__(self):
        self.index: Optional[int] = None

    def see(self, step: int) -> None:
        if self.index is None:
            self.index = step

    def offset(self, steps: int) -> Set[int]:
        return set() if self.index is None else {self.index + steps}

    def phase(self, step: int, capture_offset: int) -> Optional[str]:
        """Eager before the capture step, "capture" on it, "replay" after it."""
        offset = step - self.index
        return None if offset < capture_offset else "capture" if offset == capture_offset else "replay"
