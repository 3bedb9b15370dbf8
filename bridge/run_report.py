"""What a run reports when its loop ends, on every exit path: result.json (bridge.result builds it)
with the measurements of every rank taken together, and the one-screen table on the terminal."""

from pathlib import Path
from typing import Optional, Tuple

import torch
from rich.console import Console
from rich.table import Table

from bridge.config.schema import GraphBridgeConfig
from bridge.result import build_result, write_result
from bridge.steps import Steps

NOISY_SPREAD = 2.0
"""p90 over p10 of the timed steps beyond which the run's table calls its step times noisy. The 22 runs
in benchmarks/results (H100s, quiet) spread by 1.49 at most (1.19 in the middle), and graph choices
differ by 1.01x to 1.5x: steps spread wider than 2x come from something else on the machine, and their
median cannot rank graph choices."""


def write_run_result(cfg: GraphBridgeConfig, job_dir: Path, steps: Steps, status: str, reason: Optional[str],
                     ranks_agree: bool, reporting: bool) -> Tuple[dict, Optional[Path]]:
    """The result document, and where it was written (this rank ``reporting``). ``ranks_agree``: every
    rank stopped at the same step boundary, so their measurements can be taken together."""
    engine, record = steps.engine, steps.record
    record.capture_steps = sorted(engine.capture_steps())
    record.graph_count = engine.graph_count()
    if engine.device.type == "cuda":
        try:
            record.peak_allocated_gb = torch.cuda.max_memory_allocated(engine.device) / 2**30
            record.peak_reserved_gb = torch.cuda.max_memory_reserved(engine.device) / 2**30
        except RuntimeError:  # after a sticky CUDA error (illegal address); the result matters more
            pass
    if ranks_agree:
        take_slowest_rank(steps)
    for window in steps.windows():
        try:
            window.stop()
        except RuntimeError as error:  # after a sticky CUDA error; the result matters more
            reason = f"{reason}; the profile was not written: {error}" if reason else str(error)
    record.profiled_steps = sorted({step for window in steps.windows() for step in window.traced_steps})
    result = build_result(cfg, job_dir, status, reason, record)
    if steps.profiler is not None:
        result["profile"] = steps.profiler.summary(result["step_time_ms"]["median"])
    path = write_result(job_dir, result) if reporting else None
    if steps.scalars is not None:
        steps.scalars.close(result)
    return result, path


def take_slowest_rank(steps: Steps) -> None:
    """Under torchrun each step takes as long as its slowest rank, and the job needs the largest peak
    memory: the record keeps the maximum over ranks of each."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1):
        return
    record = steps.record
    measured = record.step_times_s + [record.peak_allocated_gb or 0.0, record.peak_reserved_gb or 0.0]
    slowest = torch.tensor(measured, dtype=torch.float64, device=steps.engine.device)
    torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
    *record.step_times_s, record.peak_allocated_gb, record.peak_reserved_gb = slowest.tolist()


def noise(times: dict) -> Optional[str]:
    """A warning when the timed steps spread beyond NOISY_SPREAD, else None."""
    if times["count"] < 2 or not times["p10"] or times["p90"] / times["p10"] <= NOISY_SPREAD:
        return None
    return (f"NOISY: p90 is {times['p90'] / times['p10']:.1f}x p10 (more than {NOISY_SPREAD:g}x): is something "
            "else running here? Medians this noisy cannot rank graph choices")


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
        *([("step time noise", noise(times))] if noise(times) else []),
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
