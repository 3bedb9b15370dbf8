"""The config model: structured schema, composition and migration."""

from bridge.config.schema import CUDA_GRAPH_MODULES, CudaGraphImpl, GraphBridgeConfig

__all__ = ["CUDA_GRAPH_MODULES", "CudaGraphImpl", "GraphBridgeConfig"]
