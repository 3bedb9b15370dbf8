"""perf.profile: the last perf.profile_steps steps run under torch.profiler; their trace is
written to trace.json and they are left out of the step-time statistics. GPU time and the
GPU-busy fraction are measured on the GPU (tests/gpu); here they are null."""

import json
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from bridge.profiling import busy_time_us, device_work_intervals
from bridge.trainer import Trainer


@pytest.mark.parametrize("intervals, expected", [
    ([], 0.0),
    ([(0, 2), (5, 6)], 3.0),  # apart
    ([(0, 4), (1, 2), (3, 6)], 6.0),  # nested and overlapping: counted once
    ([(3, 6), (0, 4)], 6.0),  # any order
])
def test_gpu_busy_time_is_the_union_of_device_intervals(intervals, expected):
    assert busy_time_us(intervals) == expected


def profiler_event(device_type, start, end, annotation=False):
    return SimpleNamespace(device_type=device_type, is_user_annotation=annotation,
                           time_range=SimpleNamespace(start=start, end=end))


def test_gpu_work_is_kernels_and_copies_not_the_step_annotations():
    """The trainer's record_function("step N") shows on the GPU timeline as a user annotation that
    spans its kernels and the gaps between them: counted, a launch-bound step read as over 100 % busy."""
    events = [profiler_event(DeviceType.CPU, 0, 100), profiler_event(DeviceType.CUDA, 10, 20),
              profiler_event(DeviceType.CUDA, 50, 55), profiler_event(DeviceType.CUDA, 5, 95, annotation=True)]
    assert device_work_intervals(events) == [(10, 20), (50, 55)]
    assert busy_time_us(device_work_intervals(events)) == 15


def test_without_profile_there_is_no_trace(read_result, small_config, write_job, tmp_path):
    cfg = small_config("llama/tiny", "train.train_iters=4")
    trainer = Trainer(cfg, write_job(tmp_path, cfg))
    trainer.run()
    trainer.close()
    assert "profile" not in read_result(tmp_path)
    assert not (tmp_path / "trace.json").exists()


def test_profile_through_the_cli(cli, tmp_path):
    # CPU-sized: torch.profiler records every op, which at llama/tiny's own size took minutes on a CPU.
    run = cli("engine=torch", "device=cpu", "train.train_iters=6", "perf.warmup_steps=1", "model.num_layers=2",
              "model.hidden_size=128", "dataset.seq_length=64", "perf.profile=true", "perf.profile_steps=2",
              "hydra.run.dir=job", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert result["status"] == "completed"
    assert result["profile"] == {"trace": "trace.json", "steps": [4, 5], "gpu_ms_per_step": None, "gpu_busy": None}
    assert result["step_time_ms"]["count"] == 6 - 1 - 2  # the warmup and the traced steps are not timed
    events = json.loads((tmp_path / "job" / "trace.json").read_text())["traceEvents"]
    assert any(event.get("name", "").startswith("aten::") for event in events)
    assert not list((tmp_path / "job").glob(".*partial"))


def test_a_profile_window_without_timed_steps_is_rejected_by_the_cli(cli, tmp_path):
    run = cli("engine=torch", "device=cpu", "train.train_iters=6", "perf.profile=true", cwd=tmp_path)
    assert run.returncode == 2
    assert "[profile_window]" in run.stderr and "train.train_iters=" in run.stderr
    assert "Traceback" not in run.stderr
