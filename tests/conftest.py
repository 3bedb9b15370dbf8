"""What the test modules share: the real command-line tools in a subprocess, CPU-sized configs,
job directories as the launcher writes them, a trainer over a scripted engine, and a cuda_graph=auto
decision cache per test.

Tests use these fixtures; no test module imports another one.
"""

import getpass
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# Importing megatron-core makes torch create its compile cache (torchinductor_<user>) in the system's temporary
# directory: the suite and the commands it runs keep it in pytest's own (pytest-of-<user>), where it outlives a
# session as that cache should. A cache the user chose is kept.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      str(Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}" / "torchinductor"))
TINY_RECIPES = ("llama/tiny", "qwen/tiny", "deepseek/tiny", "gpt_oss/tiny")
# Small enough for two CPU cores; deepseek's per-layer MoE pattern must match num_layers.
SMALL = ("model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64", "train.train_iters=5")
SMALL_PER_RECIPE = {"deepseek/tiny": ("model.moe_layer_freq=[0,1]",)}
JOB = {"choices": {"recipe": "llama/tiny", "cuda_graph": "none"}, "overrides": ["train.train_iters=5"]}
# The console scripts by module, so that a checkout that is not installed (the GPU machine) runs them too.
ENTRY_POINTS = {
    "graphbridge": "from perf.main import main; main()",
    "graphbridge-workload": "from perf.workload import main; main()",
    "graphbridge-report": "import sys; from perf.report import main; sys.exit(main())",  # as its console script
}


class Tool:
    """A console script as a user types it: ``tool(*args, cwd=...)`` runs it to the end and captures its
    output; ``tool.start(*args, cwd=..., **popen)`` starts it in the background (to signal it, or run a
    second one beside it); ``tool.argv`` is the command itself, for a test that runs it inside another."""

    def __init__(self, name: str):
        self.argv = [sys.executable, "-c", ENTRY_POINTS[name]]

    def __call__(self, *args: str, cwd: Path, env: Optional[dict] = None, timeout: float = 300,
                 input: Optional[str] = None) -> subprocess.CompletedProcess:
        return subprocess.run([*self.argv, *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout,
                              input=input)

    def start(self, *args: str, cwd: Path, **popen) -> subprocess.Popen:
        return subprocess.Popen([*self.argv, *args], cwd=cwd, **popen)


@pytest.fixture(scope="session")  # stateless: a module-scoped fixture may run a command once for its tests
def cli() -> Tool:
    """``cli(*args, cwd=..., env=None, timeout=300)``: the `graphbridge` command as a user types it."""
    return Tool("graphbridge")


@pytest.fixture
def workload_cli() -> Tool:
    """``workload_cli(*args, cwd=...)``: the Bridge-style `graphbridge-workload` command."""
    return Tool("graphbridge-workload")


@pytest.fixture
def report_cli() -> Tool:
    """``report_cli(sweep_dir, cwd=...)``: the `graphbridge-report` command."""
    return Tool("graphbridge-report")


def load_small_config(recipe: str = "llama/tiny", *overrides: str):
    import bridge

    return bridge.load([f"recipe={recipe}", "engine=torch", *SMALL, *SMALL_PER_RECIPE.get(recipe, ()), *overrides])


@pytest.fixture
def small_config() -> Callable:
    """``small_config(recipe="llama/tiny", *overrides)``: a CPU-sized, prepared config of a recipe."""
    return load_small_config


def write_job_files(job_dir: Path, cfg) -> Path:
    from perf.launch import write_job

    write_job(cfg, Path(job_dir), JOB)
    return Path(job_dir)


@pytest.fixture
def write_job() -> Callable[[Path, object], Path]:
    """``write_job(job_dir, cfg)``: resolved.yaml and job.json as the launcher leaves them."""
    return write_job_files


@pytest.fixture
def read_result() -> Callable[[Path], dict]:
    """``read_result(job_dir)``: the job's result.json."""
    return lambda job_dir: json.loads((Path(job_dir) / "result.json").read_text())


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """The cuda_graph=auto decision cache of this test alone ($XDG_CACHE_HOME)."""
    home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


class ScriptedEngine:
    """An engine whose losses, capture steps and failures the test decides."""

    name, device, effective_impl = "torch", torch.device("cpu"), "full_iteration"

    def __init__(self, losses, capture_step=None, fail_at=None, error=RuntimeError("boom")):
        self.losses, self.capture_step, self.fail_at, self.error = losses, capture_step, fail_at, error
        self.closed = 0

    def train_step(self, step):
        if step == self.fail_at:
            raise self.error
        return torch.tensor(self.losses[step])

    def capture_steps(self):
        return {self.capture_step} if self.capture_step is not None else set()

    def graph_count(self):
        return 0 if self.closed else int(self.capture_step is not None)

    def close(self):
        self.closed += 1


@pytest.fixture
def scripted_engine():
    """The ScriptedEngine class: ``scripted_engine(losses, capture_step=None, fail_at=None, error=...)``."""
    return ScriptedEngine


@pytest.fixture
def scripted(monkeypatch):
    """A Trainer over a given engine: ``scripted(job_dir, engine, *overrides)``."""
    from bridge.trainer import Trainer

    def make(job_dir, engine, *overrides):
        monkeypatch.setattr("bridge.trainer.build_engine", lambda cfg, target: engine)
        cfg = load_small_config("llama/tiny", "perf.warmup_steps=1", *overrides)
        return Trainer(cfg, write_job_files(job_dir, cfg))

    return make
