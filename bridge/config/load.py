"""Composition: conf/config.yaml with Hydra overrides, exactly as the command line composes it,
as a structured DictConfig typed by GraphBridgeConfig (derived values still interpolations)."""

from pathlib import Path
from typing import Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from bridge.config.paths import config_dir
from bridge.config.store import register


def compose_config(overrides: Sequence[str] = (), config_root: Optional[Path] = None) -> DictConfig:
    """Compose config.yaml with Hydra overrides, from graphbridge's conf/ or from another tree laid
    out like it (``config_root``)."""
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_root or config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def override_value(value: object) -> str:
    """A Python value as the right-hand side of a Hydra override: true/false, null, [a,b]."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(override_value(item) for item in value) + "]"
    return str(value)
