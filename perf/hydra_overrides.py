"""What the command line may set in Hydra's own tree (``hydra.*``): nothing that names a callable.

Hydra instantiates every ``hydra.callbacks`` entry on every run, a plan included (``_target_``),
and its logging config goes to logging.config.dictConfig, which calls what a handler's ``class``
or a ``()`` key names. From the command line, ``hydra.callbacks`` takes graphbridge's own
callbacks (conf/config.yaml), under their own names, and their settings; any other callable is set
in a config file the user owns (a ``--config-dir``), or chosen by a group (``hydra/job_logging=...``).
"""

from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import yaml
from hydra.core.override_parser.types import ChoiceSweep, Override

CALLABLE_KEYS = ("_target_", "class", "()")
"""Keys whose value Hydra or logging imports and calls."""


def own_callbacks(primary_config: Path) -> Dict[str, str]:
    """graphbridge's callbacks, name -> _target_, as its primary config declares them."""
    try:
        tree = yaml.safe_load(primary_config.read_text(encoding="utf-8")) or {}
        callbacks = tree["hydra"]["callbacks"]
        return {name: entry["_target_"] for name, entry in callbacks.items()}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return {}  # not graphbridge's primary config: no callback is graphbridge's own


def hydra_override_error(override: Override, own: Dict[str, str]) -> Optional[str]:
    """One line when ``override`` (a key under hydra) names a callable it may not, else None."""
    path = override.key_or_group.split(".")
    if override.is_delete() or path[0] != "hydra":
        return None  # a group choice (hydra/launcher=...) names a config file, not a callable
    text = override.input_line
    for value in _values(override):
        if path[:2] == ["hydra", "callbacks"]:
            error = _callbacks_error(text, path, value, own)
        else:
            where, target = next(_named_callables(path, value), (None, None))
            error = where and (f"{text}: Hydra would import and call {target} ({where}); choose Hydra's logging and "
                               "plugins by group (hydra/job_logging=..., hydra/launcher=...) or set them in a config "
                               "file of your --config-dir")
        if error:
            return error
    return None


def _callbacks_error(text: str, path: List[str], value, own: Dict[str, str]) -> Optional[str]:
    """Each callback the override sets is one of graphbridge's, under its own name and _target_."""
    entries = value if len(path) == 2 and isinstance(value, dict) else {path[2]: value} if len(path) > 2 else None
    if entries is None:
        return f"{text}: hydra.callbacks is a mapping of graphbridge's callbacks ({', '.join(sorted(own))})"
    for name, entry in entries.items():
        if name not in own:
            return (f"{text}: no callback '{name}'; from the command line hydra.callbacks takes graphbridge's own "
                    f"({', '.join(sorted(own))}) and their settings")
        if len(path) <= 3 and not isinstance(entry, dict):
            return f"{text}: hydra.callbacks.{name} is a mapping of its settings (hydra.callbacks.{name}.<key>=...)"
        for where, target in _named_callables([*path[:2], name, *path[3:]], entry):
            if where != f"hydra.callbacks.{name}._target_" or target != own[name]:
                return (f"{text}: Hydra would import and call {target} on every run, a plan included; "
                        f"hydra.callbacks.{name} is graphbridge's {own[name]}")
    return None


def _values(override: Override) -> list:
    value = override.value()
    if isinstance(value, ChoiceSweep):
        return list(value.list)
    return [] if override.is_sweep_override() else [value]


def _named_callables(path: List[str], value) -> Iterator[Tuple[str, object]]:
    """(dotted key, value) of every callable-naming key at or below ``path``."""
    if path[-1] in CALLABLE_KEYS:
        yield ".".join(path), value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _named_callables([*path, str(key)], item)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _named_callables([*path, str(index)], item)
