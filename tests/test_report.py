"""The sweep report, from synthetic result.json files laid out as a Hydra multirun leaves them."""

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from omegaconf import OmegaConf

from perf.callbacks import SummaryCallback
from perf.report import build_summary, expected_gain, main, write_summary
from perf.report_tables import summary_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def add_job(sweep: Path, num: int, choice: str, status: str = "completed", *, median=None, count=40,
            peak_gb=None, effective_impl=None, reason=None, extra_overrides=()) -> Path:
    """A job directory as Hydra and the trainer leave it; status "missing" writes no result.json."""
    job_dir = sweep / str(num)
    (job_dir / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra:\n  mode: MULTIRUN\n")  # as Hydra starts every sweep
    overrides = [f"cuda_graph={choice}", *extra_overrides]
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if status == "missing":
        return job_dir
    result = {"status": status, "reason": reason,
              "job": {"choices": {"recipe": "llama/tiny", "cuda_graph": choice}, "overrides": overrides}}
    if status == "completed":
        result.update({
            "engine": "megatron", "device": "cuda", "impl": choice, "effective_impl": effective_impl or choice,
            "modules": [], "train_iters": count + 4, "steps_completed": count + 4,
            "step_time_ms": {"median": median, "p10": median * 0.9, "p90": median * 1.2, "mean": median,
                             "count": count},
            "capture_step": None, "capture_time_s": None if choice == "none" else 2.0, "graph_count": 1,
            "tokens_per_s": 1e6 / median, "tflops_per_gpu": 4000 / median,
            "memory": {"peak_allocated_gb": peak_gb, "peak_reserved_gb": peak_gb and peak_gb + 1},
            "loss": [10.0, 9.0], "env": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.9", "python": "3.11"},
        })
    (job_dir / "result.json").write_text(json.dumps(result))
    return job_dir


@pytest.fixture
def scope_sweep(tmp_path):
    """The dense_scopes sweep with every outcome a job can have."""
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=100.0, peak_gb=10.0, effective_impl="none")
    add_job(sweep, 1, "full_iteration", median=80.0, peak_gb=12.5)
    add_job(sweep, 2, "local_layer", median=125.0, peak_gb=11.0, effective_impl="local", count=12)
    add_job(sweep, 3, "te_layer", "failed", reason="RuntimeError: operation not permitted when stream is capturing")
    add_job(sweep, 4, "te_attn", "invalid", reason="[engine_impl] engine, model.cuda_graph_impl: no TE graphs")
    add_job(sweep, 5, "te_attn_mlp", "missing")
    return sweep


