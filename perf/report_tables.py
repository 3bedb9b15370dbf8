"""Rendering a sweep's summary (perf/report.py builds it): summary.md, summary.csv, summary.png and
the terminal table. Values from the command line (override values, reasons) are the user's text:
markdown and HTML are escaped, CSV cells cannot start a formula, and no terminal control sequence
passes through. The terminal table fits the terminal (80 columns and up), keeping the key columns;
summary.md has every column.
"""

import csv
import html
import io
import re
from collections import Counter
from pathlib import Path
from typing import List, Tuple

from bridge.atomic import write_bytes_atomic, write_text_atomic
from bridge.result import MIN_TIMED_STEPS

SUMMARY_FILES = ("summary.md", "summary.csv", "summary.png")
EAGER_COLOR, GRAPHED_COLOR = "#8c8c8c", "#76b900"
CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|[\x00-\x08\x0b-\x1f\x7f]")
"""ANSI escape sequences and other control characters (a terminal would obey them)."""
MARKDOWN = re.compile(r"[\\`*\[\]|~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
"""Markdown's inline syntax: backslash, code, emphasis, link and image brackets, cell bar, strikethrough."""
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""How a CSV cell starts a formula in a spreadsheet (OWASP's CSV injection list)."""
TERMINAL_COLUMNS = ("job", "cuda_graph", "speedup", "step ms (median)", "status", "peak alloc GB", "note")
"""What the terminal keeps when it is narrow, in this order of importance: the speedup is what a
sweep of graph choices is for, so it goes before every other measurement."""


def plain(value) -> str:
    """A cell as one line of plain text: control sequences dropped, line breaks as spaces."""
    return CONTROL.sub("", str(value)).replace("\n", " ").replace("\r", " ")


def markdown_cell(value) -> str:
    """Plain text in a table cell: HTML escaped, and the markdown that would start a link, an image, code,
    emphasis, strikethrough or a new cell backslash-escaped (a lone _ inside a word is text already)."""
    return MARKDOWN.sub(r"\\\g<0>", html.escape(plain(value), quote=False))


def csv_cell(value):
    if isinstance(value, str):
        value = plain(value)
        return "'" + value if value.startswith(FORMULA_START) else value
    return value


def write_summary(summary) -> None:
    """Write summary.md, summary.csv and summary.png into the sweep directory."""
    write_csv(summary, summary.directory / "summary.csv")
    write_markdown(summary, summary.directory / "summary.md")
    write_plot(summary, summary.directory / "summary.png")


def write_csv(summary, path: Path) -> None:
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=[csv_cell(name) for name in summary.rows[0]])
    writer.writeheader()
    writer.writerows([{csv_cell(key): csv_cell(value) for key, value in row.items()} for row in summary.rows])
    write_text_atomic(path, text.getvalue())


def display_table(summary) -> Tuple[List[str], List[list]]:
    """Headers and formatted cells shared by summary.md and the console table."""
    headers = ["job", "cuda_graph", *summary.swept_keys, "status", "impl", "step ms (median)",
               "p10–p90 ms", "speedup", "tokens/s", "TFLOP/s/GPU", "peak alloc GB",
               "Δ mem vs eager", "capture s", "note"]
    profiled = any(row["gpu_busy"] is not None for row in summary.rows)
    if profiled:
        headers[-1:-1] = ["GPU busy", "what graphs can buy"]
    cells = []
    for row in summary.rows:
        speedup = _fmt(row["speedup"], "{:.2f}×")
        if _is_baseline(row):
            speedup += " (baseline)"
        elif row["effective_impl"] == "none" and row["cuda_graph"] not in (None, "none"):
            speedup = "ran eagerly"
        spread = ""
        if row["step_ms_p10"] is not None and row["step_ms_p90"] is not None:
            spread = f"{row['step_ms_p10']:.2f}–{row['step_ms_p90']:.2f}"
        warning = "⚠ " if row["step_ms_median"] is not None and row["timed_steps"] < MIN_TIMED_STEPS else ""
        cells.append([
            row["job"], row["cuda_graph"] or "", *[row[key] or "" for key in summary.swept_keys],
            row["status"], row["effective_impl"] or "", warning + _fmt(row["step_ms_median"], "{:.2f}"),
            spread, speedup, _fmt(row["tokens_per_s"], "{:,.0f}"), _fmt(row["tflops_per_gpu"], "{:.3g}"),
            _fmt(row["peak_allocated_gb"], "{:.2f}"), _fmt(row["memory_overhead_gb"], "{:+.2f} GB"),
            _fmt(row["capture_time_s"], "{:.2f}"),
            *([_fmt(row["gpu_busy"], "{:.0%}"), row["bound"] or ""] if profiled else []), row["note"],
        ])
    return headers, cells


def write_markdown(summary, path: Path) -> None:
    headers, cells = display_table(summary)
    status_counts = Counter(row["status"] for row in summary.rows)
    lines = [
        f"# {markdown_cell(summary.title)}",
        "",
        f"Sweep {markdown_cell(summary.directory)}: {len(summary.rows)} jobs "
        f"({', '.join(f'{n} {markdown_cell(status)}' for status, n in status_counts.items())}).",
        "",
        "| " + " | ".join(markdown_cell(header) for header in headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(markdown_cell(cell) for cell in row) + " |" for row in cells]
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
        "- What graphs can buy: graphs remove the gaps between kernels, so a step whose eager GPU is busy a "
        "fraction b of the time can gain at most 1/b; from 90 % busy (compute-bound) graphs are neutral, as "
        "expected. Run the sweep with `perf.profile=true` to see it; a job that asked for graphs but ran "
        "eagerly (no CUDA device) shows no speedup.",
    ]
    write_text_atomic(path, "\n".join(lines) + "\n")


def write_plot(summary, path: Path) -> None:
    png = io.BytesIO()
    summary_figure(summary).savefig(png, dpi=150, format="png")
    write_bytes_atomic(path, png.getvalue())  # a reader never sees half a PNG


def summary_figure(summary):
    """summary.png's figure: step time with its spread and speedup labels, and peak memory where measured."""
    # A Figure without pyplot renders with Agg and touches no global state or display.
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = summary.rows
    has_memory = any(row["peak_allocated_gb"] is not None for row in rows)
    panels = 2 if has_memory else 1  # CPU runs have no device memory to show
    figure = Figure(figsize=(panels * max(6.0, 0.9 * len(rows) + 2.5), 6.0), layout="constrained")
    axes = figure.subplots(1, panels, squeeze=False)[0]
    figure.suptitle(plain(summary.title), fontsize=15, fontweight="bold")
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
        # A job without a bar gets its status; written upright, cannot_run_here is wider than a bar's
        # slot and runs into its neighbour's, so such labels stand vertically on the axis.
        barless = row["step_ms_median"] is None
        time_axis.annotate(_bar_label(row), (x, top), xytext=(0, 4), textcoords="offset points", ha="center",
                           va="bottom", rotation=90 if barless else 0, fontsize=11, fontweight="bold",
                           color="black" if row["status"] == "completed" else "red")

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
    labels = ["\n".join([plain(row["cuda_graph"] or row["job"])] + [plain(row[key]) for key in summary.swept_keys])
              for row in rows]
    for axis in axes:
        axis.set_xticks(positions, labels, fontsize=10)
        axis.set_xlabel(" / ".join(["cuda_graph", *summary.swept_keys]))
        axis.margins(y=0.18)
        axis.grid(axis="y", alpha=0.3)
    figure.legend(handles=[Patch(color=EAGER_COLOR, label="eager"), Patch(color=GRAPHED_COLOR, label="graphed")],
                  loc="outside lower center", ncols=2, frameon=False)
    return figure


def _bar_label(row: dict) -> str:
    if row["status"] != "completed":
        return row["status"]
    if row["step_ms_median"] is None:
        return "no timed steps"
    if row["effective_impl"] == "none" and row["cuda_graph"] not in (None, "none"):
        return "ran eagerly"
    label = "baseline" if _is_baseline(row) else _fmt(row["speedup"], "{:.2f}×") or "no baseline"
    if row["timed_steps"] < MIN_TIMED_STEPS:
        label += f"\n(n={row['timed_steps']})"
    return label


def print_summary(summary) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    headers, cells = display_table(summary)
    kept = terminal_columns(headers, cells, console.width)
    table = Table(title=plain(summary.title), caption="every column: summary.md" if len(kept) < len(headers) else None)
    for index in kept:
        table.add_column(headers[index], overflow="fold", min_width=4, max_width=40 if headers[index] == "note" else None)
    for row in cells:
        table.add_row(*(Text(plain(row[index])) for index in kept))  # Text: [rule] is not markup
    console.print(table)
    console.print(Text(f"written: {', '.join(str(summary.directory / name) for name in SUMMARY_FILES)}"))


def terminal_columns(headers: List[str], cells: List[list], width: int) -> List[int]:
    """The columns that fit ``width``: the key ones first, then the others while there is room (the note
    column folds its text, so it counts at 16 characters)."""
    def needed(index: int) -> int:
        widest = max([len(headers[index])] + [len(plain(row[index])) for row in cells])
        return min(widest, 16 if headers[index] == "note" else widest) + 3

    order = [headers.index(name) for name in TERMINAL_COLUMNS if name in headers]
    order += [index for index in range(len(headers)) if index not in order]
    kept, used = [], 1
    for index in order:
        if used + needed(index) <= width or not kept:
            kept.append(index)
            used += needed(index)
    return sorted(kept)


def _is_baseline(row: dict) -> bool:
    return row["baseline_job"] == row["job"]


def _fmt(value, spec: str) -> str:
    return "" if value is None else spec.format(value)
