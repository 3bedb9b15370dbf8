"""What profilers see of the training loop: named step ranges and the Nsight Systems window.

Each step is a range "step N", with "capture" inside on the step that captures the graphs and
"replay" on the steps after it (from bridge.config.graphs, for the impl that really runs). With
perf.nsys the ranges are NVTX ranges, which Nsight Systems shows on its timeline; with
perf.profile they are torch.profiler ranges (``record_function``), so the same names appear in
trace.json. perf.nsys also brackets the profiling window with cudaProfilerStart/Stop, the capture
range the launcher starts ``nsys profile`` with (perf/launch.py).
"""

from contextlib import ExitStack, contextmanager
from typing import Iterator, List, Optional

import torch

from bridge.config.graphs import graph_impl


def capture_step(effective_impl: str, engine: str, warmup_steps: int) -> Optional[int]:
    """The step that captures the graphs of the impl that runs; None when none is captured."""
    try:
        impl = graph_impl(effective_impl)
    except ValueError:  # torch.compile's cudagraph trees capture whenever torch decides
        return None
    return impl.capture_step(warmup_steps, engine)


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


class StepRanges:
    """Opens the ranges of one step for the profilers a run uses (none: nothing at all)."""

    def __init__(self, nvtx: bool, trace: bool, capture_at: Optional[int]):
        self.nvtx, self.trace, self.capture_at = nvtx, trace, capture_at

    def phase(self, step: int) -> Optional[str]:
        if self.capture_at is None or step < self.capture_at:
            return None
        return "capture" if step == self.capture_at else "replay"

    @contextmanager
    def step(self, step: int) -> Iterator[None]:
        names = [f"step {step}", self.phase(step)]
        with ExitStack() as ranges:
            for name in filter(None, names):
                if self.nvtx:
                    ranges.enter_context(nvtx_range(name))
                if self.trace:
                    ranges.enter_context(torch.profiler.record_function(name))
            yield


class CudaProfilerWindow:
    """perf.nsys: cudaProfilerStart before the window's first step, cudaProfilerStop after its
    last (or when the run ends early), so that nsys records the window and nothing else."""

    def __init__(self, window: range):
        self.window = window
        self.traced_steps: List[int] = []
        self._recording = False

    def before_step(self, step: int) -> None:
        if step == self.window.start:
            torch.cuda.profiler.start()
            self._recording = True

    def after_step(self, step: int) -> None:
        """Call once the step's GPU work has finished (the trainer synchronises)."""
        if not self._recording:
            return
        self.traced_steps.append(step)
        if step == self.window[-1]:
            self.stop()

    def stop(self) -> None:
        if self._recording:
            self._recording = False
            torch.cuda.profiler.stop()
