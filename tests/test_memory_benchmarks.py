"""The memory benchmarks on the CPU: benchmarks/memory_accuracy.py (the estimate against what a GPU reserves) and
benchmarks/capture_holders.py (what the allocator holds at a capture and at the peak), through gpu_check.sh's modes
where they start from, so that no GPU block is the first to run them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bridge

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import capture_holders  # noqa: E402  (benchmarks/ is a directory of scripts)
import memory_accuracy  # noqa: E402


def gpu_check(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess:
    """gpu_check.sh with a stand-in for the GPU machine's release set-up (the releases are this Python's)."""
    stand_in = tmp_path / "env.sh"
    stand_in.write_text("# the releases are whatever this Python has\n")
    env = {**os.environ, "GPU_ENV": str(stand_in), "OUT": str(tmp_path / "out"), "MCORE": "0.19.2"}
    return subprocess.run(["bash", "scripts/gpu_check.sh", *arguments], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("name", sorted(memory_accuracy.CASES))
def test_every_case_plans_valid_on_an_h100_with_megatron_core_019(name):
    """A case its plan refuses would spend a GPU block's minutes on a refusal."""
    plan = bridge.plan([*memory_accuracy.CASES[name].overrides, "plan.megatron_core=0.19.2"])
    assert plan.valid, [str(violation) for violation in plan.violations]


def test_every_graphed_case_names_an_eager_twin_that_is_a_case():
    for name, case in memory_accuracy.CASES.items():
        if case.eager_twin:
            twin = memory_accuracy.CASES[case.eager_twin]
            assert "cuda_graph=none" in twin.overrides and "cuda_graph=none" not in case.overrides, name


def test_a_graphed_row_is_compared_with_its_eager_twins_reserve(tmp_path):
    for name, reserved in (("llama32_1b_eager", 13.7), ("llama32_1b_full_iteration", 16.7)):
        job = tmp_path / name
        job.mkdir()
        (job / "result.json").write_text(json.dumps({"status": "completed", "memory": {
            "peak_allocated_gb": 13.5, "peak_reserved_gb": reserved}}))
    rows = {name: memory_accuracy.measured_row(name, memory_accuracy.CASES[name], tmp_path / name, 30.0,
                                               {"estimate_gib": 15.0, "terms": {}})
            for name in ("llama32_1b_eager", "llama32_1b_full_iteration")}
    memory_accuracy.with_twins(rows)
    assert rows["llama32_1b_full_iteration"]["reserved_vs_eager"] == pytest.approx(16.7 / 13.7, abs=0.001)
    assert "reserved_vs_eager" not in rows["llama32_1b_eager"]
    assert rows["llama32_1b_eager"]["estimate_vs_reserved"] == pytest.approx(15.0 / 13.7, abs=0.001)


def test_re_estimating_a_record_keeps_its_peaks_and_names_the_commit(tmp_path):
    """After a change to bridge/memory the record's rows get today's estimate against the peaks they measured."""
    case = memory_accuracy.CASES["llama32_1b_eager"]
    row = {"name": "llama32_1b_eager", "overrides": list(case.overrides), "status": "completed", "eager_twin": None,
           "estimate_gib": 1.0, "terms": {}, "peak_allocated_gib": 12.5, "peak_reserved_gib": 13.2, "wall_s": 30.0}
    record = tmp_path / "memory_accuracy.json"
    record.write_text(json.dumps({"summary": {"commit": "0000000"}, "rows": [row]}))
    assert memory_accuracy.main(["--re-estimate", str(record)]) == 0
    again = json.loads(record.read_text())
    estimate = memory_accuracy.estimate_of(case)["estimate_gib"]
    assert again["rows"][0]["estimate_gib"] == estimate != 1.0 and again["rows"][0]["peak_reserved_gib"] == 13.2
    assert again["rows"][0]["estimate_vs_reserved"] == round(estimate / 13.2, 3)
    assert again["summary"]["commit"] == "0000000" and again["summary"]["estimated_at"]


@pytest.mark.harness
def test_the_memory_mode_needs_a_gpu_and_says_so_in_one_line(tmp_path):
    done = gpu_check(tmp_path, "memory", "llama32_1b_eager")
    log = (tmp_path / "out" / "mcore-0.19.2" / "memory_accuracy.log").read_text()
    assert "needs a CUDA GPU and --out" in log and "Traceback" not in log, done.stdout[-2000:]


@pytest.mark.harness
def test_the_holders_mode_trains_the_job_and_writes_its_record(tmp_path):
    """On the CPU there is no allocator to record: the job trains, and the record says what it ran."""
    done = gpu_check(tmp_path, "holders", "tiny", "recipe=llama/tiny", "model.num_layers=1", "train.train_iters=2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "out" / "mcore-0.19.2" / "holders_tiny.json").read_text())
    assert record["status"] == "completed" and record["moments"] == [] and record["live_at_peak"] is None
    assert record["overrides"] == ["recipe=llama/tiny", "model.num_layers=1", "train.train_iters=2"]


def frames(path: str):
    return [{"filename": f"/site-packages/megatron/core/{path}", "line": 1, "name": "f"}]


def test_what_is_live_at_the_peak_is_totalled_by_the_site_that_made_it():
    gib = 2 ** 30
    trace = [{"action": "alloc", "addr": 1, "size": gib, "frames": frames("weights.py")},
             {"action": "alloc", "addr": 2, "size": 2 * gib, "frames": frames("activations.py")},
             {"action": "alloc", "addr": 3, "size": gib, "frames": frames("activations.py")},
             {"action": "free_requested", "addr": 2, "size": 2 * gib},
             {"action": "alloc", "addr": 4, "size": gib, "frames": frames("optimizer.py")},
             {"action": "segment_alloc", "addr": 9, "size": 8 * gib}]
    peak = capture_holders.live_at_peak(trace)
    assert peak["peak_allocated_gib"] == 4.0
    assert peak["by_site"] == [{"made_by": "megatron/core/activations.py:1 f", "gib": 3.0},
                               {"made_by": "megatron/core/weights.py:1 f", "gib": 1.0}]


def test_a_segment_that_a_live_block_pins_counts_its_free_space_as_stranded():
    mib = 2 ** 20
    segments = [{"segment_pool_id": (0, 0), "total_size": 64 * mib, "allocated_size": 8 * mib, "stream": 0,
                 "blocks": [{"state": "active_allocated", "size": 8 * mib, "frames": frames("adam.py")},
                            {"state": "inactive", "size": 56 * mib}]},
                {"segment_pool_id": (0, 1), "total_size": 32 * mib, "allocated_size": 0, "stream": 7, "blocks": []}]
    summary = capture_holders.summarize(segments)
    assert summary["pools"]["default"] == {"reserved_gib": 1 / 16, "allocated_gib": 1 / 128}
    assert summary["pools"]["private (0, 1)"]["reserved_gib"] == 1 / 32
    assert summary["default_stranded_gib"] == pytest.approx(56 / 1024)
    assert summary["made_by_totals"] == [{"made_by": "megatron/core/adam.py:1 f", "stranded_gib": 0.05}]
