"""The device-side NaN check on the CPU: FiniteCheck counts the steps before the first
non-finite loss or gradient norm with in-place device ops only (what lets it run inside a
full-iteration graph), and the trainer reads it every perf.nan_check_interval steps and stops
the run naming the step it happened at and the step it was seen at. perf.inject_nan_at_step
puts the NaN inside the step. On the GPU the same code runs captured: tests/gpu/test_failures_gpu.py.
"""

import math

import pytest
import torch

from bridge import run
from bridge.diagnosis import NonFiniteError
from bridge.engines.torch.engine import TorchEngine
from bridge.engines.finite_check import FiniteCheck
from bridge.trainer import Trainer

NAN, INF = math.nan, math.inf


def finite_steps_after(values):
    check = FiniteCheck(torch.device("cpu"))
    all_finite, finite_steps = check.all_finite, check.finite_steps
    for loss, grad_norm in values:
        check.record(torch.tensor(loss), None if grad_norm is None else torch.tensor(grad_norm))
    # The same tensors throughout: a captured graph keeps writing into them.
    assert check.all_finite is all_finite and check.finite_steps is finite_steps
    return int(check.finite_steps)


@pytest.mark.parametrize("values, expected", [
    ([(2.0, 1.0)] * 4, 4),
    ([(2.0, 1.0), (2.0, 1.0), (NAN, 1.0), (2.0, 1.0)], 2),  # later finite steps do not count
    ([(2.0, 1.0), (2.0, INF), (2.0, 1.0)], 1),  # a bad gradient norm with a finite loss
    ([(2.0, None), (-INF, None)], 1),  # no clipping: the loss alone
    ([(2.0, [1.0]), (2.0, [NAN])], 1),  # megatron-core 0.19.2 with TE 2.20.2: a one-element tensor
])
def test_finite_check_counts_the_steps_before_the_first_bad_one(values, expected):
    assert finite_steps_after(values) == expected


@pytest.fixture
def full_iteration_trainer(small_config, write_job):
    """``full_iteration_trainer(job_dir, *overrides)``. On the CPU full_iteration runs eagerly, but
    the config is the real one: both loss and grad NaN checks off, so only the interval check can
    catch the NaN."""

    def make(tmp_path, *overrides):
        cfg = small_config("llama/tiny", "cuda_graph=full_iteration", "train.train_iters=12", *overrides)
        assert cfg.rerun_state_machine.check_for_nan_in_loss is False
        return Trainer(cfg, write_job(tmp_path, cfg))

    return make


def test_an_injected_nan_is_caught_at_the_next_check_with_its_step(full_iteration_trainer, read_result, tmp_path):
    trainer = full_iteration_trainer(tmp_path, "perf.inject_nan_at_step=5", "perf.nan_check_interval=4")
    with pytest.raises(NonFiniteError):
        trainer.run()
    trainer.close()
    result = read_result(tmp_path)
    assert result["status"] == "failed"
    assert result["reason"] == "non-finite loss or grad norm at step 5 (detected at step 7)"
    assert result["steps_completed"] == 8 and len(result["loss"]) == 8
    assert all(math.isfinite(loss) for loss in result["loss"][:5]) and math.isnan(result["loss"][5])


def test_the_last_step_is_checked_whatever_the_interval(full_iteration_trainer, tmp_path):
    trainer = full_iteration_trainer(tmp_path, "train.train_iters=7", "perf.inject_nan_at_step=5",
                                     "perf.nan_check_interval=4")
    with pytest.raises(NonFiniteError, match=r"at step 5 \(detected at step 6\)"):
        trainer.run()


def test_interval_zero_turns_the_check_off(full_iteration_trainer, tmp_path):
    trainer = full_iteration_trainer(tmp_path, "perf.inject_nan_at_step=5", "perf.nan_check_interval=0")
    assert trainer.engine.finite_steps() is None
    result = trainer.run()
    assert result["status"] == "completed" and math.isnan(result["loss"][-1])


def test_a_clean_run_counts_every_step_as_finite(small_config):
    engine = TorchEngine(small_config("llama/tiny", "cuda_graph=full_iteration"))
    for step in range(3):
        engine.train_step(step)
    assert int(engine.finite_steps()) == 3


def test_eager_runs_keep_the_per_step_loss_check(small_config, write_job, tmp_path):
    cfg = small_config("llama/tiny", "perf.inject_nan_at_step=2")
    trainer = Trainer(cfg, write_job(tmp_path, cfg))
    with pytest.raises(NonFiniteError, match="loss is nan at step 2"):
        trainer.run()


def test_engines_without_the_device_check_fall_back_to_the_losses(scripted_engine, small_config, write_job,
                                                                  tmp_path, monkeypatch):
    engine = scripted_engine([3.0, 2.0, 1.5, NAN, 1.0, 1.0, 1.0])
    assert not hasattr(engine, "finite_steps")
    monkeypatch.setattr("bridge.trainer.build_engine", lambda cfg, target: engine)
    cfg = small_config("llama/tiny", "cuda_graph=full_iteration", "train.train_iters=7", "perf.nan_check_interval=5")
    with pytest.raises(NonFiniteError, match=r"at step 3 \(detected at step 4\)"):
        Trainer(cfg, write_job(tmp_path, cfg)).run()


def test_the_training_process_reports_a_nan_in_one_line(read_result, small_config, write_job, tmp_path, capsys):
    cfg = small_config("llama/tiny", "cuda_graph=full_iteration", "train.train_iters=6", "perf.inject_nan_at_step=1",
                       "perf.nan_check_interval=3")
    assert run.main([str(write_job(tmp_path, cfg))]) == run.FAILED
    assert read_result(tmp_path)["reason"] == "non-finite loss or grad norm at step 1 (detected at step 2)"
    assert "Traceback" not in capsys.readouterr().err
