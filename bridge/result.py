"""``<job_dir>/result.json``: what one training job measured, written atomically.

This module is the one writer of result.json: a trained (or stopped) job's full record, and the
short records of a job refused before it started (status "invalid" when its config breaks a rule,
"cannot_run_here" when only this machine cannot run it; with its violations) or of a job whose
training process left none ("failed" / "interrupted", with the reason).

Keys of a full record (perf/report.py reads exactly these):
    status "completed" | "failed" | "interrupted", reason (null or why it did not complete),
    config_digest (sha256 of resolved.yaml, first 16 hex digits), job (job.json or {}),
    engine, device, impl (requested model.cuda_graph_impl), effective_impl, modules,
    train_iters, steps_completed,
    step_time_ms {median, p10, p90, mean, count}: excludes the first perf.warmup_steps steps,
        every capture step and the profiled steps; values are null when no step is left.
        Under torchrun, each step's time is the slowest rank's,
    profiled_steps (the steps perf.profile or perf.nsys recorded, untimed),
    capture_step (first capture step or null), capture_time_s (wall time of the capture steps),
    graph_count, tokens_per_s, tflops_per_gpu (null when bridge.flops is unavailable),
    memory {peak_allocated_gb, peak_reserved_gb} in GiB (2**30 bytes; null on the CPU; the
        largest over ranks) and estimate_gb, the plan's estimate of peak_allocated_gb for graphbridge's
        engine's run (bridge.memory),
    parameters {total, trainable}: rank 0's model (under tensor or pipeline parallelism its share), trainable
        being what the optimizer steps (LoRA's adapters under peft=lora); null before an engine was built,
    loss (one float per completed step), env {gpu, torch, megatron_core, transformer_engine,
    python}, created (ISO 8601);
    with perf.profile=true also profile {trace, steps, gpu_ms_per_step, gpu_busy} (see
    bridge.profiling; the GPU values are null on the CPU);
    auto: null, or under cuda_graph=auto the record the graphbridge process left in auto.json before
    training (perf.auto_probe): chosen, reason, source, and candidates, each {choice, status, median_ms,
    spread_ms, reason, job, wall_s}; after a probe also eager_ms, noise_ms and probe {directory, wall_s,
    imports_s (the launcher's imports, within wall_s), gpus, rounds (each runs, timed_steps, train_iters)}.
"""

import hashlib
import json
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional, Tuple

from bridge.atomic import write_json_atomic
from bridge.config.schema import GraphBridgeConfig
from bridge.diagnosis import failure_reason
from bridge.machine import probe
from bridge.memory import engine_regime, estimate_memory

RESULT_FILE = "result.json"
AUTO_RECORD = "auto.json"
"""How cuda_graph=auto chose the graphs the job trains with (perf.auto_probe writes it before training)."""

REFUSED_HERE = "cannot_run_here"
"""The status of a valid job this machine cannot run (too few GPUs, a package missing)."""


@dataclass
class RunRecord:
    """What the trainer measured; filled step by step."""

    engine: Optional[str] = None
    device: Optional[str] = None
    effective_impl: Optional[str] = None
    losses: List[float] = field(default_factory=list)
    step_times_s: List[float] = field(default_factory=list)
    capture_steps: List[int] = field(default_factory=list)
    profiled_steps: List[int] = field(default_factory=list)
    graph_count: int = 0
    peak_allocated_gb: Optional[float] = None
    peak_reserved_gb: Optional[float] = None
    parameters: Optional[Tuple[int, int]] = None
    """(every parameter, the trainable ones) of rank 0's model (a share of it under model parallelism)."""