def read_rows(sweep: Path):
    with (sweep / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_every_job_is_a_row_with_its_status_and_speedup_against_the_eager_job(scope_sweep):
    assert main([str(scope_sweep)]) == 0
    for name in ("summary.md", "summary.csv"):
        assert (scope_sweep / name).stat().st_size > 0
    assert (scope_sweep / "summary.png").read_bytes()[:8] == PNG_MAGIC

    rows = read_rows(scope_sweep)
    assert [(r["job"], r["cuda_graph"], r["status"]) for r in rows] == [
        ("0", "none", "completed"), ("1", "full_iteration", "completed"), ("2", "local_layer", "completed"),
        ("3", "te_layer", "failed"), ("4", "te_attn", "invalid"), ("5", "te_attn_mlp", "missing"),
    ]
    assert [r["speedup"] for r in rows] == ["1.0", "1.25", "0.8", "", "", ""]
    assert [r["memory_overhead_gb"] for r in rows[:3]] == ["0.0", "2.5", "1.0"]
    assert {r["baseline_job"] for r in rows} == {"0"}
    assert rows[1]["capture_time_s"] == "2.0" and rows[1]["step_ms_p90"] == "96.0"
    assert "operation not permitted" in rows[3]["note"] and "[engine_impl]" in rows[4]["note"]
    assert rows[5]["note"].startswith("no result.json")
    assert all(r["step_ms_median"] == "" for r in rows[3:])


def test_markdown_has_the_title_the_table_and_flags_short_measurements(scope_sweep):
    write_summary(build_summary(scope_sweep))
    markdown = (scope_sweep / "summary.md").read_text()
    assert markdown.startswith("# CUDA graphs: llama/tiny · megatron engine · NVIDIA H100 80GB HBM3")
    assert "6 jobs (3 completed, 1 failed, 1 invalid, 1 missing)" in markdown
    assert "| 1 | full_iteration | completed | full_iteration | 80.00 | 72.00–96.00 | 1.25× |" in markdown
    assert "1.00× (baseline)" in markdown
    local_layer = next(line for line in markdown.splitlines() if "| local_layer |" in line)
    assert "⚠ 125.00" in local_layer and "only 12 timed steps (&lt; 30)" in local_layer  # < escaped for HTML
    assert "warmup and graph-capture steps" in markdown


def test_a_profiled_sweep_shows_the_gpu_busy_fraction(tmp_path):
    sweep = tmp_path / "sweep"
    for num, (choice, median, busy) in enumerate([("none", 40.0, 0.09), ("full_iteration", 4.0, 0.91)]):
        job_dir = add_job(sweep, num, choice, median=median, peak_gb=1.0)
        result = json.loads((job_dir / "result.json").read_text())
        result["profile"] = {"trace": "trace.json", "steps": [40], "gpu_ms_per_step": busy * median, "gpu_busy": busy}
        (job_dir / "result.json").write_text(json.dumps(result))
    write_summary(build_summary(sweep))
    assert [row["gpu_busy"] for row in read_rows(sweep)] == ["0.09", "0.91"]
    markdown = (sweep / "summary.md").read_text()
    assert "| GPU busy |" in markdown and "| 91% |" in markdown


def test_an_unprofiled_sweep_has_no_gpu_busy_column(scope_sweep):
    write_summary(build_summary(scope_sweep))
    assert "GPU busy" not in (scope_sweep / "summary.md").read_text()


def test_with_another_swept_key_each_job_is_compared_with_the_eager_job_of_its_own_settings(tmp_path):
    sweep = tmp_path / "sweep"
    for num, (choice, hidden, median, impl) in enumerate([
        ("none", 128, 10.0, "none"), ("full_iteration", 128, 5.0, None),
        ("none", 256, 30.0, "none"), ("full_iteration", 256, 20.0, None),
        ("full_iteration", 512, 40.0, None),
    ]):
        add_job(sweep, num, choice, median=median, effective_impl=impl,
                extra_overrides=[f"model.hidden_size={hidden}", "train.train_iters=50"])
    summary = build_summary(sweep)
    assert summary.swept_keys == ["model.hidden_size"]  # train_iters is the same everywhere
    write_summary(summary)
    rows = read_rows(sweep)
    assert [(r["model.hidden_size"], r["speedup"], r["baseline_job"]) for r in rows] == [
        ("128", "1.0", "0"), ("128", "2.0", "0"), ("256", "1.0", "2"), ("256", "1.5", "2"), ("512", "", ""),
    ]
    assert rows[4]["note"] == "no eager job with the same other overrides"


def test_a_graph_choice_that_ran_eagerly_shows_no_speedup_anywhere(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "te_attn", median=8.8, effective_impl="none")  # an eager time: no speedup to claim
    add_job(sweep, 1, "none", median=10.0, effective_impl="none")
    summary = build_summary(sweep)
    assert [row["baseline_job"] for row in summary.rows] == ["1", "1"]
    assert summary.rows[0]["speedup"] is None and "ran eagerly" in summary.rows[0]["note"]
    drawn, annotate = [], Axes.annotate  # the PNG's bar labels, as they are drawn
    monkeypatch.setattr(Axes, "annotate", lambda axis, text, *args, **kwargs: (
        drawn.append(text), annotate(axis, text, *args, **kwargs))[1])
    write_summary(summary)
    assert drawn[:2] == ["ran eagerly", "baseline"] and not any("×" in text for text in drawn)
    fallback = next(line for line in (sweep / "summary.md").read_text().splitlines() if "| te_attn |" in line)
    assert "ran eagerly" in fallback and "×" not in fallback
    assert read_rows(sweep)[0]["speedup"] == ""


def test_a_recipe_chosen_cuda_graph_names_the_row(tmp_path):
    sweep = tmp_path / "sweep"
    job_dir = add_job(sweep, 0, "none", median=10.0, effective_impl="none")
    result = json.loads((job_dir / "result.json").read_text())
    result["job"] = {"choices": {"cuda_graph": None, "cuda_graph@_global_": "te_attn"}, "overrides": []}
    (job_dir / "result.json").write_text(json.dumps(result))
    assert build_summary(sweep).rows[0]["cuda_graph"] == "te_attn"


def test_jobs_are_in_hydra_job_order(tmp_path):
    sweep = tmp_path / "sweep"
    for num in (10, 9, 2):
        add_job(sweep, num, "none", median=float(num), effective_impl="none")
    assert [row["job"] for row in build_summary(sweep).rows] == ["2", "9", "10"]


def test_a_cpu_sweep_without_memory_data_still_plots(tmp_path):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=10.0, effective_impl="none")
    add_job(sweep, 1, "full_iteration", median=9.0, effective_impl="none", count=3)
    write_summary(build_summary(sweep))
    assert (sweep / "summary.png").read_bytes()[:8] == PNG_MAGIC
    assert read_rows(sweep)[1]["peak_allocated_gb"] == ""


