"""The ground floor: the structured schema, the graphs vocabulary, composition, migration and
paths. Nothing here imports another graphbridge package; every other layer reads this one."""

from bridge.config.resolvers import register_resolvers
from bridge.config.schema import CUDA_GRAPH_MODULES, CudaGraphImpl, GraphBridgeConfig

register_resolvers()  # before any config with a derived default is resolved

__all__ = ["CUDA_GRAPH_MODULES", "CudaGraphImpl", "GraphBridgeConfig"]
