"""The rule judged before all others: every value of the composed config resolves.

The other rules read the finished config. An interpolation that resolves to nothing
(``train.train_iters=${oops}``) or to a value of the wrong type, or a mandatory value left unset,
keeps a config from becoming one, so this rule reads the composed config instead.
"""

from typing import List

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge.validation.registry import rule, violation
from bridge.validation.violation import Violation

FIX = "give it a value of its type, or an interpolation that resolves to one"


@rule("resolvable", before_resolution=True, fix=FIX,
      rejects="a value that does not resolve: an interpolation to no key (`${oops}`) or to a value of the "
              "wrong type, or a mandatory value left unset (`???`)")
def resolvable(composed: DictConfig) -> List[Violation]:
    try:
        OmegaConf.to_container(composed, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", None)
        return [violation("resolvable", [key] if key else [], f"{str(error).splitlines()[0]}; {FIX}")]
    return []
