"""Every command and code block of README.md runs as written, so that its snippets cannot rot.

The README's indented blocks are read as they stand (a line ending in a backslash continues on the
next, ``#`` starts a comment). Each kind is handled so that the whole file stays fast on a CPU
machine, one subprocess per command:

- a Python block runs verbatim (``python -c``) and must exit 0;
- a ``graphbridge`` command that only looks (``mode=plan``, ``--cfg``, ``--info``, ``--help``, a
  ``-d`` dry run) runs verbatim and must exit 0;
- a command that would train, sweep or submit (it needs a GPU, Slurm, or minutes) runs in plan mode:
  ``mode=plan`` (graphbridge-workload: ``-d``) is added, and a Slurm submission keeps its sweep but
  plans it here, without the submitit Slurm launcher and its keys; the plan must be valid (exit 0);
- a placeholder (``<...>``) is filled with the value in PLACEHOLDERS;
- the set-up lines (SETUP: they create a virtual environment and install) and the layout block
  (NOT_COMMANDS: a file listing) are not run; the tests here run in the environment they make.

Files the commands read (run_config.yaml, overrides.yaml) are written into the test's directory
first: run_config.yaml as the README's own export command writes it.
"""

import shlex
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUP = ("python3 -m venv .venv",)
NOT_COMMANDS = ("conf/",)
TOOLS = ("graphbridge", "graphbridge-workload", "graphbridge-report")
PLACEHOLDERS = {"<overrides>": "recipe=llama/llama3_8b gpu=h100", "multirun/<date>/<time>": "multirun/empty"}
EXPORT = "graphbridge <overrides> mode=plan plan.format=bridge > run_config.yaml"
OVERRIDES_YAML = "model:\n  num_layers: 2\ntrain:\n  train_iters: 5\n"  # a partial file, as Bridge's --config-file
LOOKS = ("mode=plan", "--cfg", "--info", "--help", "-d", "--dryrun")
"""Arguments that make a command only look: it then runs verbatim."""
SLURM_LAUNCHER = ("hydra/launcher=submitit_slurm", "hydra.launcher.", "hydra.sweep.dir=")


def blocks() -> List[List[str]]:
    """The lines of every indented code block, continuation lines joined."""
    found, current, previous_blank = [], None, True
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("    ") and (current is not None or previous_blank):
            current = current if current is not None else []
            current.append(line[4:])
        elif line.strip() and current is not None:
            found.append(current)
            current = None
        previous_blank = not line.strip()
    if current is not None:
        found.append(current)
    return ["\n".join(lines).replace("\\\n", " ").splitlines() for lines in found]


def python_blocks() -> List[str]:
    return ["\n".join(lines) for lines in blocks() if lines[0].startswith(("import ", "from "))]


def commands() -> List[str]:
    found = {}  # by the words: a command shown twice (with another comment) runs once
    for lines in blocks():
        if lines[0].startswith(("import ", "from ", *NOT_COMMANDS)):
            continue
        for line in lines:
            words = shlex.split(line, comments=True)
            if words and not line.startswith(SETUP):
                assert words[0] in TOOLS, f"README line {line!r}: no handling for {words[0]} (see this module)"
                found.setdefault(tuple(words), line)
    return list(found.values())


def as_tested(line: str) -> List[str]:
    """The command as this test runs it: the tool's name and its arguments."""
    for placeholder, value in PLACEHOLDERS.items():
        line = line.replace(placeholder, value)
    words = shlex.split(line, comments=True)
    tool, args = words[0], words[1:]
    if "hydra/launcher=submitit_slurm" in args and "-m" in args:
        args = [arg for arg in args if not arg.startswith(SLURM_LAUNCHER)]
    looks = set(args) & set(LOOKS)
    if tool == "graphbridge" and not looks:
        args.append("mode=plan")
    if tool == "graphbridge-workload" and not looks:
        args.append("-d")
    return [tool, *args]


def test_the_readme_has_the_commands_and_the_python_this_module_knows():
    assert len(python_blocks()) == 1 and any(line.startswith(EXPORT) for line in commands())
    assert all(placeholder in " ".join(commands()) for placeholder in PLACEHOLDERS)


def test_the_python_block_runs(tmp_path):
    [code] = python_blocks()
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def readme_files(tmp_path):
    """run_config.yaml as the README's export command writes it (in this process: no second command),
    and a partial overrides file."""
    import bridge
    from perf.bridge_config_export import to_yaml

    (tmp_path / "run_config.yaml").write_text(to_yaml(bridge.load(PLACEHOLDERS["<overrides>"].split())))
    (tmp_path / "overrides.yaml").write_text(OVERRIDES_YAML)
    return tmp_path


def run(cli, workload_cli, report_cli, words, cwd):
    tool, *args = words
    runner = {"graphbridge": cli, "graphbridge-workload": workload_cli, "graphbridge-report": report_cli}[tool]
    if ">" in args:
        args = args[:args.index(">")]  # the output is the test's to read
    return runner(*args, cwd=cwd)


@pytest.mark.parametrize("line", commands(), ids=lambda line: shlex.join(shlex.split(line, comments=True)))
def test_every_readme_command_runs(cli, workload_cli, report_cli, tmp_path, line, request):
    words = as_tested(line)
    cwd = request.getfixturevalue("readme_files") if "bridge_config=" in line else tmp_path
    if words[0] == "graphbridge-report":
        (cwd / "multirun" / "empty").mkdir(parents=True, exist_ok=True)
    result = run(cli, workload_cli, report_cli, words, cwd)
    if words[0] == "graphbridge-report":  # its placeholder is no sweep: the command is one line that says so
        assert result.returncode == 2 and "is not a sweep directory" in result.stderr, result.stderr
        return
    assert result.returncode == 0, f"{shlex.join(words)}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
    assert "INVALID" not in result.stdout
