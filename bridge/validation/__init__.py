"""Validation: the one rule catalogue. Every rule runs, every violation is reported at once.

Pure config logic: nothing here imports torch or megatron-core, so a plan costs well under a
second and runs before any GPU, process group or output is touched. ``validate`` judges a
config for the machine it runs on (bridge.machine.probe) unless given another target.
"""

from typing import List, Optional

from bridge.validation import (  # noqa: F401  (importing registers the rules)
    auto_rules,
    cuda_graph_rules,
    engine_rules,
    environment_rules,
    fsdp_rules,
    legacy_rules,
    local_spec_rules,
    measurement_rules,
    megatron_rules,
    memory_rules,
    moe_graph_rules,
    moe_quantization_rules,
    optimizer_rules,
    packing_rules,
    parallel_split_rules,
    peft_rules,
    pipeline_layout_rules,
    quantized_shape_rules,
    recompute_rules,
    resolution_rules,
    router_rules,
    training_rules,
    value_rules,
    version_rules,
)
from bridge.validation.registry import RULES, Rule, judge_composed, run_rules
from bridge.validation.target import Target, resolve_target
from bridge.validation.violation import Violation

__all__ = ["RULES", "Refused", "Rule", "Target", "Violation", "judge_composed", "resolve_target", "validate"]


class Refused(Exception):
    """A config the catalogue refuses on its target; the message names every violation."""

    def __init__(self, violations: List[Violation]):
        self.violations = violations
        super().__init__("\n".join(str(v) for v in violations))


def validate(cfg, target: Optional[Target] = None) -> List[Violation]:
    """All violations of ``cfg`` (a resolved GraphBridgeConfig); an empty list means it is valid and
    can run on the target (by default: this machine)."""
    return run_rules(cfg, target or resolve_target(cfg))
