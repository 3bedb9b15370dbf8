"""Write the benchmark tables into docs/benchmarks.md from the raw results, never typed numbers: the
suite's (between the suite markers) from benchmarks/results/*.json that benchmarks/suite.py writes, and
graphbridge beside Megatron-Bridge (the vs_bridge markers) from benchmarks/results/vs_bridge/*.json that
benchmarks/vs_bridge.py writes, and the equivalence tables (the equivalence markers) from
benchmarks/results/<gpu>/mcore-<release>/equivalence.json that benchmarks/equivalence.py writes, and the
workloads (the workloads markers) from the workloads.json beside them that benchmarks/workloads.py writes.

The page shows today's numbers: of the records that measured the same thing on the same megatron-core release
(a suite workload, an equivalence run, a side-by-side row), only the newest, on whichever GPU it ran; each
section names the older records it leaves out, which stay in the repository (and git) as they were written.

    python scripts/benchmark_table.py          # rewrite the section
    python scripts/benchmark_table.py --check  # exit 1 when it is out of date
"""

import json
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from sections import write_or_check

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import vs_bridge  # noqa: E402  (its table; importing it needs no Bridge)
from equivalence import LATE_WINDOW, WINDOW, window_gap  # noqa: E402
from suite_levels import chosen_level_vs_fastest, levels  # noqa: E402
from suite_workloads import AUTO, WORKLOADS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"
HEADER = ("| variant | step ms (median) | p10-p90 ms | speedup | GPU busy | peak alloc GiB | plan's estimate GiB | capture s | graphs |"
          " status |")


def records(directory: Path = RESULTS) -> List[dict]:
    return sorted((json.loads(path.read_text()) | {"file": path.name} for path in directory.glob("*.json")),
                  key=lambda record: (record["workload"], record["gpu"] or "", record["versions"]["megatron_core"] or ""))


def newest(found: List[dict], measurement, when) -> Tuple[List[dict], List[dict]]:
    """``found`` split into the newest of each measurement (``when`` orders them; ties go to the later in ``found``)
    and the older ones, each list in ``found``'s order."""
    latest = {}
    for record in found:
        key = measurement(record)
        if key not in latest or when(record) >= when(latest[key]):
            latest[key] = record
    kept = [record for record in found if latest[measurement(record)] is record]
    return kept, [record for record in found if latest[measurement(record)] is not record]


def when_measured(record: dict) -> Tuple[str, str]:
    """A suite record's date, and on one day the later release first."""
    return record["date"], record["versions"]["megatron_core"] or ""


def summary_line(record: dict) -> str:
    """A record in one line: where and how it ran, eager's step and every other variant's speedup."""
    versions = record["versions"]
    cells = []
    for name, row in record["variants"].items():
        label = f"{name} (chose {row['auto_chosen']})" if row.get("auto_chosen") else name
        if row["status"] != "completed":
            cells.append(f"{label} {row['status']}")
        elif name == "eager":
            cells.append(f"{label} {row['median_ms']:.2f} ms")
        else:
            cells.append(f"{label} {number(row['speedup'], '.2f', 'x')}")
    return (f"On megatron-core {versions['megatron_core']}: `{record['file']}` ({record['gpus']} x {record['gpu']}, "
            f"Transformer Engine {versions['transformer_engine']}, graphbridge {versions['graphbridge']}, "
            f"{record['date']}, `{record['suite_command']}`{rounds_so_far(record)}): {'; '.join(cells)}.")


def left_out(older: List[str]) -> List[str]:
    """The line that names the records a section leaves out, if any."""
    return [f"Older records of the same measurements, not shown: {', '.join(older)}.", ""] if older else []


