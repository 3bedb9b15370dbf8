"""One line for what ends the `graphbridge` command around its job: a config that Hydra or OmegaConf
refuses (Hydra prints those in several lines, and an interpolation in a ``hydra.*`` key as a
traceback) and an OS error of Hydra's own writes into the run directory (disk full, no permission).

Hydra formats what its run raises itself, unless HYDRA_FULL_ERROR is set: then the exception
reaches the caller, which names it here in one line. A user who sets HYDRA_FULL_ERROR gets
Hydra's full traceback as Hydra documents; an exception of any other type is a bug in graphbridge
and keeps its traceback.
"""

import os
import sys
from contextlib import contextmanager
from typing import Iterator

from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

FULL_ERROR = "HYDRA_FULL_ERROR"
INVALID = 2
"""The config (or the command line) is wrong."""
FAILED = 1
"""The machine refused: a write into the run directory failed."""


@contextmanager
def one_line_errors(program: str = "graphbridge") -> Iterator[None]:
    """Run Hydra inside: its refusals exit 2 and OS errors exit 1, each as one line on stderr."""
    asked_for_traceback = bool(os.environ.get(FULL_ERROR))
    os.environ[FULL_ERROR] = "1"
    try:
        yield
    except (HydraException, OmegaConfBaseException, OSError) as error:
        if asked_for_traceback:
            raise
        print(f"{program}: {describe(error)}", file=sys.stderr)
        sys.exit(FAILED if isinstance(error, OSError) else INVALID)
    finally:
        if not asked_for_traceback:
            os.environ.pop(FULL_ERROR, None)


def describe(error: BaseException) -> str:
    """The error as one line: its message and its cause's, the key an OmegaConf error names."""
    if isinstance(error, OSError):
        if error.filename is not None and error.strerror:
            return f"{error.filename}: {error.strerror}"
        return _first_lines(error)
    text = _first_lines(error)
    key = getattr(error, "full_key", None)
    if isinstance(error, OmegaConfBaseException) and key and not text.startswith(f"{key}:"):
        text = f"{key}: {text}"
    cause = error.__cause__  # raised "from" it; an implicit __context__ is an internal, unformatted message
    if isinstance(cause, (HydraException, OmegaConfBaseException)):
        detail = describe(cause)
        if detail and detail not in text:
            text = f"{text}: {detail}" if text else detail
    return text or type(error).__name__


def _first_lines(error: BaseException) -> str:
    """The message's lines joined, without OmegaConf's indented details (full_key, object_type), the
    caret under a parse error, or Hydra's config search path; the options Hydra lists (tab-indented)
    follow their line, and the pointer to Hydra's grammar page ends it in parentheses."""
    kept, see, in_search_path = [], None, False
    for line in str(error).splitlines():
        stripped = line.strip()
        if not stripped or set(stripped) <= set("^~ "):
            continue
        if stripped.startswith("See https://"):
            see = stripped[4:].rstrip(".")
        elif line.startswith("\t"):
            if kept and not in_search_path:
                kept[-1] += (" " if kept[-1].endswith(":") else ", ") + stripped
        elif not line.startswith(" "):  # an indented line is one of OmegaConf's details
            in_search_path = stripped.startswith("Config search path")
            if not in_search_path:
                kept.append(stripped.rstrip("."))
    text = ""
    for line in kept:  # a line that ends in a colon introduces the next
        text += (" " if text.endswith(":") else "; ") + line if text else line
    return f"{text} (see {see})" if see else text
