"""Checks on the command line before Hydra composes, for errors Hydra reports badly or not at all:
a YAML syntax error or a duplicate key in a config file, a malformed '# @package' header, a
defaults list that is not a list of names, a primary config that no longer loads the schema (each
a long traceback), an unknown key, a value of the wrong type (a conversion error that names no fix),
an integer too long for Python to read (a traceback), a misspelled group choice (no suggestion), a
group set to null, a callable set in Hydra's tree (perf/hydra_overrides.py), and what
perf/command_line.py checks in the argument list itself (a Slurm submission without Slurm among
them). Each becomes one line naming the file and line, or the override.
"""

import difflib
import os
import re
import sys
from pathlib import Path
from typing import Iterable, List, Optional

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, ValueType
from hydra.errors import HydraException

from bridge.config.paths import config_dir
from bridge.recipes import presets
from perf.command_line import (FLAGS_WITH_VALUE, encoding_error, flag_error, long_key_error, loop_error,
                               submission_error)
from perf.help import PRINTS_HELP
from perf.hydra_overrides import hydra_override_error, own_callbacks
from perf.key_hints import key_error, value_error

SHELL_COMPLETION = ("--shell-completion", "-sc")  # Hydra's own; its arguments are not overrides
PRIMARY_FLAGS = ("--config-path", "-cp", "--config-name", "-cn")  # another primary config than conf/config.yaml
OPEN_KEYS = ("hydra", "env_vars")  # Hydra's own tree and free-form dicts
STR, NULL = "tag:yaml.org,2002:str", "tag:yaml.org,2002:null"
# What Hydra reads as a header line, and a package it can place a config at.
HEADER = re.compile(r"^\s*#\s*@")
PACKAGE = re.compile(r"^\w[\w-]*(\.\w[\w-]*)*$")
SCHEMA = ("base_config", "/base_config")  # the ConfigStore entry of GraphBridgeConfig



class DuplicateKeyError(yaml.constructor.ConstructorError):
    pass


# YAML 1.2's floats, which OmegaConf reads too: 1e3 and 1_000.5e-2 are floats (YAML 1.1 wants a dot).
FLOAT = re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                        |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
                        |[-+]?\.(?:inf|Inf|INF)
                        |\.(?:nan|NaN|NAN))$""", re.X)


def omegaconf_implicit_types() -> dict:
    """The implicit tags OmegaConf's YAML loader resolves: PyYAML's safe set without timestamps
    (OmegaConf keeps dates as strings), with YAML 1.2's floats first."""
    resolvers = {first: [(tag, regexp) for tag, regexp in entries if tag != "tag:yaml.org,2002:timestamp"]
                 for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()}
    for first in "-+0123456789.":
        resolvers.setdefault(first, []).insert(0, ("tag:yaml.org,2002:float", FLOAT))
    return resolvers


class Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """PyYAML's C loader reading as OmegaConf's loader does: its implicit types (1e3 is a float,
    no timestamps), so a defaults entry has the type Hydra will see, and a duplicate key an
    error, here at the duplicate's line."""

    yaml_implicit_resolvers = omegaconf_implicit_types()

    def construct_mapping(self, node, deep=False):
        first_lines = {}
        for key_node, _ in node.value:
            if key_node.tag != STR:
                continue  # as OmegaConf: only string keys
            if key_node.value in first_lines:
                raise DuplicateKeyError(None, None, f"duplicate key '{key_node.value}', first at line "
                                                    f"{first_lines[key_node.value]}", key_node.start_mark)
            first_lines[key_node.value] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def check(argv: List[str], config_root: Optional[Path] = None) -> Optional[str]:
    """An error line for the first problem found, or None; ``config_root`` replaces conf/."""
    if any(arg.split("=", 1)[0] in SHELL_COMPLETION for arg in argv):
        return None
    argument = encoding_error(argv) or flag_error(argv) or submission_error(argv)
    if argument:
        return argument
    overrides, config_dirs, own_primary = _split(argv)
    own_root = config_root or config_dir()
    user_roots = [Path(d) for d in config_dirs]
    # graphbridge's own tree is read whole; of a user's --config-dir only what the command line selects,
    # so a broken file there that this command does not use stops nothing.
    files = list(_yaml_files([own_root])) + _selected_files(user_roots, overrides)
    prints_help = any(arg.split("=", 1)[0] in PRINTS_HELP for arg in argv)
    return (_file_error(files) or (None if own_primary else _primary_error(own_root / "config.yaml"))
            or _recipe_needs_gpu(overrides) or _override_error(overrides, [own_root] + user_roots)
            or long_key_error(overrides) or (loop_error(user_roots) if prints_help else None))


