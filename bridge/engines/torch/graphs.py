"""PyTorch's own CUDA-graph APIs, as the torch engine uses them.

- ``FullIterationGraph`` (cuda_graph_impl=full_iteration): one ``torch.cuda.graph`` of a whole
  optimizer step: every microbatch's forward and backward, gradient clipping and the
  optimizer step.
- ``ModuleGraphs`` (cuda_graph_impl=local): ``torch.cuda.make_graphed_callables`` over the
  submodules that ``model.cuda_graph_modules`` names, one forward and one backward graph each.

The engine captures once, at step == model.cuda_graph_warmup_steps, after eager steps. Dropout
draws from the default CUDA generator, whose state both APIs register with the graph
themselves, so no generator needs registering here. Capture and replay failures are raised as
``bridge.diagnosis.GraphCaptureError`` naming the region, for the trainer to diagnose.
"""

from typing import Callable, Dict, List, Optional, Sequence

import torch
from torch import nn

from bridge.diagnosis import graph_region
from bridge.engines.torch.native_model import MLPBlock, MoEBlock, NativeGPT

Batch = Dict[str, torch.Tensor]
FULL_ITERATION_REGION = "the full-iteration graph (forward, backward and optimizer step)"


class FullIterationGraph:
    """``step_fn(batch) -> loss`` captured whole; ``batch`` is copied into static buffers."""

    def __init__(self, step_fn: Callable[[Batch], torch.Tensor]):
        self.step_fn = step_fn
        self.side_stream = torch.cuda.Stream()
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.static_batch: Optional[Batch] = None
        self.static_loss: Optional[torch.Tensor] = None

    def warmup(self, batch: Batch) -> torch.Tensor:
        """An eager step before capture, on a side stream as PyTorch's capture recipe asks."""
        self.side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side_stream):
            loss = self.step_fn(batch)
        torch.cuda.current_stream().wait_stream(self.side_stream)
        return loss

    def capture(self, batch: Batch) -> None:
        """Record the step; nothing runs until ``replay``."""
        self.static_batch = {name: tensor.clone() for name, tensor in batch.items()}
        graph = torch.cuda.CUDAGraph()
        with graph_region(FULL_ITERATION_REGION, "capture"), torch.cuda.graph(graph):
            self.static_loss = self.step_fn(self.static_batch)
        self.graph = graph  # only a complete capture counts as a graph

    def replay(self, batch: Batch) -> torch.Tensor:
        for name, tensor in batch.items():
            self.static_batch[name].copy_(tensor)
        with graph_region(FULL_ITERATION_REGION, "replay"):
            self.graph.replay()
        # The next replay overwrites the static loss in place.
        return self.static_loss.clone()

    def count(self) -> int:
        return 0 if self.graph is None else 1

    def close(self) -> None:
        self.graph = self.static_batch = self.static_loss = None


class ModuleGraphs:
    """make_graphed_callables over ``modules`` (in forward order), captured on demand.

    Sample inputs repeat the shape, dtype and requires_grad of what each module received in
    the last eager step (recorded by forward pre-hooks), so autocast and the residual stream's
    dtype need no guessing.
    """

    def __init__(self, modules: Sequence[nn.Module]):
        self.modules: List[nn.Module] = list(modules)
        kinds = ", ".join(sorted({type(module).__name__ for module in self.modules}))
        self.region = f"the per-module graphs ({len(self.modules)} x {kinds})"
        self.input_specs: Dict[nn.Module, list] = {}
        self.hooks = [module.register_forward_pre_hook(self._record_inputs) for module in self.modules]
        self.captured = False

    def _record_inputs(self, module: nn.Module, args: tuple) -> None:
        self.input_specs[module] = [(arg.shape, arg.dtype, arg.requires_grad) for arg in args]

    def capture(self, device: torch.device) -> None:
        # make_graphed_callables refuses modules that carry hooks.
        self._remove_hooks()
        sample_args = tuple(
            tuple(torch.randn(shape, dtype=dtype, device=device, requires_grad=requires_grad)
                  for shape, dtype, requires_grad in self.input_specs[module])
            for module in self.modules
        )
        with graph_region(self.region, "capture"):
            torch.cuda.make_graphed_callables(tuple(self.modules), sample_args)
        self.captured = True

    def count(self) -> int:
        return 2 * len(self.modules) if self.captured else 0

    def close(self) -> None:
        self._remove_hooks()
        for module in self.modules:
            # make_graphed_callables installs an instance-level forward that owns the graphs.
            module.__dict__.pop("forward", None)
        self.modules, self.input_specs, self.captured = [], {}, False

    def _remove_hooks(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def select_modules(model: NativeGPT, names: Sequence[str]) -> List[nn.Module]:
    """The submodules ``model.cuda_graph_modules`` names, in forward order; [] = whole layers."""
    if not names:
        return list(model.layers)
    selected = []
    for layer in model.layers:
        ffn = layer.ffn_block
        if "attn" in names:
            selected.append(layer.attention_block)
        if "mlp" in names and isinstance(ffn, MLPBlock):
            selected.append(ffn)
        if "moe" in names and isinstance(ffn, MoEBlock):
            selected.append(ffn)
        if "moe_router" in names and isinstance(ffn, MoEBlock):
            selected.append(ffn.router)
    return selected
