"""Registers the structured schema with Hydra's ConfigStore (idempotent)."""

from hydra.core.config_store import ConfigStore

from bridge.config.schema import GraphBridgeConfig


def register() -> None:
    ConfigStore.instance().store(name="base_config", node=GraphBridgeConfig)
