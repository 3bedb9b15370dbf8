"""Full-iteration graph: megatron-core's FullCudaGraphWrapper around forward_backward_func.

The wrapper counts its calls and captures on call number ``warmup`` (eager before, replay
after, including the capture call itself). It pre-reads every microbatch of the iteration into
static buffers, so the data iterator must yield dicts of tensors.

With ``optimizer_step`` (optimizer.optimizer_in_graph=true) the captured function is
forward+backward followed by a sync-free optimizer step, so one replay is a whole training
step. The optimizer must then be capturable (see bridge.engines.megatron.capturable_optimizer).

All of the wrapper's state is class-level and megatron-core never resets it (0.19 has a reset that
leaves the static buffers); ``delete`` does, so a later wrapper in the same process starts from
call zero with empty buffers.
"""

from functools import partial
from typing import Callable, Optional, Set

import torch

from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader

from bridge.engines.megatron.compat import full_iteration_wrapper_arguments
from bridge.engines.megatron.lifecycle import FirstStep

STAGES = ("training", "validation")


class FullIterationGraphs:
    region = "the full-iteration graph (megatron-core FullCudaGraphWrapper)"

    def __init__(self, transformer_config, optimizer_step: Optional[Callable[[], None]] = None):
        self.transformer_config = transformer_config
        self.warmup_steps = transformer_config.cuda_graph_warmup_steps
        self.optimizer_step = optimizer_step
        self.first_step = FirstStep()

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
        return sum(FullCudaGraphWrapper.cuda_graph[stage] is not None for stage in STAGES)

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


def reset_full_iteration_state() -> None:
    """Free the graphs and static buffers and rewind the call counters of every stage."""
    for stage in STAGES:
        graph = FullCudaGraphWrapper.cuda_graph[stage]
        if graph is not None:
            # Frees the graph's private memory pool now, not whenever the last reference dies.
            graph.reset()
        FullCudaGraphWrapper.cuda_graph[stage] = None
        FullCudaGraphWrapper.result[stage] = None
        FullCudaGraphWrapper.curr_iteration[stage] = 0
        StaticBufferLoader.static_buffers[stage] = []


def full_iteration_state_is_clean() -> bool:
    return all(
        FullCudaGraphWrapper.cuda_graph[stage] is None
        and FullCudaGraphWrapper.result[stage] is None
        and FullCudaGraphWrapper.curr_iteration[stage] == 0
        and not StaticBufferLoader.static_buffers[stage]
        for stage in STAGES
    )
