"""Transformer Engine per-layer graphs: megatron-core's TECudaGraphHelper.

Capture follows Megatron-Bridge's train.py (v0.3.1): before the step whose index minus the
first step equals ``cuda_graph_warmup_steps``, the helper runs TE's make_graphed_callables over
every graphable layer (static inputs from seq_length x micro_batch_size), then zeroes the grad
buffers and optimizer grads it dirtied. When the distributed optimizer overlaps the param
all-gather with the forward, DDP's forward pre-hooks are switched off around the capture
(hooks are not captured) and re-registered as manual hooks that the graphed layers call.
"""

from typing import Callable, List, Optional, Set

import torch
from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

from bridge.diagnosis import graph_region
from bridge.engines.megatron.compat import graph_module_names
from bridge.engines.megatron.lifecycle import FirstStep


class TransformerEngineGraphs:
    region = "the Transformer Engine per-layer graphs (megatron-core TECudaGraphHelper)"

    def __init__(self, model_chunks: List[torch.nn.Module], transformer_config, seq_length: int,
                 micro_batch_size: int, optimizer, toggle_forward_pre_hook: bool):
        self.model_chunks = model_chunks
        self.helper = TECudaGraphHelper(model=model_chunks, config=transformer_config, seq_length=seq_length,
                                        micro_batch_size=micro_batch_size, optimizers=[optimizer])
        if not self.helper.flattened_callables:
            raise ValueError("model.cuda_graph_impl=transformer_engine found no layer matching "
                             f"model.cuda_graph_modules={graph_module_names(transformer_config)}; "
                             "pick modules the model has (attn, mlp for dense layers, moe_router for MoE)")
        self.warmup_steps = transformer_config.cuda_graph_warmup_steps
        self.toggle_forward_pre_hook = toggle_forward_pre_hook
        self.first_step = FirstStep()

    def wrap(self, forward_backward_func: Callable) -> Callable:
        return forward_backward_func

    def before_step(self, step: int) -> None:
        self.first_step.see(step)
        if self.helper.graphs_created() or step - self.first_step.index != self.warmup_steps:
            return
        if self.toggle_forward_pre_hook:
            for chunk in self.model_chunks:
                chunk.disable_forward_pre_hook(param_sync=False)
        with graph_region(self.region, "capture"):
            self.helper.create_cudagraphs()
        if self.toggle_forward_pre_hook:
            for chunk in self.model_chunks:
                chunk.enable_forward_pre_hook()
            self.helper.cuda_graph_set_manual_hooks()

    def phase(self, step: int) -> Optional[str]:
        # Captured in before_step, so the forward-backward of the capture step already replays.
        return "replay" if self.helper.graphs_created() else None

    def capture_steps(self) -> Set[int]:
        return self.first_step.offset(self.warmup_steps)

    def graph_count(self) -> int:
        return sum(len(layer.cuda_graphs) for layer in self.helper.flattened_callables)

    def delete(self) -> None:
        if self.helper.graphs_created():
            self.helper.delete_cuda_graphs()
