"""Sweep report: one row per job, from the result.json files the trainer leaves in job dirs.

    graphbridge-report multirun/2026-11-21/21-15-40-123456

writes summary.md, summary.csv and summary.png into that directory (the Hydra callback does
the same when a multirun ends). Jobs that failed, were rejected or never wrote a result stay
in the table as rows with their status and blank measurements.
"""

import argparse
import csv
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from bridge.atomic import write_text_atomic

MIN_TIMED_STEPS = 30
SUMMARY_FILES = ("summary.md", "summary.csv", "summary.png")
EAGER_COLOR, GRAPHED_COLOR = "#8c8c8c", "#76b900"
# Overrides that pick the graph configuration: they differ between a job and its eager
# baseline by design, so baseline matching ignores them.
GRAPH_KEYS = re.compile(r"^(cuda_graph|model\.cuda_graph_\w+)$")


@dataclass
class Job:
    name: str
    """The job directory relative to the sweep directory (Hydra's job number)."""
    status: str
    reason: Optional[str]
    choices: Dict[str, str]
    overrides: Dict[str, str]
    result: dict = field(default_factory=dict)

    @property
    def cuda_graph(self) -> Optional[str]:
        # A command-line choice is keyed cuda_graph; a recipe's own default, cuda_graph@_global_.
        return (self.choices.get("cuda_graph") or self.choices.get("cuda_graph@_global_")
                or self.overrides.get("cuda_graph"))

    @property
    def effective_impl(self) -> Optional[str]:
        return self.result.get("effective_impl")

    @property
    def step_time(self) -> dict:
        return self.result.get("step_time_ms") or {}

    @property
    def peak_allocated_gb(self) -> Optional[float]:
        return (self.result.get("memory") or {}).get("peak_allocated_gb")

    @property
    def other_overrides(self) -> Dict[str, str]:
        return {key: value for key, value in self.overrides.items() if not GRAPH_KEYS.match(key)}


@dataclass
class Summary:
    directory: Path
    title: str
    swept_keys: List[str]
    """Overrides that vary between jobs, besides cuda_graph (which always gets a column)."""
    rows: List[dict]


# --- reading ---------------------------------------------------------------------------------


def load_jobs(sweep_dir: Path) -> List[Job]:
    """Every job under ``sweep_dir``: a dir with a result.json or with Hydra's .hydra/ record."""
    job_dirs = {path.parent for path in sweep_dir.rglob("result.json")}
    job_dirs |= {path.parent.parent for path in sweep_dir.rglob(".hydra/overrides.yaml")}
    return [_load_job(sweep_dir, job_dir) for job_dir in sorted(job_dirs, key=_natural_key)]


def _load_job(sweep_dir: Path, job_dir: Path) -> Job:
    name = job_dir.relative_to(sweep_dir).as_posix()
    result_path = job_dir / "result.json"
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        job = result.get("job") or {}
        return Job(name, result.get("status", "unknown"), result.get("reason"),
                   dict(job.get("choices") or {}), _override_dict(job.get("overrides") or []), result)
    # Hydra records what the job was asked to do even when it never wrote a result.
    hydra_dir = job_dir / ".hydra"
    overrides = yaml.safe_load((hydra_dir / "overrides.yaml").read_text()) or []
    hydra_yaml = hydra_dir / "hydra.yaml"
    choices = {}
    if hydra_yaml.is_file():
        choices = yaml.safe_load(hydra_yaml.read_text())["hydra"]["runtime"]["choices"]
    return Job(name, "missing", "no result.json (the job was killed or never started)",
               {k: v for k, v in choices.items() if not k.startswith("hydra/")}, _override_dict(overrides))


def _override_dict(overrides: Sequence[str]) -> Dict[str, str]:
    pairs = (text.partition("=") for text in overrides)
    return {key.lstrip("+~"): value for key, _, value in pairs if not key.startswith("hydra.")}


