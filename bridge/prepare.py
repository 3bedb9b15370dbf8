"""From a composed config to the finished GraphBridgeConfig every later step reads.

One path for every entry point (the command line, ``bridge.load``, the workload flags): migrate
the older CUDA-graph spellings, then resolve. The derived values (the TE RNG tracker, the NaN
checks, the pipeline sync, the learning-rate warmup, the weak-scaled global batch) are
interpolations in the schema (bridge.config.resolvers), so they follow the migrated config, and a
value the user set anywhere (command line, recipe, preset, Python) is kept as it is: a conflict
with a derivation is a rule violation that names the fix, never a silent change.
"""

import copy
from dataclasses import dataclass, field, is_dataclass
from typing import Dict, List, Union

from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from bridge.config.migration import migrate
from bridge.config.plain import is_finished
from bridge.config.schema import GraphBridgeConfig

ConfigLike = Union[DictConfig, GraphBridgeConfig]


@dataclass
class Prepared:
    config: GraphBridgeConfig
    notes: List[str] = field(default_factory=list)
    derived: Dict[str, object] = field(default_factory=dict)
    """The values graphbridge derived because the config left them unset, by dotted key."""


def structured(cfg: ConfigLike) -> DictConfig:
    """``cfg`` as a structured DictConfig typed by the schema (composition already gives one)."""
    if isinstance(cfg, DictConfig):
        if OmegaConf.get_type(cfg) is not GraphBridgeConfig:
            # A primary config without base_config composes to a plain dict. A compact Hydra error
            # is one line on the command line, where any other exception here is a traceback.
            raise ConfigCompositionException(
                "the composed config does not carry graphbridge's schema: the primary config's defaults "
                "list must name base_config first, as graphbridge's own conf/config.yaml does")
        return cfg
    return OmegaConf.structured(cfg)


def resolve(cfg: ConfigLike) -> GraphBridgeConfig:
    """The finished config: every interpolation (derived values included) resolved."""
    return OmegaConf.to_object(structured(cfg))


def prepare(cfg: ConfigLike) -> Prepared:
    """Migrate, resolve, and say what was migrated and derived; ``cfg`` itself is left as it is."""
    if isinstance(cfg, GraphBridgeConfig) and is_finished(cfg):
        # nothing to resolve or convert, so nothing derived: OmegaConf would hand back the same object
        done = copy.deepcopy(cfg)
        return Prepared(done, migrate(done.model).notes)
    node = copy.deepcopy(structured(cfg))
    notes = migrate(node.model).notes
    derived = derived_values(node)
    notes += weak_scaling_notes(node, derived)
    return Prepared(resolve(node), notes, derived)


def derived_values(node: DictConfig, prefix: str = "") -> Dict[str, object]:
    """Dotted key -> value of every schema field whose value is an interpolation: a derivation of
    the schema (${graphbridge.*}), of the config tree (model.seq_length) or of the user."""
    found = {}
    for key in node:
        if OmegaConf.is_interpolation(node, key):
            found[prefix + str(key)] = node[key]
        elif isinstance(node[key], DictConfig) and is_dataclass(OmegaConf.get_type(node[key]) or object):
            found.update(derived_values(node[key], f"{prefix}{key}."))
    return found


def weak_scaling_notes(node: DictConfig, derived: Dict[str, object]) -> List[str]:
    workload, train = node.workload, node.train
    preset_batch, preset_gpus = workload.preset_global_batch_size, workload.preset_num_gpus
    if "train.global_batch_size" not in derived or preset_batch is None or preset_gpus in (None, train.num_gpus):
        return []
    return [f"weak scaling: train.global_batch_size={derived['train.global_batch_size']} for train.num_gpus="
            f"{train.num_gpus} (the preset runs {preset_batch} on {preset_gpus} GPUs); set train.global_batch_size "
            "to choose another"]
