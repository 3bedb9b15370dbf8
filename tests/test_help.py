"""`graphbridge --help`: every group with its choices as typed, five example commands that work, the docs."""

import re
import shlex
from pathlib import Path

import pytest

from bridge.recipes import recipe_names

README_LINE = "graphbridge --help"
"""The README's line (its "Use" section), which tests/test_readme.py leaves to this module."""


@pytest.fixture(scope="module")
def help_text(cli, tmp_path_factory):
    assert f"\n    {README_LINE} " in (Path(__file__).resolve().parent.parent / "README.md").read_text()
    result = cli(*README_LINE.split()[1:], cwd=tmp_path_factory.mktemp("help"))
    assert result.returncode == 0, result.stderr
    return result.stdout


def choices(help_text: str) -> dict:
    section = help_text.split("== Choices (group=option) ==")[1].split("==")[0]
    joined = re.sub(r"\n  +", " ", section)  # a long group's options wrap onto indented lines
    return {group: values.split(", ") for group, values in re.findall(r"^(\w+): (.+)$", joined, re.M)}


def test_help_lists_every_group_with_its_choices_as_a_user_types_them(help_text):
    groups = choices(help_text)
    assert groups["recipe"] == recipe_names()  # nested options as family/name, every one of them
    assert "llama/tiny" in groups["recipe"]
    assert {"gpu", "precision", "cuda_graph", "sweep"} <= set(groups)
    assert "full_iteration" in groups["cuda_graph"] and "h100" in groups["gpu"]
    assert not any(group.startswith(("preset", "hydra")) for group in groups)  # picked for the user
    section = help_text.split("== Choices (group=option) ==")[1].split("==")[0]
    assert max(map(len, section.splitlines())) <= 100


def test_cfg_job_names_what_a_run_migrates(cli, tmp_path):
    """--cfg job prints the config as composed; a run migrates the older spellings first, and says so."""
    shown = cli("--cfg", "job", "--resolve", "model.cuda_graph_impl=local", "model.cuda_graph_scope=[full_iteration]",
                cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "cuda_graph_impl: local" in shown.stdout and "check_for_nan_in_loss: true" in shown.stdout
    notes = shown.stderr.splitlines()
    assert notes[0].startswith("graphbridge: note: model.cuda_graph_scope=full_iteration") and "migrated" in notes[0]
    assert "mode=plan and the run's resolved.yaml show what runs" in notes[1] and len(notes) == 2
    plain = cli("--cfg", "job", "cuda_graph=te_attn", cwd=tmp_path)
    assert plain.returncode == 0 and plain.stderr == ""


def test_help_shows_five_examples_and_where_the_docs_are(help_text):
    examples = [line.split("#")[0] for line in help_text.split("== Examples ==")[1].split("==")[0].strip().splitlines()]
    assert len(examples) == 5
    tools = [shlex.split(line)[0] for line in examples]
    assert tools == ["graphbridge"] * 3 + ["graphbridge-workload", "graphbridge-report"]
    assert "mode=plan" in examples[0] and "-m" in shlex.split(examples[2])
    assert "README.md" in help_text and "docs/schema.md" in help_text and "--hydra-help" in help_text


def test_the_plan_examples_of_help_plan_valid(help_text, cli, workload_cli, tmp_path):
    examples = [shlex.split(line.split("#")[0]) for line in help_text.split("== Examples ==")[1].splitlines()]
    plan = next(args for args in examples if args[:2] == ["graphbridge", "mode=plan"])
    assert cli(*plan[1:], cwd=tmp_path).returncode == 0
    dryrun = next(args for args in examples if args and args[0] == "graphbridge-workload")
    done = workload_cli(*dryrun[1:], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "graphbridge plan: VALID" in done.stdout
