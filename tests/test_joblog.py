"""<run dir>/main.log holds what the terminal showed: the notes, the training process's output
(its progress bar's final state, the summary table), and the violations of a refused sweep job.
A CPU run's main.log is checked together with its TensorBoard scalars (tests/test_tensorboard.py):
one training run for both."""

import io
import os
import sys

from perf.joblog import Tee, final_line

SMALL = ("engine=torch", "model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64")


def test_a_redrawn_line_keeps_its_final_state():
    assert final_line(b"step 0%\rstep 50%\rstep 100%") == "step 100%"
    assert final_line(b"done\r") == "done"
    assert final_line(b"plain") == "plain"


def test_tee_streams_everything_to_the_terminal_and_final_lines_to_the_log(tmp_path):
    read_end, write_end = os.pipe()
    terminal, log = io.BytesIO(), tmp_path / "main.log"
    log.write_text("earlier line\n")
    tee = Tee(os.fdopen(read_end, "rb"), terminal, log)
    with os.fdopen(write_end, "wb") as child:
        child.write(b"bar 1/2\rbar 2/2\nsummary\nno newline at the end")
    tee.join()
    assert terminal.getvalue() == b"bar 1/2\rbar 2/2\nsummary\nno newline at the end"
    assert log.read_text() == "earlier line\nbar 2/2\nsummary\nno newline at the end\n"


def test_a_refused_sweep_job_keeps_its_violations_in_its_log(cli, tmp_path):
    sweep = tmp_path / "sweep"
    result = cli("-m", *SMALL, "train.train_iters=4", "cuda_graph=full_iteration", "model.cpu_offloading=true",
                 f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode != 0
    assert "cpu_offloading" in result.stderr
    log = (sweep / "0" / "main.log").read_text()
    assert "invalid configuration:" in log and "cpu_offloading" in log


def test_without_a_log_the_training_process_inherits_the_terminal(monkeypatch):
    """No job log (hydra/job_logging=disabled): nothing is piped, the child writes to the terminal."""
    from perf import launch

    started = {}

    class Recorded:
        def __init__(self, command, **kwargs):
            started.update(kwargs)
            self.pid = os.getpid()

        def wait(self):
            return 0

    monkeypatch.setattr(launch.subprocess, "Popen", Recorded)
    with launch.SignalForwarding() as forwarding:
        assert forwarding.run([sys.executable, "-c", "pass"], dict(os.environ)) == 0
    assert started["stdout"] is None and started["stderr"] is None
