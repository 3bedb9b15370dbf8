"""What profilers and TensorBoard see of the training loop: named step ranges, the Nsight Systems
window, and per-step scalars.

Each step is a range "step N", with "capture" inside on the step that captures the graphs and
"replay" on the steps after it (from bridge.config.graphs, for the impl that really runs). With
perf.nsys the ranges are NVTX ranges, which Nsight Systems shows on its timeline; with
perf.profile they are torch.profiler ranges (``record_function``), so the same names appear in
trace.json. perf.nsys also brackets the profiling window with cudaProfilerStart/Stop, the capture
range the launcher starts ``nsys profile`` with (perf/launch.py).
"""

import logging
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import torch

from bridge.config.graphs import compile_mode, graph_impl

log = logging.getLogger(__name__)


def capture_step(effective_impl: str, engine: str, warmup_steps: int) -> Optional[int]:
    """The step that captures the graphs of the impl that runs; None when none is captured."""
    if compile_mode(effective_impl) is not None:  # torch.compile's cudagraph trees capture whenever torch decides
        return None
    return graph_impl(effective_impl).capture_step(warmup_steps, engine)


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
        self.steps = window
        self.traced_steps: List[int] = []
        self._recording = False

    def before_step(self, step: int) -> None:
        if step == self.steps.start:
            torch.cuda.profiler.start()
            self._recording = True

    def after_step(self, step: int) -> None:
        """Call once the step's GPU work has finished (the trainer synchronises)."""
        if not self._recording:
            return
        self.traced_steps.append(step)
        if step == self.steps[-1]:
            self.stop()

    def stop(self) -> None:
        if self._recording:
            self._recording = False
            torch.cuda.profiler.stop()


class Scalars:
    """perf.tensorboard: loss, step time and memory per step (and the GPU-busy fraction of a profiled
    run) as TensorBoard scalars in ``<job_dir>/tensorboard/``, next to result.json. It needs the
    ``tensorboard`` package (``pip install 'graphbridge[tensorboard]'``); without it there are none, and
    when perf.tensorboard=true ``asked`` for them one line says so; the run goes on. A write that fails
    (a full disk) is one line too: the scalars stop there, the run goes on."""

    DIRECTORY = "tensorboard"

    def __init__(self, job_dir: Path, device: torch.device, asked: bool = True):
        self.device = device
        self._directory = Path(job_dir) / self.DIRECTORY
        self._writer = None
        self._previous_excepthook = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if asked:
                log.warning("perf.tensorboard: the tensorboard package is not installed, so no scalars are written; "
                            "pip install 'graphbridge[tensorboard]', or set perf.tensorboard=false")
            return
        # The writer's own thread (started as it is created) re-raises what it could not write; that
        # error is reported here, in one line, instead.
        self._previous_excepthook = threading.excepthook
        threading.excepthook = self._quiet_writer_thread
        try:
            self._writer = SummaryWriter(log_dir=str(self._directory))
        except OSError as error:
            self._cannot_write(error)

    def _cannot_write(self, error: OSError) -> None:
        log.warning(f"perf.tensorboard: cannot write {self._directory}: {error.strerror or error}; no (more) scalars "
                    "are written, result.json is not affected")
        self._writer = None

    def _quiet_writer_thread(self, args) -> None:
        if not type(args.thread).__module__.startswith("tensorboard."):
            self._previous_excepthook(args)

    def _write(self, *scalars) -> None:
        """Add (tag, value, step) scalars; on an OS error, say it once and write no more."""
        try:
            for tag, value, step in scalars:
                self._writer.add_scalar(tag, value, step)
        except OSError as error:
            self._cannot_write(error)

    def after_step(self, step: int, loss: float, seconds: float) -> None:
        if self._writer is None:
            return
        scalars = [("train/loss", loss, step), ("train/step_time_ms", seconds * 1e3, step)]
        if self.device.type == "cuda":
            scalars += [("memory/allocated_gib", torch.cuda.memory_allocated(self.device) / 2**30, step),
                        ("memory/peak_allocated_gib", torch.cuda.max_memory_allocated(self.device) / 2**30, step)]
        self._write(*scalars)

    def close(self, result: dict) -> None:
        """The run's summary scalars, then flush the event file."""
        if self._writer is not None:
            busy = (result.get("profile") or {}).get("gpu_busy")
            if busy is not None:
                self._write(("profile/gpu_busy", busy, result["steps_completed"]))
        if self._writer is not None:
            try:
                self._writer.close()
            except OSError as error:
                self._cannot_write(error)
            self._writer = None
        if self._previous_excepthook is not None:
            threading.excepthook, self._previous_excepthook = self._previous_excepthook, None
