"""Sweep report: one row per job, from the result.json files the trainer leaves in job dirs.

    graphbridge-report multirun/2026-11-21/21-15-40-123456

writes summary.md, summary.csv and summary.png into that directory (the Hydra callback does
the same when a multirun ends; perf/report_tables.py renders them). A sweep directory holds one
sweep (perf/outputs.py refuses a second one there), and its report holds that sweep's jobs only: not
those of another sweep whose directory lies inside it, nor a single run made there; a directory that
is no sweep's (a date directory holding several) is refused, naming the sweeps. Jobs that failed,
were refused, never wrote a result or left one that cannot be read stay in the table as rows with
their status and blank measurements; a job that asked for graphs but ran eagerly (no CUDA device)
gets no speedup. With perf.profile=true the eager job's GPU-busy fraction says what graphs can buy:
a launch-bound step (GPU idle between kernels) gains up to 1/busy, a compute-bound one (busy >= 90 %)
about nothing.
"""

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, NoReturn, Optional, Sequence

import yaml

from bridge.atomic import WriteError
from bridge.config.graphs import chosen_graph_choice
from bridge.result import MIN_TIMED_STEPS, REFUSED_HERE
from perf.report_tables import print_summary, write_summary

COMPUTE_BOUND = 0.9
"""GPU busy from which a step counts as compute-bound: graphs remove launch gaps, and there are few."""
# Overrides that pick the graph configuration: they differ between a job and its eager
# baseline by design, so baseline matching ignores them.
GRAPH_KEYS = re.compile(r"^(cuda_graph|model\.cuda_graph_\w+)$")
SWEEP_RECORD = "multirun.yaml"
"""What Hydra writes into every sweep directory when the sweep starts."""


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
        return chosen_graph_choice(self.choices) or self.overrides.get("cuda_graph")

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
    """Every job of the sweep in ``sweep_dir`` (or the one job ``sweep_dir`` is)."""
    return [_load_job(sweep_dir, job_dir) for job_dir in sorted(job_dirs(sweep_dir), key=_natural_key)]


def is_job(directory: Path) -> bool:
    """A job directory: the trainer's result.json, or Hydra's record of the job when it left none."""
    return (directory / "result.json").exists() or (directory / ".hydra" / "overrides.yaml").is_file()


def job_dirs(directory: Path, top: bool = True) -> List[Path]:
    """The job directories of one sweep: never below a job (its ranks/, tensorboard/), in another sweep's
    directory (its own multirun.yaml), in a single run Hydra made there (hydra.mode RUN) or behind a link."""
    if not top and ((directory / SWEEP_RECORD).is_file() or _single_run(directory)):
        return []
    if is_job(directory):
        return [directory]
    try:
        children = sorted(child for child in directory.iterdir()
                          if child.is_dir() and not child.is_symlink() and not child.name.startswith("."))
    except OSError:
        return []
    return [job for child in children for job in job_dirs(child, top=False)]


def _single_run(directory: Path) -> bool:
    try:
        return (yaml.safe_load((directory / ".hydra" / "hydra.yaml").read_text()) or {})["hydra"]["mode"] == "RUN"
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return False


def sweeps_below(directory: Path) -> List[Path]:
    """The sweep directories under ``directory``, for a report asked of their parent."""
    return sorted((record.parent for record in directory.rglob(SWEEP_RECORD)), key=_natural_key)


