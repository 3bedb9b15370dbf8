"""The user-facing surface, frozen in tests/surface.txt: every config key (with its type), every option
of every config group, and the console scripts. A renamed or removed key is then a reviewed diff of
that file, not an accident.

    python scripts/surface.py          # rewrite tests/surface.txt
    python scripts/surface.py --check  # exit 1 and show the difference when the surface changed
"""

import dataclasses
import difflib
import sys
import tomllib
from pathlib import Path
from typing import List

from bridge.config.paths import config_dir
from bridge.config.schema import GraphBridgeConfig
from bridge.recipes import recipe_names

ROOT = Path(__file__).resolve().parents[1]
SURFACE = ROOT / "tests" / "surface.txt"


def config_keys(node=GraphBridgeConfig, prefix: str = "") -> List[str]:
    keys = []
    for item in dataclasses.fields(node):
        if dataclasses.is_dataclass(item.type):
            keys += config_keys(item.type, f"{prefix}{item.name}.")
        else:
            kind = item.type.__name__ if isinstance(item.type, type) else str(item.type).replace("typing.", "")
            keys.append(f"key {prefix}{item.name}: {kind}")
    return keys


def group_options() -> List[str]:
    """Every option of every config group, as `group=option` (nested ones as family/name)."""
    root = config_dir()
    options = []
    for path in sorted(root.rglob("*.yaml")):
        relative = path.relative_to(root)
        if len(relative.parts) < 2 or relative.parts[0] in ("preset", "arch"):
            continue  # presets and architectures are picked by recipes, not typed
        group, option = relative.parts[0], Path(*relative.parts[1:]).with_suffix("").as_posix()
        if group == "hydra":
            group, option = "/".join(relative.parts[:2]), Path(*relative.parts[2:]).with_suffix("").as_posix()
        options.append(f"option {group}={option}")
    # conf/recipe is a link to recipes/, which rglob does not follow before Python 3.13.
    return options + [f"option recipe={name}" for name in recipe_names()]


def console_scripts() -> List[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [f"script {name} = {target}" for name, target in sorted(project["scripts"].items())]


def surface() -> str:
    return "\n".join(config_keys() + group_options() + console_scripts()) + "\n"


def main() -> int:
    current = surface()
    if "--check" in sys.argv[1:]:
        frozen = SURFACE.read_text() if SURFACE.exists() else ""
        if frozen != current:
            sys.stdout.writelines(difflib.unified_diff(frozen.splitlines(True), current.splitlines(True),
                                                       "tests/surface.txt", "the code"))
            print("the user-facing surface changed: review the diff, then run python scripts/surface.py",
                  file=sys.stderr)
            return 1
        return 0
    SURFACE.write_text(current)
    return 0


if __name__ == "__main__":
    sys.exit(main())
