"""The recipe tree as data: which recipes exist, which workload presets each has, and
Bridge's weak scaling of the global batch.

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


def apply_weak_scaling(cfg) -> List[str]:
    """Bridge's weak scaling: on another GPU count than the preset's, keep the global batch
    per GPU, GBS = GBS_preset / preset_num_gpus * num_gpus. Returns the info lines."""
    preset_gpus, gpus = cfg.workload.preset_num_gpus, cfg.train.num_gpus
    if preset_gpus is None or preset_gpus < 1 or gpus == preset_gpus:
        return []  # (a count below 1 is reported by the positive_sizes rule)
    before = cfg.train.global_batch_size
    cfg.train.global_batch_size = before * gpus // preset_gpus
    return [
        f"weak scaling: train.global_batch_size {before} -> {cfg.train.global_batch_size} for "
        f"train.num_gpus={gpus} (the preset ran {before} on {preset_gpus} GPUs; "
        f"set workload.preset_num_gpus={gpus} to keep {before})"
    ]