def test_console_script_rebuilds_the_summary_and_prints_the_table(report_cli, scope_sweep):
    result = report_cli(str(scope_sweep), cwd=scope_sweep, timeout=120,
                        env={**os.environ, "COLUMNS": "250"})  # wide enough for whole cells
    assert result.returncode == 0, result.stderr
    assert "CUDA graphs: llama/tiny" in result.stdout and "[engine_impl]" in result.stdout
    assert "summary.png" in result.stdout


@pytest.mark.parametrize("layout,message", [("empty", "is not a sweep directory"), ("started", "no jobs under"),
                                            ("absent", "is not a directory")])
def test_console_script_refuses_a_directory_without_jobs(report_cli, tmp_path, layout, message):
    directory = tmp_path / "sweep"
    if layout != "absent":
        directory.mkdir()
    if layout == "started":  # Hydra began the sweep, and no job got as far as its record
        (directory / "multirun.yaml").write_text("hydra:\n  mode: MULTIRUN\n")
    result = report_cli(str(directory), cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert message in result.stderr and "Traceback" not in result.stderr


def test_callback_writes_the_summary_when_the_multirun_ends(scope_sweep):
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(scope_sweep)}}})
    SummaryCallback().on_multirun_end(config)
    assert all((scope_sweep / name).is_file() for name in ("summary.md", "summary.csv", "summary.png"))


def test_callback_writes_nothing_for_a_plan_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", "missing")
    SummaryCallback().on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    assert not (sweep / "summary.md").exists()


def test_callback_module_is_import_light():
    # Hydra instantiates callbacks at the start of every run, plans included.
    code = ("import sys, perf.callbacks; heavy = {'torch', 'matplotlib', 'megatron', 'perf.report'} & "
            "set(sys.modules); assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


DAMAGED_RESULTS = ['{"status": "comp', "[1, 2]", "\xff\xfe not json", "", '{"status": 5}',
                   '{"status": "completed", "step_time_ms": [1]}', '{"status": "completed", "job": "x"}',
                   '{"status": "completed", "step_time_ms": {"median": "fast", "count": 40}}',
                   '{"status": "completed", "step_time_ms": {"median": 3.0, "count": "x"}}',
                   '{"status": "completed", "memory": 3}', '{"status": "completed", "profile": {"gpu_busy": "x"}}']
"""Truncated, empty, not UTF-8, not an object, and fields of the wrong type."""


def test_one_unreadable_result_is_a_row_not_a_traceback(report_cli, tmp_path):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=10.0)
    for num, text in enumerate(DAMAGED_RESULTS, 1):
        job_dir = add_job(sweep, num, "te_attn", status="missing")
        (job_dir / "result.json").write_bytes(text.encode("latin-1"))
    (add_job(sweep, len(DAMAGED_RESULTS) + 1, "te_layer", status="missing") / "result.json").mkdir()
    result = report_cli(str(sweep), cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    rows = read_rows(sweep)
    assert [row["status"] for row in rows] == ["completed"] + ["unreadable"] * (len(DAMAGED_RESULTS) + 1)
    assert all(row["note"].startswith("its record cannot be read") for row in rows[1:])
    assert "step_time_ms.median is a JSON str" in rows[8]["note"]


@pytest.mark.parametrize("in_the_way", ["summary.png", "summary.md"])
def test_a_summary_that_cannot_be_written_is_one_line_and_leaves_no_partial_file(report_cli, tmp_path, in_the_way):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=10.0)
    (sweep / in_the_way).mkdir()
    result = report_cli(str(sweep), cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == f"graphbridge-report: cannot write {sweep / in_the_way}: Is a directory\n"
    assert not [path for path in sweep.iterdir() if path.name.endswith(".tmp")]


def test_user_text_is_escaped_for_markdown_html_csv_and_the_terminal(report_cli, tmp_path):
    sweep = tmp_path / "sweep"
    hostile = "a|b\n<script>alert(1)</script>\x1b[31mred c\\|d ![i](http://x/t.png) `code` *em* _em_ ~~del~~"
    add_job(sweep, 0, "none", median=10.0, extra_overrides=[f"+env_vars.X={hostile}"])
    add_job(sweep, 1, "full_iteration", median=5.0, extra_overrides=["+env_vars.X==cmd|' /C calc'!A0"])
    result = report_cli(str(sweep), cwd=tmp_path, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    markdown = (sweep / "summary.md").read_text()
    assert "<script>" not in markdown and "&lt;script&gt;" in markdown and "\x1b" not in markdown
    assert "a\\|b" in markdown and all(line.count("|") >= 14 for line in markdown.splitlines() if line.startswith("| 0"))
    # Every markdown character of the value is escaped, a backslash before a bar included: the cells stay.
    assert ("c\\\\\\|d !\\[i\\](http://x/t.png) \\`code\\` \\*em\\* \\_em\\_ \\~\\~del\\~\\~" in markdown)
    header, row = (line for line in markdown.splitlines() if line.startswith(("| job", "| 0")))
    assert len(re.findall(r"(?<!\\)(?:\\\\)*\|", row)) == len(re.findall(r"\|", header))
    cells = [cell for row in read_rows(sweep) for cell in row.values()]
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in cells)
    assert "'=cmd|' /C calc'!A0" in cells
    assert "\x1b" not in result.stdout


@pytest.mark.parametrize("columns", [80, 100])
def test_the_terminal_table_fits_the_terminal(report_cli, scope_sweep, tmp_path, columns):
    result = report_cli(str(scope_sweep), cwd=tmp_path, env={**os.environ, "COLUMNS": str(columns)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    header = next(line for line in lines if "job" in line and "cuda_graph" in line)
    assert "speedup" in header and "status" in header and "…" not in result.stdout


def test_a_narrow_terminal_keeps_the_speedup_before_other_columns(report_cli, tmp_path):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=100.0, effective_impl="none")
    add_job(sweep, 1, "te_attn_moe_router", median=80.0, effective_impl="transformer_engine")
    add_job(sweep, 2, "te_moe", "cannot_run_here", reason="[engine_impl] engine: no TE graphs here")
    result = report_cli(str(sweep), cwd=tmp_path, env={**os.environ, "COLUMNS": "80"})
    header = next(line for line in result.stdout.splitlines() if "job" in line and "cuda_graph" in line)
    assert "speedup" in header and "impl" not in header.replace("cuda_graph", ""), result.stdout


def test_the_labels_of_jobs_without_a_bar_do_not_overlap(tmp_path):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=100.0, peak_gb=10.0, effective_impl="none")
    add_job(sweep, 1, "full_iteration", median=80.0, peak_gb=12.0)
    for num, choice in enumerate(["te_attn", "te_attn_mlp", "te_layer", "te_mlp"], start=2):
        add_job(sweep, num, choice, "cannot_run_here", reason="[engine_impl] engine: no TE graphs here")
    figure = summary_figure(build_summary(sweep))
    renderer = FigureCanvasAgg(figure).get_renderer()  # the renderer summary.png is drawn with
    figure.draw(renderer)
    labels = [text.get_window_extent(renderer) for text in figure.axes[0].texts]
    assert len(labels) == 6
    assert not [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:] if a.overlaps(b)]


