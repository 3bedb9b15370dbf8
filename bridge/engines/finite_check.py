"""The NaN check that works inside a full-iteration graph, where the host never sees the
loss or the gradient norm of a step; both engines record into it every step."""

from typing import Optional

import torch


class FiniteCheck:
    """Counts, on the device, the steps before the first non-finite loss or gradient norm.

    ``record`` launches only device ops that write in place into two tensors allocated here,
    outside any graph: inside a captured step it becomes part of the graph, and every replay
    updates the same tensors without a host sync. The trainer reads ``finite_steps`` every
    perf.nan_check_interval steps; a count below the steps run names the first bad step.
    """

    def __init__(self, device: torch.device):
        self.all_finite = torch.ones((), dtype=torch.bool, device=device)
        self.finite_steps = torch.zeros((), dtype=torch.int64, device=device)

    def record(self, loss: torch.Tensor, grad_norm: Optional[torch.Tensor]) -> None:
        # .all(): megatron-core 0.19.2 returns the gradient norm as a one-element tensor, not a scalar, when
        # Transformer Engine has multi_tensor_scale_tensor (2.20.2 has it, 2.10 not): the norm is left unsynced.
        finite = torch.isfinite(loss).all()
        if grad_norm is not None:
            finite = finite & torch.isfinite(grad_norm).all()
        self.all_finite.logical_and_(finite)
        self.finite_steps.add_(self.all_finite)
