"""Write the equivalence table into docs/benchmarks.md (between the equivalence markers), from the committed
records benchmarks/results/<gpu>/mcore-<release>/equivalence.json (`gpu_check.sh equivalence`): per record and
variant, the largest |window gap| to the eager twin over its seeds and layer specs, from the per-step losses, over
steps 10-29 (the window judged since issue 29's records) and 50-99, and whether it lies within the record's
tolerance (twice the gap rounding alone made, over the window that record judged).

    python scripts/equivalence_table.py          # rewrite the section
    python scripts/equivalence_table.py --check  # exit 1 when it is out of date
"""

import json
import sys
from pathlib import Path

from sections import write_or_check

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from equivalence import LATE_WINDOW, WINDOW, window_gap  # noqa: E402
DOC = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "benchmarks" / "results"


def records():
    """Each committed record's path (relative to the repository) and contents, by GPU and release."""
    for path in sorted(RESULTS.glob("*/mcore-*/equivalence.json")):
        yield path.relative_to(ROOT).as_posix(), json.loads(path.read_text())


def percent(gap: float) -> str:
    return "0" if gap == 0 else f"{100 * gap:.3g} %"


def largest_gap(runs, window) -> float:
    return max(abs(window_gap(run["losses"], run["eager_losses"], tuple(window))) for run in runs)


def variant_row(record: dict, variant: str) -> str:
    runs = [run for run in record["runs"] if run["variant"] == variant]
    completed = [run for run in runs if run["status"] == "completed"]
    if not completed:
        reasons = sorted({(run.get("reason") or run["status"]).split("]")[0].lstrip("[") for run in runs})
        return f"| `{variant}` | 0 of {len(runs)} | refused ({', '.join(reasons)}) | | |"
    if variant == record["rounding_variant"]:
        verdict = "the rounding pair: sets the tolerance"
    else:
        verdict = "yes" if largest_gap(completed, record["window"]) <= record["tolerance"] else "**no**"
    return (f"| `{variant}` | {len(completed)} of {len(runs)} | {percent(largest_gap(completed, WINDOW))} | "
            f"{percent(largest_gap(completed, LATE_WINDOW))} | {verdict} |")


def markdown() -> str:
    lines = []
    for path, record in records():
        start, end = record["window"]
        lines += [f"`{path}`: {record['gpu']}, megatron-core {record['megatron_core']}, TE "
                  f"{record['transformer_engine']}, graphbridge {record['commit']}, {record['date']}; seeds "
                  f"{', '.join(str(seed) for seed in record['seeds'])}, {record['steps']} steps; judged over steps "
                  f"{start}-{end - 1} within {percent(record['tolerance'])} (`{record['command']}`)", "",
                  "| variant | runs completed | largest window gap, steps 10-29 | steps 50-99 | within tolerance |",
                  "|---|---|---|---|---|"]
        lines += [variant_row(record, variant) for variant in record["variants"]] + [""]
    return "\n".join(lines).rstrip() if lines else "No record is committed yet."


if __name__ == "__main__":
    sys.exit(write_or_check(DOC, "equivalence", markdown(), "python scripts/equivalence_table.py"))
