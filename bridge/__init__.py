"""graphbridge's library: a small public API for scripts, notebooks and tests.

    import bridge
    cfg = bridge.load(["recipe=llama/tiny", "cuda_graph=te_attn_mlp"])
    bridge.validate(cfg)            # -> [] when valid
    print(bridge.plan(["cuda_graph=full_iteration"]).to_text())
"""

from typing import List, Sequence

from bridge.config.schema import GraphBridgeConfig
from bridge.overrides import set_cuda_graph_overrides
from bridge.validation import Violation
from bridge.validation import validate as _validate

__all__ = ["GraphBridgeConfig", "Violation", "load", "plan", "set_cuda_graph_overrides", "validate"]


def load(overrides: Sequence[str] = ()) -> GraphBridgeConfig:
    """Compose ``conf/`` with Hydra overrides; migrations and the override helper applied."""
    from bridge.config.load import compose_config, prepare

    return prepare(compose_config(overrides)).config


def validate(config: GraphBridgeConfig) -> List[Violation]:
    """Every rule violation of ``config``; an empty list means it is valid."""
    from bridge.config.migration import migrate

    return migrate(config.model).violations + _validate(config)


def plan(overrides: Sequence[str] = ()):
    """The plan for these overrides: verdict, what is graphed, megatron-core arguments."""
    from bridge.config.load import compose_config, prepare
    from bridge.planning import build_plan

    return build_plan(prepare(compose_config(overrides)))
