"""Training processes forked from one that has imported torch, Transformer Engine and megatron-core once.

A run of the GPU differential spends about 20 of its 32 s importing those three on one core (the footprint
record, benchmarks/results/h100/mcore-0.16.1/run_footprint.json); with one run a core the cores, not the GPU,
set the pace. Python's forkserver imports them once (set_forkserver_preload: this module, which imports them)
and forks each training process from there, before any CUDA call, so each child starts where
``python -m bridge.run <job_dir>`` would be after its imports. The child then does what that command does:
applies the config's env_vars, asks the catalogue and trains.

Python's forkserver prepares each child by importing the main script as ``__mp_main__``: a script that uses this
launcher keeps its work under ``if __name__ == "__main__"``, or each child runs it again and dies before training.

What differs from a fresh process: the environment a module reads at import time is the harness's, not the
run's (this launcher sets only MASTER_PORT and what --run-env names per run, none read at import), and exit
handlers registered by the imports do not run (result.json is written before them).
"""

import multiprocessing
import os
import sys
from pathlib import Path
from typing import Dict, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

for _heavy in ("torch", "transformer_engine.pytorch", "megatron.core", "bridge.run"):
    try:  # a missing or broken package fails the child's own import the way it fails a fresh process
        __import__(_heavy)
    except Exception:  # noqa: BLE001 - e.g. OSError from a Transformer Engine without its extension
        pass


def train(job_dir: Path, log: Path, env: Dict[str, str], unchecked_rules: Sequence[str] = (),
          timeout_s: Optional[float] = None) -> Optional[int]:
    """Train ``job_dir`` in a forked child, its output into ``log``; its exit code, None if killed at the timeout."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])  # takes effect when the server starts, at the first child
    child = context.Process(target=_child, args=(str(job_dir), str(log), env, list(unchecked_rules)))
    child.start()
    child.join(timeout_s)
    if child.is_alive():
        child.kill()
        child.join()
        return None
    return child.exitcode


def cuda_initialized() -> bool:
    """Whether this process (the forkserver, once it imported the heavy modules) holds a CUDA context: its forks
    could not use CUDA then."""
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _child(job_dir: str, log: str, env: Dict[str, str], unchecked_rules: Sequence[str]) -> None:
    descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for stream in (1, 2):
        os.dup2(descriptor, stream)
    os.close(descriptor)
    os.environ.update(env)
    if cuda_initialized():
        print("preloaded: the forkserver initialised CUDA while importing; its children cannot use it", flush=True)
        sys.exit(1)
    from unchecked_run import train_unchecked

    code = train_unchecked(job_dir, set(unchecked_rules))
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
