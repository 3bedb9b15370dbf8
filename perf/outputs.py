"""Who owns a run directory, and what a run may delete: only what it created itself.

A Hydra callback (conf/config.yaml, hydra.callbacks.run_directory) takes the run directory of a
single run, or the sweep directory of a multirun, before Hydra writes anything into it:

- it locks it with an OS file lock (``.graphbridge.lock``, fcntl.flock, released by the kernel
  even when the process is killed): a second run there is refused in one line naming the owner,
  or waits for it with ``hydra.callbacks.run_directory.wait=true``;
- a run refuses a directory that holds an earlier run's job files (resolved.yaml, job.json,
  result.json, .hydra/) or a file named as its job log (main.log: Hydra would append to it), and a
  sweep one that holds an earlier sweep's jobs: results are never overwritten;
- it records what existed before, and when the process ends (any way but SIGKILL), it removes the
  lock file it made; a run that left no job files (a plan, a refused config) also removes what
  else it created: Hydra's bookkeeping (.hydra/, main.log, multirun.yaml) among the entries that
  were not there before, the directories it made while they are empty; never anything that was
  there before, nothing else that appeared meanwhile, and never a job's files. A sweep whose jobs
  left none (a plan sweep) likewise.

Any error while taking the directory (an interpolation in hydra.run.dir, a path that cannot be
made) ends the command in one line: Hydra would only warn about a failing callback and go on.
"""

import atexit
import fcntl
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Optional, Set

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from bridge.result import RESULT_FILE

LOCK_FILE = ".graphbridge.lock"
JOB_FILES = ("resolved.yaml", "job.json", RESULT_FILE)
"""The files a job leaves; their presence means a run's results live here."""
EARLIER_RUN = (*JOB_FILES, ".hydra")
"""What marks a directory an earlier run (of graphbridge, or of any Hydra app) wrote into."""
REFUSED = 2


class RunDirectory(Callback):
    """Takes and releases the run (or sweep) directory; see the module's docstring."""

    def __init__(self, wait: bool = False):
        if not isinstance(wait, bool):
            refuse(f"hydra.callbacks.run_directory.wait={wait}: true (wait for the run that holds the directory) "
                   "or false (refuse to start)")
        self.wait = wait

    # Hydra turns an exception of a callback into a warning and goes on: the run would start unlocked.
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        guarded(lambda: take(Path(config.hydra.run.dir), self.wait, earlier_run(config), bookkeeping(config)))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        guarded(lambda: take(Path(config.hydra.sweep.dir), self.wait, earlier_sweep, bookkeeping(config),
                             kind="sweep directory"))


def guarded(step) -> None:
    """Run ``step``; any error it meets ends the command in one line (exit 2) instead."""
    try:
        step()
    except OmegaConfBaseException as error:  # an interpolation in hydra.run.dir, hydra.job.name, ...
        refuse(f"{getattr(error, 'full_key', None) or 'hydra'}: {str(error).splitlines()[0]}")
    except Exception as error:  # noqa: BLE001 - whatever it is, the run must not start unlocked
        refuse(f"cannot take the run directory ({type(error).__name__}: {error}); check hydra.run.dir / "
               "hydra.sweep.dir")


def bookkeeping(config: DictConfig) -> Set[str]:
    """The names of what Hydra writes into a run (or job) directory that left no job files."""
    return {".hydra", "multirun.yaml", f"{config.hydra.job.name}.log"}


@dataclass
class Ownership:
    directory: Path
    lock: Any
    bookkeeping: Set[str]
    created_dirs: List[Path] = field(default_factory=list)
    existed: Set[str] = field(default_factory=set)
    created_lock_file: bool = False

    def release(self) -> None:
        """Remove what this run created and no job needs, then let the lock go."""
        try:
            self.remove_created()
        except OSError:  # the directory changed under the run (moved, made read-only): leave it as it is
            pass
        self.lock.close()  # closing the file releases the flock

    def remove_created(self) -> None:
        created = [entry for entry in sorted(self.directory.iterdir()) if entry.name not in self.existed
                   and entry.name != LOCK_FILE] if self.directory.is_dir() else []
        # A run's job files sit in its directory, a sweep's in its job directories.
        left_results = any(path.name in JOB_FILES for entry in created
                           for path in ([entry, *entry.iterdir()] if entry.is_dir() else [entry]))
        if not left_results:  # Hydra's bookkeeping of a run that left no job; a file of anyone else stays
            for entry in created:
                self.remove_bookkeeping(entry)
        # The lock file is this run's own, results or not. A run that waits on it meanwhile then holds a
        # removed file, which is harmless: it finds this run's results and is refused, or none and plans.
        if self.created_lock_file:
            (self.directory / LOCK_FILE).unlink(missing_ok=True)
        for directory in reversed(self.created_dirs):  # innermost first, and only while empty
            try:
                directory.rmdir()
            except OSError:
                break

    def remove_bookkeeping(self, entry: Path) -> None:
        """``entry`` if Hydra's, else the bookkeeping inside a directory this run made (a job's)."""
        if entry.name in self.bookkeeping:
            remove(entry)
        elif entry.is_dir() and not entry.is_symlink():
            for child in entry.iterdir():
                self.remove_bookkeeping(child)
            try:
                entry.rmdir()
            except OSError:  # something that is not Hydra's is in it
                pass


