"""LoRA's vocabulary, read by the rules, the memory estimate, the plan and both engines."""

from typing import Optional, Tuple

from bridge.config.schema import LoraTarget, PeftConfig, PeftScheme

COLUMN_PARALLEL_TARGETS = (LoraTarget.linear_qkv.value, LoraTarget.linear_fc1.value)
"""The column-parallel targets (whole hidden state in, output sharded over TP); an adapter's down-projection there
splits its rank over the TP ranks. linear_proj and linear_fc2 are row-parallel."""


def lora_targets(peft: PeftConfig) -> Optional[Tuple[str, ...]]:
    """The layers LoRA adapts (config ``peft``), by megatron-core's names, or None without LoRA (every weight
    trains)."""
    if PeftScheme(peft.scheme) != PeftScheme.lora:
        return None
    return tuple(LoraTarget(target).value for target in peft.target_modules)