def _split(argv: List[str]):
    overrides, config_dirs, own_primary, args = [], [], False, iter(argv)
    for arg in args:
        own_primary = own_primary or arg.split("=", 1)[0] in PRIMARY_FLAGS
        if arg in FLAGS_WITH_VALUE:
            value = next(args, "")
            if arg in ("--config-dir", "-cd"):
                config_dirs.append(value)
        elif arg.startswith("--config-dir="):
            config_dirs.append(arg.split("=", 1)[1])
        elif not arg.startswith("-"):
            overrides.append(arg)
    return overrides, config_dirs, own_primary


def _yaml_files(roots: Iterable[Path]):
    for root in roots:
        seen = set()
        # os.walk, not Path.rglob: before Python 3.13 rglob skips the conf/recipe symlink. A link
        # back up the tree would loop forever: each real directory is walked once.
        for directory, subdirs, names in os.walk(root, followlinks=True):
            real = os.path.realpath(directory)
            if real in seen:
                subdirs[:] = []
                continue
            seen.add(real)
            subdirs.sort()
            yield from (Path(directory) / name for name in sorted(names) if name.endswith(".yaml"))


def _selected_files(roots: List[Path], overrides: List[str]) -> List[Path]:
    """The files of ``roots`` that the command line's group choices name (group=option)."""
    selected = []
    for override in overrides:
        group, _, option = override.lstrip("+~").partition("=")
        for root in roots:
            try:
                if option and (root / group / f"{option}.yaml").is_file():
                    selected.append(root / group / f"{option}.yaml")
            except OSError:  # a name too long for the filesystem names no file
                continue
    return selected


def _read(path: Path) -> Optional[str]:
    """The file's text, or None for a link to nothing (Hydra sees no config there either)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _file_error(files: List[Path]) -> Optional[str]:
    for path in files:
        try:
            text = _read(path)
        except UnicodeDecodeError as error:
            return (f"{path}: byte {error.start}: not UTF-8 text ({error.reason}); save the file as UTF-8")
        except OSError as error:
            return f"{path}: cannot be read ({error.strerror or error}); fix its permissions or remove it"
        if text is None:
            continue
        try:
            node = _load(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "context_mark", None) or getattr(error, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
            problem = ": ".join(filter(None, (getattr(error, "context", None), getattr(error, "problem", None))))
            fix = "merge the two or delete one" if isinstance(error, DuplicateKeyError) else "fix the YAML syntax there"
            return f"{path}: {where}: {problem or error} ({fix})"
        error = _header_error(text) or _shape_error(node, text)
        if error:
            return f"{path}: {error}"
    return None


def _load(text: str) -> Optional[yaml.Node]:
    """The document's node tree, after constructing it as yaml.load does (constructor errors)."""
    loader = Loader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            loader.construct_document(node)
        return node
    finally:
        loader.dispose()


def _header_error(text: str) -> Optional[str]:
    # Hydra's reading of the header: the first lines that are '# @KEY VALUE', blank lines skipped.
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not HEADER.match(line):
            return None
        words = line.lstrip("#").strip().split(" ")  # Hydra splits at spaces only
        words = [word for word in words if word]
        if len(words) != 2 or (words[0] == "@package" and not PACKAGE.match(words[1])):
            return (f"line {number}: malformed header '{line}'; write '# @package <package>' with one space, "
                    f"the package _global_, _group_ or a dotted key path (e.g. '# @package _global_')")
    return None


