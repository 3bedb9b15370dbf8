"""Write docs/memory.md's table of the plan's memory estimate against what one GPU reserved (between the
memory_accuracy markers), from the committed records benchmarks/results/<gpu>/mcore-<release>/memory_accuracy.json
(benchmarks/memory_accuracy.py, `bash scripts/gpu_check.sh memory`).

    python scripts/memory_table.py          # rewrite the section
    python scripts/memory_table.py --check  # exit 1 when it is out of date
"""

import json
import sys
from pathlib import Path
from typing import List

from sections import write_or_check

ROOT = Path(__file__).resolve().parents[1]
MEMORY_PAGE = ROOT / "docs" / "memory.md"
RECORDS = "benchmarks/results/*/mcore-*/memory_accuracy.json"
HEADER = "| row | recipe | estimate GiB | reserved GiB | allocated GiB | estimate / reserved | reserved / eager twin |"


def number(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def rows_of(path: Path) -> List[str]:
    """One line per row of the record: its name and recipe (the record and `benchmarks/memory_accuracy.py --list`
    hold each row's overrides), estimate, peaks and ratios."""
    rows = []
    for row in json.loads(path.read_text())["rows"]:
        recipe = next(item.split("=", 1)[1] for item in row["overrides"] if item.startswith("recipe="))
        if row["status"] != "completed":
            rows.append(f"| {row['name']} | {recipe} | {number(row['estimate_gib'])} | {row['status']} | | | |")
            continue
        rows.append(f"| {row['name']} | {recipe} | {number(row['estimate_gib'])} "
                    f"| {number(row['peak_reserved_gib'])} | {number(row['peak_allocated_gib'])} "
                    f"| {number(row.get('estimate_vs_reserved'))} | {number(row.get('reserved_vs_eager'))} |")
    return rows


def estimated_at(summary: dict) -> str:
    """Where `memory_accuracy.py --re-estimate` gave the rows a later estimate than the one they were run with."""
    commit = summary.get("estimated_at")
    return f"; the estimates are bridge/memory's at {commit} (`--re-estimate`)" if commit else ""


def markdown() -> str:
    parts = []
    for path in sorted(ROOT.glob(RECORDS)):
        summary = json.loads(path.read_text())["summary"]
        versions = summary["versions"]
        parts += [f"`{path.relative_to(ROOT)}`: {summary['gpu']}, megatron-core {versions['megatron-core']}, "
                  f"Transformer Engine {versions['transformer-engine']}, PyTorch {versions['torch']}, at "
                  f"{summary['commit']}, {summary['steps']} steps a job (`{summary['command']}`)"
                  f"{estimated_at(summary)}.", "",
                  HEADER, "|---|---|---|---|---|---|---|", *rows_of(path), ""]
    return "\n".join(parts).rstrip("\n")


def main(argv=None) -> int:
    return write_or_check(MEMORY_PAGE, "memory_accuracy", markdown(), "python scripts/memory_table.py", argv)


if __name__ == "__main__":
    sys.exit(main())
