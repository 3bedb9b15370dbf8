"""graphbridge's library: a small public API for scripts, notebooks and tests.

    import bridge
    cfg = bridge.load(["recipe=llama/tiny", "cuda_graph=te_attn_mlp"])   # finished config
    bridge.validate(cfg)            # -> [] when valid and runnable on this machine
    print(bridge.plan(["cuda_graph=full_iteration"]).to_text())

    cfg = bridge.compose(["recipe=llama/tiny"])     # a composed config to edit, Bridge-style
    bridge.set_cuda_graph_overrides(cfg, impl="local", modules="full_iteration")
    print(bridge.plan(cfg).to_text())
"""

from typing import List, Sequence, Union

from omegaconf import DictConfig

from bridge.config.schema import GraphBridgeConfig
from bridge.overrides import set_cuda_graph_overrides
from bridge.validation import Violation

__all__ = ["GraphBridgeConfig", "Violation", "compose", "load", "plan", "resolve", "set_cuda_graph_overrides",
           "validate"]


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/`` with Hydra overrides, as the command line does: a structured DictConfig whose
    derived values (TE RNG tracker, NaN checks, warmup, global batch) still follow its other values."""
    from bridge.config.load import compose_config

    return compose_config(overrides)


def load(overrides: Sequence[str] = ()) -> GraphBridgeConfig:
    """The finished config for these overrides: older spellings migrated, derived values resolved."""
    from bridge.prepare import prepare

    return prepare(compose(overrides)).config


def resolve(cfg: Union[DictConfig, GraphBridgeConfig]) -> GraphBridgeConfig:
    """A composed (or hand-built) config, finished: migrated, derived values resolved."""
    from bridge.prepare import prepare

    return prepare(cfg).config


def validate(cfg: Union[DictConfig, GraphBridgeConfig], machine=None) -> List[Violation]:
    """Every rule violation of ``cfg`` on this machine (or ``machine``, a bridge.machine.Machine);
    an empty list means it is valid and can run there."""
    from bridge.validation import resolve_target
    from bridge.validation import validate as run_catalogue

    finished = resolve(cfg)
    return run_catalogue(finished, resolve_target(finished, machine))


def plan(overrides_or_config: Union[Sequence[str], DictConfig, GraphBridgeConfig] = (), machine=None):
    """The plan for these overrides (or this config): verdict, what is graphed, megatron-core arguments (and
    megatron-core's own verdict on them with plan.check_megatron=true)."""
    from bridge.planning import build_plan
    from bridge.prepare import prepare

    source = overrides_or_config
    if not isinstance(source, (DictConfig, GraphBridgeConfig)):
        source = compose(source)
    prepared = prepare(source)
    return build_plan(prepared, machine, check_megatron=prepared.config.plan.check_megatron)
