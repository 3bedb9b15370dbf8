"""Training processes forked from one that has imported torch, Transformer Engine and megatron-core once.

A run of the GPU differential spends about 20 of its 32 s importing those three on one core (the footprint
record, benchmarks/results/h100/mcore-0.16.1/run_footprint.json); with one run a core the cores, not the GPU,
set the pace, and cuda_graph=auto's probe would pay the imports once per run. Python's forkserver imports them
once (set_forkserver_preload: perf/training_imports.py) and forks each training process from there, before any
CUDA call, so each child starts where ``python -m bridge.run <job_dir>`` would be after its imports. The child
then does what that command does: applies the config's env_vars, asks the catalogue and trains. A job of
several GPUs gets one child per GPU of this node, with the environment torchrun gives its ranks.

Python's forkserver prepares each child by importing the main script as ``__mp_main__``: a script that uses this
launcher keeps its work under ``if __name__ == "__main__"``, or each child runs it again and dies before training.

What differs from a fresh process: the environment a module reads at import time is the launcher's, not the
run's (this launcher sets only the ranks' variables and what ``env`` names, none read at import), and exit
handlers registered by the imports do not run (result.json is written before them).
"""

import multiprocessing
import os
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from bridge.machine import free_port

PRELOADED = "perf.training_imports"
SHARED_GPU_FAILURES = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "ncclUnhandledCudaError", "EADDRINUSE")
"""How a run fails for want of what other runs on its GPU hold (their memory, a port one took): the fault of
starting runs side by side (the GPU differential, cuda_graph=auto's probe), not of the run, which trains alone."""


def train_job(job_dir: str) -> int:
    """What ``python -m bridge.run <job_dir>`` does: the default work of a child."""
    from bridge import run

    return run.main([job_dir])


def train(job_dir: Path, log: Path, env: Dict[str, str], ranks: int = 1, timeout_s: Optional[float] = None,
          entry: Callable[..., int] = train_job, entry_args: Sequence = (),
          port: Optional[int] = None) -> Optional[int]:
    """Train ``job_dir`` as ``start`` does and wait for it: the first non-zero exit code (0 when every rank
    completed); None when the ranks were killed at the timeout. The children never outlive this call: leaving it
    by an exception (a signal) kills them."""
    job = start(job_dir, log, env, ranks, entry, entry_args, port)
    try:
        return job.wait(timeout_s)
    finally:
        job.kill()


def start(job_dir: Path, log: Path, env: Dict[str, str], ranks: int = 1, entry: Callable[..., int] = train_job,
          entry_args: Sequence = (), port: Optional[int] = None) -> "ForkedJob":
    """Start ``job_dir`` in ``ranks`` forked children (one per GPU of this node), rank 0's output into ``log``,
    rank r's into ``rank_log(log, r)``; each child calls ``entry(job_dir, *entry_args)``. The ranks meet at
    ``port`` (default: one free now; a caller starting many jobs at once gives each its own). The caller waits for
    the job and kills what is left of it."""
    context = forkserver()
    port = port or free_port()
    children = [context.Process(target=_child, args=(str(job_dir), str(rank_log(log, rank)),
                                                     {**env, **rank_environment(rank, ranks, port)}, entry,
                                                     tuple(entry_args)))
                for rank in range(ranks)]
    job = ForkedJob(children)
    try:
        for child in children:
            child.start()
    except BaseException:
        job.kill()
        raise
    return job


class ForkedJob:
    """The ranks of one job, forked from the server."""

    def __init__(self, children: list):
        self.children = children

    def ended(self) -> bool:
        """Every rank ended, or one failed (the others would wait for it in a collective)."""
        return any(child.exitcode for child in self.children) or all(child.exitcode is not None
                                                                       for child in self.children)

    def wait(self, timeout_s: Optional[float]) -> Optional[int]:
        """The first non-zero exit code (0 when every rank completed); None when one still runs at the timeout. A
        rank that fails ends the wait: kill() stops the others."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self.ended():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            wait([child.sentinel for child in self.children if child.exitcode is None], left)
        return next((child.exitcode for child in self.children if child.exitcode), 0)

    def kill(self) -> None:
        for child in self.children:
            if child.pid is not None and child.is_alive():
                child.kill()
                child.join()


def forkserver():
    """The forkserver context, with the training stack to import when its server starts (at its first child)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([PRELOADED])
    return context


def start_server() -> float:
    """Start the forkserver now, so that it imports the training stack before the first timed child: the
    seconds it took (next to nothing when it runs already)."""
    started = time.monotonic()
    child = forkserver().Process(target=started_by_the_server)
    child.start()
    child.join()
    return time.monotonic() - started


def started_by_the_server() -> None:
    """A child with nothing to do: its start is the server's."""


def rank_log(log: Path, rank: int) -> Path:
    return log if rank == 0 else log.with_name(f"{log.stem}.rank{rank}{log.suffix}")


def other_rank_logs(log: Path) -> List[Path]:
    """The logs ranks after the first left beside ``log`` (rank_log)."""
    return sorted(log.parent.glob(f"{log.stem}.rank*{log.suffix}"))


def rank_environment(rank: int, ranks: int, port: int) -> Dict[str, str]:
    """What torchrun tells each rank of a one-node job; a single process needs none (the engine makes its own
    one-process group)."""
    if ranks == 1:
        return {}
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_WORLD_SIZE": str(ranks),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def cuda_initialized() -> bool:
    """Whether this process (the forkserver, once it imported the heavy modules) holds a CUDA context: its forks
    could not use CUDA then."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _child(job_dir: str, log: str, env: Dict[str, str], entry: Callable[..., int], entry_args: tuple) -> None:
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (1, 2):
        os.dup2(descriptor, stream)
    os.close(descriptor)
    os.environ.update(env)
    if cuda_initialized():
        print("preloaded: the forkserver initialised CUDA while importing; its children cannot use it", flush=True)
        sys.exit(1)
    code = entry(job_dir, *entry_args)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
