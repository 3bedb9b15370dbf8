"""LoRA in the megatron engine (``peft=lora``): a low-rank adapter beside each targeted linear layer of megatron-core's
GPTModel, every other weight frozen, so that megatron-core's DDP builds gradient buffers, and its optimizer states,
for the adapters alone (both skip parameters that do not require a gradient).

The adapter of a layer maps the layer's input through A (input -> rank) and B (rank -> output) and adds
``alpha / dim`` times the result to the layer's output; B starts at zero, so step 0 computes what the base model
does. Across tensor parallelism the adapter lays its output out as the layer does (the layout Megatron-Bridge's
LoRA uses, megatron.bridge.peft.utils.ParallelLinearAdapter):

- column-parallel layers (linear_qkv, linear_fc1: whole hidden state in, output sharded): A is column-parallel and
  gathers its rank-sized output, B is column-parallel like the layer. Under sequence parallelism the input arrives
  split along the sequence and is gathered first (Transformer Engine's layer-norm linear hands back its gathered
  layer-norm output instead); A then leaves its input gradient partial, for the gather's reduce-scatter to sum.
- row-parallel layers (linear_proj, linear_fc2: sharded input, reduced output): A is row-parallel, B is
  column-parallel and gathers; under sequence parallelism the output is split along the sequence as the layer's is.

The decoder's input comes from a frozen embedding and needs no gradient, so megatron-core's recompute
(CheckpointFunction) and its per-layer graphs (CudaGraphManager), which run their backward only for an input that
needs one, would leave the first layers' adapters without gradients (recompute: silently, a step of zeros) or fail
at capture ("grad requires non-empty inputs": local_layer on an H100 at fb59268, benchmarks/results/h100/
mcore-0.19.2/gpu_tests.log). Under either, the decoder's input is made to require a gradient, as Megatron-Bridge
does for recompute; this trains no weight.

Adapters sit on dense MLPs and shared experts, never on routed experts (the catalogue refuses those targets for MoE
models); their layers are built by megatron-core's own tensor-parallel classes, which mark their weights for its
gradient norm and optimizer.
"""

import contextlib
import re
from typing import Iterator, Tuple

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import (
    gather_from_sequence_parallel_region,
    scatter_to_sequence_parallel_region,
)
from megatron.core.transformer.transformer_block import TransformerBlock
from torch import nn

from bridge.config.peft import COLUMN_PARALLEL_TARGETS
from bridge.config.schema import PeftConfig

ROUTED_EXPERTS = re.compile(r"(^|\.)experts\.")
"""Routed experts live under ``mlp.experts.`` (grouped or sequential); shared experts under ``shared_experts.``."""


@contextlib.contextmanager
def without_sequence_parallel(config):
    """An adapter's own layers never split the sequence (the adapter gathers and scatters around them);
    megatron-core's linear layers read the flag once, when they are built."""
    saved = config.sequence_parallel
    config.sequence_parallel = False
    try:
        yield config
    finally:
        config.sequence_parallel = saved


class LoraAdapter(nn.Module):
    """``alpha / dim * B(A(dropout(x)))`` of one linear layer, laid out as that layer's output."""

    def __init__(self, config, column_parallel: bool, in_features: int, out_features: int, peft: PeftConfig):
        super().__init__()
        self.column_parallel = column_parallel
        self.sequence_parallel = bool(config.sequence_parallel)
        self.scale = peft.alpha / peft.dim
        self.dropout = nn.Dropout(peft.dropout) if peft.dropout > 0 else nn.Identity()
        self.dropout_position = peft.dropout_position
        with without_sequence_parallel(config):
            if column_parallel:
                self.linear_in = ColumnParallelLinear(
                    in_features, peft.dim, config=config, init_method=nn.init.xavier_normal_, bias=False,
                    gather_output=True, disable_grad_reduce=self.sequence_parallel)
            else:
                self.linear_in = RowParallelLinear(
                    in_features, peft.dim, config=config, init_method=nn.init.xavier_normal_, bias=False,
                    input_is_parallel=True, skip_bias_add=True)
            self.linear_out = ColumnParallelLinear(
                peft.dim, out_features, config=config, init_method=nn.init.zeros_, bias=False,
                gather_output=not column_parallel)

    def forward(self, x: torch.Tensor, input_gathered: bool = False) -> torch.Tensor:
        if self.dropout_position == "pre":
            x = self.dropout(x)
        if self.sequence_parallel and self.column_parallel and not input_gathered:
            x = gather_from_sequence_parallel_region(x)
        low_rank, _ = self.linear_in(x)
        out, _ = self.linear_out(low_rank)
        if self.sequence_parallel and not self.column_parallel:
            out = scatter_to_sequence_parallel_region(out)
        if self.dropout_position == "post":
            out = self.dropout(out)
        return out * self.scale


