"""Step timing that lets the GPU run while the host prepares the next step.

On a CUDA device the trainer does not wait for a step before queueing the next one, as a
training loop without a per-step sync does: the host launches step n+1 while the GPU runs step n.
A step's time is the GPU-stream time between the events recorded as it and the next step were
queued. When the GPU is the bottleneck (a graphed step) that is the step's GPU time plus any gap
the host leaves; when the host is (a launch-bound eager step) it is the host's time per step. Its
loss is read once the next step is queued, when it is already computed. Waiting for every step
instead idles the GPU while the host prepares the next one: at a 3 ms graphed step, about a fifth.

Steps that a profiler records run one at a time (``synchronous``): the trace must hold exactly
their GPU work, and nothing of a neighbour's. On a CPU the same bookkeeping runs with host
timestamps in place of events (the work itself is done when ``train_step`` returns), so a step is
reported after the next one is queued on every device.
"""

import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import torch

Mark = Union[torch.cuda.Event, float]
"""Where the device's work stood when a step was queued: a CUDA event, or a host timestamp on a CPU."""


@dataclass(frozen=True)
class FinishedStep:
    step: int
    loss: float
    seconds: float


class StepClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self._queued: Optional[Tuple[int, torch.Tensor, Mark]] = None
        """The step whose work may still run on the device: its number, loss and start mark."""
        # float() of a CUDA tensor waits for everything queued on the current stream, the next step
        # included: losses are read on a stream of their own, once they are computed.
        self._reader = torch.cuda.Stream(device) if self.cuda else None

    @property
    def queued_step(self) -> Optional[int]:
        return None if self._queued is None else self._queued[0]

    def run(self, step: int, train_step: Callable[[], torch.Tensor], synchronous: bool = False) -> List[FinishedStep]:
        """Queue ``train_step`` as step ``step``; returns the steps that finished meanwhile, in order
        (usually the previous one; with ``synchronous``, the queued one and this one)."""
        finished = self.finish() if synchronous else []
        start = self._mark()
        loss = train_step()
        if self._queued is not None:
            previous_step, previous_loss, previous_start = self._queued
            self._wait(start)  # the previous step's work is done; this step's is queued behind it
            finished.append(FinishedStep(previous_step, self._read(previous_loss), self._seconds(previous_start, start)))
        self._queued = (step, loss, start)
        return finished + (self.finish() if synchronous else [])

    def finish(self) -> List[FinishedStep]:
        """Wait for the queued step, if any, and return it (it is no longer queued, even if waiting fails)."""
        if self._queued is None:
            return []
        step, loss, start = self._queued
        self._queued = None
        end = self._mark()
        self._wait(end)
        return [FinishedStep(step, self._read(loss), self._seconds(start, end))]

    def _mark(self) -> Mark:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _wait(self, mark: Mark) -> None:
        if self.cuda:
            mark.synchronize()

    def _seconds(self, start: Mark, end: Mark) -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start

    def _read(self, loss: torch.Tensor) -> float:
        """The value of a loss whose step is done (its successor's start mark has passed)."""
        if not self.cuda:
            return float(loss)
        with torch.cuda.stream(self._reader):
            return float(loss)
