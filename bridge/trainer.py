"""The training loop shared by both engines (torchtitan style).

``__init__`` builds the engine (which owns model, optimizer, data and graphs), ``run`` times
``train.train_iters`` steps and writes result.json on every exit path, ``close`` releases
every graph. What happens around each step is bridge.steps; the result and the table are
bridge.run_report. One trainer per process: megatron-core keeps graph, RNG-tracker and static-buffer
state at class level, so every job trains in a fresh process (perf/launch.py).

Stopping early never loses the result: SIGINT or SIGTERM (``ExitSignals``) end the loop at the
next step boundary, a non-finite loss or gradient norm ends it with the step it first happened
at, and a capture or replay failure ends it with a diagnosis (bridge.diagnosis); each writes
result.json with what was measured so far.
"""

import os
import signal
import threading
from pathlib import Path
from typing import Dict, Optional

import torch
from tqdm import tqdm

from bridge.config.schema import GraphBridgeConfig
from bridge.engines import build_engine
from bridge.result import RunRecord, failure
from bridge.run_report import print_summary, write_run_result
from bridge.steps import Steps
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
        self.engine = build_engine(cfg, target or resolve_target(cfg))
        # After the engine picked this rank's GPU: before it, torchrun ranks would all open GPU 0.
        if self.engine.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.engine.device)
        record = RunRecord(engine=self.engine.name, device=self.engine.device.type,
                           effective_impl=self.engine.effective_impl, parameters=self.engine.parameter_counts())
        self.steps = Steps(cfg, self.engine, self.job_dir, record, self.is_reporting_rank)
        self._closed = False

    def run(self) -> dict:
        """Train; returns the result document (also written to result.json)."""
        status, reason = "completed", None
        # Counted by hand, not iterated: tqdm closes (and draws its last line) when its iterator ends, before
        # the last step's loss arrives from the step clock, so the bar would end one loss behind.
        progress = progress_bar(total=self.cfg.train.train_iters, unit="step", disable=not self.is_reporting_rank,
                        desc=f"{self.engine.name} {self.engine.effective_impl}")
        try:
            for step in range(self.cfg.train.train_iters):
                self.steps.queueing = step
                if self._stop_requested():
                    status, reason = "interrupted", self._interrupt_reason(step)
                    break
                self.steps.run(progress, step)
                progress.update()
            self.steps.finish(progress)
        except (Exception, KeyboardInterrupt) as error:
            status, reason = failure(error, self.steps.failing_step)
            raise
        finally:
            # Every rank is at the same step boundary when the run completed or a signal stopped it.
            ranks_agree = status == "completed" or self.stopped_by is not None
            result, path = write_run_result(self.cfg, self.job_dir, self.steps, status, reason, ranks_agree,
                                            self.is_reporting_rank)
            progress.close()  # its last line, into an output pipe that may have closed: after the result
        if self.is_reporting_rank:
            print_summary(result, path)
        return result

    def close(self) -> None:
        """Delete every graph and release the engine; safe to call twice."""
        if not self._closed:
            self._closed = True
            self.engine.close()

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


def progress_bar(**options) -> tqdm:
    """The run's bar, under a thread lock: tqdm's default lock is a multiprocessing one, a named semaphore that the
    resource tracker of the process which started this one records. cuda_graph=auto's probe kills each run once its
    result is written, and its parent then warned at exit of "14 leaked semaphore objects" (one a probe run, on an
    H100: main_job_025da11.log). One process writes this bar; a thread lock is all it needs."""
    tqdm.set_lock(threading.RLock())
    return tqdm(**options)
