"""How the GPU differential (benchmarks/gpu_differential.py) trains one of its runs and reads what the run left:
the command that starts it (the CLI, torchrun for a run with rules unasked, or the preloaded launcher's forked
ranks), its rendezvous port, its result.json, and for a failure the log that says why."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

from bridge.machine import EPHEMERAL_PORTS, ephemeral_ports
from perf import preloaded

ROOT = Path(__file__).resolve().parents[1]
GRAPHBRIDGE = [sys.executable, "-m", "perf.main"]
UNCHECKED = [sys.executable, str(ROOT / "benchmarks" / "unchecked_run.py")]
RUN_TIMEOUT_S = 300
LOG_TAIL = 40
COMPOSING = threading.Lock()
FAILURE_MARKERS = ("Traceback", "terminate called", "CUDA error", "Error")
"""What marks the log that says why a run failed, strongest first: a Python traceback, then a C++ abort's
message (a rank that aborts in CUDA leaves no Python traceback)."""
REASON = re.compile(r"^\s*([\w.]+(Error|Exception)\b|what\(\):)")


def port_range_problem(first: int, count: int, ephemeral: Path = EPHEMERAL_PORTS) -> Optional[str]:
    """Why rendezvous ports ``first`` .. ``first + count - 1`` cannot be relied on, or None. The kernel gives
    ports of its ephemeral range to outgoing connections (NCCL's, the TCPStore clients'), so a rendezvous server
    that asks for one later may find it taken: on 2026-11-27 a multigpu test's torchrun failed on port 39632 with
    EADDRINUSE while another release's tests ran beside it."""
    span = ephemeral_ports(ephemeral)
    if span is None:  # not Linux: nothing to check against
        return None
    low, high = span
    last = first + count - 1
    if first <= high and last >= low:
        return (f"--port-base {first}: its {count} ports reach the kernel's ephemeral ports {low}-{high}, which "
                f"outgoing connections take; pick a base from 1024 to {low - count}")
    return None


@dataclass
class Launch:
    """How each run's training process starts: ``process``, the CLI in a fresh process as a user types it (the
    bypass: benchmarks/unchecked_run.py); ``preloaded``, the job the CLI would write, trained in children (a rank
    each) forked from one that imported torch, TE and megatron-core once (perf/preloaded.py)."""
    launcher: str
    run_env: Dict[str, str]
    port_base: int
    timeout_s: float = RUN_TIMEOUT_S

    def port(self, index: int, retry: bool) -> int:
        # Each run its own rendezvous port: ports picked free by concurrent processes collided (EADDRINUSE).
        return self.port_base + 2 * index + retry

    def command(self, run, run_dir: Path, log: Path, retry: bool) -> Optional[int]:
        """Train ``run`` (a gpu_differential.Run) into ``run_dir``; its exit code, None at the timeout."""
        env = {**self.run_env, "PYTHONUNBUFFERED": "1", "MASTER_PORT": str(self.port(run.index, retry))}
        if run.unchecked_rules or self.launcher == "preloaded":
            import bridge
            from perf.launch import job_record, write_job

            with COMPOSING:  # Hydra's compose holds one global state
                config = bridge.plan(run.overrides).config
            write_job(config, run_dir, job_record({}, run.overrides))
        if self.launcher == "preloaded":
            from unchecked_run import train_unchecked

            return preloaded.train(run_dir, log, env, ranks=config.train.num_gpus, timeout_s=self.timeout_s,
                                   entry=train_unchecked, entry_args=(set(run.unchecked_rules),),
                                   port=int(env["MASTER_PORT"]))
        if run.unchecked_rules:
            # One process a GPU, as the CLI's launcher starts a job (perf.launch.training_command): torchrun's own
            # rendezvous on this host, so the harness's MASTER_PORT is not asked for twice; each rank's output
            # also in a file of its own, where a rank's abort is found (failure_log_tail).
            processes = config.train.num_gpus
            launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
                        f"--log-dir={run_dir / 'ranks'}", "--tee=3"]
            command = [*(launcher if processes > 1 else [sys.executable]), *UNCHECKED[1:], str(run_dir),
                       ",".join(run.unchecked_rules)]
        else:
            command = [*GRAPHBRIDGE, *run.overrides, f"hydra.run.dir={run_dir}"]
        with open(log, "w") as output:
            try:
                return subprocess.run(command, cwd=ROOT, env={**os.environ, **env}, stdout=output,
                                      stderr=subprocess.STDOUT, timeout=self.timeout_s).returncode
            except subprocess.TimeoutExpired:
                return None


