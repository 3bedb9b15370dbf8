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

from tests.command_tool import Tool
from tests.sampling import DEFAULT_MARKS

ROOT = Path(__file__).resolve().parent.parent
# Importing megatron-core makes torch create its compile cache (torchinductor_<user>) in the system's temporary
# directory: the suite and the commands it runs keep it in pytest's own (pytest-of-<user>), where it outlives a
# session as that cache should. A cache the user chose is kept.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      str(Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}" / "torchinductor"))
# Under pytest-xdist every worker, and every command a test starts, shares the cores with the other workers: torch's
# default of one OpenMP thread a core then oversubscribes them, and OpenMP's spinning threads wait on each other (a
# llama/tiny step on two busy cores took 10 s with two threads, 1.2 s with one). Each worker's share of the cores,
# unless the user chose a number; a run in this process alone (-n 0) keeps torch's default.
XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // XDIST_WORKERS)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # torch is imported above: its threads are set now
TINY_RECIPES = ("llama/tiny", "qwen/tiny", "deepseek/tiny", "gpt_oss/tiny")
# Small enough for two CPU cores; deepseek's per-layer MoE pattern must match num_layers.
SMALL = ("model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64", "train.train_iters=5")
SMALL_PER_RECIPE = {"deepseek/tiny": ("model.moe_layer_freq=[0,1]",)}
JOB = {"choices": {"recipe": "llama/tiny", "cuda_graph": "none"}, "overrides": ["train.train_iters=5"]}
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


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory, worker_id) -> Path:
    """The temporary folder of this whole session, the same for every pytest-xdist worker (each worker's own
    tmp_path_factory folders lie inside it)."""
    return tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent


@pytest.fixture(scope="session")
def across_workers(shared_tmp) -> Callable:
    """``across_workers(name, make)``: ``make()``'s value, made once a session by the first pytest-xdist worker that
    asks and read back (pickled) by the others, which wait for it; for a costly value that tests on every worker
    read and none changes (composing every workload preset takes ~20 s). Without xdist, ``make()`` once."""
    import pickle

    from filelock import FileLock

    made = {}

    def value(name: str, make: Callable):
        if name not in made:
            path = shared_tmp / f"across_workers_{name}.pickle"
            with FileLock(f"{path}.lock"):
                if not path.is_file():
                    path.write_bytes(pickle.dumps(make()))
            made[name] = pickle.loads(path.read_bytes())
        return made[name]

    return value


@pytest.fixture(scope="session")
def cli_batch(cli, tmp_path_factory, across_workers) -> Callable:
    """``cli_batch(name, commands, timeout=600, env=None)``: {command: its CompletedProcess} for each command (a tuple
    of arguments) of `graphbridge`, all of them run one after another by one process a session (cli.many,
    across_workers) in an empty directory, which they must leave empty: for tests of plans and refusals, each looking
    up its own."""
    def results(name: str, commands, timeout: float = 600, env: Optional[dict] = None) -> dict:
        def make() -> dict:
            work = tmp_path_factory.mktemp(name)
            done = dict(zip(commands, cli.many(commands, cwd=work, timeout=timeout, env=env)))
            assert list(work.iterdir()) == [], f"the commands of {name} left {list(work.iterdir())}"
            return done

        return across_workers(f"cli_batch_{name}", make)

    return results


CPU_RUN = ("model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64", "train.train_iters=4")
"""The main job as a user types it (llama/tiny, its own graph choice: auto, eager here), small enough for two cores."""


@pytest.fixture(scope="session")
def cpu_run(cli, tmp_path_factory, across_workers) -> dict:
    """``graphbridge <CPU_RUN>`` run once a session (across_workers) in an empty directory, its run directory the
    default one, its decision cache ($XDG_CACHE_HOME) its own: {"result": its CompletedProcess, "run_dir": the
    directory of the result.json its last line names, "cache": the cache's home}. For the tests that read what a
    finished run printed and left (its last lines, the progress bar, main.log, result.json, TensorBoard's scalars),
    which each trained one of their own (~7 CPU seconds each); none may change them."""
    def make() -> dict:
        work = tmp_path_factory.mktemp("cpu_run")
        (work / "here").mkdir()
        cache = work / "cache"
        result = cli(*CPU_RUN, cwd=work / "here", env={**os.environ, "XDG_CACHE_HOME": str(cache)})
        assert result.returncode == 0, result.stderr[-3000:]
        return {"result": result, "run_dir": Path(result.stdout.splitlines()[-1]).parent, "cache": cache}

    return across_workers("cpu_run", make)


@pytest.fixture(scope="session")
def prepared_presets(across_workers) -> dict:
    """Every preset row of tests/preset_reference.py, (recipe, gpu, precision) -> its finished GraphBridgeConfig, as
    the command line composes and prepares it: made once a session (across_workers) for test_presets.py and
    test_memory.py, which prepared all 140 again on each worker (~5 s each time)."""
    from bridge.prepare import prepare
    from tests.preset_reference import ROWS, composed_presets

    def make() -> dict:
        composed = across_workers("composed_presets", composed_presets)
        return {key: prepare(composed[key]).config for key in ROWS}

    return across_workers("prepared_presets", make)


COMPOSITIONS = {}
"""(config name, overrides) -> Hydra's composition of graphbridge's own conf/, for composed_once."""


