"""Job directories that Hydra creates before the job runs."""

import shutil
from pathlib import Path

HYDRA_ONLY = {".hydra"}


def discard_job_dir(job_dir: Path, multirun: bool) -> None:
    """Remove a single run's directory when it holds only Hydra's own bookkeeping.

    Plans and rejected configurations produce nothing worth keeping; in a sweep the job
    directory stays, since the sweep summary lists every job.
    """
    if multirun or not job_dir.is_dir():
        return
    entries = list(job_dir.iterdir())
    if all(entry.name in HYDRA_ONLY or entry.suffix == ".log" for entry in entries):
        shutil.rmtree(job_dir, ignore_errors=True)
        _remove_empty_parents(job_dir.parent)


def _remove_empty_parents(directory: Path) -> None:
    # outputs/<date>/ is left empty when its only run was discarded.
    for parent in (directory, directory.parent):
        if parent.name in ("", ".") or any(parent.iterdir()):
            return
        parent.rmdir()
