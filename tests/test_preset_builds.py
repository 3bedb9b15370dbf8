"""Every shipped preset builds at its own layout on the CPU (tests/preset_build.py says how, and what the CPU stands
in for): the first rank of one preset a recipe by default, every role of every preset under -m slow."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")

ROOT = Path(__file__).resolve().parents[1]


def failures(*flags: str) -> list:
    done = subprocess.run([sys.executable, "-m", "tests.preset_build", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=3600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_preset_of_every_recipe_builds_at_its_layout():
    assert failures("--one-a-recipe") == []


@pytest.mark.slow
def test_every_preset_builds_at_its_layout():
    assert failures("--every-role") == []
