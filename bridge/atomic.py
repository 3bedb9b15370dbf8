"""Atomic file writes: a reader sees the old file or the new one, never half of one.

The text goes to a temporary file beside the target, is flushed to disk, gets the permissions a
plain ``open()`` would give it (the user's umask), and only then replaces the target. A write
that fails (disk full, no permission, a directory in the way) leaves the earlier file as it was,
removes the temporary one and raises ``WriteError``, whose message is one line naming the path.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union


class WriteError(OSError):
    """Writing a result file failed; str() is one line naming the path and why."""

    def __init__(self, path: Path, error: OSError):
        super().__init__(error.errno, f"cannot write {path}: {error.strerror or error}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: Union[str, Path], text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Union[str, Path], data: bytes) -> None:
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it 0600; the result is the user's file
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise WriteError(path, error) from error
    except BaseException:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Union[str, Path], data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