def test_a_profiled_sweep_says_what_graphs_can_buy(tmp_path):
    sweep = tmp_path / "sweep"
    for num, (choice, median, busy) in enumerate([("none", 40.0, 0.2), ("full_iteration", 8.0, 0.95)]):
        job_dir = add_job(sweep, num, choice, median=median, peak_gb=1.0)
        result = json.loads((job_dir / "result.json").read_text())
        result["profile"] = {"gpu_busy": busy}
        (job_dir / "result.json").write_text(json.dumps(result))
    rows = build_summary(sweep).rows
    assert rows[1]["bound"] == "launch-bound (20% busy eager): graphs can buy up to 5.0x"
    compute = expected_gain(0.99)
    assert compute.startswith("compute-bound (99% busy eager)") and "neutral, as expected" in compute


def test_a_report_holds_its_own_sweeps_jobs_only(report_cli, tmp_path):
    sweep = tmp_path / "sweep"
    add_job(sweep, 0, "none", median=10.0)
    add_job(sweep, 1, "full_iteration", median=5.0)
    add_job(sweep / "later", 0, "te_attn", median=7.0)  # another sweep, its directory inside this one
    single = add_job(sweep / "probe", 0, "local_layer", median=6.0).parent  # a single run made here
    (single / "multirun.yaml").unlink()
    (single / "0" / ".hydra" / "hydra.yaml").write_text("hydra:\n  mode: RUN\n")
    (sweep / "loop").symlink_to(sweep)  # a link back up is not followed
    result = report_cli(str(sweep), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [(row["job"], row["cuda_graph"]) for row in read_rows(sweep)] == [("0", "none"), ("1", "full_iteration")]
    assert report_cli(str(sweep / "later"), cwd=tmp_path).returncode == 0
    assert [row["cuda_graph"] for row in read_rows(sweep / "later")] == ["te_attn"]


def test_a_directory_of_several_sweeps_is_refused_naming_them(report_cli, tmp_path):
    day = tmp_path / "multirun" / "2026-11-24"
    for sweep in ("12-00-00", "13-00-00"):
        add_job(day / sweep, 0, "none", median=10.0)
    result = report_cli(str(day), cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "is not a sweep directory (no multirun.yaml" in result.stderr and "holds 2 sweeps, pass one" in result.stderr
    assert str(day / "12-00-00") in result.stderr and not (day / "summary.md").exists()
