"""Full-iteration graph: megatron-core's FullCudaGraphWrapper around forward_backward_func.

The wrapper counts its calls and captures on call number ``warmup`` (eager before, replay
after, including the capture call itself). It pre-reads every microbatch of the iteration into
static buffers, so the data iterator must yield dicts of tensors.

With ``optimizer_step`` (optimizer.optimizer_in_graph=true) the captured function is
forward+backward followed by a sync-free optimizer step, so one replay is a whole training
step. The optimizer must then be capturable (see bridge.engines.megatron.capturable_optimizer).
With ``graphed_optimizer`` instead (the in-graph optimizer with the distributed optimizer, megatron-core
0.19) megatron-core's own OptimizerCudaGraphWrapper captures the megatron optimizer's step as a second
graph on the same call, as Megatron-LM and Megatron-Bridge (optimizer.optimizer_cuda_graph) wrap it.

All of the wrappers' state is class-level and megatron-core never resets it (0.19 has a reset that
leaves the static buffers; the optimizer wrapper's destructor leaves its call count); ``delete`` does,
so a later wrapper in the same process starts from call zero with empty buffers.
"""

from functools import partial
from typing import Callable, Optional, Set

import torch

from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader

from bridge.engines.megatron.compat import OptimizerCudaGraphWrapper, full_iteration_wrapper_arguments
from bridge.engines.megatron.lifecycle import FirstStep

STAGES = ("training", "validation")


class FullIterationGraphs:
    region = "the full-iteration graph (megatron-core FullCudaGraphWrapper)"

    def __init__(self, transformer_config, optimizer_step: Optional[Callable[[], None]] = None,
                 graphed_optimizer=None):
        self.transformer_config = transformer_config
        self.warmup_steps = transformer_config.cuda_graph_warmup_steps
        self.optimizer_step = optimizer_step
        self.first_step = FirstStep()
        if graphed_optimizer is not None:
            graph_optimizer_step(graphed_optimizer, transformer_config)

    def wrap(self, forward_backward_func: Callable) -> Callable:
        captured = forward_backward_func
        if self.optimizer_step is not None:
            captured = partial(_forward_backward_then_step, forward_backward_func, self.optimizer_step)
        wrapper = FullCudaGraphWrapper(captured, cuda_graph_warmup_steps=self.warmup_steps,
                                       **full_iteration_wrapper_arguments(self.transformer_config))
        return partial(_behind_queued_work, wrapper)

    def before_step(self, step: int) -> None:
        self.first_step.see(step)

    def phase(self, step: int) -> Optional[str]:
        return self.first_step.phase(step, self.warmup_steps)

    def capture_steps(self) -> Set[int]:
        return self.first_step.offset(self.warmup_steps)

    def graph_count(self) -> int:
        optimizer_graphs = OptimizerCudaGraphWrapper is not None and OptimizerCudaGraphWrapper.cuda_graph is not None
        return sum(FullCudaGraphWrapper.cuda_graph[stage] is not None for stage in STAGES) + optimizer_graphs

    def delete(self) -> None:
        reset_full_iteration_state()


def _behind_queued_work(wrapper: FullCudaGraphWrapper, **kwargs):
    # The wrapper copies the step's batches into its static buffers on a stream of its own. In
    # 0.16.1 that stream does not wait for work already queued (0.19 added the wait), and the trainer
    # queues a step while the one before still runs (bridge.step_clock): its copy would overwrite
    # the batch that step's replay is reading.
    wrapper.static_loader.stream.wait_stream(torch.cuda.current_stream())
    return wrapper(**kwargs)


def _forward_backward_then_step(forward_backward_func, optimizer_step, **kwargs):
    losses = forward_backward_func(**kwargs)
    optimizer_step()
    return losses


def graph_optimizer_step(optimizer, transformer_config) -> None:
    """megatron-core's optimizer graph around ``optimizer.step``: eager for the config's warmup calls, captured
    on the next (the full-iteration graph's capture step) into the pool cuda_graph_use_single_mempool names,
    replayed after. The optimizer must be built capturable (OptimizerConfig.optimizer_cuda_graph)."""
    optimizer.step = OptimizerCudaGraphWrapper(optimizer.step,
                                               cuda_graph_warmup_steps=transformer_config.cuda_graph_warmup_steps,
                                               use_single_mempool=transformer_config.cuda_graph_use_single_mempool)


def reset_full_iteration_state() -> None:
    """Free the graphs and static buffers and rewind the call counters of every stage and of the optimizer graph."""
    for stage in STAGES:
        graph = FullCudaGraphWrapper.cuda_graph[stage]
        if graph is not None:
            # Frees the graph's private memory pool now, not whenever the last reference dies.
            graph.reset()
        FullCudaGraphWrapper.cuda_graph[stage] = None
        FullCudaGraphWrapper.result[stage] = None
        FullCudaGraphWrapper.curr_iteration[stage] = 0
        StaticBufferLoader.static_buffers[stage] = []
    if OptimizerCudaGraphWrapper is not None:
        if OptimizerCudaGraphWrapper.cuda_graph is not None:
            OptimizerCudaGraphWrapper.cuda_graph.reset()
        OptimizerCudaGraphWrapper.cuda_graph = None
        OptimizerCudaGraphWrapper.result = None
        OptimizerCudaGraphWrapper.curr_iteration = 0


def full_iteration_state_is_clean() -> bool:
    optimizer_graph_clean = OptimizerCudaGraphWrapper is None or (
        OptimizerCudaGraphWrapper.cuda_graph is None and OptimizerCudaGraphWrapper.result is None
        and OptimizerCudaGraphWrapper.curr_iteration == 0)
    return optimizer_graph_clean and all(
        FullCudaGraphWrapper.cuda_graph[stage] is None
        and FullCudaGraphWrapper.result[stage] is None
        and FullCudaGraphWrapper.curr_iteration[stage] == 0
        and not StaticBufferLoader.static_buffers[stage]
        for stage in STAGES
    )
