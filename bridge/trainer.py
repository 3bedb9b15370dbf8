"""The training loop shared by both engines (torchtitan style).

``__init__`` builds the engine (which owns model, optimizer, data and graphs), ``run`` times
``train.train_iters`` steps and writes result.json on every exit path, ``close`` releases
every graph. One trainer per process: megatron-core keeps graph, RNG-tracker and static-buffer
state at class level, so every job trains in a fresh process (perf/launch.py).

Stopping early never loses the result: SIGINT or SIGTERM (``ExitSignals``) end the loop at the
next step boundary, a non-finite loss or gradient norm ends it with the step it first happened
at, and a capture or replay failure ends it with a diagnosis (bridge.diagnosis); each writes
result.json with what was measured so far.
"""

import math
import os
import signal
from functools import partial
from pathlib import Path
from typing import Dict, List, Optional

import torch
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from bridge.config.schema import GraphBridgeConfig, profiling_window
from bridge.diagnosis import NonFiniteError
from bridge.engines import build_engine
from bridge.observers import CudaProfilerWindow, Scalars, StepRanges, capture_step
from bridge.profiling import StepProfiler
from bridge.result import RunRecord, build_result, failure, write_result
from bridge.step_clock import FinishedStep, StepClock
from bridge.validation import Target, resolve_target


class ExitSignals:
    """SIGINT and SIGTERM (Slurm's preemption notice) only record that they came.

    Raising from the handler, as Python's default SIGINT handler does, could land inside a
    captured region and leave a half-captured graph; the loop checks ``received`` between steps.
    """

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: Optional[signal.Signals] = None
        self._previous: Dict[int, object] = {}

    def install(self) -> None:
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._record)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _record(self, signum: int, frame) -> None:
        # The first one counts: the launcher forwards what a terminal or Slurm also sent here.
        if self.received is None:
            self.received = signal.Signals(signum)


class Trainer:
    def __init__(self, cfg: GraphBridgeConfig, job_dir: Path, target: Optional[Target] = None,
                 exit_signals: Optional[ExitSignals] = None):
        """``target``: the engine and device the catalogue judged the config for (default: this machine)."""
        self.cfg = cfg
        self.job_dir = Path(job_dir)
        self.exit_signals = exit_signals
        self.stopped_by: Optional[signal.Signals] = None
        # Under torchrun only rank 0 reports.
        self.is_reporting_rank = int(os.environ.get("RANK", "0")) == 0
        self.result_path: Optional[Path] = None
        self.engine = build_engine(cfg, target or resolve_target(cfg))
        # After the engine picked this rank's GPU: before it, torchrun ranks would all open GPU 0.
        if self.engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.engine.device)
        self.record = RunRecord(engine=self.engine.name, device=self.engine.device.type,
                                effective_impl=self.engine.effective_impl)
        window = profiling_window(cfg.perf, cfg.train.train_iters)
        self.profiler: Optional[StepProfiler] = None
        if cfg.perf.profile:
            self.profiler = StepProfiler(self.job_dir, window.start, cfg.perf.profile_steps, self.engine.device)
        self.nsys_window = CudaProfilerWindow(window) if cfg.perf.nsys else None
        self.clock = StepClock(self.engine.device)
        self._queueing: Optional[int] = None
        self.capture_at = capture_step(self.engine.effective_impl, self.engine.name, cfg.model.cuda_graph_warmup_steps)
        self.ranges = StepRanges(nvtx=cfg.perf.nsys, trace=cfg.perf.profile, capture_at=self.capture_at)
        reports = cfg.perf.tensorboard is not False and self.is_reporting_rank
        self.scalars = Scalars(self.job_dir, self.engine.device, asked=bool(cfg.perf.tensorboard)) if reports else None
        self._closed = False

    def run(self) -> dict:
        """Train; returns the result document (also written to result.json)."""
        status, reason = "completed", None
        # Counted by hand, not iterated: tqdm closes (and draws its last line) when its iterator ends, before
        # the last step's loss arrives from the step clock, so the bar would end one loss behind.
        progress = tqdm(total=self.cfg.train.train_iters, unit="step", disable=not self.is_reporting_rank,
                        desc=f"{self.engine.name} {self.engine.effective_impl}")
        try:
            for step in range(self.cfg.train.train_iters):
                self._queueing = step
                if self._stop_requested():
                    status, reason = "interrupted", self._interrupt_reason(step)
                    break
                self._timed_step(progress, step)
                progress.update()
            self._after_steps(progress, self.clock.finish())
        except (Exception, KeyboardInterrupt) as error:
            status, reason = failure(error, self.failing_step)
            raise
        finally:
            result = self._write_result(status, reason)
            progress.close()  # its last line, into an output pipe that may have closed: after the result
        if self.is_reporting_rank:
            print_summary(result, self.result_path)
        return result

    @property
    def steps_completed(self) -> int:
        return len(self.record.losses)

    @property
    def failing_step(self) -> int:
        """The step a failure belongs to: the one the loop was queueing (the step before may still be
        running on the GPU, bridge.step_clock), else the next one."""
        return self._queueing if self._queueing is not None else self.steps_completed

    def close(self) -> None:
        """Delete every graph and release the engine; safe to call twice."""
        if not self._closed:
            self._closed = True
            self.engine.close()

    def _take_slowest_rank(self) -> None:
        """Under torchrun each step takes as long as its slowest rank, and the job needs the
        largest peak memory: the record keeps the maximum over ranks of each."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()
                and torch.distributed.get_world_size() > 1):
            return
        record = self.record
        measured = record.step_times_s + [record.peak_allocated_gb or 0.0, record.peak_reserved_gb or 0.0]
        slowest = torch.tensor(measured, dtype=torch.float64, device=self.engine.device)
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        *record.step_times_s, record.peak_allocated_gb, record.peak_reserved_gb = slowest.tolist()

    def _stop_requested(self) -> bool:
        """Whether a signal came, on any rank: every rank must stop after the same step, or the
        others would wait forever in the next step's collectives."""
        if self.exit_signals is None:
            return False
        received = int(self.exit_signals.received or 0)
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if distributed and torch.distributed.get_world_size() > 1:
            agreed = torch.tensor(received, device=self.engine.device)
            torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MAX)
            received = int(agreed)
        self.stopped_by = signal.Signals(received) if received else None
        return self.stopped_by is not None

    def _interrupt_reason(self, step: int) -> str:
        return (f"{self.stopped_by.name} received: stopped at the step boundary after {step} of "
                f"{self.cfg.train.train_iters} steps")

    def _windows(self):
        """The profilers that record a window of steps, which are then left out of the timing."""
        return [window for window in (self.profiler, self.nsys_window) if window is not None]

    def _timed_step(self, progress: tqdm, step: int) -> None:
        """Queue step ``step`` and record the steps that finished meanwhile (bridge.step_clock). A step
        a profiler records runs alone (the one before finishes before tracing starts), and so does the
        capture step: a capture that fails is then that step's failure, with every step before it done."""
        windows = [window for window in self._windows() if step in window.steps]
        alone = bool(windows) or step == self.capture_at
        if alone:
            self._after_steps(progress, self.clock.finish())
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
        self._after_steps(progress, finished)

    def _after_steps(self, progress: tqdm, finished: List[FinishedStep]) -> None:
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
            self._queueing = queued
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
        return count if count < self.steps_completed else None

    def _show_progress(self, progress: tqdm, step: int, loss: float, seconds: float) -> None:
        # tqdm redraws at its own pace (mininterval): a redraw per step would cost the host time per step.
        progress.set_postfix(loss=f"{loss:.4f}", step_ms=f"{seconds * 1e3:.1f}", refresh=False)
        if step in self.engine.capture_steps():
            progress.write(f"step {step}: captured, {self.engine.graph_count()} graph(s), "
                           f"{seconds:.2f} s including capture")

    def _write_result(self, status: str, reason: Optional[str]) -> dict:
        self.record.capture_steps = sorted(self.engine.capture_steps())
        self.record.graph_count = self.engine.graph_count()
        if self.engine.device.type == "cuda":
            try:
                self.record.peak_allocated_gb = torch.cuda.max_memory_allocated(self.engine.device) / 2**30
                self.record.peak_reserved_gb = torch.cuda.max_memory_reserved(self.engine.device) / 2**30
            except RuntimeError:  # after a sticky CUDA error (illegal address); the result matters more
                pass
        if status == "completed" or self.stopped_by is not None:  # every rank is at the same step boundary
            self._take_slowest_rank()
        for window in self._windows():
            try:
                window.stop()
            except RuntimeError as error:  # after a sticky CUDA error; the result matters more
                reason = f"{reason}; the profile was not written: {error}" if reason else str(error)
        self.record.profiled_steps = sorted({step for window in self._windows() for step in window.traced_steps})
        result = build_result(self.cfg, self.job_dir, status, reason, self.record)
        if self.profiler is not None:
            result["profile"] = self.profiler.summary(result["step_time_ms"]["median"])
        if self.is_reporting_rank:
            self.result_path = write_result(self.job_dir, result)
        if self.scalars is not None:
            self.scalars.close(result)
        return result


