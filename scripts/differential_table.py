"""Write the GPU differential's tables into docs/gpu_differential.md (between the differential markers), from
the current committed records: benchmarks/results/<gpu>/mcore-<release>/gpu_differential.json (one GPU a
configuration), gpu_differential_2gpu.json and gpu_differential_4gpu.json (two and four), and the witness-only
records gpu_witnesses.json and gpu_witnesses_2gpu.json (`gpu_check.sh witnesses`: named witness cases beside their
eager twins). A record replaced by a newer one of the same GPU, release and GPU count keeps its commit in its name
(gpu_differential_<commit>.json.gz, gpu_witnesses_<commit>.json, scripts/gpu/README.md) and is left out here.

    python scripts/differential_table.py          # rewrite the section
    python scripts/differential_table.py --check  # exit 1 when it is out of date
"""

import json
import sys
from pathlib import Path

from sections import write_or_check

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "gpu_differential.md"
RESULTS = ROOT / "benchmarks" / "results"
RECORDS = ("gpu_differential.json", "gpu_differential_2gpu.json", "gpu_differential_4gpu.json")
WITNESS_RECORDS = ("gpu_witnesses.json", "gpu_witnesses_2gpu.json", "gpu_witnesses_4gpu.json")
COUNTS = ("drawn", "accepted", "trained", "completed", "crash_after_accept")


def records(names=RECORDS):
    """Each committed record's path (relative to the repository) and summary, by GPU and release."""
    for name in names:
        for path in sorted(RESULTS.glob(f"*/mcore-*/{name}")):
            yield path.relative_to(ROOT).as_posix(), json.loads(path.read_text())["summary"]


def markdown() -> str:
    rows = list(records())
    if not rows:
        return "No record is committed yet."
    lines = ["| record | GPUs | megatron-core | TE | commit | " + " | ".join(COUNTS) + " | twins compared (differ) |",
             "|---|---|---|---|---|" + "---|" * len(COUNTS) + "---|"]
    for path, s in rows:
        twins = s["eager_twins"]
        lines.append(f"| `{path}` | {s.get('num_gpus', 1)} x {s['gpu']} | {s['megatron_core']} | "
                     f"{s['transformer_engine']} | {commits(s)} | "
                     + " | ".join(str(s[key]) for key in COUNTS) + f" | {twins['compared']} ({len(twins['differ'])}) |")
    for path, s in rows:
        earlier = reversed(s.get("earlier_blocks", []))  # the record keeps them oldest first; each goes before the next
        lines += ["", f"`{path}` (`{s['command']}`" + "".join(f"; before it `{block['command']}` on {block['gpu']}"
                                                           for block in earlier) + "):", "",
                  "- refused by rule: " + ", ".join(f"`{rule}` {count}" for rule, count in s["rejections"].items()),
                  "- refused configurations trained with the rule unasked: "
                  + (", ".join(f"`{rule}` {counts.get('completed', 0)} trained / {counts.get('failed', 0)} failed"
                               for rule, counts in s["bypassed_rules"].items()) or "none"),
                  "- failures after an accepting plan: "
                  + ("; ".join(f"{c['count']}x {c['cause']} (run {c['example']})" for c in s["failure_classes"])
                     or "none")]
        lines += witness_table(s)
    for path, s in records(WITNESS_RECORDS):
        lines += ["", f"`{path}` ({s.get('num_gpus', 1)} x {s['gpu']}, megatron-core {s['megatron_core']}, "
                      f"TE {s['transformer_engine']}, at {commits(s)}: `{s['command']}`):", ""] + witness_table(s)
    return "\n".join(lines)


def witness_table(summary) -> list:
    """The record's witness cases in a few lines: those that failed with their rules unasked (as the rules say),
    those that completed (with their loss gap to the eager twin where one ran; one that completed with a rule
    unasked is a rule stricter than the GPU), and those that failed with no rule unasked, with their error."""
    witnesses = summary["witnesses"]
    refused = [w for w in witnesses if w["status"] != "completed" and w["unchecked_rules"]]
    completed = [w for w in witnesses if w["status"] == "completed"]
    crashed = [w for w in witnesses if w["status"] != "completed" and not w["unchecked_rules"]]
    lines = []
    if refused:
        lines.append(f"- witnesses that failed with their rules unasked ({len(refused)}): "
                     + ", ".join(f"`{w['label']}` ({', '.join(w['unchecked_rules'])})" for w in refused))
    if completed:
        lines.append(f"- witnesses that completed ({len(completed)}): " + ", ".join(
            f"`{w['label']}`" + "".join(f" ({note})" for note in completed_notes(w)) for w in completed))
    if crashed:
        lines.append(f"- **witnesses that failed with no rule unasked** ({len(crashed)}): "
                     + "; ".join(f"`{w['label']}` {w['status']}: {first_line(w['error'])}" for w in crashed))
    return lines


def completed_notes(witness) -> list:
    """What a completed witness's entry says beyond its name: the rules it trained without, its gap to its twin."""
    notes = [f"trained with {', '.join(f'`{rule}`' for rule in witness['unchecked_rules'])} unasked"] \
        if witness["unchecked_rules"] else []
    return notes + ([f"gap to its eager twin {gap(witness)}"] if witness.get("eager_gap") is not None else [])


def commits(summary) -> str:
    """The commit of each block of device time the record took (--resume), the first first."""
    return " + ".join([block["commit"] for block in summary.get("earlier_blocks", [])] + [summary["commit"]])


def gap(witness) -> str:
    """The largest relative loss gap to the case's eager twin (gpu_differential.py --witness-twins), or '-'."""
    return "-" if witness.get("eager_gap") is None else f"{witness['eager_gap']:.1e}"


def first_line(error) -> str:
    return (error or "").split("\n")[0][:140].replace("|", "/")


def main() -> int:
    return write_or_check(DOC, "differential", markdown(), "python scripts/differential_table.py")


if __name__ == "__main__":
    sys.exit(main())
