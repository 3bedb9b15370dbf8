"""Reading a Megatron-Bridge ConfigContainer YAML as Bridge reads it, and its fields by dotted path.

Bridge loads its YAML with ``yaml.safe_load`` and resolves OmegaConf interpolations
(``ConfigContainer.from_yaml``); so do ``read_yaml`` and ``as_container``, which also checks that the
document is a ConfigContainer: a full one (``_target_`` at the top) or a partial overrides file (some
of its sections). What cannot be read raises BridgeConfigError with one line.
"""

import difflib
from pathlib import Path
from typing import Any, List

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from perf.bridge_config_fields import CONTAINER, PLANNED_FOR, SECTIONS


class BridgeConfigError(ValueError):
    """A file that cannot be read as a ConfigContainer; the message is one line."""


def read_yaml(path: str) -> Any:
    """The YAML document at ``path`` as Bridge loads it (yaml.safe_load); BridgeConfigError says why it
    cannot be read. ``as_container`` then checks that it is a ConfigContainer."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BridgeConfigError("no such file") from None
    except UnicodeDecodeError as error:
        raise BridgeConfigError(f"byte {error.start}: not UTF-8 text") from None
    except OSError as error:
        raise BridgeConfigError(f"cannot be read ({error.strerror or error})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise BridgeConfigError(f"{where}not valid YAML ({getattr(error, 'problem', None) or error})") from None
    return data


def _sets_as_lists(data: Any) -> Any:
    """Bridge's to_yaml writes a PEFT's params_to_save as a YAML set (``!!set {}``), which OmegaConf cannot hold
    (so Bridge's own from_yaml cannot read a LoRA run's config back): a set is read as the list of its items."""
    if isinstance(data, dict):
        return {key: _sets_as_lists(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_sets_as_lists(item) for item in data]
    if isinstance(data, (set, frozenset)):
        return sorted(data, key=str)
    return data


def planned_for(path: str) -> List[str]:
    """The overrides of an exported file's PLANNED_FOR line (read after read_yaml, so the file reads)."""
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith(PLANNED_FOR):
            return line[len(PLANNED_FOR):].split()
        if not line.startswith("#"):
            return []  # the header's comments are over
    return []


def as_container(data: Any) -> dict:
    """The file as Bridge reads it (OmegaConf resolves its interpolations), checked to be a ConfigContainer."""
    if not isinstance(data, dict):
        kind = "an empty file" if data is None else f"a {type(data).__name__}"
        raise BridgeConfigError(f"is {kind}, not a ConfigContainer mapping (section: fields)")
    target = data.get("_target_")
    if target is not None and target != CONTAINER:
        raise BridgeConfigError(f"_target_ is {target}, not a ConfigContainer ({CONTAINER})")
    unknown = [key for key in data if key not in SECTIONS and key != "_target_"]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), SECTIONS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise BridgeConfigError(f"'{unknown[0]}'{hint} is not a section of Bridge 0.3.1's ConfigContainer "
                                f"({', '.join(SECTIONS)})")
    try:
        container = OmegaConf.to_container(OmegaConf.create(_sets_as_lists(data)), resolve=True)
    except OmegaConfBaseException as error:
        raise BridgeConfigError(f"{str(error).splitlines()[0]}") from None
    for section, value in container.items():
        if section not in ("_target_", "mixed_precision") and value is not None and not isinstance(value, dict):
            raise BridgeConfigError(f"section {section} is {value!r}; a section is a mapping of its fields")
    return container


def plain(value: Any, path: str) -> Any:
    """A field's value as graphbridge takes it: objects (``_target_``) and mappings cannot be."""
    if isinstance(value, dict):
        shown = value.get("_target_", "a mapping")
        raise BridgeConfigError(f"{path}: {shown} cannot be read as a value of graphbridge's key")
    if isinstance(value, list):
        return [plain(item, path) for item in value]
    return value


class Fields:
    """The file's fields by dotted path (section.field), and which of them the import used."""

    def __init__(self, container: dict):
        self.container, self.used = container, set()

    def has(self, path: str) -> bool:
        section, _, name = path.partition(".")
        value = self.container.get(section)
        return isinstance(value, dict) and name in value if name else section in self.container

    def peek(self, path: str, default=None):
        section, _, name = path.partition(".")
        value = self.container.get(section)
        if not name:
            return value if section in self.container else default
        return value.get(name, default) if isinstance(value, dict) else default

    def take(self, path: str, default=None):
        if self.has(path):
            self.used.add(path)
        return self.peek(path, default)

    def ignored(self) -> List[str]:
        names = []
        for section, value in self.container.items():
            if section == "_target_" or value is None:
                continue
            if isinstance(value, dict):
                names += [f"{section}.{name}" for name in value if name != "_target_"
                          and f"{section}.{name}" not in self.used]
            elif section not in self.used:
                names.append(section)
        return names