def requested(result: dict) -> str:
    """The graph impl the run asked for; under cuda_graph=auto, auto and its choice (the impl is the choice's)."""
    auto = result.get("auto")
    return f"auto (chose {auto['chosen']})" if auto else result["impl"]


def print_summary(result: dict, result_path: Optional[Path]) -> None:
    """One screen: what ran, how fast, how much memory, what was captured."""

    def number(value, unit="", digits=1):
        return "n/a" if value is None else f"{value:,.{digits}f}{unit}"

    times, memory, loss = result["step_time_ms"], result["memory"], result["loss"]
    table = Table(title=f"graphbridge run: {result['status']}", show_header=False)
    table.add_column(style="bold", no_wrap=True)  # the labels stay whole; the values take what is left
    table.add_column(overflow="fold")  # paths wrap instead of being cut
    rows = [
        ("engine / device", f"{result['engine']} / {result['device']} {result['env']['gpu'] or ''}".strip()),
        ("impl (requested -> effective)",
         f"{requested(result)} -> {result['effective_impl']} {result['modules'] or ''}"),
        ("step time median (p10-p90)",
         f"{number(times['median'], ' ms', 2)} ({number(times['p10'], '', 2)}-{number(times['p90'], ' ms', 2)}), "
         f"{times['count']} steps timed"),
        ("tokens/s", number(result["tokens_per_s"], "", 0)),
        ("TFLOP/s per GPU", number(result["tflops_per_gpu"], "", 2)),
        ("peak memory allocated / reserved",
         f"{number(memory['peak_allocated_gb'], ' GiB', 2)} / {number(memory['peak_reserved_gb'], ' GiB', 2)}"),
        ("capture", f"step {result['capture_step']}, {number(result['capture_time_s'], ' s', 2)}, "
                    f"{result['graph_count']} graph(s)" if result["capture_step"] is not None else "none"),
        ("loss first -> last", f"{loss[0]:.4f} -> {loss[-1]:.4f}" if loss else "n/a"),
        ("result", str(result_path)),
    ]
    for name, value in rows:
        table.add_row(name, value)
    Console().print(table)
