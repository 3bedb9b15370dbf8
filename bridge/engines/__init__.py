"""Building the engine a job trains on. Which engine and device that is, and whether it can
run the config at all, the catalogue decided already (bridge.validation.target): an engine
defines no rules of its own. Engines are imported lazily: megatron-core costs seconds to import.
"""

from bridge.config.schema import GraphBridgeConfig
from bridge.validation import Target


def build_engine(cfg: GraphBridgeConfig, target: Target):
    """The engine ``target`` names (see bridge.engines.base.TrainingEngine for what it offers)."""
    if target.engine == "megatron":
        from bridge.engines.megatron.engine import MegatronEngine

        return MegatronEngine(cfg)
    from bridge.engines.torch.engine import TorchEngine

    return TorchEngine(cfg, target.device)