def failure(error: BaseException, step: Optional[int] = None) -> Tuple[str, str]:
    """(status, reason) for an exception that ended a run at ``step`` (None: before the loop)."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", "interrupted (KeyboardInterrupt)"
    if isinstance(error, BrokenPipeError):  # writing progress or logs: whoever read them has gone
        at = f" at step {step}" if step is not None else ""
        return "interrupted", f"output pipe closed{at}: the graphbridge process that started this run ended"
    return "failed", failure_reason(error, step)


def build_result(cfg: Optional[GraphBridgeConfig], job_dir: Path, status: str, reason: Optional[str],
                 record: RunRecord) -> dict:
    """The result document; ``cfg`` is None when the config itself could not be loaded."""
    job_dir = Path(job_dir)
    warmup_steps = cfg.perf.warmup_steps if cfg else 0
    timed = [seconds for step, seconds in enumerate(record.step_times_s)
             if step >= warmup_steps and step not in record.capture_steps and step not in record.profiled_steps]
    stats = step_time_stats_ms(timed)
    median_s = stats["median"] / 1e3 if stats["median"] else None
    capture_times = [record.step_times_s[step] for step in record.capture_steps if step < len(record.step_times_s)]
    return {
        "status": status,
        "reason": reason,
        "config_digest": config_digest(job_dir),
        "job": _read_json(job_dir / "job.json"),
        "engine": record.engine or (cfg.engine.value if cfg else None),
        "device": record.device or (cfg.device.value if cfg else None),
        "impl": cfg.model.cuda_graph_impl.value if cfg else None,
        "effective_impl": record.effective_impl,
        "modules": list(cfg.model.cuda_graph_modules) if cfg else [],
        "train_iters": cfg.train.train_iters if cfg else None,
        "steps_completed": len(record.losses),
        "step_time_ms": stats,
        # In step order, to show how the step moved over the run (host drift, a neighbour's load), which the
        # median and percentiles cannot.
        "timed_step_ms": [round(seconds * 1e3, 3) for seconds in timed],
        "profiled_steps": list(record.profiled_steps),
        "capture_step": min(record.capture_steps) if record.capture_steps else None,
        "capture_time_s": sum(capture_times) if capture_times else None,
        "graph_count": record.graph_count,
        "tokens_per_s": cfg.train.global_batch_size * cfg.dataset.seq_length / median_s if cfg and median_s else None,
        "tflops_per_gpu": _tflops_per_gpu(cfg, median_s) if cfg and median_s else None,
        "memory": {"peak_allocated_gb": record.peak_allocated_gb, "peak_reserved_gb": record.peak_reserved_gb,
                   "estimate_gb": estimate_memory(cfg, regime=engine_regime(cfg)).total_gib if cfg else None},
        "parameters": ({"total": record.parameters[0], "trainable": record.parameters[1]}
                       if record.parameters else None),
        "loss": list(record.losses),
        "env": environment(record.device == "cuda"),
        "auto": _read_json(job_dir / AUTO_RECORD) or None,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_result(job_dir: Path, result: dict) -> Path:
    """Write ``result.json`` atomically: a reader sees the old file or the whole new one."""
    path = Path(job_dir) / RESULT_FILE
    write_json_atomic(path, result)
    return path


def write_invalid_result(job_dir: Path, violations: List, job: dict) -> Path:
    """The record of a job the catalogue refused (its violations, each as rule/keys/message/where):
    "invalid" when the config breaks a rule, "cannot_run_here" when it is valid but this machine lacks
    what it needs (GPUs, packages), so that a sweep on a laptop does not call a cluster job invalid."""
    status = "invalid" if any(violation.in_config for violation in violations) else REFUSED_HERE
    return write_result(job_dir, {"status": status, "reason": "; ".join(str(v) for v in violations),
                                  "violations": [v.as_dict() for v in violations], "job": job})


def write_missing_result(job_dir: Path, job: dict, reason: str, interrupted: bool) -> Path:
    """The record of a job whose training process wrote none: it ended early or never started."""
    return write_result(job_dir, {"status": "interrupted" if interrupted else "failed", "reason": reason, "job": job})


MIN_TIMED_STEPS = 30
"""Fewer timed steps than this give a median too noisy to trust for small differences: a sweep's report marks
such rows, and cuda_graph=auto's probe times this many a candidate."""


def first_timed_step(warmup_steps: int, capture_step: Optional[int]) -> int:
    """The first step a run times with its graphs in place: after perf.warmup_steps and after the capture."""
    return max(warmup_steps, capture_step + 1 if capture_step is not None else 0)


def step_time_stats_ms(step_times_s: List[float]) -> dict:
    if not step_times_s:
        return {"median": None, "p10": None, "p90": None, "mean": None, "count": 0}
    ms = sorted(seconds * 1e3 for seconds in step_times_s)
    return {"median": percentile(ms, 50), "p10": percentile(ms, 10), "p90": percentile(ms, 90),
            "mean": sum(ms) / len(ms), "count": len(ms)}


def percentile(sorted_values: List[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), defined for one value too."""
    position = (len(sorted_values) - 1) * q / 100
    lower = int(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    return sorted_values[lower] + (sorted_values[upper] - sorted_values[lower]) * (position - lower)


def config_digest(job_dir: Path) -> Optional[str]:
    resolved = Path(job_dir) / "resolved.yaml"
    if not resolved.exists():
        return None
    return hashlib.sha256(resolved.read_text().encode()).hexdigest()[:16]


def environment(on_cuda: bool) -> dict:
    import torch

    machine = probe()
    return {
        "gpu": _gpu_name() if on_cuda else None,
        "torch": torch.__version__,
        "megatron_core": machine.version("megatron-core"),
        "transformer_engine": machine.version("transformer-engine"),
        "python": platform.python_version(),
    }


def _gpu_name() -> Optional[str]:
    import torch

    try:
        return torch.cuda.get_device_name()
    except RuntimeError:  # after a sticky CUDA error (illegal address) every call fails; write the rest
        return None


def _tflops_per_gpu(cfg: GraphBridgeConfig, median_s: float) -> Optional[float]:
    try:
        from bridge.flops import model_flops_per_step
    except ImportError:  # bridge/flops.py is optional for the trainer
        return None
    return model_flops_per_step(cfg) / median_s / cfg.train.num_gpus / 1e12


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}
