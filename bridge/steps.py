"""What happens around each step of the training loop (bridge.trainer): the step clock that queues a
step while the one before still runs on the GPU, the profiler windows and named step ranges, the
record of losses and step times, the NaN checks, TensorBoard scalars and the progress bar.
"""

import math
import os
from functools import partial
from pathlib import Path
from typing import List, Optional

from tqdm import tqdm

from bridge.config.schema import GraphBridgeConfig, profiling_window
from bridge.diagnosis import NonFiniteError
from bridge.observers import CudaProfilerWindow, Scalars, StepRanges, capture_step
from bridge.profiling import StepProfiler
from bridge.result import RunRecord, first_timed_step
from bridge.start_gate import gate_of_this_run, wait_for_turn
from bridge.step_clock import FinishedStep, StepClock


class Steps:
    def __init__(self, cfg: GraphBridgeConfig, engine, job_dir: Path, record: RunRecord, reporting: bool):
        """``reporting``: this rank writes the run's reports (rank 0 under torchrun)."""
        self.cfg, self.engine, self.record = cfg, engine, record
        window = profiling_window(cfg.perf, cfg.train.train_iters)
        self.profiler: Optional[StepProfiler] = None
        if cfg.perf.profile:
            self.profiler = StepProfiler(job_dir, window.start, cfg.perf.profile_steps, engine.device)
        self.nsys_window = CudaProfilerWindow(window) if cfg.perf.nsys else None
        self.clock = StepClock(engine.device)
        self.queueing: Optional[int] = None
        """The step the loop is queueing: a failure belongs to it."""
        self.capture_at = capture_step(engine.effective_impl, engine.name, cfg.model.cuda_graph_warmup_steps)
        self.ranges = StepRanges(nvtx=cfg.perf.nsys, trace=cfg.perf.profile, capture_at=self.capture_at)
        self.gate = gate_of_this_run()
        """Where cuda_graph=auto's probe started this run beside others: it waits there before its first timed
        step (after the warmup and the capture) until the probe lets it time its steps alone."""
        self.first_timed_step = first_timed_step(cfg.perf.warmup_steps, self.capture_at)
        reports = cfg.perf.tensorboard is not False and reporting
        self.scalars = Scalars(job_dir, engine.device, asked=bool(cfg.perf.tensorboard)) if reports else None

    @property
    def completed(self) -> int:
        return len(self.record.losses)

    @property
    def failing_step(self) -> int:
        """The step a failure belongs to: the one the loop was queueing (the step before may still be
        running on the GPU, bridge.step_clock), else the next one."""
        return self.queueing if self.queueing is not None else self.completed

    def windows(self):
        """The profilers that record a window of steps, which are then left out of the timing."""
        return [window for window in (self.profiler, self.nsys_window) if window is not None]

    def run(self, progress: tqdm, step: int) -> None:
        """Queue step ``step`` and record the steps that finished meanwhile (bridge.step_clock). A step
        a profiler records runs alone (the one before finishes before tracing starts), and so does the
        capture step: a capture that fails is then that step's failure, with every step before it done."""
        if self.gate is not None and step == self.first_timed_step:
            self.finish(progress)  # nothing of this run on the GPU while it waits
            wait_for_turn(self.gate, int(os.environ.get("RANK", "0")))
        windows = [window for window in self.windows() if step in window.steps]
        alone = bool(windows) or step == self.capture_at
        if alone:
            self.finish(progress)
        for window in windows:
            window.before_step(step)
        with self.ranges.step(step):
            try:
                finished = self.clock.run(step, partial(self.engine.train_step, step), synchronous=alone)
            except BaseException:
                self._settle_queued_step()
                raise
        for window in windows:
            window.after_step(step)
        self._after(progress, finished)

    def finish(self, progress: tqdm) -> None:
        """Wait for the step still queued on the GPU and record it."""
        self._after(progress, self.clock.finish())

    def _after(self, progress: tqdm, finished: List[FinishedStep]) -> None:
        for done in finished:
            self._record(done)
            if self.scalars is not None:
                self.scalars.after_step(done.step, done.loss, done.seconds)
            self._check_finite(done.step, done.loss)
            self._show_progress(progress, done.step, done.loss, done.seconds)

    def _settle_queued_step(self) -> None:
        """After a step failed, the one still queued on the GPU: recorded if it finished. After a sticky
        CUDA error (an illegal address) the GPU cannot say, and the failure is put on that step: CUDA
        reports such an error late, and its work ran first."""
        queued = self.clock.queued_step
        try:
            finished = self.clock.finish()
        except Exception:
            self.queueing = queued
            return
        for done in finished:
            self._record(done)

    def _record(self, done: FinishedStep) -> None:
        self.record.losses.append(done.loss)
        self.record.step_times_s.append(done.seconds)

    def _check_finite(self, step: int, loss: float) -> None:
        # The loss is on the host anyway, so checking it every step costs nothing.
        if self.cfg.rerun_state_machine.check_for_nan_in_loss is not False and not math.isfinite(loss):
            raise NonFiniteError(f"loss is {loss} at step {step}")
        interval = self.cfg.perf.nan_check_interval
        if interval > 0 and ((step + 1) % interval == 0 or step + 1 == self.cfg.train.train_iters):
            first = self._first_non_finite_step()
            if first is not None:
                raise NonFiniteError(f"non-finite loss or grad norm at step {first} (detected at step {step})")

    def _first_non_finite_step(self) -> Optional[int]:
        finite_steps = self.engine.finite_steps() if hasattr(self.engine, "finite_steps") else None
        if finite_steps is None:  # an engine without the device-side check: the losses seen so far
            return next((step for step, loss in enumerate(self.record.losses) if not math.isfinite(loss)), None)
        # Waits for the step still queued on the GPU too: once per perf.nan_check_interval steps.
        count = int(finite_steps)
        return count if count < self.completed else None

    def _show_progress(self, progress: tqdm, step: int, loss: float, seconds: float) -> None:
        # tqdm redraws at its own pace (mininterval): a redraw per step would cost the host time per step.
        progress.set_postfix(loss=f"{loss:.4f}", step_ms=f"{seconds * 1e3:.1f}", refresh=False)
        if step in self.engine.capture_steps():
            progress.write(f"step {step}: captured, {self.engine.graph_count()} graph(s), "
                           f"{seconds:.2f} s including capture")
