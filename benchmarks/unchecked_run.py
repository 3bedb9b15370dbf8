"""The GPU differential's bypass, never a user option: train a job whose plan a rule refused, with those rules
not asked again in the training process, to learn whether the refused configuration would have failed.

    python benchmarks/unchecked_run.py <job_dir> <rule>[,<rule>...]

The job directory holds the files the launcher writes (perf.launch.write_job). Every other rule still
applies, and the run records its result.json as any run does.
"""

import sys
from pathlib import Path
from typing import Set

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridge import run  # noqa: E402


def train_unchecked(job_dir: str, rules: Set[str]) -> int:
    """``python -m bridge.run <job_dir>`` with ``rules`` not asked (none: the run exactly as the launcher's)."""
    asked = run.refusals
    run.refusals = lambda cfg, target: [v for v in asked(cfg, target) if v.rule not in rules]
    return run.main([job_dir])


def main() -> int:
    return train_unchecked(sys.argv[1], set(sys.argv[2].split(",")))


if __name__ == "__main__":
    sys.exit(main())