def _natural_key(path: Path) -> list:
    """Job 10 after job 9: compare digit runs as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", str(path))]


# --- summarising -----------------------------------------------------------------------------


def summarize(sweep_dir: Path, jobs: List[Job]) -> Summary:
    swept = _swept_keys(jobs)
    eager = _eager_jobs(jobs)
    rows = [_row(job, _baseline_for(job, eager), swept) for job in jobs]
    return Summary(sweep_dir, _title(jobs), swept, rows)


def _swept_keys(jobs: List[Job]) -> List[str]:
    keys = []
    for job in jobs:
        keys += [key for key in job.overrides if key not in keys and key != "cuda_graph"]
    return [key for key in keys if len({job.overrides.get(key) for job in jobs}) > 1]


def _eager_jobs(jobs: List[Job]) -> List[Job]:
    eager = [job for job in jobs
             if job.status == "completed" and job.effective_impl == "none" and job.step_time.get("median")]
    # A graph choice that fell back to eager (TE graphs on the torch engine) measures eager too,
    # but the cuda_graph=none job is the baseline the sweep was designed around.
    return [job for job in eager if job.cuda_graph == "none"] or eager


def _baseline_for(job: Job, eager: List[Job]) -> Optional[Job]:
    if len(eager) == 1:
        return eager[0]
    matching = [candidate for candidate in eager if candidate.other_overrides == job.other_overrides]
    return matching[0] if matching else None


def _row(job: Job, baseline: Optional[Job], swept: List[str]) -> dict:
    step = job.step_time
    memory = job.result.get("memory") or {}
    measured = job.status == "completed" and bool(step.get("median"))
    speedup = overhead = None
    if measured and baseline is not None:
        speedup = baseline.step_time["median"] / step["median"]
        if job.peak_allocated_gb is not None and baseline.peak_allocated_gb is not None:
            overhead = job.peak_allocated_gb - baseline.peak_allocated_gb
    row = {"job": job.name, "cuda_graph": job.cuda_graph}
    row.update({key: job.overrides.get(key) for key in swept})
    row.update({
        "status": job.status,
        "effective_impl": job.effective_impl,
        "step_ms_median": step.get("median"),
        "step_ms_p10": step.get("p10"),
        "step_ms_p90": step.get("p90"),
        "timed_steps": step.get("count"),
        "speedup": speedup,
        "tokens_per_s": job.result.get("tokens_per_s"),
        "tflops_per_gpu": job.result.get("tflops_per_gpu"),
        "peak_allocated_gb": memory.get("peak_allocated_gb"),
        "peak_reserved_gb": memory.get("peak_reserved_gb"),
        "memory_overhead_gb": overhead,
        "capture_time_s": job.result.get("capture_time_s"),
        # perf.profile=true: kernel time / step time, how close the step is to launch-free.
        "gpu_busy": (job.result.get("profile") or {}).get("gpu_busy"),
        "graph_count": job.result.get("graph_count"),
        "baseline_job": baseline.name if baseline else None,
        "note": _note(job, measured, baseline),
    })
    return row


def _note(job: Job, measured: bool, baseline: Optional[Job]) -> str:
    if job.status != "completed":
        return job.reason or ""
    notes = []
    count = job.step_time.get("count") or 0
    if not measured:
        notes.append("no timed steps: raise train.train_iters above the warmup and capture steps")
    elif count < MIN_TIMED_STEPS:
        notes.append(f"only {count} timed steps (< {MIN_TIMED_STEPS}): noisy")
    if job.cuda_graph not in (None, "none") and job.effective_impl == "none":
        notes.append("ran eagerly")
    if measured and baseline is None:
        notes.append("no eager job with the same other overrides")
    return "; ".join(notes)


def _title(jobs: List[Job]) -> str:
    def unique(values) -> str:
        return ", ".join(dict.fromkeys(str(value) for value in values if value))

    results = [job.result for job in jobs if job.result]
    engine = unique(result.get("engine") for result in results)
    parts = [
        unique(job.choices.get("recipe") for job in jobs),
        f"{engine} engine" if engine else "",
        unique((result.get("env") or {}).get("gpu") or result.get("device") for result in results),
    ]
    return "CUDA graphs: " + " · ".join(part for part in parts if part)


# --- writing ---------------------------------------------------------------------------------


def build_summary(sweep_dir: Path) -> Summary:
    return summarize(sweep_dir, load_jobs(sweep_dir))


def write_summary(summary: Summary) -> None:
    """Write summary.md, summary.csv and summary.png into the sweep directory."""
    write_csv(summary, summary.directory / "summary.csv")
    write_markdown(summary, summary.directory / "summary.md")
    write_plot(summary, summary.directory / "summary.png")


def write_csv(summary: Summary, path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=list(summary.rows[0]))
    writer.writeheader()
    writer.writerows(summary.rows)
    write_text_atomic(path, text.getvalue())


def display_table(summary: Summary) -> Tuple[List[str], List[list]]:
    """Headers and formatted cells shared by summary.md and the console table."""
    headers = ["job", "cuda_graph", *summary.swept_keys, "status", "impl", "step ms (median)",
               "p10–p90 ms", "speedup", "tokens/s", "TFLOP/s/GPU", "peak alloc GB",
               "Δ mem vs eager", "capture s", "note"]
    profiled = any(row["gpu_busy"] is not None for row in summary.rows)
    if profiled:
        headers.insert(-1, "GPU busy")
    cells = []
    for row in summary.rows:
        speedup = _fmt(row["speedup"], "{:.2f}×")
        if _is_baseline(row):
            speedup += " (baseline)"
        spread = ""
        if row["step_ms_p10"] is not None and row["step_ms_p90"] is not None:
            spread = f"{row['step_ms_p10']:.2f}–{row['step_ms_p90']:.2f}"
        warning = "⚠ " if row["step_ms_median"] is not None and row["timed_steps"] < MIN_TIMED_STEPS else ""
        cells.append([
            row["job"], row["cuda_graph"] or "", *[row[key] or "" for key in summary.swept_keys],
            row["status"], row["effective_impl"] or "", warning + _fmt(row["step_ms_median"], "{:.2f}"),
            spread, speedup, _fmt(row["tokens_per_s"], "{:,.0f}"), _fmt(row["tflops_per_gpu"], "{:.3g}"),
            _fmt(row["peak_allocated_gb"], "{:.2f}"), _fmt(row["memory_overhead_gb"], "{:+.2f} GB"),
            _fmt(row["capture_time_s"], "{:.2f}"), *([_fmt(row["gpu_busy"], "{:.0%}")] if profiled else []),
            row["note"],
        ])
    return headers, cells


def write_markdown(summary: Summary, path: Path) -> None:
    headers, cells = display_table(summary)
    status_counts = Counter(row["status"] for row in summary.rows)
    lines = [
        f"# {summary.title}",
        "",
        f"Sweep `{summary.directory}`: {len(summary.rows)} jobs "
        f"({', '.join(f'{n} {status}' for status, n in status_counts.items())}).",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in cells]
    lines += [
        "",
        "## How to read this",
        "",
        "- Step times exclude the warmup and graph-capture steps (the trainer drops them); the median, "
        "p10 and p90 are over each job's timed steps.",
        "- Speedup is the eager job's median step time over this job's, against the sweep's "
        "`cuda_graph=none` job with the same other overrides. Δ mem is peak allocated memory minus "
        "that job's.",
        f"- ⚠ marks medians over fewer than {MIN_TIMED_STEPS} timed steps: too few to trust small "
        "differences; raise `train.train_iters`.",
        "- A successful capture is not a speedup guarantee: repeat the A/B after any dispatcher, "
        "overlap, precision or recompute change.",
    ]
    write_text_atomic(path, "\n".join(lines) + "\n")


def write_plot(summary: Summary, path: Path) -> None:
    # A Figure without pyplot renders with Agg and touches no global state or display.
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = summary.rows
    has_memory = any(row["peak_allocated_gb"] is not None for row in rows)
    panels = 2 if has_memory else 1  # CPU runs have no device memory to show
    figure = Figure(figsize=(panels * max(6.0, 0.9 * len(rows) + 2.5), 6.0), layout="constrained")
    axes = figure.subplots(1, panels, squeeze=False)[0]
    figure.suptitle(summary.title, fontsize=15, fontweight="bold")
    positions = list(range(len(rows)))
    colors = [EAGER_COLOR if row["effective_impl"] == "none" else GRAPHED_COLOR for row in rows]

    time_axis = axes[0]
    medians = [row["step_ms_median"] or 0.0 for row in rows]
    below = [median - (row["step_ms_p10"] or median) for median, row in zip(medians, rows)]
    above = [(row["step_ms_p90"] or median) - median for median, row in zip(medians, rows)]
    time_axis.bar(positions, medians, yerr=[below, above], capsize=5, color=colors)
    time_axis.set_title("Step time: median with p10–p90 bars (lower is better)")
    time_axis.set_ylabel("ms per step")
    for x, row, top in zip(positions, rows, (median + gap for median, gap in zip(medians, above))):
        time_axis.annotate(_bar_label(row), (x, top), xytext=(0, 4), textcoords="offset points", ha="center",
                           fontsize=11, fontweight="bold", color="black" if row["status"] == "completed" else "red")

    if has_memory:
        memory_axis = axes[1]
        memory_axis.bar(positions, [row["peak_allocated_gb"] or 0.0 for row in rows], color=colors)
        memory_axis.set_title("Peak allocated memory")
        memory_axis.set_ylabel("GB")
        for x, row in zip(positions, rows):
            if row["peak_allocated_gb"] is not None:
                text = (f"{row['peak_allocated_gb']:.2f} GB" if _is_baseline(row)
                        else _fmt(row["memory_overhead_gb"], "{:+.2f} GB"))
                memory_axis.annotate(text, (x, row["peak_allocated_gb"]), xytext=(0, 4),
                                     textcoords="offset points", ha="center", fontsize=10)

    # One tick line per swept key; the key names go once into the axis label.
    labels = ["\n".join([str(row["cuda_graph"] or row["job"])] + [str(row[key]) for key in summary.swept_keys])
              for row in rows]
    for axis in axes:
        axis.set_xticks(positions, labels, fontsize=10)
        axis.set_xlabel(" / ".join(["cuda_graph", *summary.swept_keys]))
        axis.margins(y=0.18)
        axis.grid(axis="y", alpha=0.3)
    figure.legend(handles=[Patch(color=EAGER_COLOR, label="eager"), Patch(color=GRAPHED_COLOR, label="graphed")],
                  loc="outside lower center", ncols=2, frameon=False)
    partial = path.with_name(f".{path.name}.tmp")  # a reader never sees half a PNG
    figure.savefig(partial, dpi=150, format="png")
    os.replace(partial, path)


def _bar_label(row: dict) -> str:
    if row["status"] != "completed":
        return row["status"]
    if row["step_ms_median"] is None:
        return "no timed steps"
    label = "baseline" if _is_baseline(row) else _fmt(row["speedup"], "{:.2f}×") or "no baseline"
    if row["timed_steps"] < MIN_TIMED_STEPS:
        label += f"\n(n={row['timed_steps']})"
    return label


def print_summary(summary: Summary) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    headers, cells = display_table(summary)
    table = Table(title=summary.title)
    for header in headers:
        # Reasons can list several violations: kept narrow here, in full in summary.md.
        table.add_column(header, max_width=40 if header == "note" else None)
    for row in cells:
        table.add_row(*(Text(str(cell)) for cell in row))  # Text: reasons hold [rule] brackets, not markup
    console = Console()
    console.print(table)
    console.print(f"written: {', '.join(str(summary.directory / name) for name in SUMMARY_FILES)}")


def _is_baseline(row: dict) -> bool:
    return row["baseline_job"] == row["job"]


def _fmt(value, spec: str) -> str:
    return "" if value is None else spec.format(value)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="graphbridge-report",
        description="Rebuild summary.md, summary.csv and summary.png of a sweep from its result.json files.",
    )
    parser.add_argument("directory", type=Path, help="the sweep directory (hydra.sweep.dir) or one job directory")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory} is not a directory; pass the sweep directory (hydra.sweep.dir)")
    summary = build_summary(args.directory)
    if not summary.rows:
        parser.error(f"no jobs under {args.directory}: no result.json and no .hydra/overrides.yaml found")
    write_summary(summary)
    print_summary(summary)
    return 0