def take(directory: Path, wait: bool, earlier, bookkeeping: Set[str], kind: str = "run directory") -> Ownership:
    """Create (as needed) and lock ``directory``; exit 2 in one line when it is not ours to use."""
    directory = directory.absolute()
    try:
        created = missing_parents(directory)
        directory.mkdir(parents=True, exist_ok=True)
        lock_path = directory / LOCK_FILE
        created_lock_file = not lock_path.exists()
        lock = open(lock_path, "a+")
        existed = {entry.name for entry in directory.iterdir()} - {LOCK_FILE}
    except OSError as error:
        refuse(f"cannot use {directory} as the {kind}: {error.strerror or error}; choose another "
               "hydra.run.dir / hydra.sweep.dir")
    ownership = Ownership(directory, lock, bookkeeping, created, existed, created_lock_file)
    acquire(ownership, wait)
    problem = earlier(directory)
    if problem:
        ownership.release()
        refuse(problem)
    lock.seek(0)
    lock.truncate()
    lock.write(json.dumps(owner()) + "\n")
    lock.flush()
    atexit.register(ownership.release)
    return ownership


def acquire(ownership: Ownership, wait: bool) -> None:
    try:
        fcntl.flock(ownership.lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        holder = describe_owner(ownership)
    if not wait:
        ownership.lock.close()
        refuse(f"{ownership.directory} is in use by {holder}; wait for it (hydra.callbacks.run_directory.wait=true) "
               "or choose another hydra.run.dir / hydra.sweep.dir")
    print(f"graphbridge: waiting for {ownership.directory} ({holder})", file=sys.stderr)
    fcntl.flock(ownership.lock.fileno(), fcntl.LOCK_EX)


def owner() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(["graphbridge", *sys.argv[1:]])}


def describe_owner(ownership: Ownership) -> str:
    ownership.lock.seek(0)
    try:
        record = json.loads(ownership.lock.read() or "{}")
    except ValueError:
        return "another graphbridge run"
    if not record:
        return "another graphbridge run"
    return (f"graphbridge pid {record.get('pid')} on {record.get('host')} since {record.get('since')} "
            f"({record.get('command')})")


def earlier_run(config: DictConfig):
    """A plan writes no job files, so only a run refuses a directory that holds an earlier run's, or a
    file named as its job log (Hydra would append to it)."""
    job_log = f"{config.hydra.job.name}.log"

    def check(directory: Path) -> Optional[str]:
        if config.get("mode") == "plan":
            return None
        found = [name for name in EARLIER_RUN if (directory / name).exists()]
        if found:
            return (f"{directory} holds an earlier run's {', '.join(found)}; graphbridge never overwrites a result: "
                    "choose another hydra.run.dir (the default is a new timestamped one) or move them away")
        if (directory / job_log).exists():
            return (f"{directory} holds {job_log}, which this run's log would be appended to: choose another "
                    "hydra.run.dir (the default is a new timestamped one) or move it away")
        return None

    return check


def earlier_sweep(directory: Path) -> Optional[str]:
    jobs = [entry.name for entry in directory.iterdir()
            if entry.is_dir() and any((entry / name).exists() for name in EARLIER_RUN)]
    if jobs:
        return (f"{directory} holds {len(jobs)} job(s) of an earlier sweep; graphbridge never mixes sweeps: choose "
                "another hydra.sweep.dir (the default is a new timestamped one) or move them away")
    return None


def missing_parents(directory: Path) -> List[Path]:
    """The directories from the first missing ancestor down to ``directory`` (what mkdir will create)."""
    missing = []
    for path in [directory, *directory.parents]:
        if path.exists():
            break
        missing.append(path)
    return list(reversed(missing))


def remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        for child in entry.iterdir():
            remove(child)
        entry.rmdir()
    else:
        entry.unlink(missing_ok=True)


def refuse(message: str) -> None:
    print(f"graphbridge: {message}", file=sys.stderr)
    sys.exit(REFUSED)
