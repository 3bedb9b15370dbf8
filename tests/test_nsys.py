"""Profiling hooks: perf.profile_start_step moves the window of perf.profile and perf.nsys; perf.nsys
names every step with NVTX ranges, brackets the window with cudaProfilerStart/Stop and starts the
training process under `nsys profile`; the same step ranges show in torch.profiler's trace."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from perf.launch import training_command


@pytest.fixture
def nsys_calls(monkeypatch):
    """torch.cuda.nvtx and torch.cuda.profiler as this CPU build lacks them, recording each call."""
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append(("pop",)))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("start",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("stop",)))
    return calls


def test_nsys_ranges_every_step_and_records_only_the_window(nsys_calls, read_result, scripted, scripted_engine,
                                                           tmp_path):
    engine = scripted_engine([4.0 - step / 10 for step in range(10)], capture_step=3)
    trainer = scripted(tmp_path, engine, "perf.nsys=true", "perf.profile_start_step=5", "perf.profile_steps=2",
                       "train.train_iters=10", "model.cuda_graph_warmup_steps=3")
    trainer.run()
    pushed = [call[1] for call in nsys_calls if call[0] == "push"]
    assert pushed[:5] == ["step 0", "step 1", "step 2", "step 3", "capture"]
    assert pushed[5:7] == ["step 4", "replay"] and pushed[-2:] == ["step 9", "replay"]
    assert nsys_calls.count(("pop",)) == len(pushed)
    # cudaProfilerStart right before step 5's ranges, cudaProfilerStop after step 6's.
    start, stop = nsys_calls.index(("start",)), nsys_calls.index(("stop",))
    assert nsys_calls[start + 1] == ("push", "step 5") and nsys_calls[stop - 1] == ("pop",)
    assert [call for call in nsys_calls[start:stop] if call[0] == "push" and call[1].startswith("step")] == [
        ("push", "step 5"), ("push", "step 6")]
    result = read_result(tmp_path)
    assert result["profiled_steps"] == [5, 6]
    # Timed: after warmup (1) and capture (3), outside the window: 1, 2, 4, 7, 8, 9.
    assert result["step_time_ms"]["count"] == 6


def test_an_early_end_stops_the_cuda_profiler(nsys_calls, scripted, scripted_engine, tmp_path):
    engine = scripted_engine([1.0] * 10, fail_at=6)
    trainer = scripted(tmp_path, engine, "perf.nsys=true", "perf.profile_start_step=5", "train.train_iters=12")
    with pytest.raises(RuntimeError):
        trainer.run()
    assert nsys_calls.count(("start",)) == nsys_calls.count(("stop",)) == 1


def test_without_nsys_no_nvtx_call_is_made(nsys_calls, scripted, scripted_engine, tmp_path):
    scripted(tmp_path, scripted_engine([1.0] * 4), "train.train_iters=4").run()
    assert nsys_calls == []


def test_profile_start_step_moves_the_torch_profiler_window_and_the_ranges_show_in_its_trace(
        read_result, small_config, write_job, tmp_path):
    from bridge.trainer import Trainer

    cfg = small_config("llama/tiny", "perf.profile=true", "perf.profile_start_step=3", "perf.profile_steps=2",
                       "train.train_iters=8", "perf.warmup_steps=2")
    trainer = Trainer(cfg, write_job(tmp_path, cfg))
    trainer.run()
    trainer.close()
    result = read_result(tmp_path)
    assert result["profile"]["steps"] == [3, 4]
    assert result["step_time_ms"]["count"] == 8 - 2 - 2
    names = {event.get("name") for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]}
    assert {"step 3", "step 4"} <= names and "step 5" not in names


def test_the_launcher_starts_each_training_process_under_nsys(small_config, tmp_path):
    options = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop", "-t", "cuda,nvtx,osrt"]
    cfg = small_config("llama/tiny", "perf.nsys=true", "perf.nsys_trace=[cuda,nvtx,osrt]",
                       'perf.nsys_extra_args=["--cuda-graph-trace=node"]', "train.train_iters=20")
    one = training_command(cfg, tmp_path, {})
    assert one == ["nsys", "profile", *options, "-o", str(tmp_path / "profile_0"), "--cuda-graph-trace=node",
                   sys.executable, "-m", "bridge.run", str(tmp_path)]
    cfg.train.num_gpus = 2
    torchrun = training_command(cfg, tmp_path, {})
    assert torchrun[:4] == [sys.executable, "-m", "torch.distributed.run", "--no-python"]
    worker = torchrun[torchrun.index("nsys"):]
    assert worker == ["nsys", "profile", *options, "-o", str(tmp_path / "profile_%q{RANK}"),
                      "--cuda-graph-trace=node", sys.executable, "-m", "bridge.run", str(tmp_path)]
    cfg.perf.nsys = False
    assert "nsys" not in training_command(cfg, tmp_path, {})


def test_nsys_runs_with_bridges_launcher_defaults(small_config, tmp_path):
    """What Megatron-Bridge's launcher (NeMo-Run) passes: no CPU sampling, kernels inside graphs traced one by one."""
    command = training_command(small_config("llama/tiny", "perf.nsys=true", "train.train_iters=20"), tmp_path, {})
    assert command[:command.index(sys.executable)] == [
        "nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "-t", "cuda,nvtx",
        "-o", str(tmp_path / "profile_0"), "--sample=none", "--cuda-graph-trace=node", "--cuda-event-trace=false"]


def test_nsys_without_nsys_on_path_is_refused_in_one_line(cli, tmp_path):
    env_path = {"PATH": str(Path(sys.executable).parent)}  # python, and no nsys
    result = cli("engine=torch", "train.train_iters=20", "perf.nsys=true", cwd=tmp_path,
                 env={**os.environ, **env_path})
    assert result.returncode == 2
    problems = [line for line in result.stderr.splitlines() if line.startswith("  [")]
    assert len(problems) == 1 and problems[0].startswith("  [nsys_available] perf.nsys:")
    assert "not on PATH" in problems[0] and "perf.nsys=false" in problems[0]
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []
    plan = cli("mode=plan", "engine=torch", "train.train_iters=20", "perf.nsys=true", cwd=tmp_path,
               env={**os.environ, **env_path})
    assert plan.returncode == 0 and "cannot run on this machine" in plan.stdout


def test_nsys_with_the_torch_profiler_is_refused_with_the_fix(cli, tmp_path):
    result = cli("mode=plan", "engine=torch", "train.train_iters=20", "perf.nsys=true", "perf.profile=true",
                 cwd=tmp_path)
    assert result.returncode == 2
    assert "[nsys_with_profile]" in result.stderr and "set perf.profile=false" in result.stderr
