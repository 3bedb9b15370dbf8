"""What differs between the megatron-core releases the engine runs on (0.16.1 and 0.19.2), in one
place: the engine and its graph lifecycles call these instead of asking the version themselves.
How each release spells the config is translation's business (bridge.config.releases).

0.19 changed, for the engine:
- get_batch_on_this_cp_rank takes ``is_hybrid_cp`` (positional, no default);
- FullCudaGraphWrapper takes ``use_single_mempool`` (the config's cuda_graph_use_single_mempool);
- the local graphs' TensorReusePool is gone, and CudaGraphManager's inference lookup table is named
  ``custom_cudagraphs_lookup_table``;
- the per-layer module list lives in ``cuda_graph_modules`` (``cuda_graph_scope`` before);
- the local graphs keep a layer's boundary buffers alive from forward to backward only when the
  eager first step saw them saved for backward (native_saves_observed says why that needs help);
- megatron-core has its own optimizer graph, OptimizerCudaGraphWrapper (None before);
- TECudaGraphHelper skips capture on a rank without graphable layers (capture_layer_graphs).
"""

from contextlib import nullcontext
from typing import ContextManager, Dict, List

import torch

from megatron.core import __version__ as MEGATRON_CORE_VERSION
from megatron.core.transformer import cuda_graphs
from megatron.core.utils import get_batch_on_this_cp_rank

from bridge.config.releases import release as table_row, version_tuple
from bridge.machine import release

SINCE_0_19 = version_tuple(MEGATRON_CORE_VERSION) >= (0, 19)

# An installed release graphbridge does not support has no row: the catalogue refuses it before any engine.
if getattr(table_row(release(MEGATRON_CORE_VERSION)), "optimizer_graph", False):
    from megatron.core.optimizer.optimizer_cuda_graph import OptimizerCudaGraphWrapper
else:
    OptimizerCudaGraphWrapper = None


def batch_on_this_cp_rank(batch: Dict) -> Dict:
    """This context-parallel rank's slice of ``batch`` (graphbridge has no hybrid CP)."""
    if SINCE_0_19:
        return get_batch_on_this_cp_rank(batch, False)
    return get_batch_on_this_cp_rank(batch)


def full_iteration_wrapper_arguments(transformer_config) -> Dict:
    """Keyword arguments of FullCudaGraphWrapper beyond the function and the warmup steps."""
    if SINCE_0_19:
        return {"use_single_mempool": transformer_config.cuda_graph_use_single_mempool}
    return {}


def graph_module_names(transformer_config) -> List[str]:
    """The per-layer modules the config captures, as names (the catalogue refused an unsupported release)."""
    field = table_row(release(MEGATRON_CORE_VERSION)).modules_field
    return [module.name for module in getattr(transformer_config, field)]


def capture_layer_graphs(helper) -> None:
    """Capture a TECudaGraphHelper's layers, also where this pipeline rank has none while others do. 0.19's helper
    skips capture there and calls no collective. 0.16.1's has no such case (it would hand Transformer Engine's
    make_graphed_callables an empty tuple), and its capture meets every rank at a barrier before and after: a rank
    without layers meets the others at both."""
    if helper.flattened_callables or SINCE_0_19:
        helper.create_cudagraphs()
    else:
        torch.distributed.barrier()  # where the helper's capture starts on the other ranks
        torch.distributed.barrier()  # where it finishes


def clear_manager_lookup(manager) -> None:
    """Drop a CudaGraphManager's inference graph lookup table."""
    table = manager.custom_cudagraphs_lookup_table if SINCE_0_19 else manager.inference_cudagraphs_lookup_table
    table.clear()


def reset_tensor_reuse_pool() -> None:
    """Release the local graphs' buffer-reuse pool (0.16.1 only; 0.19 has none)."""
    if not SINCE_0_19:
        pool = cuda_graphs.TensorReusePool
        pool.tensor_strong_refs.clear()
        pool.tensor_strong_refs_dataptrs.clear()
        pool.pool.clear()


def tensor_reuse_pool_is_empty() -> bool:
    if SINCE_0_19:
        return True
    pool = cuda_graphs.TensorReusePool
    return not pool.tensor_strong_refs and not pool.pool


def native_saves_observed() -> ContextManager:
    """While megatron-core 0.19 records the local graphs' first step, also tag the tensors native
    autograd ops save for backward.

    0.19 releases a layer graph's input and output buffers to the graph pool after capture unless
    the recording step saw them saved for backward, and it sees only saves made by Python autograd
    Functions (it patches FunctionCtx.save_for_backward). Native ops save in C++: megatron-core's
    local layer spec starts each layer with torch's RMSNorm, so a layer's input buffer was released,
    reused by later graphs and read back corrupted by the backward graph (on an H100 the graphed
    losses left eager's by 1.4 within 8 steps; Transformer Engine's layers save through Python and
    trained right). A saved-tensors hook tags those saves the same way, only while megatron-core's
    own observer is on.
    """
    if not SINCE_0_19:
        return nullcontext()
    record = cuda_graphs._CudagraphGlobalRecord

    def tag(tensor):
        if record._saved_tensors_observer is not None:
            cuda_graphs._tag_cudagraph_buffer_saved_for_backward(tensor)
        return tensor

    return torch.autograd.graph.saved_tensors_hooks(tag, lambda tensor: tensor)