def _load_job(sweep_dir: Path, job_dir: Path) -> Job:
    name = job_dir.relative_to(sweep_dir).as_posix()
    try:
        if (job_dir / "result.json").exists():
            result = json.loads((job_dir / "result.json").read_text())
            if not isinstance(result, dict):
                raise ValueError(f"a JSON {type(result).__name__}, not an object")
            _check_fields(result)
            job = result.get("job") or {}
            return Job(name, str(result.get("status", "unknown")), result.get("reason"),
                       dict(job.get("choices") or {}), _override_dict(job.get("overrides") or []), result)
        # Hydra records what the job was asked to do even when it never wrote a result.
        overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
        hydra_yaml = job_dir / ".hydra" / "hydra.yaml"
        choices = yaml.safe_load(hydra_yaml.read_text())["hydra"]["runtime"]["choices"] if hydra_yaml.is_file() else {}
        return Job(name, "missing", "no result.json (the job was killed or never started)",
                   {k: v for k, v in choices.items() if not k.startswith("hydra/")}, _override_dict(overrides))
    except (OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as error:
        return Job(name, "unreadable", f"its record cannot be read: {type(error).__name__}: {error}"[:300], {}, {})


NUMBER = (int, float)
RESULT_FIELDS = {
    "status": str, "reason": str, "effective_impl": str, "engine": str, "device": str,
    "job": dict, "job.choices": dict, "job.overrides": list,
    "step_time_ms": dict, "step_time_ms.median": NUMBER, "step_time_ms.p10": NUMBER, "step_time_ms.p90": NUMBER,
    "step_time_ms.count": NUMBER, "memory": dict, "memory.peak_allocated_gb": NUMBER,
    "memory.peak_reserved_gb": NUMBER, "profile": dict, "profile.gpu_busy": NUMBER, "env": dict, "env.gpu": str,
    "tokens_per_s": NUMBER, "tflops_per_gpu": NUMBER, "capture_time_s": NUMBER, "graph_count": NUMBER,
}
"""What the report reads from a result.json, and the types it can read (null is always allowed)."""


def _check_fields(result: dict) -> None:
    """ValueError naming the first field the report reads that has another type (a damaged file)."""
    for dotted, kind in RESULT_FIELDS.items():
        node = result
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and not isinstance(node, kind):
            raise ValueError(f"{dotted} is a JSON {type(node).__name__}")


def _override_dict(overrides: Sequence[str]) -> Dict[str, str]:
    pairs = (str(text).partition("=") for text in overrides)
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


def ran_eagerly(job: Job) -> bool:
    """It asked for graphs and captured none (graphs need a CUDA device): its time is an eager time."""
    return job.cuda_graph not in (None, "none") and job.effective_impl == "none"


def expected_gain(gpu_busy: Optional[float]) -> Optional[str]:
    """What graphs can buy a step whose eager GPU-busy fraction is ``gpu_busy``: launch gaps are all
    they remove, so at most 1/busy; compute-bound steps gain about nothing (and that is expected)."""
    if not gpu_busy:
        return None
    ceiling = f"graphs can buy up to {1 / gpu_busy:.1f}x"
    if gpu_busy >= COMPUTE_BOUND:
        return f"compute-bound ({gpu_busy:.0%} busy eager): graphs neutral, as expected"
    return f"launch-bound ({gpu_busy:.0%} busy eager): {ceiling}"


def _row(job: Job, baseline: Optional[Job], swept: List[str]) -> dict:
    step = job.step_time
    memory = job.result.get("memory") or {}
    measured = job.status == "completed" and bool(step.get("median"))
    speedup = overhead = None
    baseline_busy = (baseline.result.get("profile") or {}).get("gpu_busy") if baseline else None
    if measured and baseline is not None and not ran_eagerly(job):
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
        "bound": expected_gain(baseline_busy),
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
    if ran_eagerly(job):
        notes.append("ran eagerly (no CUDA device): no speedup to show")
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


def exit_code(summary: Summary) -> int:
    """A sweep's verdict: 1 when a job failed, was interrupted, left no or an unreadable result; else 2
    when a job was refused (an invalid config, or one this machine cannot run); else 0."""
    statuses = {row["status"] for row in summary.rows}
    refused = {"invalid", REFUSED_HERE}
    if statuses - {"completed"} - refused:
        return 1
    return 2 if statuses & refused else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="graphbridge-report",
        description="Rebuild summary.md, summary.csv and summary.png of a sweep from its result.json files.",
    )
    parser.add_argument("directory", type=Path, help="the sweep directory (hydra.sweep.dir) or one job directory")
    args = parser.parse_args(argv)
    directory = args.directory
    if not directory.is_dir():
        refuse(f"{directory} is not a directory; pass the sweep directory (hydra.sweep.dir)")
    if not (directory / SWEEP_RECORD).is_file() and not is_job(directory):
        # A report covers one sweep: never the rows of several sweeps, or of single runs, in one table.
        sweeps = sweeps_below(directory)
        listing = f"; it holds {len(sweeps)} sweeps, pass one: {', '.join(map(str, sweeps[:5]))}" if sweeps else ""
        refuse(f"{directory} is not a sweep directory (no {SWEEP_RECORD}, which Hydra writes into each) "
               f"nor a job directory{listing}")
    summary = build_summary(directory)
    if not summary.rows:
        refuse(f"no jobs under {directory}: no result.json and no .hydra/overrides.yaml found")
    try:
        write_summary(summary)
    except WriteError as error:
        print(f"graphbridge-report: {error}", file=sys.stderr)
        return 1
    print_summary(summary)
    return 0


def refuse(message: str) -> NoReturn:
    """Bad input is one line and exit status 2."""
    print(f"graphbridge-report: {message}", file=sys.stderr)
    sys.exit(2)
