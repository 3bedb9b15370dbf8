"""The equivalence benchmark's harness on the CPU (benchmarks/equivalence.py; the GPU runs it through
scripts/gpu_check.sh equivalence): what it trains, how it pairs each run with its eager twin, and how the loss
tests' tolerance is read back from its record."""

import sys
import tempfile
from pathlib import Path

import pytest

import bridge

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import equivalence  # noqa: E402  (benchmarks/ is a directory of scripts)

RUNS = equivalence.runs_to_make([1234], equivalence.STEPS)
RUNS_BY_VARIANT = [(run["variant"], run) for run in RUNS if run["spec"] == "local"]


@pytest.mark.parametrize("version", ["0.16.1", "0.19.2"])
def test_every_run_and_twin_is_a_configuration_the_release_accepts_but_the_distributed_optimizer_graph_before_0_19(
        version):
    refused = {}
    for run in RUNS:
        for overrides in (run["overrides"], run["eager_overrides"]):
            plan = bridge.plan([*overrides, f"plan.megatron_core={version}"])
            refused[tuple(overrides)] = {violation.rule for violation in plan.config_violations}
    expected = {tuple(run["overrides"]): {"optimizer_graph_distributed"} for run in RUNS
                if run["variant"] == "full_iteration+optimizer+distributed" and version == "0.16.1"}
    assert {overrides: rules for overrides, rules in refused.items() if rules} == expected


def test_a_twin_is_the_same_training_without_graphs_with_the_optimizer_outside_in_the_recipes_micro_batches():
    twin = equivalence.eager_twin(["recipe=llama/tiny", "cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true",
                                   "ddp.use_distributed_optimizer=true", "rng.seed=1"])
    assert twin == ("recipe=llama/tiny", "ddp.use_distributed_optimizer=true", "rng.seed=1", "cuda_graph=none")
    split = dict(RUNS_BY_VARIANT)[equivalence.ROUNDING_VARIANT]
    assert "train.micro_batch_size=1" in split["overrides"] and "cuda_graph=none" in split["overrides"]
    assert sorted(split["eager_overrides"]) == sorted(item for item in split["overrides"]
                                                      if item != "train.micro_batch_size=1")


def losses(level: float, late: float = 7.0, steps: int = equivalence.STEPS) -> list:
    """A curve whose window (steps 10-29) averages ``level``, far from it before and after."""
    start, end = equivalence.WINDOW
    return [10.0] * start + [level] * (end - start) + [late] * (steps - end)


def test_runs_are_measured_once_each_with_their_twins_losses_beside_them(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # measure's work directory: under pytest's, not /tmp
    trained = []

    def train(overrides, workdir, index, launch):
        trained.append(overrides)
        graph = next(item for item in overrides if item.startswith("cuda_graph="))
        split = "train.micro_batch_size=1" in overrides
        level = {"cuda_graph=none": 4.02 if split else 4.0, "cuda_graph=local_layer": 4.03}.get(graph, 4.04)
        return {"status": "completed", "reason": None, "losses": losses(level)}

    monkeypatch.setattr(equivalence, "refusal", lambda overrides: None)
    monkeypatch.setattr(equivalence, "train", train)
    runs = [run for run in RUNS if run["spec"] == "local"]
    measured = equivalence.measure(runs, workers=2, port_base=21000)
    assert len(trained) == len(set(trained)) == len({tuple(r["overrides"]) for r in runs} |
                                                     {tuple(r["eager_overrides"]) for r in runs})
    by_variant = {run["variant"]: run for run in measured}
    assert by_variant["local_layer"]["eager_losses"] == losses(4.0)
    assert by_variant["local_layer"]["relative_gap"] == pytest.approx(0.0075)
    assert by_variant["local_layer"]["late_relative_gap"] == 0.0
    assert by_variant["full_iteration"]["largest_step_gap"] == pytest.approx(0.04)
    assert equivalence.rounding_gap({"runs": measured}) == pytest.approx(0.005)


def test_the_rounding_gap_is_the_largest_of_the_completed_rounding_only_pairs():
    def run(variant, level, status="completed"):
        return {"variant": variant, "status": status, "eager_status": "completed", "losses": losses(level),
                "eager_losses": losses(4.0)}

    split = equivalence.ROUNDING_VARIANT
    record = {"runs": [run(split, 4.01), run(split, 3.98), run(split, 5.0, "failed"),
                       run("full_iteration+optimizer", 4.4), run("local_layer", 4.3)]}
    assert equivalence.rounding_gap(record) == pytest.approx(0.005)
    assert equivalence.rounding_gap({"runs": [run("full_iteration", 4.4)]}) is None