def _shape_error(node: Optional[yaml.Node], text: str) -> Optional[str]:
    if node is None:
        return None  # an empty file is an empty config
    if not isinstance(node, yaml.MappingNode):
        kind = "list" if isinstance(node, yaml.SequenceNode) else "single value"
        return f"line {node.start_mark.line + 1}: a config file is a mapping of keys, not a {kind} (write 'key: value')"
    defaults = _defaults_node(node)
    if defaults is None:
        return None
    key, value = defaults
    if not isinstance(value, yaml.SequenceNode):
        return (f"line {key.start_mark.line + 1}: 'defaults' must be a list of config names, one '- name' or "
                f"'- group: option' per line; fill it in or delete the 'defaults:' line")
    for item in value.value:
        if not _is_default(item):
            return (f"line {item.start_mark.line + 1}: '{_source(item, text)}' is not a defaults entry; write "
                    f"'- name' or '- group: option' (the option a name, a list of names or null)")
    return None


def _source(node: yaml.Node, text: str) -> str:
    """The node's text on its first line, or that whole line where the node has none (null)."""
    start, end, lines = node.start_mark, node.end_mark, text.splitlines()
    line = lines[start.line] if start.line < len(lines) else ""
    return (line[start.column:end.column] if end.line == start.line else line[start.column:]).strip() or line.strip()


def _defaults_node(node: yaml.MappingNode):
    """(key node, value node) of the top-level 'defaults', or None."""
    return next(((key, value) for key, value in node.value if key.tag == STR and key.value == "defaults"), None)


def _is_default(item: yaml.Node) -> bool:
    """What Hydra accepts as a defaults entry: a name, or one group with a name, names or null."""
    if isinstance(item, yaml.ScalarNode):
        # ??? (mandatory) is a group's option only; as a config's name Hydra fails with a traceback.
        return item.tag == STR and not item.value.split("@")[0].endswith("???")
    if not isinstance(item, yaml.MappingNode) or len(item.value) != 1:
        return False
    (key, value), = item.value
    if key.tag != STR:
        return False
    if isinstance(value, yaml.SequenceNode):
        return all(isinstance(option, yaml.ScalarNode) and option.tag == STR for option in value.value)
    return isinstance(value, yaml.ScalarNode) and value.tag in (STR, NULL)


def _primary_error(path: Path) -> Optional[str]:
    """Without base_config in its defaults list, config.yaml composes to an untyped dict."""
    if not path.is_file():
        return None  # Hydra says the primary config is missing
    node = _load(path.read_text(encoding="utf-8"))  # its syntax and shape passed _file_error
    defaults = _defaults_node(node) if isinstance(node, yaml.MappingNode) else None
    names = [item.value for item in defaults[1].value if isinstance(item, yaml.ScalarNode)] if defaults else []
    if not set(names) & set(SCHEMA):
        where = f"line {defaults[0].start_mark.line + 1}: " if defaults else ""
        return (f"{path}: {where}the primary config no longer loads the schema; put '- base_config' first in its "
                f"defaults list, as graphbridge's own conf/config.yaml does")
    return None


def _override_error(overrides: List[str], roots: List[Path]) -> Optional[str]:
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        return None  # Hydra's parser message is clear; let Hydra report it
    except ValueError:  # its int() refuses more digits than sys.get_int_max_str_digits(), with a traceback
        return _long_number_error(overrides)
    own = own_callbacks(roots[0] / "config.yaml")
    for override in parsed:
        key = override.key_or_group
        if key.split(".")[0] == "hydra":
            error = hydra_override_error(override, own)
        elif key.split(".")[0] in OPEN_KEYS:
            continue
        elif _group_choices(key, roots) is not None:
            error = None if override.is_force_add() else _choice_error(key, override, _group_choices(key, roots))
        elif "/" in key:
            error = None
        else:  # a key, set or added (+/++): under the schema it must be one of its fields, its value of its type
            error = key_error(key, _group_names(roots)) or value_error(override, overrides, roots[0])
        if error:
            return error
    return None


