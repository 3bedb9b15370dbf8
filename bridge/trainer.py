"""The training loop shared by both engines (torchtitan style).

``__init__`` builds the engine (which owns model, optimizer, data and graphs), ``run`` times
``train.train_iters`` steps and writes result.json on every exit path, ``close`` releases
every graph. One trainer per process: see DESIGN.md, "Process model".
"""

import math
import os
import time
from pathlib import Path
from typing import Optional

import torch
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from bridge.config.schema import GraphBridgeConfig
from bridge.engines import build_engine
from bridge.result import RunRecord, build_result, failure, write_result


class Trainer:
    def __init__(self, cfg: GraphBridgeConfig, job_dir: Path):
        self.cfg = cfg
        self.job_dir = Path(job_dir)
        # Under torchrun only rank 0 reports.
        self.is_reporting_rank = int(os.environ.get("RANK", "0")) == 0
        self.result_path: Optional[Path] = None
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.engine = build_engine(cfg)
        self.record = RunRecord(engine=self.engine.name, device=self.engine.device.type,
                                effective_impl=self.engine.effective_impl)
        self._closed = False

    def run(self) -> dict:
        """Train; returns the result document (also written to result.json)."""
        status, reason = "completed", None
        progress = tqdm(range(self.cfg.train.train_iters), unit="step", disable=not self.is_reporting_rank,
                        desc=f"{self.engine.name} {self.engine.effective_impl}")
        try:
            for step in progress:
                loss, seconds = self._timed_step(step)
                self.record.losses.append(loss)
                self.record.step_times_s.append(seconds)
                self._check_loss(step, loss)
                self._show_progress(progress, step, loss, seconds)
        except (Exception, KeyboardInterrupt) as error:
            status, reason = failure(error)
            raise
        finally:
            progress.close()
            result = self._write_result(status, reason)
        if self.is_reporting_rank:
            print_summary(result, self.result_path)
        return result

    def close(self) -> None:
        """Delete every graph and release the engine; safe to call twice."""
        if not self._closed:
            self._closed = True
            self.engine.close()

    def _timed_step(self, step: int):
        start = time.perf_counter()
        loss = self.engine.train_step(step)
        if self.engine.device.type == "cuda":
            torch.cuda.synchronize(self.engine.device)  # the clock must see the GPU work
        return float(loss), time.perf_counter() - start

    def _check_loss(self, step: int, loss: float) -> None:
        # The loss is on the host anyway, so checking it costs nothing; the interval keeps a
        # check under full-iteration graphs, where check_for_nan_in_loss is off.
        interval = self.cfg.perf.nan_check_interval
        wanted = self.cfg.rerun_state_machine.check_for_nan_in_loss is not False or (interval and step % interval == 0)
        if wanted and not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}")

    def _show_progress(self, progress: tqdm, step: int, loss: float, seconds: float) -> None:
        progress.set_postfix(loss=f"{loss:.4f}", step_ms=f"{seconds * 1e3:.1f}")
        if step in self.engine.capture_steps():
            progress.write(f"step {step}: captured, {self.engine.graph_count()} graph(s), "
                           f"{seconds:.2f} s including capture")

    def _write_result(self, status: str, reason: Optional[str]) -> dict:
        self.record.capture_steps = sorted(self.engine.capture_steps())
        self.record.graph_count = self.engine.graph_count()
        if self.engine.device.type == "cuda":
            self.record.peak_allocated_gb = torch.cuda.max_memory_allocated(self.engine.device) / 2**30
            self.record.peak_reserved_gb = torch.cuda.max_memory_reserved(self.engine.device) / 2**30
        result = build_result(self.cfg, self.job_dir, status, reason, self.record)
        if self.is_reporting_rank:
            self.result_path = write_result(self.job_dir, result)
        return result


def print_summary(result: dict, result_path: Optional[Path]) -> None:
    """One screen: what ran, how fast, how much memory, what was captured."""

    def number(value, unit="", digits=1):
        return "n/a" if value is None else f"{value:,.{digits}f}{unit}"

    times, memory, loss = result["step_time_ms"], result["memory"], result["loss"]
    table = Table(title=f"graphbridge run: {result['status']}", show_header=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")  # paths wrap instead of being cut
    rows = [
        ("engine / device", f"{result['engine']} / {result['device']} {result['env']['gpu'] or ''}".strip()),
        ("impl (requested -> effective)", f"{result['impl']} -> {result['effective_impl']} {result['modules'] or ''}"),
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
