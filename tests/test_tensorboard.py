"""perf.tensorboard: loss, step time (and on a GPU memory) per step as TensorBoard scalars in
<job_dir>/tensorboard/, next to result.json; without the tensorboard package one line says so.
The CPU run here checks main.log too (tests/test_joblog.py has the rest of the job log's tests)."""

import builtins
import logging
import re

import pytest
import torch

def scalars(directory):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = event_accumulator.EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_cpu_run_writes_loss_and_step_time_per_step_and_main_log_what_the_terminal_showed(cpu_run, read_result):
    result, run = cpu_run["result"], cpu_run["run_dir"]  # four steps (conftest.py's CPU_RUN)
    # main.log: the notes (bf16 asked, fp32 on the CPU: said in one line), the progress bar's last state, the summary.
    log = (run / "main.log").read_text()
    note = "no CUDA device here: model.bf16 trains in fp32 on the CPU"
    assert note in log and note in result.stdout
    assert "graphbridge run: completed" in log and "graphbridge run: completed" in result.stdout
    summary = [line for line in result.stdout.splitlines() if line.startswith(("│", "┌", "└"))]
    assert any("step time median" in line for line in summary) and all(line in log for line in summary)
    assert "4/4" in log and "\r" not in log  # the progress bar's last state, without its redraws
    # The terminal still gets every redraw of the live progress bar ("0/4 [...]" first, "4/4 [...]" last);
    # counted by the step count, since its rate reads "step/s" or "s/step" by the machine's speed.
    assert len(re.findall(r"\b[0-4]/4 \[", result.stderr)) > 1
    written = scalars(run / "tensorboard")
    losses = read_result(run)["loss"]
    assert [step for step, _ in written["train/loss"]] == [0, 1, 2, 3]
    assert [value for _, value in written["train/loss"]] == pytest.approx(losses)
    assert len(written["train/step_time_ms"]) == 4 and all(value > 0 for _, value in written["train/step_time_ms"])
    assert "memory/allocated_gib" not in written  # no CUDA device: no memory to report


def test_gpu_busy_of_a_profiled_run_is_a_scalar_too(tmp_path):
    from bridge.observers import Scalars

    Scalars(tmp_path, torch.device("cpu")).close({"profile": {"gpu_busy": 0.25}, "steps_completed": 4})
    assert scalars(tmp_path / "tensorboard")["profile/gpu_busy"] == [(4, 0.25)]


def test_off_writes_nothing(scripted, scripted_engine, tmp_path):
    scripted(tmp_path, scripted_engine([1.0, 1.0]), "train.train_iters=2", "perf.tensorboard=false").run()
    assert not (tmp_path / "tensorboard").exists()


@pytest.mark.parametrize("asked, said", [("perf.tensorboard=true", 1), ("perf.tensorboard=null", 0)])
def test_without_the_package_the_run_goes_on_and_says_so_when_asked(scripted, scripted_engine, tmp_path, monkeypatch,
                                                                    caplog, asked, said):
    """perf.tensorboard=true without the package: one line; unset (the README's plain install): nothing."""
    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    with caplog.at_level(logging.WARNING):
        result = scripted(tmp_path, scripted_engine([1.0, 1.0]), "train.train_iters=2", asked).run()
    assert result["status"] == "completed" and not (tmp_path / "tensorboard").exists()
    warnings = [record.getMessage() for record in caplog.records if "tensorboard" in record.getMessage()]
    assert len(warnings) == said and all("pip install 'graphbridge[tensorboard]'" in line for line in warnings)


def test_a_write_that_fails_midway_is_one_line_and_the_run_goes_on(tmp_path, caplog):
    """A disk that fills during the run (tests/test_outputs.py fills a real one through the CLI): the
    scalars stop with one warning, later steps and close write nothing more and raise nothing."""
    pytest.importorskip("tensorboard")
    from bridge.observers import Scalars

    written = Scalars(tmp_path, torch.device("cpu"))
    written.after_step(0, 1.0, 0.1)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    written._writer.add_scalar = full_disk
    with caplog.at_level(logging.WARNING):
        written.after_step(1, 1.0, 0.1)
        written.after_step(2, 1.0, 0.1)
        written.close({"steps_completed": 3})
    warnings = [record.getMessage() for record in caplog.records]
    assert warnings == [f"perf.tensorboard: cannot write {tmp_path / 'tensorboard'}: No space left on device; "
                        "no (more) scalars are written, result.json is not affected"]
