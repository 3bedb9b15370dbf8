"""The plan's memory estimate: peak memory one GPU allocates, from the config alone (no torch).

estimate.py puts the terms together (graph pools, workspaces, the optimizer step) and gives the
verdict; params.py holds weights, gradients and optimizer states; activations.py the activations.
"""

from bridge.memory.estimate import ESTIMATE_ERROR, GIB, GPU_MEMORY_GB, MemoryEstimate, estimate_memory
from bridge.memory.params import engine_regime

__all__ = ["ESTIMATE_ERROR", "GIB", "GPU_MEMORY_GB", "MemoryEstimate", "engine_regime", "estimate_memory"]
