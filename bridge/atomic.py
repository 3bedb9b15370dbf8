"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union


def write_text_atomic(path: Union[str, Path], text: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Union[str, Path], data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")
