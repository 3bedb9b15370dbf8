"""The recipe tree as data: which recipes exist and which workload presets each has (Bridge's
weak scaling of a preset's global batch is the derived default of train.global_batch_size, see
bridge.config.resolvers).

Recipes are ``recipes/<family>/<name>.yaml`` (the Hydra group ``recipe``); a recipe with
per-GPU workload presets pulls ``conf/preset/<family>/<name>/<gpu>_<precision>.yaml`` in with
``- /preset/<family>/<name>: ${gpu}_${precision}``, so a missing combination fails in Hydra
with the list of the ones that exist. Hydra's glob cannot see nested options, hence the walk.
"""

from typing import List, Tuple

from bridge.config.paths import config_dir, recipes_dir


def recipe_names() -> List[str]:
    """Every selectable recipe, as the user types it: ``recipe=<family>/<name>``."""
    root = recipes_dir()
    return sorted(path.relative_to(root).with_suffix("").as_posix() for path in root.glob("*/*.yaml"))


def presets(recipe: str) -> List[Tuple[str, str]]:
    """The (gpu, precision) pairs ``recipe`` has a workload preset for; [] when it has none."""
    folder = config_dir() / "preset" / recipe
    return sorted(tuple(path.stem.split("_", 1)) for path in folder.glob("*.yaml"))
