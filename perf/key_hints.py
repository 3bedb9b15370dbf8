"""What the command line is told about a key under the schema: an unknown key, with the closest key that
exists as a whole, and a value its key's type refuses, with what the key takes and an example (OmegaConf's own
messages name no fix). perf/preflight.py asks them of each override before Hydra composes."""

import dataclasses
import difflib
import typing
from enum import Enum
from pathlib import Path
from typing import Any, List, Optional, Tuple, Union

from hydra.core.override_parser.types import ChoiceSweep, ValueType
from omegaconf import BooleanNode, EnumNode, FloatNode, IntegerNode, OmegaConf
from omegaconf.errors import ValidationError

from bridge.config.load import compose_config, override_value
from bridge.config.schema import GraphBridgeConfig

# The scalar types a value is checked against: OmegaConf's node for each (its own conversion rules), how
# a message names what it takes, and the example where the composed config has no value to show.
SCALARS = {int: (IntegerNode, "an integer", 1), float: (FloatNode, "a number", 0.5),
           bool: (BooleanNode, "true or false", True)}


def key_error(dotted: str, groups: List[str]) -> Optional[str]:
    """An unknown key, with the closest key that exists as a whole: a field, or at the top level a group
    (cuda_graphs=...)."""
    node = GraphBridgeConfig
    path: List[str] = []
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        fields = _fields(node)
        if fields is None:
            return None  # below a leaf or a free-form node: OmegaConf judges it
        if part not in fields:
            rest = parts[index + 1:]
            close = _closest(part, fields, groups if len(parts) == 1 else [], rest)
            where = ".".join(path) or "the top level"
            hint = f"; did you mean {'.'.join(path + [close] + rest)}?" if close else ""
            return f"{dotted}: no key '{part}' in {where}{hint} (graphbridge --cfg job lists every key)"
        path.append(part)
        node = fields[part].type
    return None


def _fields(node) -> Optional[dict]:
    """A schema section's fields by name; None for a leaf or a free-form node."""
    return {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else None


def _closest(part: str, fields: dict, groups: List[str], rest: List[str]) -> Optional[str]:
    """The name nearest ``part`` below which ``rest`` is a key too: for modle.num_layers model, not mode
    (nearer, but a string), so that following the suggestion does not fail again."""
    names = [*fields, *groups]
    for name in difflib.get_close_matches(part, names, n=len(names)):
        if (name in fields and _lookup(fields[name].type, rest) is not None) or (name in groups and not rest):
            return name
    return None


def _lookup(node, parts: List[str]):
    """The schema's type of the key ``parts`` below ``node``, or None where there is no such key. Any
    key below a free-form dict (env_vars) is one, of any type."""
    for part in parts:
        if typing.get_origin(node) is dict:
            return Any
        fields = _fields(node)
        if fields is None or part not in fields:
            return None
        node = fields[part].type
    return node


def value_error(override, overrides: List[str], root: Path) -> Optional[str]:
    """A value its key's type refuses, as what the key takes and an example; OmegaConf's own message
    ("could not be converted to Integer") names no fix."""
    if override.is_delete() or override.is_add():
        return None  # deleting takes any value; adding a key the schema has fails whatever the value
    if override.value_type not in (ValueType.ELEMENT, ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP):
        return None  # a range or interval sweep: Hydra makes its values
    key = override.key_or_group
    scalar = _scalar(_lookup(GraphBridgeConfig, key.split(".")))
    if scalar is None:
        return None  # strings, lists, dicts and Any: OmegaConf judges them
    value = override.value()
    if all(_accepts(scalar, item) for item in (value.list if isinstance(value, ChoiceSweep) else [value])):
        return None
    base, optional = scalar
    takes = f"one of {', '.join(member.name for member in base)}" if issubclass(base, Enum) else SCALARS[base][1]
    others = [line for line in overrides if line != override.input_line]
    return (f"{key} takes {takes}{' (or null)' if optional else ''}, "
            f"e.g. {key}={_example(key, base, others, root)}")


def _scalar(annotation) -> Optional[Tuple[type, bool]]:
    """(type, optional) of a key typed int, float, bool or a string Enum, optional or not; else None."""
    args = typing.get_args(annotation)
    optional = typing.get_origin(annotation) is Union and len(args) == 2 and type(None) in args
    base = next(arg for arg in args if arg is not type(None)) if optional else annotation
    if base in SCALARS or (isinstance(base, type) and issubclass(base, Enum)):
        return base, optional
    return None


def _accepts(scalar: Tuple[type, bool], value) -> bool:
    """Whether OmegaConf takes ``value`` for a key of this type (an interpolation it takes for any)."""
    base, optional = scalar
    try:
        if issubclass(base, Enum):
            EnumNode(enum_type=base, value=value, is_optional=optional)
        else:
            SCALARS[base][0](value=value, is_optional=optional)
    except ValidationError:
        return False
    return True


def _example(key: str, base: type, others: List[str], root: Path) -> str:
    """The key's value in what the rest of the command line composes, as an override's value; a value of
    its type where that has none."""
    try:
        current = OmegaConf.select(compose_config(others, config_root=root), key, throw_on_resolution_failure=False)
    except Exception:  # noqa: BLE001 - Hydra's errors, OmegaConf's, and a ValueError for an override "=1"
        current = None  # the rest does not compose (another override is wrong too, or a sweep): the example is
        # only decoration, and that override gets its own message once this one is fixed
    if current is None:
        current = next(iter(base)) if issubclass(base, Enum) else SCALARS[base][2]
    return current.name if isinstance(current, Enum) else override_value(current)