def _long_number_error(overrides: List[str]) -> Optional[str]:
    """The override whose integer is too long for Python to read, by its key."""
    parser = OverridesParser.create()
    for line in overrides:
        try:
            parser.parse_override(line)
        except ValueError:
            return (f"{line.split('=', 1)[0]}: a number of more than {sys.get_int_max_str_digits()} digits; "
                    f"no key takes one that long")
        except HydraException:
            continue  # another override's syntax: Hydra names it once this one is fixed
    return None


def _recipe_needs_gpu(overrides: List[str]) -> Optional[str]:
    """A recipe with per-GPU presets picks one by gpu= and precision=; without either (unset, or deleted
    with ~) Hydra fails on the preset named None_<precision>, and on a pair without a preset it prints
    its search path: one line each instead. A swept precision is left to Hydra. It comes before the
    tip for a group set to null (write ~gpu), which such a recipe refuses too."""
    choices = dict(override.lstrip("+").split("=", 1) for override in overrides if "=" in override)
    deleted = {override.lstrip("~").split("=")[0] for override in overrides if override.startswith("~")}
    deleted |= {group for group in ("gpu", "precision") if choices.get(group) == "null"}
    recipe = choices.get("recipe")
    if recipe is None or "," in recipe or not presets(recipe):
        return None
    by_gpu = {}
    for gpu, precision in presets(recipe):
        by_gpu.setdefault(gpu, []).append(precision)
    pairs = "; ".join(f"gpu={gpu} precision={'|'.join(precisions)}" for gpu, precisions in by_gpu.items())
    if "gpu" not in choices or deleted & {"gpu", "precision"}:
        return f"recipe={recipe} runs Bridge's per-GPU presets: add gpu= and precision= (default bf16), one of: {pairs}"
    gpu, precision = choices["gpu"], choices.get("precision", "bf16")
    if "," in gpu:  # Hydra composes a multirun once before its jobs, with no gpu: ${gpu} has no value there
        return f"recipe={recipe}: gpu={gpu} cannot be swept, a preset is picked before the sweep; run one command per gpu"
    if "," in precision or precision in by_gpu.get(gpu, ()):
        return None
    return f"recipe={recipe} has no preset for gpu={gpu} precision={precision}; its presets: {pairs}"


def _group_choices(group: str, roots: List[Path]) -> Optional[List[str]]:
    """Options of a config group (nested ones as family/name), or None if not a group."""
    dirs = [root / group for root in roots if _is_dir(root / group)]
    if not dirs:
        return None
    # A link to nothing is no option: Hydra cannot load it.
    return sorted({str(p.relative_to(d).with_suffix("")) for d in dirs for p in d.rglob("*.yaml") if p.is_file()})


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a key longer than a file name can be is no group
        return False


def _choice_error(group: str, override, choices: List[str]) -> Optional[str]:
    if override.is_delete() or override.value_type in (None, ValueType.GLOB_CHOICE_SWEEP):
        return None
    value = override.value()
    if None in (value.list if isinstance(value, ChoiceSweep) else [value]):
        # Hydra takes a group's value for an option name and fails on None with a traceback.
        return (f"{group}=null: a config group cannot be set to null; to use no {group} option write ~{group} "
                f"(options: {', '.join(choices)})")
    if group.split("/")[0] in OPEN_KEYS:
        return None  # Hydra and its plugins add options that conf/ lacks: hydra/launcher=basic
    values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [
        override.get_value_element_as_str()]
    for value in values:
        if value not in choices:
            close = difflib.get_close_matches(value, choices, n=3)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            return f"{group}={value}: no such option; {hint}options: {', '.join(choices)}"
    return None


def _group_names(roots: List[Path]) -> List[str]:
    return sorted({path.name for root in roots if _is_dir(root) for path in root.iterdir() if _is_dir(path)})
