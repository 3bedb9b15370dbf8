"""Validation: every rule runs, every violation is reported at once.

Pure config logic: nothing here imports torch or megatron-core, so a plan costs well under a
second and can run before any GPU, process group or output is touched.
"""

from typing import List

from bridge.validation import (  # noqa: F401  (importing registers the rules)
    cuda_graph_rules,
    environment_rules,
    measurement_rules,
    megatron_rules,
    moe_graph_rules,
    training_rules,
)
from bridge.validation.registry import RULES, run_rules
from bridge.validation.violation import Violation

__all__ = ["RULES", "Violation", "validate"]


def validate(cfg) -> List[Violation]:
    """All violations of ``cfg`` (a GraphBridgeConfig); an empty list means valid."""
    return run_rules(cfg)
