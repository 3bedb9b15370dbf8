"""Local per-layer graphs: megatron-core's CudaGraphManager (cuda_graph_impl=local).

megatron-core builds a CudaGraphManager into every graphable layer when the model is built.
During the first scheduled step each manager runs eagerly and records its forward and
backward order in ``_CudagraphGlobalRecord``; at the end of that step the schedule function
calls ``create_cudagraphs()``, which warms up and captures every layer in recorded order into
one shared memory pool. Every later step replays. So the capture lands in the first step; the
engine has nothing to trigger.

megatron-core's ``delete_cuda_graphs()`` only resets runners still in the record (empty once
graphs exist) and, in 0.16.1, leaves the reuse pool's strong references alive; ``delete`` frees
the runners' graphs itself, then resets the global record, mempool and buffer pool.
"""

from contextlib import nullcontext
from typing import Callable, List, Optional, Set

import torch
from megatron.core.transformer import cuda_graphs
from megatron.core.transformer.cuda_graphs import CudaGraphManager, _CudagraphGlobalRecord

from bridge.engines.megatron.compat import (clear_manager_lookup, native_saves_observed, reset_tensor_reuse_pool,
                                           tensor_reuse_pool_is_empty)
from bridge.engines.megatron.lifecycle import FirstStep


class LocalLayerGraphs:
    region = "the local per-layer graphs (megatron-core CudaGraphManager)"

    def __init__(self, model_chunks: List[torch.nn.Module]):
        self.managers = [module for chunk in model_chunks for module in chunk.modules()
                         if isinstance(module, CudaGraphManager)]
        if not self.managers:
            raise ValueError("model.cuda_graph_impl=local found no graphable layer in the model; "
                             "check model.cuda_graph_modules against the model's layer types")
        self.first_step = FirstStep()

    def wrap(self, forward_backward_func: Callable) -> Callable:
        def step(**kwargs):
            # The first step records (and ends by capturing); later steps replay without the hook.
            with native_saves_observed() if not _CudagraphGlobalRecord.cudagraph_created else nullcontext():
                return forward_backward_func(**kwargs)
        return step

    def before_step(self, step: int) -> None:
        self.first_step.see(step)

    def phase(self, step: int) -> Optional[str]:
        return self.first_step.phase(step, 0)

    def capture_steps(self) -> Set[int]:
        return self.first_step.offset(0)

    def graph_count(self) -> int:
        return sum(runner.fwd_graph is not None
                   for manager in self.managers for runner in manager.cudagraph_runners)

    def delete(self) -> None:
        for manager in self.managers:
            for runner in manager.cudagraph_runners:
                for graph in (runner.fwd_graph, runner.bwd_graph):
                    if graph is not None:
                        graph.reset()
            manager.cudagraph_runners = []
            clear_manager_lookup(manager)
        reset_local_graph_state()


def reset_local_graph_state() -> None:
    """megatron-core's global record, mempool and buffer-reuse pool back to their initial state."""
    cuda_graphs.delete_cuda_graphs()
    reset_tensor_reuse_pool()
    cuda_graphs.fwd_buffer_reuse_ref_count = 0
    cuda_graphs.bwd_buffer_reuse_ref_count = 0


def local_graph_state_is_clean() -> bool:
    return (not _CudagraphGlobalRecord.cudagraph_created
            and not _CudagraphGlobalRecord.cudagraph_record
            and not _CudagraphGlobalRecord.cudagraph_inference_record
            and CudaGraphManager.global_mempool is None
            and tensor_reuse_pool_is_empty()
            and not cuda_graphs.is_graph_capturing())
