"""perf.profile: torch.profiler over the profiling window of a run (by default its last
``perf.profile_steps`` steps; bridge.config.schema.profiling_window).

The trace goes to ``<job_dir>/trace.json`` (Perfetto or chrome://tracing open it). From it the
run reports the GPU time per step: the union of the intervals in which a kernel, copy or
memset ran, so work overlapping on several streams counts once. Divided by the median step
time of the steps the profiler did not slow down, that is the GPU-busy fraction: 1.0 means the
step is as short as its kernels allow, the launch-overhead-free limit CUDA graphs approach.
"""

import os
from pathlib import Path
from typing import List, Optional, Tuple

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

TRACE_FILE = "trace.json"


class StepProfiler:
    def __init__(self, job_dir: Path, first_step: int, steps: int, device: torch.device):
        self.steps = range(first_step, first_step + steps)
        self.trace_path = Path(job_dir) / TRACE_FILE
        self.device = device
        self.traced_steps: List[int] = []
        self.gpu_ms_per_step: Optional[float] = None
        self._profile: Optional[torch.profiler.profile] = None

    def before_step(self, step: int) -> None:
        if step == self.steps.start:
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profile = torch.profiler.profile(activities=activities)
            self._profile.start()

    def after_step(self, step: int) -> None:
        """Call once the step's GPU work has finished (the trainer synchronises)."""
        if self._profile is None:
            return
        self.traced_steps.append(step)
        if step == self.steps[-1]:
            self.stop()

    def stop(self) -> None:
        """End tracing and write the trace; on an early exit, of the steps traced so far."""
        if self._profile is None:
            return
        profile, self._profile = self._profile, None
        profile.stop()
        if not self.traced_steps:
            return
        partial = self.trace_path.with_name(f".{TRACE_FILE}.partial")
        profile.export_chrome_trace(str(partial))
        os.replace(partial, self.trace_path)  # a reader never sees half a trace
        if self.device.type == "cuda":
            self.gpu_ms_per_step = gpu_busy_us(profile) / 1e3 / len(self.traced_steps)

    def summary(self, median_step_ms: Optional[float]) -> dict:
        """result.json's "profile" entry."""
        busy = None
        if self.gpu_ms_per_step is not None and median_step_ms:
            busy = self.gpu_ms_per_step / median_step_ms
        return {"trace": TRACE_FILE if self.trace_path.exists() else None, "steps": list(self.traced_steps),
                "gpu_ms_per_step": self.gpu_ms_per_step, "gpu_busy": busy}


def gpu_busy_us(profile: torch.profiler.profile) -> float:
    """Microseconds in which the GPU ran anything during a finished profile."""
    return busy_time_us(device_work_intervals(profile.events()))


def device_work_intervals(events) -> List[Tuple[float, float]]:
    """The [start, end) of every kernel, copy and memset among profiler events. Ranges named with
    record_function (the trainer's "step N") also appear on the GPU timeline, as user annotations
    spanning the first to the last kernel of the range, idle gaps included: they are not work."""
    return [(event.time_range.start, event.time_range.end) for event in events
            if event.device_type == DeviceType.CUDA and not event.is_user_annotation]


def busy_time_us(intervals: List[Tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, covered_until = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_until:
            total += end - max(start, covered_until)
            covered_until = end
    return total