@pytest.fixture
def composed_once(monkeypatch):
    """Hydra's compositions of graphbridge's own conf/ (bridge.config.load.compose_config, which bridge.compose, the
    plan and cuda_graph=auto's candidates go through) made once a process for each list of overrides; every later
    one is a copy of it. For tests that compose the same overrides again and again (each cuda_graph=auto plan composes
    its dozen candidates: ~0.4 s each), not for a test of composition itself: another config tree (config_root)
    composes as ever, and the files of conf/ must not change while the test runs."""
    import copy

    from bridge.config import load

    compose, initialize_config_dir, tree = load.compose, load.initialize_config_dir, {}

    def initialize(config_dir, **kwargs):
        tree["dir"] = config_dir
        return initialize_config_dir(config_dir=config_dir, **kwargs)

    def composed(config_name=None, overrides=(), **kwargs):
        if kwargs or tree.get("dir") != str(load.config_dir()):
            return compose(config_name=config_name, overrides=overrides, **kwargs)
        key = (config_name, tuple(overrides))
        if key not in COMPOSITIONS:
            COMPOSITIONS[key] = compose(config_name=config_name, overrides=list(overrides))
        return copy.deepcopy(COMPOSITIONS[key])

    monkeypatch.setattr(load, "initialize_config_dir", initialize)
    monkeypatch.setattr(load, "compose", composed)


JUDGED = {}
"""(option, overrides, machine) -> cuda_graph=auto's candidate judged so, for judged_once."""


@pytest.fixture
def judged_once(composed_once, monkeypatch):
    """cuda_graph=auto's candidates (bridge.auto.candidates.judge: each composed, prepared and planned) judged once a
    process for each job's overrides and machine; every later plan of that job gets copies of them. For the probe's
    tests, which plan llama/tiny's auto again and again: past its compositions (composed_once), preparing and
    judging its dozen candidates took a second each time. The rules must not read anything the test changes."""
    import copy

    from bridge.auto import candidates

    judge = candidates.judge

    def judged(option, overrides, machine, composed=None):
        if composed is not None:  # the plan's own configuration, composed already
            return judge(option, overrides, machine, composed)
        key = (option, tuple(overrides), repr(machine))
        if key not in JUDGED:
            JUDGED[key] = judge(option, overrides, machine)
        return copy.deepcopy(JUDGED[key])

    monkeypatch.setattr(candidates, "judge", judged)


@pytest.fixture(scope="session", autouse=True)
def system_temporary_directory(tmp_path_factory):
    """The system's temporary directory, for the code under test and every command a test starts (tempfile and
    $TMPDIR), is a folder of pytest's own: a harness whose runs a killed process still wrote to leaves what it could
    not remove there (benchmarks/gpu_differential.py left empty gpu_differential_* folders in /tmp)."""
    folder = tmp_path_factory.mktemp("system-tmp", numbered=False)
    before = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(folder)
    yield folder
    if before[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = before[0]
    tempfile.tempdir = before[1]


@pytest.fixture(autouse=True)
def allocator_environment():
    """Every test leaves the allocator's variables as it found them: a graphed job that bridge.run.main trains in
    this process sets them in os.environ (bridge/allocator.py), and a later test's subprocess, which inherits them,
    would read them as the user's own (a plan then adds no option of its own)."""
    found = {name: os.environ.get(name) for name in ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_GRAPH_REGISTER")}
    yield
    for name, value in found.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


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

    def parameter_counts(self):
        return 100, 10

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


# --- what a plain `pytest` runs (tests/test_default_coverage.py) ------------------------------------------------

NARROWING = ("keyword", "deselect", "ignore", "ignore_glob", "lf", "stepwise")
"""Options that run fewer tests than the whole selection (-k, --deselect, --ignore, --lf, --sw)."""


def collected_the_default_run(config) -> bool:
    """Whether this session collected what a plain `pytest` runs: all of tests/, deselected by DEFAULT_MARKS alone."""
    if config.option.markexpr != DEFAULT_MARKS or any(getattr(config.option, name, None) for name in NARROWING):
        return False
    here = Path(config.invocation_params.dir)
    return any("::" not in arg and (ROOT / "tests").is_relative_to((here / arg).resolve()) for arg in config.args)


def default_node_ids() -> frozenset:
    """The node ids a plain `pytest` runs, as a `pytest --collect-only` in a process of its own lists them (~40 s)."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST"))}
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "-n", "0", "-m", DEFAULT_MARKS, "tests"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert listed.returncode == 0, listed.stdout[-3000:] + listed.stderr[-3000:]
    return frozenset(line for line in listed.stdout.splitlines() if line.startswith("tests/") and "::" in line)


@pytest.fixture(scope="session")
def default_selection(request, across_workers) -> frozenset:
    """The node ids (``tests/test_x.py::test_y[id]``) of every test a plain `pytest` runs. Where this session collected
    just that, its own items (under pytest-xdist every worker collects and deselects the whole list); otherwise (one
    module alone, -k, -m slow) a collection of its own, made once a session (default_node_ids)."""
    if collected_the_default_run(request.config):
        return frozenset(item.nodeid for item in request.session.items)
    return across_workers("default_selection", default_node_ids)
