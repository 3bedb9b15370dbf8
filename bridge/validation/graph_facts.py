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


def te_graphs_attention(cfg) -> bool:
    """Transformer Engine per-layer graphs capture attention: whole layers, or the attn module."""
    return impl_of(cfg) == TE and (not modules_of(cfg) or "attn" in modules_of(cfg))


MODULE_HOLDS = {"moe": ("moe_router", "moe_preprocess")}
"""The per-layer modules whose graph holds others: the MoE module's is the whole MoE part of the layer, its router
and dispatch preprocessing included (megatron-core's ``_forward_mlp()``)."""


def captured_modules(modules) -> set:
    """The per-layer modules a module list captures, with those the listed ones hold."""
    return set(modules).union(*(MODULE_HOLDS.get(module, ()) for module in modules))


def te_graphs_router(cfg) -> bool:
    """Transformer Engine per-layer graphs capture an MoE layer's router: whole layers, or a module list that
    captures moe_router (the moe module holds it)."""
    return impl_of(cfg) == TE and (not modules_of(cfg) or "moe_router" in captured_modules(modules_of(cfg)))


def graphs_moe_dispatch(cfg) -> bool:
    """The graph captures an MoE layer's token dispatch: full iteration, or per-layer graphs of whole layers or
    of the moe module."""
    impl = impl_of(cfg)
    return impl == FULL_ITERATION or (impl in (LOCAL, TE) and (not modules_of(cfg) or "moe" in modules_of(cfg)))


def graphs_moe_preprocess(cfg) -> bool:
    """The graph captures an MoE layer's dispatch preprocessing (TE's moe_preprocess module; local graphs of the
    router always add it)."""
    modules = active_modules(cfg)
    return (impl_of(cfg) == TE and "moe_preprocess" in modules) or (impl_of(cfg) == LOCAL and "moe_router" in modules)
