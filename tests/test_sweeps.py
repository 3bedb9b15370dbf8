"""Sweep presets and multiruns through the real `graphbridge` command."""

import csv
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

import bridge
from bridge.config.paths import config_dir
from bridge.config.store import register

SWEEPS = {
    "dense_scopes": ["none", "full_iteration", "local_layer", "te_layer", "te_attn", "te_attn_mlp"],
    "moe_scopes": ["none", "te_attn", "te_moe_router", "te_attn_moe_router"],
    "moe_drop_and_pad_scopes": ["none", "full_iteration", "te_layer", "te_moe", "te_attn_moe_router"],
}
PRESET_RECIPES = {"dense_scopes": ["llama/tiny"],
                  "moe_scopes": ["qwen/tiny", "deepseek/tiny", "gpt_oss/tiny"],
                  "moe_drop_and_pad_scopes": ["qwen/tiny", "deepseek/tiny", "gpt_oss/tiny"]}
TINY = ["recipe=llama/tiny", "model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64"]
README = Path(__file__).resolve().parent.parent / "README.md"


def compose_with_hydra(overrides):
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=overrides, return_hydra_config=True)


def test_the_sweep_group_holds_exactly_the_presets():
    assert sorted(path.stem for path in (config_dir() / "sweep").iterdir()) == sorted(SWEEPS)


@pytest.mark.parametrize("preset", sorted(SWEEPS))
def test_preset_turns_on_multirun_over_existing_cuda_graph_choices(preset):
    config = compose_with_hydra([f"sweep={preset}", "recipe=llama/tiny"])
    assert config.hydra.mode == RunMode.MULTIRUN
    choices = config.hydra.sweeper.params.cuda_graph.split(",")
    assert choices == SWEEPS[preset]
    assert choices[0] == "none"  # the eager baseline every speedup is measured against
    assert all((config_dir() / "cuda_graph" / f"{choice}.yaml").is_file() for choice in choices)


