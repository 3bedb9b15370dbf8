"""Engine selection: which engine and device a job runs on, decided before anything starts.

``engine=auto`` picks megatron when a CUDA device is visible and megatron-core is installed,
else torch. Engines are imported lazily: megatron-core costs seconds to import.
"""

import importlib.util

import torch

from bridge.config.schema import Device, Engine, GraphBridgeConfig


class ConfigError(ValueError):
    """A configuration that cannot run here; the message names the keys and the fix."""


def resolve_device(cfg: GraphBridgeConfig) -> torch.device:
    requested = Device(cfg.device)
    has_cuda = torch.cuda.is_available()
    if requested == Device.cuda and not has_cuda:
        raise ConfigError("device=cuda but no CUDA device is visible; use device=auto or device=cpu")
    return torch.device("cuda" if has_cuda and requested != Device.cpu else "cpu")


def resolve_engine(cfg: GraphBridgeConfig) -> str:
    """"megatron" or "torch"."""
    device = resolve_device(cfg)
    requested = Engine(cfg.engine)
    if requested == Engine.megatron and device.type != "cuda":
        raise ConfigError(
            f"engine=megatron needs a CUDA device, but the job would run on {device.type}; "
            "use engine=torch (or engine=auto) to train on the CPU"
        )
    if requested != Engine.auto:
        return requested.value
    return "megatron" if device.type == "cuda" and _megatron_core_installed() else "torch"


def _megatron_core_installed() -> bool:
    # find_spec of a submodule raises when its parent package is missing.
    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


def build_engine(cfg: GraphBridgeConfig):
    """The engine for ``cfg`` (see bridge.engines.base.Engine for what it offers)."""
    if resolve_engine(cfg) == "megatron":
        from bridge.engines.megatron_engine import MegatronEngine

        return MegatronEngine(cfg)
    from bridge.engines.torch_engine import TorchEngine

    return TorchEngine(cfg)
