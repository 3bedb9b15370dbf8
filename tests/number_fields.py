"""Every int and float field of graphbridge's schema, by dotted key: the fields tests/test_absurd_values.py sets to
absurd values, and tests/test_default_coverage.py holds its default sample to (every field tried by default)."""

import dataclasses
import typing

from bridge.config.schema import GraphBridgeConfig

NUMBER_TYPES = {int: int, float: float, typing.Optional[int]: int, typing.Optional[float]: float}


def number_fields(node=GraphBridgeConfig, prefix=""):
    """(dotted key, int or float) of every number field of the schema, Optional ones included."""
    hints = typing.get_type_hints(node)
    for item in dataclasses.fields(node):
        kind = hints[item.name]
        if dataclasses.is_dataclass(kind):
            yield from number_fields(kind, f"{prefix}{item.name}.")
        elif kind in NUMBER_TYPES:
            yield prefix + item.name, NUMBER_TYPES[kind]


FIELDS = dict(number_fields())
INT_KEYS = tuple(key for key, kind in FIELDS.items() if kind is int)
EVERY_INT = "every-int"
"""The id prefix of a case that sets every int field at once (INT_KEYS), as ``every-int=<value>``."""
