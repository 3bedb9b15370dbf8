"""Checks on the command line before Hydra composes, for errors Hydra reports badly:
a YAML syntax error in a config file (a long traceback), an unknown key or a misspelled group
choice (no suggestion). Each becomes one line naming the file and line, or the nearest name.
"""

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Iterable, List, Optional

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException

from bridge.config.paths import config_dir
from bridge.config.schema import GraphBridgeConfig

# Hydra's own flags and the ones that take a value.
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "--config-path", "-cp", "--config-name", "-cn",
                    "--config-dir", "-cd", "--experimental-rerun"}
OPEN_KEYS = ("hydra", "env_vars")  # Hydra's own tree and free-form dicts
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check(argv: List[str], config_root: Optional[Path] = None) -> Optional[str]:
    """An error line for the first problem found, or None; ``config_root`` replaces conf/."""
    overrides, config_dirs = _split(argv)
    roots = [config_root or config_dir()] + [Path(d) for d in config_dirs]
    return _yaml_error(roots) or _override_error(overrides, roots)


def _split(argv: List[str]):
    overrides, config_dirs, args = [], [], iter(argv)
    for arg in args:
        if arg in FLAGS_WITH_VALUE:
            value = next(args, "")
            if arg in ("--config-dir", "-cd"):
                config_dirs.append(value)
        elif arg.startswith("--config-dir="):
            config_dirs.append(arg.split("=", 1)[1])
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides, config_dirs


def _yaml_files(roots: Iterable[Path]):
    for root in roots:
        # os.walk, not Path.rglob: before Python 3.13 rglob skips the conf/recipe symlink.
        for directory, _, names in sorted(os.walk(root, followlinks=True)):
            yield from (Path(directory) / name for name in sorted(names) if name.endswith(".yaml"))


def _yaml_error(roots: List[Path]) -> Optional[str]:
    for path in _yaml_files(roots):
        try:
            yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)
        except yaml.YAMLError as error:
            mark = getattr(error, "context_mark", None) or getattr(error, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
            problem = ": ".join(filter(None, (getattr(error, "context", None), getattr(error, "problem", None))))
            return f"{path}: {where}: {problem or error} (fix the YAML syntax there)"
    return None


def _override_error(overrides: List[str], roots: List[Path]) -> Optional[str]:
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return None  # Hydra's parser message is clear; let Hydra report it
    for override in parsed:
        key = override.key_or_group
        if override.is_add() or override.is_force_add() or key.split(".")[0] in OPEN_KEYS:
            continue
        choices = _group_choices(key, roots)
        if choices is not None:
            error = _choice_error(key, override, choices)
        elif "/" not in key:
            error = _key_error(key)
        else:
            error = None
        if error:
            return error
    return None


def _group_choices(group: str, roots: List[Path]) -> Optional[List[str]]:
    """Options of a config group (nested ones as family/name), or None if not a group."""
    dirs = [root / group for root in roots if (root / group).is_dir()]
    if not dirs:
        return None
    return sorted({str(p.relative_to(d).with_suffix("")) for d in dirs for p in d.rglob("*.yaml")})


def _choice_error(group: str, override, choices: List[str]) -> Optional[str]:
    if override.is_delete() or override.value_type in (None, ValueType.GLOB_CHOICE_SWEEP):
        return None
    values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [
        override.get_value_element_as_str()]
    for value in values:
        if value != "null" and value not in choices:
            close = difflib.get_close_matches(value, choices, n=3)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            return f"{group}={value}: no such option; {hint}options: {', '.join(choices)}"
    return None


def _key_error(dotted: str) -> Optional[str]:
    node = GraphBridgeConfig
    path: List[str] = []
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        fields = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else None
        if fields is None:
            return None  # below a leaf or a free-form node: OmegaConf judges it
        if part not in fields:
            close = difflib.get_close_matches(part, fields, n=1)
            where = ".".join(path) or "the top level"
            hint = f"; did you mean {'.'.join(path + close + parts[index + 1:])}?" if close else ""
            return f"{dotted}: no key '{part}' in {where}{hint} (graphbridge --cfg job lists every key)"
        path.append(part)
        node = fields[part].type if dataclasses.is_dataclass(fields[part].type) else None
    return None
