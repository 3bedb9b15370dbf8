"""From Hydra's composed DictConfig (or a list of overrides) to a finished GraphBridgeConfig.

``prepare`` is the one path every entry point takes: typed object, migration of the older
spellings, then the override helper. It never touches CUDA.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from bridge.config.migration import migrate
from bridge.config.paths import config_dir
from bridge.config.schema import GraphBridgeConfig
from bridge.config.store import register
from bridge.recipes import apply_weak_scaling
from bridge.overrides import set_cuda_graph_overrides
from bridge.validation.violation import Violation


@dataclass
class Prepared:
    config: GraphBridgeConfig
    notes: List[str] = field(default_factory=list)
    violations: List[Violation] = field(default_factory=list)


def prepare(composed: DictConfig) -> Prepared:
    """Typed config with migrations, weak scaling, the learning-rate warmup and the override helper applied."""
    config = OmegaConf.to_object(composed)
    if not isinstance(config, GraphBridgeConfig):
        # A primary config without base_config composes to a plain dict. A compact Hydra error
        # is one line on the command line, where any other exception here is a traceback.
        raise ConfigCompositionException(
            "the composed config does not carry graphbridge's schema: the primary config's defaults "
            "list must name base_config first, as graphbridge's own conf/config.yaml does")
    report = migrate(config.model)
    report.notes.extend(apply_weak_scaling(config))
    fill_lr_warmup(config)
    set_cuda_graph_overrides(config)
    return Prepared(config, report.notes, report.violations)


def fill_lr_warmup(config: GraphBridgeConfig) -> None:
    """An unset warmup scales with the run, so that a short run (train.train_iters=5) needs no
    second override to stay below the decay length megatron-core's scheduler asserts on."""
    if config.optimizer.lr_warmup_iters is None:
        config.optimizer.lr_warmup_iters = max(0, config.train.train_iters // 10)


def compose_config(overrides: Sequence[str] = (), config_root: Optional[Path] = None) -> DictConfig:
    """Compose config.yaml with Hydra overrides, exactly as the CLI would; from graphbridge's
    conf/ or from another tree laid out like it (``config_root``)."""
    register()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_root or config_dir()), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))
