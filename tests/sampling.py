"""A broad parametrization split in two: a deterministic sample of its cases runs in a plain `pytest`, every other
case under `pytest -m slow` (pyproject's addopts leave slow out: DEFAULT_MARKS), so that the default run stays short
while no case is lost; tests/test_default_coverage.py reads what the default run selects back from pytest (node ids)
and asserts that the sample keeps what must stay covered by default (every rule, recipe and preset), and that both
halves of a split together are the whole list.

    @pytest.mark.parametrize("key", one_per(sorted(ROWS), signature=lambda key: ROWS[key].recipe))
"""

from typing import Callable, Hashable, Iterable, List, Optional, Sequence

import pytest

SLOW = pytest.mark.slow
DEFAULT_MARKS = "not slow and not harness"
"""The mark expression of pyproject's addopts, what a plain `pytest` selects by (test_default_coverage.py checks)."""


def split(values: Iterable, by_default: Callable[[int, object], bool], ids: Optional[Callable] = None,
          several: bool = False) -> List:
    """``values`` as pytest params: those ``by_default(index, value)`` keeps run by default, the rest are slow.
    ``several``: each value is the tuple of a case's arguments (a parametrize over several names)."""
    return [pytest.param(*(value if several else (value,)), marks=() if by_default(index, value) else SLOW,
                         id=ids(value) if ids else None)
            for index, value in enumerate(values)]


def every(values: Sequence, step: int, ids: Optional[Callable] = None, several: bool = False) -> List:
    """Every ``step``-th of ``values`` (the first, then each ``step`` on) by default; the rest slow."""
    return split(values, lambda index, _: index % step == 0, ids, several)


def one_per(values: Sequence, signature: Callable[[object], Hashable], ids: Optional[Callable] = None,
            several: bool = False) -> List:
    """The first of ``values`` with each ``signature`` by default (one case of each kind); the rest slow."""
    first = {}
    for index, value in enumerate(values):
        first.setdefault(signature(value), index)
    chosen = set(first.values())
    return split(values, lambda index, _: index in chosen, ids, several)
