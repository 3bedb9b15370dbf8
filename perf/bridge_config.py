"""``graphbridge bridge_config=<path>``: a Megatron-Bridge 0.3.1 ConfigContainer YAML as graphbridge's
overrides, then graphbridge itself.

    graphbridge bridge_config=run_config.yaml train.num_gpus=8 mode=plan
    graphbridge -m bridge_config=run_config.yaml model.num_layers=2 cuda_graph=none,te_attn

The file's fields become overrides in the place of ``bridge_config=<path>`` on the command line
(perf.bridge_config_import reads them), so what is typed after it wins: a key by Hydra's own order,
a group choice (``cuda_graph=``, ``precision=``, ``gpu=``, ``sweep=``, swept or not) by dropping the
file's values of the keys that option sets (a graph choice also drops a parked
``model.cuda_graph_scope``). ``recipe=`` is the base the file lands on, wherever it is typed. The
fields graphbridge has no key for are named in one line on stderr. Then ``graphbridge`` goes on in
this process with the expanded command line (printed on stderr, as graphbridge-workload prints
its own), so plans, runs, sweeps and exit codes are graphbridge's. A file that cannot be read stops
here: one line, exit status 2.
"""

import shlex
import sys
from typing import Iterable, List, Sequence, Set

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException
from omegaconf import OmegaConf

from bridge.config.paths import config_dir
from perf.bridge_config_import import BridgeConfigError, read_file
from perf.preflight import FLAGS_WITH_VALUE

KEY = "bridge_config"
BASE_GROUP = "recipe"  # the file lands on the recipe; it never replaces the file's values
GRAPH_KEYS = ("model.cuda_graph_impl", "model.cuda_graph_scope")


def requested(argv: Sequence[str]) -> bool:
    return any(arg.startswith(f"{KEY}=") for arg in argv)


def command_line(argv: Sequence[str]) -> List[str]:
    """graphbridge's arguments with the file's overrides in place of ``bridge_config=<path>``, echoed on stderr;
    a file that cannot be read exits 2 here."""
    try:
        expanded = expand(argv)
    except BridgeConfigError as error:
        print(f"graphbridge: {KEY}={error}", file=sys.stderr)
        sys.exit(2)
    print(echo(argv, expanded), file=sys.stderr, flush=True)
    return expanded


def expand(argv: Sequence[str]) -> List[str]:
    places = [index for index, arg in enumerate(argv) if arg.startswith(f"{KEY}=")]
    if len(places) > 1:
        raise BridgeConfigError(f"{argv[places[1]].split('=', 1)[1]}: a second {KEY}; import one file per command")
    place = places[0]
    path = argv[place].split("=", 1)[1]
    if not path:
        raise BridgeConfigError(": no file named; write bridge_config=<path to a ConfigContainer YAML>")
    imported = read_file(path)
    if imported.ignored:
        count = len(imported.ignored)
        print(f"graphbridge: {KEY}={path}: ignored, no graphbridge key ({count} field{'s' if count > 1 else ''}):\n"
              f"{grouped(imported.ignored)}", file=sys.stderr)
    replaced = keys_set_by_groups(argv[place + 1:])
    if "model.cuda_graph_impl" in replaced:
        replaced.update(GRAPH_KEYS)
    kept = [override for override in imported.overrides if override.split("=", 1)[0] not in replaced]
    # A gpu= typed anywhere wins over the file's (Hydra refuses two choices of one group).
    typed = {override.lstrip("+").split("=", 1)[0] for override in _overrides_only(argv)}
    planned = [override for override in imported.planned_for if override.split("=", 1)[0] not in typed]
    return [*argv[:place], *planned, *kept, *argv[place + 1:]]


def echo(argv: Sequence[str], expanded: Sequence[str]) -> str:
    """The command that runs, with the file's overrides counted rather than listed: a preset's file gives
    hundreds (``graphbridge --cfg job`` with the same arguments shows the config they make)."""
    place = next(index for index, arg in enumerate(argv) if arg.startswith(f"{KEY}="))
    count = len(expanded) - len(argv) + 1
    folded = f"<{count} overrides from {argv[place].split('=', 1)[1]}>"
    return " ".join(["graphbridge", *map(shlex.quote, argv[:place]), folded, *map(shlex.quote, argv[place + 1:])])


def grouped(paths: Iterable[str]) -> str:
    """One indented line per section, with its count when it holds several: a Bridge recipe's file
    leaves hundreds of fields (checkpointing, logging, ...), which on one line nobody reads."""
    sections = {}
    for path in paths:
        section, _, name = path.partition(".")
        sections.setdefault(section, []).append(name)
    return "\n".join(f"  {_group(section, names)}" for section, names in sections.items())


def _group(section: str, names: List[str]) -> str:
    if names == [""]:  # a section that is a value (mixed_precision: bf16_mixed)
        return section
    return f"{section}: {names[0]}" if len(names) == 1 else f"{section} ({len(names)}): {', '.join(names)}"


def keys_set_by_groups(overrides: Sequence[str]) -> Set[str]:
    """The keys that the group choices among ``overrides`` set (all options of a swept group)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(_overrides_only(overrides)))
    except HydraException:
        return set()  # graphbridge reports the malformed override itself
    keys: Set[str] = set()
    for override in parsed:
        group = override.key_or_group
        if override.is_delete() or group == BASE_GROUP or not (config_dir() / group).is_dir():
            continue
        for option in _options(group, override):
            keys |= _keys_of_option(group, option)
    return keys


def _overrides_only(argv: Sequence[str]):
    """The key=value arguments, without Hydra's flags and their values (--cfg job)."""
    arguments = iter(argv)
    for arg in arguments:
        if arg in FLAGS_WITH_VALUE:
            next(arguments, None)
        elif not arg.startswith("-"):
            yield arg


def _options(group: str, override) -> List[str]:
    if override.value_type == ValueType.GLOB_CHOICE_SWEEP:
        return sorted(path.stem for path in (config_dir() / group).glob("*.yaml"))
    if override.is_sweep_override():
        return list(override.sweep_string_iterator())
    return [override.get_value_element_as_str()]


def _keys_of_option(group: str, option: str) -> Set[str]:
    """Every key the option (a ``@package _global_`` file) sets; a sweep preset's swept groups and keys too."""
    path = config_dir() / group / f"{option}.yaml"
    if not path.is_file():
        return set()  # graphbridge names the missing option itself
    content = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    keys = set(_leaf_keys({name: value for name, value in content.items() if name not in ("defaults", "hydra")}))
    swept = ((content.get("hydra") or {}).get("sweeper") or {}).get("params") or {}
    for name, choices in swept.items():
        if (config_dir() / name).is_dir():
            keys |= {key for choice in str(choices).split(",") for key in _keys_of_option(name, choice.strip())}
        else:
            keys.add(name)
    return keys


def _leaf_keys(node, prefix: str = ""):
    for name, value in node.items():
        if isinstance(value, dict) and value:
            yield from _leaf_keys(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"
