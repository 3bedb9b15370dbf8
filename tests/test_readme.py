"""README.md runs as pasted: every code block, in order, as a user in an empty directory runs it.

Each ``##`` section runs in a fresh directory of its own, line after line through bash (a line that
ends in a backslash continues on the next), so an example writes the files that the later lines of
its section read, and no section leans on another's. A Python block runs as one program. The tests
run in the environment the set-up lines make, with its console scripts on PATH.

A line runs on a CPU machine without Slurm, as CI is, and must exit 0, or with the status named in
EXIT_HERE, with the README's reason. A line that does not run here is named in NOT_RUN_HERE with why, and a
section whose every line another test runs, in SECTIONS_RUN_ELSEWHERE.
"""

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the README's CPU story; on a GPU its lines train")

SET_UP = "creates a virtual environment and installs: these tests run in the one it made"
NOT_RUN_HERE = {
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && graphbridge": SET_UP,
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e '.[dev]' && pytest": SET_UP,
    "graphbridge sweep=dense_scopes recipe=llama/tiny": "six graph scopes, each trained: on a CPU every one "
                                                        "trains eagerly for a minute and measures nothing",
    "graphbridge recipe=llama/tiny_lora train.train_iters=3": "tests/test_lora.py runs it (in a run directory of "
                                                              "its own) and checks that it trains adapters alone",
    "graphbridge --help": "tests/test_help.py runs it and reads its choices, examples and the docs it names",
    "graphbridge recipe=llama/tiny cuda_graph=full_iteration train.train_iters=5":
        "tests/test_torch_engine_cpu.py runs it and checks that it trains eagerly and says so once",
    "graphbridge recipe=llama/tiny cuda_graph=auto train.train_iters=5":
        "tests/test_auto.py runs it and reads why auto trained eagerly in its record",
}
SECTIONS_RUN_ELSEWHERE = {
    "Running on a Slurm cluster": "tests/test_launch.py runs each of its commands as pasted and checks what it asks "
                                  "of Slurm (test_every_readme_command_is_tested_here)",
    "Sweeps and reports": "tests/test_sweeps.py runs its sweep and its report as pasted and reads every job's row "
                          "(test_the_readmes_sweep_summarizes_every_job_...); its sweep=dense_scopes line trains on a "
                          "GPU (NOT_RUN_HERE), and test_sweeps.py plans that preset's jobs",
}
"""A section -> the test that runs all of its lines (the tests run each line once)."""
NEEDS_TE = "Transformer Engine graphs need a GPU and Transformer Engine: refused here (exit 2)"
NEEDS_GPUS = "the preset's 8 GPUs are not here: refused (exit 2), as a plan would say"
NEEDS_SLURM = "a Slurm submission needs srun: refused here in one line (exit 2)"
EXIT_HERE = {
    "graphbridge model.cuda_graph_impl=transformer_engine model.cuda_graph_modules=[attn]": (2, NEEDS_TE),
    "graphbridge-workload -m qwen -mr tiny --cuda_graph_impl transformer_engine --cuda_graph_scope attn,moe_router":
        (2, NEEDS_TE),
    "graphbridge-workload -m llama -mr llama3_8b -g h100 -ng 16 -gn 8 -a my_account -p batch -t 01:00:00":
        (2, NEEDS_SLURM),
    "graphbridge bridge_config=run_config.yaml model.num_layers=4 cuda_graph=te_attn": (2, NEEDS_GPUS),
    "graphbridge -m bridge_config=run_config.yaml cuda_graph=none,full_iteration": (2, NEEDS_GPUS),
}
"""A line -> (its exit status on a CPU machine without Slurm, why)."""


def blocks(text: str) -> List[List[str]]:
    """Every indented code block as its lines, a continuation joined to the line it continues."""
    found, current, previous_blank = [], None, True
    for line in text.splitlines():
        if line.startswith("    ") and (current is not None or previous_blank):
            current = current if current is not None else []
            current.append(line[4:])
        elif line.strip() and current is not None:
            found.append(current)
            current = None
        previous_blank = not line.strip()
    if current is not None:
        found.append(current)
    return [re.sub(r" *\\\n *", " ", "\n".join(lines)).splitlines() for lines in found]


def sections() -> Dict[str, List[List[str]]]:
    """Each ``##`` section's title -> its code blocks, in the README's order."""
    parts = re.split(r"^## ", README.read_text(), flags=re.MULTILINE)[1:]
    found = {part.splitlines()[0]: blocks(part) for part in parts}
    return {title: section_blocks for title, section_blocks in found.items() if section_blocks}


def is_python(block: List[str]) -> bool:
    return block[0].startswith(("import ", "from "))


def command(line: str) -> str:
    """The line as the shell runs it, without its trailing comment."""
    return re.sub(r"\s+#.*$", "", line).strip()


def all_commands() -> List[str]:
    return [command(line) for section_blocks in sections().values() for block in section_blocks
            if not is_python(block) for line in block if command(line)]


def run(argv: List[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def expected_exit(line: str) -> Tuple[int, str]:
    return EXIT_HERE.get(line, (0, "runs here"))


@pytest.mark.parametrize("title", sorted(set(sections()) - set(SECTIONS_RUN_ELSEWHERE)))
def test_the_sections_code_runs_as_pasted(title, tmp_path):
    for block in sections()[title]:
        if is_python(block):
            done = run([sys.executable, "-c", "\n".join(block)], tmp_path)
            assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
            continue
        for pasted in block:
            line = command(pasted)
            if not line or line in NOT_RUN_HERE:
                continue
            done = run(["bash", "-c", pasted], tmp_path)
            code, why = expected_exit(line)
            assert done.returncode == code, f"{line}\nexit {done.returncode}, expected {code} ({why})\n" \
                                            f"{done.stderr[-3000:]}"
            assert "Traceback" not in done.stderr, done.stderr[-3000:]


def test_every_line_named_here_is_in_the_readme():
    commands = set(all_commands())
    assert set(NOT_RUN_HERE) <= commands and set(EXIT_HERE) <= commands, (
        (set(NOT_RUN_HERE) | set(EXIT_HERE)) - commands)
    assert set(SECTIONS_RUN_ELSEWHERE) <= set(sections())


PAGE_LINES = {README: 400, ROOT / "docs" / "benchmarks.md": 300, ROOT / "docs" / "gpu_differential.md": 300,
              ROOT / "scripts" / "gpu" / "README.md": 150}
"""The most lines each page may have: pages of the product as it is now and of how to measure it, while the rounds
before stay in their records and in git (issue 82)."""


@pytest.mark.parametrize("page", PAGE_LINES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_the_page_stays_short(page):
    assert len(page.read_text().splitlines()) <= PAGE_LINES[page]


def test_the_readme_is_a_guide_that_names_each_reference_page_once():
    text = README.read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert text.count(f"docs/{page.name}") == 1, page.name


def test_a_block_of_continued_lines_is_one_command():
    assert blocks("text\n\n    graphbridge -m a=1 \\\n        b=2   # why\n    graphbridge c=3\n") == [
        ["graphbridge -m a=1 b=2   # why", "graphbridge c=3"]]
    assert command("graphbridge -m a=1 b=2   # why") == "graphbridge -m a=1 b=2"