def train(run, workdir: Path, launch: Launch):
    """Train ``run`` (a second time when the first attempt failed for want of what the other --workers on its GPU
    held: preloaded.SHARED_GPU_FAILURES; it counts by that second attempt)."""
    attempt(run, workdir, launch)
    if run.status != "completed" and any(text in (run.error or "") for text in preloaded.SHARED_GPU_FAILURES):
        run.retried_after, run.status = run.error, None
        attempt(run, workdir, launch, retry=True)
    return run


def attempt(run, workdir: Path, launch: Launch, retry: bool = False) -> None:
    """Train ``run`` in its own directory and read its result.json; a failure without one keeps the reason its
    log gives (failure_reason)."""
    name = f"run{run.index}{'_retry' if retry else ''}"
    run_dir, log = workdir / name, workdir / f"{name}.log"
    run.error = None
    start = time.monotonic()
    if launch.command(run, run_dir, log, retry) is None:
        run.status, run.error = "timeout", f"no result within {launch.timeout_s:.0f} s"
    run.seconds = round(time.monotonic() - start, 1)
    result_file = run_dir / "result.json"
    if run.status is None:
        if result_file.exists():
            result = json.loads(result_file.read_text())
            run.status, run.error, run.losses = result.get("status"), result.get("reason"), result.get("loss", [])
            run.peak_reserved_gb = (result.get("memory") or {}).get("peak_reserved_gb")
        else:
            run.status = "failed"
    if run.status != "completed":
        run.log_tail = failure_log_tail(log, run_dir)
        run.error = run.error or failure_reason(run.log_tail)


def failure_log_tail(log: Path, run_dir: Path) -> Optional[str]:
    """The last LOG_TAIL lines of the log that says why a run failed. The ranks' own logs first: under torchrun
    each rank's files in the run's folder (perf.launch and Launch.command ask for them), with the preloaded
    launcher the run's log and those of the ranks after the first beside it (perf.preloaded.rank_log). Then the
    run's other logs and its log, which under torchrun ends with the launcher's own traceback. In each group the
    strongest FAILURE_MARKERS first; without any, the run's log."""
    others = preloaded.other_rank_logs(log)
    ranks = sorted(path for path in run_dir.rglob("*") if path.name.startswith(("stderr", "stdout")))
    ranks += [log, *others] if others else []
    rest = [path for path in sorted(run_dir.rglob("*.log")) if path not in ranks] + [log]
    texts = {path: path.read_text(errors="replace") for path in [*ranks, *rest] if path.is_file()}
    for group in (ranks, rest):
        for marker in FAILURE_MARKERS:
            source = next((path for path in group if marker in texts.get(path, "")), None)
            if source is not None:
                return "\n".join(texts[source].splitlines()[-LOG_TAIL:])
    return "\n".join(texts[log].splitlines()[-LOG_TAIL:]) if log in texts else None


def failure_reason(tail: Optional[str]) -> str:
    """The line of a failed run's log that names its error: the last exception or C++ abort message, else the
    last line."""
    lines = [line.strip() for line in (tail or "").splitlines() if line.strip()]
    named = [line for line in lines if REASON.match(line)]
    return (named or lines or ["no output"])[-1][:300]
