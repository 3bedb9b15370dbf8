"""Starting one training job: the resolved config goes into the job directory and a fresh
process (plain python for one GPU, torchrun for several) trains from it.

A fresh process per job is what makes sweeps correct: megatron-core keeps graph, RNG-tracker
and static-buffer state at class level, so two jobs in one process are unsafe.

SIGINT and SIGTERM sent to this process while a job trains go on to the training process, which
stops at a step boundary and writes a partial result.json; one that is still running
``GRACE_S`` seconds later is killed. The signal then ends the whole command, a sweep included.
"""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from omegaconf import OmegaConf

from bridge.atomic import write_json_atomic, write_text_atomic
from bridge.config.schema import GraphBridgeConfig
from bridge.validation.violation import Violation

RESOLVED = "resolved.yaml"
JOB = "job.json"
RESULT = "result.json"
GRACE_S = 60.0
"""How long a signalled training process may take to reach a step boundary and write its result."""


def job_record(choices: Dict[str, str], overrides: Sequence[str]) -> dict:
    return {"choices": dict(choices), "overrides": list(overrides)}


def write_job(config: GraphBridgeConfig, job_dir: Path, job: dict) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(job_dir / RESOLVED, OmegaConf.to_yaml(OmegaConf.structured(config)))
    write_json_atomic(job_dir / JOB, job)


def write_invalid_result(job_dir: Path, violations: List[Violation], job: dict) -> None:
    write_json_atomic(job_dir / RESULT, {
        "status": "invalid",
        "reason": "; ".join(str(v) for v in violations),
        "violations": [v.as_dict() for v in violations],
        "job": job,
    })


def training_command(config: GraphBridgeConfig, job_dir: Path) -> List[str]:
    gpus = config.train.num_gpus
    if gpus <= 1:
        return [sys.executable, "-m", "bridge.run", str(job_dir)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            "-m", "bridge.run", str(job_dir)]


def write_missing_result(job_dir: Path, job: dict, reason: str, interrupted: bool) -> None:
    """A result for a training process that ended without writing one."""
    write_json_atomic(job_dir / RESULT, {"status": "interrupted" if interrupted else "failed", "reason": reason,
                                         "job": job})


def run_job(config: GraphBridgeConfig, job_dir: Path, job: dict) -> int:
    """Write the job's files, train in a fresh process, return its exit code (128 + N for
    signal N). A signal forwarded to the job raises SystemExit with that code instead, which
    ends a sweep too."""
    env = {**os.environ, **{key: str(value) for key, value in config.env_vars.items()}}
    with SignalForwarding() as forwarding:
        write_job(config, job_dir, job)
        code = forwarding.run(training_command(config, job_dir), env)
        if not (job_dir / RESULT).exists():
            write_missing_result(job_dir, job, forwarding.why_no_result(code), interrupted=bool(forwarding.received))
    if forwarding.received:
        raise SystemExit(128 + forwarding.received)
    return code


class SignalForwarding:
    """While a training process runs, SIGINT and SIGTERM sent here go on to it; if it has not
    exited GRACE_S seconds after the first, it is killed, so a stuck step cannot hang the launcher."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: Optional[int] = None
        self.killed = False
        self._child: Optional[subprocess.Popen] = None
        self._deadline: Optional[threading.Timer] = None
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "SignalForwarding":
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._forward)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._deadline is not None:
            self._deadline.cancel()

    def run(self, command: List[str], env: Dict[str, str]) -> int:
        """Start the process (unless a signal came first) and wait for it; its exit code."""
        if self.received:
            return 128 + self.received
        # Its own process group: a terminal's Ctrl-C reaches it once, through _forward, not twice
        # (torchrun would start its shutdown twice). torchrun passes signals on to its workers.
        self._child = subprocess.Popen(command, env=env, process_group=0)
        if self.received:  # came while it was starting
            self._forward(self.received, None)
        code = self._child.wait()
        return 128 - code if code < 0 else code

    def why_no_result(self, code: int) -> str:
        """Why the training process ended without writing result.json."""
        if self._child is None:
            return f"{signal_name(self.received)} received before the training process started"
        if self.killed:
            return f"killed {GRACE_S:.0f} s after {signal_name(self.received)}: it reached no step boundary in time"
        if code > 128:
            return f"training process ended by {signal_name(code - 128)} before writing result.json"
        return f"training process exited with status {code} before writing result.json"

    def _forward(self, signum: int, frame) -> None:
        self.received = self.received or signum
        if self._child is None:
            return
        self._signal_child(signum)
        if self._deadline is None:
            self._deadline = threading.Timer(GRACE_S, self._kill)
            self._deadline.daemon = True
            self._deadline.start()

    def _kill(self) -> None:
        self.killed = True
        self._signal_child(signal.SIGKILL)

    def _signal_child(self, signum: int) -> None:
        try:
            os.killpg(self._child.pid, signum)
        except ProcessLookupError:  # it has exited already
            pass


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
