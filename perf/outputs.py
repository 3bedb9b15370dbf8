"""Who owns a run directory, and what a run may delete: only what it created itself.

A Hydra callback (conf/config.yaml, hydra.callbacks.run_directory) takes the run directory of a
single run, or the sweep directory of a multirun, before Hydra writes anything into it:

- it locks it with an OS file lock (``.graphbridge.lock``, fcntl.flock, released by the kernel
  even when the process is killed): a second run there is refused in one line naming the owner,
  or waits for it with ``hydra.callbacks.run_directory.wait=true``;
- a run refuses a directory that holds an earlier run's job files (resolved.yaml, job.json,
  result.json), and a sweep one that holds an earlier sweep's jobs: results are never overwritten;
- it records what existed before, and when the process ends (any way but SIGKILL), a run that
  left no job files (a plan, a refused config) removes what it created (Hydra's .hydra/ and
  main.log, the lock file, the directories it made), and a sweep whose jobs left none (a plan
  sweep) likewise; never anything that was there before, and never a job's files.
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
        self.wait = wait

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        take(Path(config.hydra.run.dir), self.wait, earlier=earlier_run(config))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        take(Path(config.hydra.sweep.dir), self.wait, earlier=earlier_sweep)


@dataclass
class Ownership:
    directory: Path
    lock: Any
    created_dirs: List[Path] = field(default_factory=list)
    existed: Set[str] = field(default_factory=set)
    created_lock_file: bool = False

    def release(self) -> None:
        """Remove what this run created and no job needs, then let the lock go."""
        created = [entry for entry in sorted(self.directory.iterdir()) if entry.name not in self.existed
                   and entry.name != LOCK_FILE] if self.directory.is_dir() else []
        # A run's job files sit in its directory, a sweep's in its job directories.
        left = [entry for entry in created for path in ([entry, *entry.iterdir()] if entry.is_dir() else [entry])
                if path.name in JOB_FILES]
        left_results = bool(left)
        for entry in [] if left_results else created:  # Hydra's bookkeeping of a run that left no job
            remove(entry)
        if self.created_lock_file and not left_results:
            (self.directory / LOCK_FILE).unlink(missing_ok=True)
        for directory in reversed(self.created_dirs):  # innermost first, and only while empty
            try:
                directory.rmdir()
            except OSError:
                break
        self.lock.close()  # closing the file releases the flock


def take(directory: Path, wait: bool, earlier) -> Ownership:
    """Create (as needed) and lock ``directory``; exit 2 in one line when it is not ours to use."""
    directory = directory.absolute()
    created = missing_parents(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock_path = directory / LOCK_FILE
        created_lock_file = not lock_path.exists()
        lock = open(lock_path, "a+")
    except OSError as error:
        refuse(f"cannot use {directory} as the run directory: {error.strerror or error}; choose another "
               "hydra.run.dir / hydra.sweep.dir")
    ownership = Ownership(directory, lock, created,
                          {entry.name for entry in directory.iterdir()} - {LOCK_FILE}, created_lock_file)
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
    flags = fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB
    if wait:
        print(f"graphbridge: waiting for {ownership.directory} ({describe_owner(ownership)})", file=sys.stderr)
    try:
        fcntl.flock(ownership.lock.fileno(), flags)
    except BlockingIOError:
        message = (f"{ownership.directory} is in use by {describe_owner(ownership)}; wait for it "
                   "(hydra.callbacks.run_directory.wait=true) or choose another hydra.run.dir / hydra.sweep.dir")
        ownership.lock.close()
        refuse(message)


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
    """A plan writes no job files, so only a run refuses a directory that holds an earlier run's."""
    def check(directory: Path) -> Optional[str]:
        if config.get("mode") == "plan":
            return None
        found = [name for name in EARLIER_RUN if (directory / name).exists()]
        if found:
            return (f"{directory} holds an earlier run's {', '.join(found)}; graphbridge never overwrites a result: "
                    "choose another hydra.run.dir (the default is a new timestamped one) or move them away")
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
