"""Damage to a copy of the config tree: the cases that once got past preflight as tracebacks, and a
context manager that swaps one file's text for a test. Shared by the fuzz and the preflight tests."""

from contextlib import contextmanager
from pathlib import Path
from typing import Optional


# Each was a traceback until preflight learned to name it: (overrides, file of the config tree
# to replace, its new text, what the one-line message says). "{file}" is the replaced file's path.
FORMER_GAPS = {
    "defaults_empty": ([], "recipe/llama/tiny.yaml", "# @package _global_\ndefaults:\n",
                       "{file}: line 2: 'defaults' must be a list of config names"),
    "defaults_item_list": ([], "recipe/llama/tiny.yaml", "defaults:\n  - [1, 2]\n",
                           "{file}: line 2: '[1, 2]' is not a defaults entry"),
    "header_cut": ([], "arch/llama3.yaml", "# @", "{file}: line 1: malformed header '# @'"),
    "config_emptied": ([], "config.yaml", "", "{file}: the primary config no longer loads the schema"),
    "group_null": (["gpu=null"], None, None, "gpu=null: a config group cannot be set to null; to use no gpu "
                                               "option write ~gpu"),
    "duplicate_key": ([], "arch/llama3.yaml", "model:\n  rotary_base: 1.0\nmodel:\n  vocab_size: 5\n",
                      "{file}: line 3, column 1: duplicate key 'model', first at line 1"),
}


@contextmanager
def replaced(root: Path, relative_path: Optional[str], text: Optional[str]):
    """The config tree with one file's text replaced, restored afterwards."""
    if relative_path is None:
        yield
        return
    path = root / relative_path
    original = path.read_text()
    path.write_text(text)
    try:
        yield
    finally:
        path.write_text(original)
