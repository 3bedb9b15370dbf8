"""The job's log file (Hydra's job logging: ``<run dir>/main.log``) holds what the terminal showed.

Hydra's file handler already receives this process's log records. What it would miss is written
here as well: the lines ``graphbridge`` prints (the plan, violations) through ``echo``, and the
training process's stdout and stderr, which ``Tee`` streams to the terminal unchanged while it
appends them to the log. A progress bar redraws its line with carriage returns; the log keeps
each line's final state only, so it reads like the terminal looked when the run ended.

The log is whatever file Hydra's ``hydra/job_logging`` configured (its root logger's file
handler); with job logging disabled there is none and only the terminal gets the output.
"""

import logging
import sys
import threading
from pathlib import Path
from typing import BinaryIO, Optional, TextIO

JOIN_TIMEOUT_S = 5.0
"""How long to wait for the rest of the training process's output after it exited: a descendant
that outlived it may hold its pipe open, and must not keep the launcher waiting."""


def job_log_path() -> Optional[Path]:
    """The file Hydra's job logging writes this job's log records to, if any."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            return Path(handler.baseFilename)
    return None


def append(path: Optional[Path], text: str) -> None:
    """Append ``text`` (whole lines) to the job log, unless there is none."""
    if path is None or not text:
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(text if text.endswith("\n") else text + "\n")


def echo(text: str, stream: TextIO = sys.stdout, logged: bool = True) -> None:
    """Print ``text``, and keep it in the job log too unless not ``logged`` (a plan writes nothing)."""
    print(text, file=stream)
    if logged:
        append(job_log_path(), text)


def final_line(raw: bytes) -> str:
    """What a terminal shows of one line that was redrawn with carriage returns."""
    return raw.rstrip(b"\r").rsplit(b"\r", 1)[-1].decode("utf-8", errors="replace")


class Tee:
    """Copies one pipe of the training process to a terminal stream (as it comes, carriage returns
    included; none: not shown) and to the job log (one final line per line), on a thread of its own."""

    def __init__(self, source: BinaryIO, terminal: Optional[BinaryIO], log: Optional[Path]):
        self._source, self._terminal, self._log = source, terminal, log
        self._thread = threading.Thread(target=self._copy, daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join(JOIN_TIMEOUT_S)

    def _copy(self) -> None:
        log = open(self._log, "a", encoding="utf-8") if self._log is not None else None
        pending = b""
        try:
            while chunk := self._source.read1(1 << 16):
                if self._terminal is not None:
                    self._terminal.write(chunk)
                    self._terminal.flush()
                *lines, pending = (pending + chunk).split(b"\n")
                if log is not None and lines:
                    log.write("".join(final_line(line) + "\n" for line in lines))
                    log.flush()
            if log is not None and pending:
                log.write(final_line(pending) + "\n")
        finally:
            self._source.close()
            if log is not None:
                log.close()
