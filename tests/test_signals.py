"""Interrupts never lose results: SIGINT and SIGTERM stop training at a step boundary with a
partial result.json and exit status 128 + N; the launcher forwards them to the training process
and kills one that does not stop in time; `kill <graphbridge pid>` ends a real run cleanly.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bridge import run
from bridge.trainer import ExitSignals, Trainer
from perf import launch


@pytest.fixture
def signalled_job(scripted_engine, small_config, write_job, tmp_path, monkeypatch):
    class SignalledEngine(scripted_engine):
        """Sends ``signum`` to its own process in the middle of step ``at``, as a scheduler would."""

        def __init__(self, losses, signum, at):
            super().__init__(losses)
            self.signum, self.at = signum, at

        def train_step(self, step):
            if step == self.at:
                os.kill(os.getpid(), self.signum)
            return super().train_step(step)  # the step still finishes: nothing was raised into it

    def make(signum, *overrides):
        engine = SignalledEngine([3.0, 2.5, 2.0, 1.5, 1.0, 0.5], signum, at=2)
        monkeypatch.setattr("bridge.trainer.build_engine", lambda cfg, target: engine)
        write_job(tmp_path, small_config("llama/tiny", "train.train_iters=6", *overrides))
        return engine

    return make


def test_exit_signals_record_the_first_signal_and_restore_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    exit_signals = ExitSignals()
    exit_signals.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # a repeat, e.g. forwarded by the launcher
    finally:
        exit_signals.restore()
    assert exit_signals.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_training_at_the_next_step_boundary(read_result, tmp_path, signalled_job, signum, code):
    engine = signalled_job(signum)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    assert run.main([str(tmp_path)]) == code
    result = read_result(tmp_path)
    assert result["status"] == "interrupted"
    assert result["reason"] == f"{signum.name} received: stopped at the step boundary after 3 of 6 steps"
    assert result["steps_completed"] == 3 and result["loss"] == [3.0, 2.5, 2.0]
    assert engine.closed == 1
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_without_the_handler_sigint_is_a_keyboard_interrupt(read_result, tmp_path, signalled_job):
    signalled_job(signal.SIGINT, "train.exit_signal_handler=false")
    # Python's own SIGINT handler, as under a terminal: a job started in the background by a
    # non-interactive shell (CI) inherits SIGINT ignored, and Python then installs none.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert run.main([str(tmp_path)]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    result = read_result(tmp_path)
    assert (result["status"], result["reason"], result["steps_completed"]) == (
        "interrupted", "interrupted (KeyboardInterrupt)", 2)


def test_a_signal_before_the_first_step_still_writes_a_result(small_config, write_job, tmp_path):
    cfg = small_config()
    exit_signals = ExitSignals()
    exit_signals.received = signal.SIGTERM  # came while the engine was being built
    result = Trainer(cfg, write_job(tmp_path, cfg), exit_signals=exit_signals).run()
    assert (result["status"], result["steps_completed"], result["loss"]) == ("interrupted", 0, [])


def sleeper(ignore_sigterm: bool):
    body = "import signal, time\n"
    if ignore_sigterm:
        body += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    return [sys.executable, "-c", body + "time.sleep(60)\n"]


def signal_self_soon(signum, delay=1.0):
    threading.Timer(delay, os.kill, args=(os.getpid(), signum)).start()


def test_the_launcher_forwards_a_signal_to_the_training_process():
    with launch.SignalForwarding() as forwarding:
        signal_self_soon(signal.SIGTERM)
        code = forwarding.run(sleeper(ignore_sigterm=False), dict(os.environ))
    assert (code, forwarding.received, forwarding.killed) == (143, signal.SIGTERM, False)


def test_the_launcher_passes_submitits_time_limit_notice_on_as_sigterm():
    with launch.SignalForwarding() as forwarding:
        signal_self_soon(signal.SIGUSR2)
        code = forwarding.run(sleeper(ignore_sigterm=False), dict(os.environ))
    # 143: the sleeper died of SIGTERM (SIGUSR2 would have ended it with 140).
    assert (code, forwarding.received, forwarding.killed) == (143, signal.SIGUSR2, False)


def test_the_launcher_kills_a_training_process_that_does_not_stop(monkeypatch):
    monkeypatch.setattr(launch, "GRACE_S", 1.0)
    start = time.monotonic()
    with launch.SignalForwarding() as forwarding:
        signal_self_soon(signal.SIGTERM)
        code = forwarding.run(sleeper(ignore_sigterm=True), dict(os.environ))
    assert code == 128 + signal.SIGKILL and forwarding.killed
    assert time.monotonic() - start < 10
    assert forwarding.why_no_result(code) == "killed 1 s after SIGTERM: it reached no step boundary in time"


def test_a_signal_before_the_training_process_starts_keeps_it_from_starting():
    with launch.SignalForwarding() as forwarding:
        os.kill(os.getpid(), signal.SIGINT)
        code = forwarding.run([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    assert code == 130
    assert forwarding.why_no_result(code) == "SIGINT received before the training process started"


@pytest.mark.parametrize("body, code, reason", [
    ("raise SystemExit(3)", 3, "training process exited with status 3 before writing result.json"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 139,
     "training process ended by SIGSEGV before writing result.json"),
])
def test_a_training_process_that_dies_still_leaves_a_result(read_result, small_config, tmp_path, monkeypatch, body,
                                                             code, reason):
    monkeypatch.setattr(launch, "training_command", lambda config, job_dir, environ: [sys.executable, "-c", body])
    job = {"choices": {}, "overrides": []}
    assert launch.run_job(small_config(), tmp_path, job) == code
    assert read_result(tmp_path) == {"status": "failed", "reason": reason, "job": job}


@pytest.mark.parametrize("sweep", [pytest.param(False, marks=pytest.mark.slow), True])
def test_kill_of_the_graphbridge_process_ends_with_a_partial_result(cli, read_result, tmp_path, sweep):
    """The real command: Hydra process, fresh training process, SIGTERM to the former. In a
    sweep the signal ends the sweep too: the second job never starts. The single run is slow: by default the sweep
    sends the same SIGTERM through the same forwarding, and test_outputs.py's test_two_real_runs_in_one_directory_...
    interrupts a single real run (SIGINT) and reads its partial result and exit status."""
    out = tmp_path / "out"
    # More steps than any machine trains before the signal: the run must still be training when it comes.
    jobs = ["-m", "train.train_iters=100000,100001", f"hydra.sweep.dir={out}"] if sweep else [
        "train.train_iters=100000", f"hydra.run.dir={out}"]
    process = cli.start(*jobs, "recipe=llama/tiny", "engine=torch", "model.num_layers=2", "model.hidden_size=128",
                        "dataset.seq_length=64", cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        text=True)
    stderr = StderrReader(process)
    try:
        stderr.wait_for(r"\b[1-9]\d*/100000\b", timeout=120)  # tqdm's progress: at least one step done
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
    finally:
        process.kill()
    assert code == 143, stderr.text
    assert time.monotonic() - signalled < 30
    job_dir = out / "0" if sweep else out
    result = read_result(job_dir)
    assert result["status"] == "interrupted" and result["reason"].startswith("SIGTERM received")
    assert 0 < result["steps_completed"] < 100000 and len(result["loss"]) == result["steps_completed"]
    names = {path.name for path in job_dir.iterdir()}
    assert {"job.json", "resolved.yaml", "result.json"} <= names and not [n for n in names if n.endswith(".tmp")]
    assert not (out / "1").exists()
    assert "Traceback" not in stderr.text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("logging, reason", [
    # Its output goes through the graphbridge process (into the job log too): the SIGTERM, or its next
    # progress line into the closed pipe, stops it.
    ((), r"SIGTERM received|output pipe closed at step \d+: the graphbridge process"),
    # Without a job log it writes to the terminal directly, which stays: only the SIGTERM tells it.
    (("hydra/job_logging=disabled",), r"SIGTERM received"),
], ids=["piped", "not-piped"])
def test_a_killed_graphbridge_process_takes_its_training_process_with_it(cli, read_result, tmp_path, logging, reason):
    """SIGKILL reaches no handler of the graphbridge process: the kernel passes its death on to the
    training process as SIGTERM, which stops at its next step boundary instead of training on."""
    out = tmp_path / "out"
    process = cli.start("train.train_iters=3000", f"hydra.run.dir={out}", "recipe=llama/tiny", "engine=torch",
                        "model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64", *logging,
                        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = StderrReader(process)
    try:
        stderr.wait_for(r"\b[1-9]\d*/3000\b", timeout=120)
        process.kill()
        deadline = time.monotonic() + 60
        while processes_running_in(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not processes_running_in(out), "the training process trains on without its graphbridge process"
    finally:
        process.kill()
        for pid in processes_running_in(out):  # were it left running, it would train on for minutes
            os.kill(pid, signal.SIGKILL)
    result = read_result(out)
    assert result["status"] == "interrupted" and re.match(reason, result["reason"]), result["reason"]
    assert 0 < result["steps_completed"] < 3000


def processes_running_in(job_dir):
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(job_dir).encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:  # gone meanwhile
            pass
    return found


class StderrReader:
    """Collects a process's stderr on a thread, so the test can wait for a line without blocking."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.text = ""
        self._thread = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for chunk in iter(lambda: stream.read(64), ""):
            self.text += chunk

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            assert self.process.poll() is None, f"exited with {self.process.returncode}:\n{self.text}"
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout} s:\n{self.text}"
            time.sleep(0.1)