class LoraLinear(nn.Module):
    """A megatron-core linear layer with its adapter: returns what the layer returns, (output, bias), with the
    adapter's output added. Attributes it lacks are the layer's (megatron-core reads ``weight`` and
    ``backward_dw`` of linear_qkv and linear_proj through their parent)."""

    def __init__(self, base: nn.Module, adapter: LoraAdapter):
        super().__init__()
        self.base = base
        self.adapter = adapter
        # Transformer Engine's layer-norm linear normalizes inside; the adapter needs the normalized input, which
        # TE hands back on request (gathered along the sequence, under sequence parallelism).
        self.layernorm_inside = hasattr(base, "return_layernorm_output")
        if self.layernorm_inside:
            base.return_layernorm_output = True
            base.return_layernorm_output_gathered = adapter.sequence_parallel

    def forward(self, x: torch.Tensor, *args, **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
        output, bias, adapter_input = split_output(self.base(x, *args, **kwargs), x)
        return output + self.adapter(adapter_input, input_gathered=self.layernorm_inside), bias

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)


def split_output(returned, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, bias, the input the adapter takes) from what a megatron-core linear layer returned: (out, bias),
    with Transformer Engine's layer-norm output ((out, ln_out), bias), or (out, bias, ln_out) when TE also
    returns the bias."""
    if len(returned) == 3:
        return returned
    output, bias = returned
    if isinstance(output, tuple):
        output, layernorm_output = output
        return output, bias, layernorm_output
    return output, bias, x


def targeted_layers(model: nn.Module, targets: Tuple[str, ...]) -> Iterator[Tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) of each linear layer ``targets`` names, outside routed experts."""
    for name, module in list(model.named_modules()):
        for attribute, child in list(module.named_children()):
            if attribute in targets and not ROUTED_EXPERTS.search(f"{name}.{attribute}"):
                yield module, attribute, child


def add_lora(model: nn.Module, config, peft: PeftConfig, targets: Tuple[str, ...]) -> None:
    """Freeze ``model`` and put an adapter beside each layer ``targets`` names (bridge.config.peft.lora_targets)."""
    model.requires_grad_(False)
    for parent, attribute, layer in list(targeted_layers(model, targets)):
        column_parallel = attribute in COLUMN_PARALLEL_TARGETS
        out_local, in_local = layer.weight.shape
        tp = config.tensor_model_parallel_size
        in_features, out_features = (in_local, out_local * tp) if column_parallel else (in_local * tp, out_local)
        adapter = LoraAdapter(config, column_parallel, in_features, out_features, peft)
        setattr(parent, attribute, LoraLinear(layer, adapter))
    if config.recompute_granularity is not None or config.cuda_graph_impl == "local":
        for module in model.modules():
            if isinstance(module, TransformerBlock):
                module.register_forward_pre_hook(input_requires_grad, with_kwargs=True)


def input_requires_grad(block: nn.Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """A forward pre-hook of the decoder: its hidden_states (a keyword in GPTModel's call) as a tensor that needs a
    gradient. Pipeline stages after the first receive one that already does, or None."""
    if args:
        args = (needing_grad(args[0]), *args[1:])
    elif "hidden_states" in kwargs:
        kwargs = {**kwargs, "hidden_states": needing_grad(kwargs["hidden_states"])}
    return args, kwargs


def needing_grad(hidden_states):
    if torch.is_tensor(hidden_states) and hidden_states.is_floating_point() and not hidden_states.requires_grad:
        return hidden_states.detach().requires_grad_(True)
    return hidden_states