def number(value, spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"


GPU_BOUND_SLACK = 1.05
"""A GPU-bound step's profiled GPU time can exceed its median time by a little: profiled steps run
alone and under the profiler, timed ones queued back to back (bridge.step_clock)."""


def busy(fraction) -> str:
    """A GPU-busy fraction. Slightly above 1 is a GPU-bound step, shown as 100 %; far above cannot be
    (graphbridge f7c7096 and earlier counted the profiler's step annotations as GPU work)."""
    if fraction is not None and fraction > GPU_BOUND_SLACK:
        return "invalid"
    return number(None if fraction is None else min(fraction, 1.0), ".0%")


def auto_notes(row: dict) -> str:
    """What the auto variant chose, how long its last probe took (and any earlier one), its step time over the best
    other variant's (with --rounds: the median of the per-round ratios, and their range) and that of the variant it
    chose."""
    notes = [f"chose {row['auto_chosen']}"]
    if row.get("auto_probe_s") is not None:
        earlier = row.get("auto_probes_s", [])[:-1]
        notes.append(f"probe {row['auto_probe_s']:.0f} s"
                     + (f" (earlier rounds' {', '.join(f'{wall:.0f}' for wall in earlier)} s)" if earlier else ""))
    if row.get("vs_best") is not None:
        notes.append(f"{row['vs_best']:.2f}x the best" + ratio_range(row.get("vs_best_range")))
    if row.get("chosen_vs_best") is not None:
        chosen_range = ratio_range(row.get("chosen_vs_best_range"))
        notes.append(f"its choice's variant {row['chosen_vs_best']:.2f}x{chosen_range}")
    return "; ".join(notes)


def ratio_range(spread: Optional[List[float]]) -> str:
    """`` (low-high)`` of a ratio's per-round values, which a median of two rounds (the lower one) hides."""
    return f" ({spread[0]:.2f}-{spread[1]:.2f})" if spread else ""


def rounds_so_far(record: dict) -> str:
    """A record cut off by its block's end (suite.py --resume goes on from it) says how much it holds."""
    rounds, done = record.get("rounds", 1), record.get("rounds_done", record.get("rounds", 1))
    return f" ({done} of {rounds} rounds so far)" if done < rounds else ""


def table(record: dict) -> List[str]:
    versions = record["versions"]
    lines = [f"### {record['workload']}: {record['description']}",
             f"{record['gpus']} x {record['gpu']} (driver {record['driver']}"
             + (f"; host {record['host_cpu']}" if record.get("host_cpu") else "")
             + f"), torch {versions['torch']}, megatron-core {versions['megatron_core']}, Transformer Engine "
             f"{versions['transformer_engine']}, graphbridge {versions['graphbridge']}, {record['date']}: "
             f"`{record['suite_command']}`" + rounds_so_far(record), "",
             HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for name, row in record["variants"].items():
        spread = f"{number(row['p10_ms'], '.2f')}-{number(row['p90_ms'], '.2f')}" if row["p10_ms"] else ""
        speedup = number(row["speedup"], ".2f", "x")
        if row.get("speedup_range"):  # --rounds: the per-round ratios
            speedup += f" ({row['speedup_range'][0]:.2f}-{row['speedup_range'][1]:.2f})"
        label = f"{name} ({auto_notes(row)})" if row.get("auto_chosen") else name
        cells = (label, number(row["median_ms"], ".2f"), spread, speedup,
                 busy(row["gpu_busy"]), number(row["peak_allocated_gb"], ".2f"),
                 number(row.get("estimate_gb"), ".2f"),
                 number(row["capture_time_s"], ".2f"), number(row["graph_count"], "d"),
                 row["status"] if row["status"] == "completed" else f"{row['status']}: {why_not(row)}")
        lines.append("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |")
    return lines + [""] + levels_line(record)


def levels_line(record: dict) -> List[str]:
    """Under a row with auto and its rounds: each configuration's level over every process of the record
    (benchmarks/suite_levels.py), and where auto's choice stands against the fastest."""
    if AUTO not in record["variants"] or "round_records" not in record:
        return []
    found = levels(record, WORKLOADS[record["workload"]])
    pooled = ", ".join(f"{name} {level:.2f} ({count})" for name, level, count in found)
    chosen = "; ".join(f"{name} {number(ratio, '.2f', 'x')}" for name, ratio
                       in chosen_level_vs_fastest(record, found).items())
    return [f"Every process of the record by configuration (mean of their medians, ms; how many): {pooled}. "
            f"Auto's choice over the fastest of these: {chosen}.", ""]


def why_not(row: dict) -> str:
    """A variant's reason, or where its process ended before writing one, the last two lines of its output (a plan
    refused: the CLI's heading and the rule's line)."""
    if row.get("reason"):
        return row["reason"]
    tail = [line.strip() for line in row.get("log_tail") or [] if line.strip()]
    return " ".join(tail[-2:]) if tail else "no reason recorded"


def markdown(directory: Path = RESULTS) -> str:
    """Per workload, a table of its newest record, and a line for the newest on each other release."""
    found, older = newest(records(directory), lambda record: (record["workload"], record["versions"]["megatron_core"]),
                          when_measured)
    if not found:
        return "No suite results yet: run `python benchmarks/suite.py <workload>` on a GPU machine."
    body = []
    for workload in dict.fromkeys(record["workload"] for record in found):
        ran = sorted((record for record in found if record["workload"] == workload), key=when_measured, reverse=True)
        body += table(ran[0]) + [summary_line(record) for record in ran[1:]] + ([""] if ran[1:] else [])
    intro = ("Generated by `python scripts/benchmark_table.py` from benchmarks/results/*.json (written by "
             "`python benchmarks/suite.py`; each file holds the exact commands): per workload, the table of its "
             "newest record, and under it a line for the newest on the other megatron-core release (eager's median "
             "step and each variant's speedup; its file has the rest). Timed steps exclude the eager "
             "warmup, the capture step and the 5 profiled steps; GPU busy is the profiled GPU time per step over "
             "the median step time (up to 5 % above it reads 100 %: a GPU-bound step); \"invalid\" marks a fraction "
             "far above 100 %, which graphbridge f7c7096 and earlier measured when the profiler's step annotations "
             "were counted as GPU work. From graphbridge 16a9d7e on, the trainer queues each step while the one "
             "before runs and times steps by GPU-stream events (bridge.step_clock); earlier commits waited for "
             "every step, which adds the host's time per step to launch-bound and graphed steps. A command with "
             "`--rounds N` ran every variant N times in alternating order: its row is the middle round, and the "
             "brackets after the speedup give the lowest and highest per-round ratio. The auto row names its choice, "
             "the probe's wall time (from the last round that probed, at its commit; rounds on the same machine take "
             "the cached decision, and earlier probes follow in brackets) and its step "
             "time over the best other variant's, the median of the per-round ratios; then the same ratio for the "
             "variant that sets what it chose. Where the two differ, auto chose well and its own run (the same "
             "configuration in another process) landed elsewhere: the noise between processes. Under a row with auto, "
             "each configuration's level pools every process of the record that ran it (the variants, auto's runs "
             "and its probe's runs; a variant without a cuda_graph override stands under its own name), and auto's "
             "choice is set against the fastest level: on a host-bound row, where one configuration's processes "
             "land far apart, that says more than one process a variant. A record cut off by "
             "its block's end says how many rounds it holds, and `suite.py --resume` adds the rest.")
    older_files = [f"`{record['file']}` ({record['gpu']}, {record['date']})" for record in older]
    return "\n".join([intro, ""] + body + left_out(older_files)).rstrip()


def vs_bridge_markdown(directory: Path = RESULTS / "vs_bridge") -> str:
    """One table per vs_bridge.py run that holds the newest measurement of a row (ratio above 1: graphbridge is
    faster), with those rows only: a row measured again later (the same row, GPU and release) is left out."""
    runs = [json.loads(path.read_text()) | {"file": path.name} for path in sorted(directory.glob("*.json"))]
    rows = [(run, row) for run in runs for row in run["rows"]]
    kept, older = newest(rows, lambda pair: (pair[1]["row"], pair[0]["environment"]["gpu"],
                                             pair[0]["environment"]["megatron_core"]), row_created)
    blocks = []
    for run in runs:
        current = [row for shown, row in kept if shown is run]
        if not current:
            continue
        env = run["environment"]
        blocks += [f"#### {run['file']}",
                   f"{env['gpu']}, torch {env['torch']}, megatron-core {env['megatron_core']}, Transformer Engine "
                   f"{env['transformer_engine']}, Megatron-Bridge {env['megatron_bridge']}, graphbridge "
                   f"{run['graphbridge_commit']}, {run['date']}, {run['steps']} steps ({run['warmup_excluded']} "
                   f"untimed): `{run['command']}`", ""]
        blocks += [f"{run['note']}.", ""] if run.get("note") else []
        blocks += [vs_bridge.table(current, run["tolerance"]), ""]
    intro = ("Generated by `python scripts/benchmark_table.py` from benchmarks/results/vs_bridge/*.json (written by "
             "`python benchmarks/vs_bridge.py`, each row with both sides' exact commands): the newest measurement of "
             "each row. Ratio = Bridge's median step / graphbridge's: above 1, graphbridge is faster. Losses agree: "
             "the first 10 steps within 2 %.")
    return "\n".join([intro, ""] + blocks + left_out(
        [f"`{run['file']}`'s {row['row']}" for run, row in older])).rstrip()


def row_created(pair) -> str:
    """When a side-by-side row was measured: its graphbridge run's result, else Bridge's, else the run's date."""
    run, row = pair
    sides = [row.get(side) for side in ("graphbridge", "bridge")]
    return next((side["created"] for side in sides if isinstance(side, dict) and side.get("created")), run["date"])


def gap_percent(gap: float) -> str:
    return "0" if gap == 0 else f"{100 * gap:.3g} %"


def largest_gap(runs: List[dict], window) -> float:
    return max(abs(window_gap(run["losses"], run["eager_losses"], tuple(window))) for run in runs)


def equivalence_row(record: dict, variant: str) -> str:
    """A variant's runs: how many completed, the largest |window gap| to the eager twin over its seeds and specs,
    from the per-step losses (steps 10-29, judged since issue 29's records, and 50-99), and the verdict under
    the record's own window and tolerance (twice the gap of its rounding-only pair)."""
    runs = [run for run in record["runs"] if run["variant"] == variant]
    completed = [run for run in runs if run["status"] == "completed"]
    if not completed:
        reasons = sorted({(run.get("reason") or run["status"]).split("]")[0].lstrip("[") for run in runs})
        return f"| `{variant}` | 0 of {len(runs)} | refused ({', '.join(reasons)}) | | |"
    if variant == record["rounding_variant"]:
        verdict = "the rounding pair: sets the tolerance"
    else:
        verdict = "yes" if largest_gap(completed, record["window"]) <= record["tolerance"] else "**no**"
    return (f"| `{variant}` | {len(completed)} of {len(runs)} | {gap_percent(largest_gap(completed, WINDOW))} | "
            f"{gap_percent(largest_gap(completed, LATE_WINDOW))} | {verdict} |")


def equivalence_markdown(directory: Path = RESULTS) -> str:
    """One table for the newest equivalence record of each megatron-core release."""
    found = [json.loads(path.read_text()) | {"file": path.relative_to(ROOT).as_posix()}
             for path in sorted(directory.glob("*/mcore-*/equivalence.json"))]
    kept, older = newest(found, lambda record: record["megatron_core"], lambda record: record["date"])
    lines = []
    for record in kept:
        start, end = record["window"]
        lines += [f"`{record['file']}`: {record['gpu']}, megatron-core {record['megatron_core']}, "
                  f"TE {record['transformer_engine']}, graphbridge {record['commit']}, {record['date']}; seeds "
                  f"{', '.join(str(seed) for seed in record['seeds'])}, {record['steps']} steps; judged over steps "
                  f"{start}-{end - 1} within {gap_percent(record['tolerance'])} (`{record['command']}`)", "",
                  "| variant | runs completed | largest window gap, steps 10-29 | steps 50-99 | within tolerance |",
                  "|---|---|---|---|---|"]
        lines += [equivalence_row(record, variant) for variant in record["variants"]] + [""]
    lines += left_out([f"`{record['file']}` ({record['gpu']}, {record['date']})" for record in older])
    return "\n".join(lines).rstrip() if lines else "No record is committed yet."


def workloads_markdown(directory: Path = RESULTS) -> str:
    """A table a workloads record (benchmarks/workloads.py): each workload's variants with their loss, median step,
    speedup over the workload's eager variant, reserved peak and trainable parameters."""
    lines = []
    for path in sorted(directory.glob("*/mcore-*/workloads.json")):
        record = json.loads(path.read_text())
        first = next(iter(record["records"].values()), None)
        if first is None:
            continue
        versions = first["versions"]
        lines += [f"`{path.relative_to(ROOT).as_posix()}`: {first['gpu']}, megatron-core {versions['megatron_core']}, "
                  f"TE {versions['transformer_engine']}, graphbridge {versions['graphbridge']}, {first['date']}, "
                  f"{first['steps']} steps (`{record['command']}`)", "",
                  "| workload | variant | status | loss first -> last | step ms (median) | speedup | reserved GiB "
                  "| trainable of total parameters |", "|---|---|---|---|---|---|---|---|"]
        lines += [workload_row(row) for row in record["rows"]] + [""]
        lines += [f"{name}: not measured here ({why})" for name, why in record["refused"].items()]
    return "\n".join(lines).rstrip() if lines else "No record is committed yet."


def workload_row(row: dict) -> str:
    loss, parameters = row["loss"], row["parameters"]
    losses = f"{loss['first']:.4f} -> {loss['last']:.4f}" if loss else ""
    share = (f"{parameters['trainable']:,} of {parameters['total']:,} "
             f"({100 * parameters['trainable'] / parameters['total']:.3g} %)" if parameters else "")
    return (f"| {row['workload']} | `{row['variant']}` | {row['status']} | {losses} | {number(row['median_ms'], '.1f')} "
            f"| {number(row['speedup'], '.2f', 'x')} | {number(row['peak_reserved_gb'], '.2f')} | {share} |")


def main() -> int:
    return (write_or_check(DOCS, "suite", markdown(), "python scripts/benchmark_table.py")
            or write_or_check(DOCS, "vs_bridge", vs_bridge_markdown(), "python scripts/benchmark_table.py")
            or write_or_check(DOCS, "equivalence", equivalence_markdown(), "python scripts/benchmark_table.py")
            or write_or_check(DOCS, "workloads", workloads_markdown(), "python scripts/benchmark_table.py"))


if __name__ == "__main__":
    sys.exit(main())
