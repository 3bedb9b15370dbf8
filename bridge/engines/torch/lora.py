"""LoRA in the torch engine (``peft=lora``): the native model's linear layers that megatron-core's names in
``peft.target_modules`` stand for get a low-rank adapter, and every other weight is frozen, so that the optimizer
holds the adapters alone. The adapter adds ``alpha / dim * B(A(x))`` to the layer's output, A drawn like the
megatron engine's (Xavier normal), B zero, so step 0 computes what the base model does."""

from typing import Dict, Tuple

import torch
from torch import nn

from bridge.config.schema import LoraTarget, PeftConfig

NATIVE_NAMES: Dict[str, str] = {LoraTarget.linear_qkv.value: "qkv", LoraTarget.linear_proj.value: "proj",
                                LoraTarget.linear_fc1.value: "fc1", LoraTarget.linear_fc2.value: "fc2"}
"""megatron-core's layer names -> the native model's (attention's qkv and proj, the dense and shared MLP's fc1 and
fc2; routed experts are tensors of their own, never adapted)."""


class LoraLinear(nn.Module):
    def __init__(self, base: nn.Linear, peft: PeftConfig, generator: torch.Generator):
        super().__init__()
        self.base = base
        self.linear_in = nn.Linear(base.in_features, peft.dim, bias=False)
        self.linear_out = nn.Linear(peft.dim, base.out_features, bias=False)
        with torch.no_grad():
            nn.init.xavier_normal_(self.linear_in.weight, generator=generator)
            self.linear_out.weight.zero_()
        self.scale = peft.alpha / peft.dim
        self.dropout = nn.Dropout(peft.dropout) if peft.dropout > 0 else nn.Identity()
        self.dropout_position = peft.dropout_position

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        adapter_input = self.dropout(x) if self.dropout_position == "pre" else x
        adapted = self.linear_out(self.linear_in(adapter_input))
        if self.dropout_position == "post":
            adapted = self.dropout(adapted)
        return self.base(x) + self.scale * adapted


def add_lora(model: nn.Module, peft: PeftConfig, targets: Tuple[str, ...], generator: torch.Generator) -> None:
    """Freeze ``model`` and wrap each linear layer ``targets`` names (bridge.config.peft.lora_targets)."""
    model.requires_grad_(False)
    names = {NATIVE_NAMES[target] for target in targets}
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in names and isinstance(child, nn.Linear):
                setattr(module, name, LoraLinear(child, peft, generator))