def test_plan_sweep_plans_every_choice_and_writes_no_summary(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = cli("sweep=dense_scopes", "recipe=llama/tiny", "mode=plan", f"hydra.sweep.dir={sweep_dir}",
                         cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("graphbridge plan:") == len(SWEEPS["dense_scopes"])
    assert not sweep_dir.exists() and "no summary" not in result.stdout + result.stderr  # plans write nothing


def test_a_plan_sweep_with_an_invalid_job_plans_every_job_and_exits_2(cli, tmp_path):
    result = cli("-m", "mode=plan", "cuda_graph=none,te_attn", "model.cuda_graph_warmup_steps=-1,3", cwd=tmp_path)
    assert result.returncode == 2, result.stderr  # a script gating on a plan sweep must see the invalid jobs
    verdicts = [line for line in result.stdout.splitlines() if line.startswith("graphbridge plan:")]
    assert len(verdicts) == 4 and sum("INVALID" in verdict for verdict in verdicts) == 2
    # Each block on stderr names its job: the invalid ones are the two with a warmup of -1.
    headings = [line for line in result.stderr.splitlines() if line.endswith("invalid configuration:")]
    assert headings == [f"job {number} (mode=plan cuda_graph={choice} model.cuda_graph_warmup_steps=-1): invalid "
                        "configuration:" for number, choice in ((0, "none"), (2, "te_attn"))]


def test_a_job_whose_override_does_not_resolve_is_refused_and_the_sweep_goes_on(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = cli("-m", *TINY, "engine=torch", "train.global_batch_size=${oops},2", "train.train_iters=2",
                 "perf.warmup_steps=1", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    [refusal] = [line for line in result.stderr.splitlines() if "Interpolation key 'oops' not found" in line]
    assert refusal.startswith("graphbridge: job 0 (") and "train.train_iters=2" in refusal
    assert "): train.global_batch_size: Interpolation key 'oops' not found; give it a value" in refusal
    rows = read_summary(sweep_dir)
    assert [row["status"] for row in rows] == ["invalid", "completed"]
    assert rows[0]["note"].startswith("[resolvable] train.global_batch_size: Interpolation key 'oops' not found")


def read_summary(sweep_dir: Path):
    assert all((sweep_dir / name).is_file() for name in ("summary.md", "summary.csv", "summary.png"))
    with (sweep_dir / "summary.csv").open() as handle:
        return list(csv.DictReader(handle))


def readme_sweep_and_report() -> list:
    """The README's sweep and report lines ("Sweeps and reports": tests/test_readme.py leaves them to the test below)
    as argument lists; its third line, sweep=dense_scopes, trains on a GPU."""
    section = README.read_text().split("\n## Sweeps and reports\n")[1].split("\n## ")[0]
    lines = [shlex.split(line, comments=True) for line in section.replace("\\\n", " ").splitlines()
             if line.startswith("    graphbridge")]
    assert [line[0] for line in lines] == ["graphbridge", "graphbridge-report", "graphbridge"], lines
    return lines[:2]


def test_the_readmes_sweep_summarizes_every_job_and_a_failed_sweep_inside_it_keeps_to_its_own(cli, report_cli,
                                                                                            tmp_path):
    """The README's sweep as pasted: what trains here (eagerly) is measured against eager, te_attn_mlp is a valid job
    this machine cannot run (not invalid: exit 2); a sweep that fails (a NaN loss: exit 1) lies inside its directory,
    and the README's report of the first keeps to the first's jobs."""
    (_, *sweep), (_, *report) = readme_sweep_and_report()
    result = cli(*sweep, cwd=tmp_path)
    assert result.returncode == 2, result.stderr  # a job refused here: exit 2, after the report
    sweep_dir = tmp_path / "multirun" / "scopes"
    rows = read_summary(sweep_dir)
    assert [(row["cuda_graph"], row["status"]) for row in rows] == [
        ("none", "completed"), ("full_iteration", "completed"), ("te_attn_mlp", "cannot_run_here")]
    assert rows[0]["speedup"] == "1.0" and "timed steps (< 30): noisy" in rows[0]["note"]
    assert "ran eagerly (no CUDA device)" in rows[1]["note"] and "[engine_impl]" in rows[2]["note"]
    inner = sweep_dir / "inner"
    failed = cli("-m", *TINY, "engine=torch", "train.train_iters=2", "perf.inject_nan_at_step=0",
                 f"hydra.sweep.dir={inner}", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert [row["status"] for row in read_summary(inner)] == ["failed"]
    again = report_cli(*report, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert [row["job"] for row in read_summary(sweep_dir)] == ["0", "1", "2"]


@pytest.mark.slow
def test_a_sweep_of_good_jobs_exits_0(cli, tmp_path):
    """By default tests/test_launch.py's README sweep (test_readme_local_sweep_runs_each_job_through_submitit_and_ends_
    with_a_summary) exits 0 on a sweep whose every job completed, graph choices trained eagerly among them: the same
    summary and exit status (perf/report.py's exit_code) under the submitit launcher."""
    result = cli("-m", *TINY, "engine=torch", "cuda_graph=none,local_layer", "train.train_iters=3",
                 "perf.warmup_steps=1", "model.cuda_graph_warmup_steps=1", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.gpu
def test_gpu_sweep_measures_a_full_iteration_speedup(cli, tmp_path):
    """The speedups the benchmark measures (docs/benchmarks.md, the llama_tiny rows: full_iteration 6-10x,
    local_layer about 3x on this shape), checked against the issue's floors, and the GPU-busy fraction:
    a full-iteration graph keeps the GPU far busier than eager launches do."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    sweep_dir = tmp_path / "sweep"
    # The benchmark's shape: llama/tiny as it is (8 layers, hidden 512, seq 256, micro-batch 2).
    result = cli("-m", "recipe=llama/tiny", "cuda_graph=none,full_iteration,local_layer",
                         "train.train_iters=50", "perf.profile=true", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = {row["cuda_graph"]: row for row in read_summary(sweep_dir)}
    assert [row["status"] for row in rows.values()] == ["completed"] * 3
    assert float(rows["full_iteration"]["speedup"]) >= 5.0
    assert float(rows["local_layer"]["speedup"]) >= 2.0
    busy = {choice: float(row["gpu_busy"]) for choice, row in rows.items()}
    assert all(0.0 < value <= 1.05 for value in busy.values()), busy
    assert busy["full_iteration"] > 2 * busy["none"], busy


@pytest.mark.parametrize("preset, recipe", [(p, r) for p, recipes in sorted(PRESET_RECIPES.items()) for r in recipes])
def test_every_job_of_a_sweep_preset_is_valid_on_the_recipes_it_is_for(preset, recipe):
    """Each job as the sweep composes it (the preset's own settings, then its cuda_graph choice), planned
    in-process: the command-line path of a plan sweep is test_plan_sweep_plans_every_choice_and_writes_no_summary."""
    for choice in SWEEPS[preset]:
        plan = bridge.plan([f"sweep={preset}", f"recipe={recipe}", f"cuda_graph={choice}"])
        assert plan.valid, (choice, [str(violation) for violation in plan.config_violations])
