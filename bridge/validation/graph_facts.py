"""What a config graphs, as the CUDA-graph rules read it (the vocabulary is bridge.config.graphs)."""

from bridge.config import graphs
from bridge.config.schema import CudaGraphImpl

IMPL = "model.cuda_graph_impl"
MODULES = "model.cuda_graph_modules"
TE = CudaGraphImpl.transformer_engine
LOCAL = CudaGraphImpl.local
FULL_ITERATION = CudaGraphImpl.full_iteration


def impl_of(cfg) -> CudaGraphImpl:
    return CudaGraphImpl(cfg.model.cuda_graph_impl)


def is_graphed(cfg) -> bool:
    return graphs.is_graphed(cfg.model.cuda_graph_impl)


def modules_of(cfg) -> list:
    modules = cfg.model.cuda_graph_modules
    return list(modules) if isinstance(modules, (list, tuple)) else []  # module_names reports others


def active_modules(cfg) -> set:
    """Modules that reach megatron-core: none when impl is none (they are parked)."""
    return set(modules_of(cfg)) if is_graphed(cfg) else set()
