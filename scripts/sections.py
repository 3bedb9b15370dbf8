"""Generated sections of the docs: text between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``
markers that a script rewrites from the code or data it documents, and that a test keeps current.

    python scripts/<table script>.py          # rewrite the section
    python scripts/<table script>.py --check  # exit 1 when it is out of date
"""

import sys
from pathlib import Path


def with_section(text: str, name: str, body: str) -> str:
    """``text`` with the ``name`` section's body replaced by ``body``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def write_or_check(path: Path, name: str, body: str, command: str, argv=None) -> int:
    """Rewrite the section in ``path``, or with --check say (exit 1) that it is out of date."""
    text = path.read_text()
    updated = with_section(text, name, body)
    if "--check" in (sys.argv[1:] if argv is None else argv):
        if updated != text:
            print(f"{path.name}'s {name} section is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    path.write_text(updated)
    return 0
