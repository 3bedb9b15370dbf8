"""Registers the structured schemas with Hydra's ConfigStore (idempotent)."""

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins

from bridge.config.schema import GraphBridgeConfig

SUBMITIT_LAUNCHERS = ("submitit_slurm", "submitit_local")


def register() -> None:
    store = ConfigStore.instance()
    if "base_config.yaml" not in store.repo:  # storing converts the schema anew: 30 ms of every composition
        store.store(name="base_config", node=GraphBridgeConfig)
    take_over_submitit_launchers(store)


def take_over_submitit_launchers(store: ConfigStore) -> None:
    """conf/hydra/launcher/submitit_{slurm,local}.yaml keep the option names users already type,
    on top of the plugin's configs of those names. Hydra would otherwise match each file to the
    ConfigStore entry of its name, a schema matching deprecated since Hydra 1.1 that warns on
    every run, so the plugin's entries move to the group hydra/launcher_schema, which the files
    extend, and the launcher choices stay those users expect."""
    Plugins.instance()  # imports the submitit plugin, which stores its launcher configs
    launchers = store.repo["hydra"]["launcher"]
    for name in SUBMITIT_LAUNCHERS:
        entry = launchers.pop(f"{name}.yaml", None)
        if entry is not None:
            store.store(group="hydra/launcher_schema", name=name, node=entry.node, provider=entry.provider)
