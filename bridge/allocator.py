"""What a graphed job's training process asks of PyTorch's CUDA caching allocator, on top of what the user set.

A captured graph allocates into a private pool. Blocks freed during the capture that another stream has used
(record_stream: megatron-core's and Transformer Engine's side streams, NCCL) are not reused inside that capture unless
the allocator is told to (``graph_capture_record_stream_reuse``, PyTorch >= 2.9), so the pool grows to far more than
the step's activations. Measured on an H100 (megatron-core 0.19.2, benchmarks/results/h100/mcore-0.19.2/
memory_diagnosis_025da11.json): Llama 3.2 1B's widths at four layers reserved 27.65 GiB with a full-iteration graph
against 13.73 eager; with capture reuse 17.37; with expandable segments beside it 16.69 (1.22x), as Megatron-LM's
full-iteration presets set both. So:

- every graphed job gets ``graph_capture_record_stream_reuse:True``;
- a full-iteration job also gets ``expandable_segments:True`` and, beside it, ``NCCL_GRAPH_REGISTER=0``
  (megatron-core's condition for expandable segments under graphs, the nccl_graph_register rule);

each only where the user set nothing for it: in the config's ``env_vars``, else in the environment the job started
in. A user who sets ``PYTORCH_CUDA_ALLOC_CONF`` keeps every option written there; only options it does not name
are added.
"""

from typing import Dict, Mapping, Tuple

from bridge.config.graphs import graph_impl
from bridge.config.schema import CudaGraphImpl

ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
NCCL_GRAPH_REGISTER = "NCCL_GRAPH_REGISTER"
CAPTURE_REUSE = "graph_capture_record_stream_reuse"
EXPANDABLE = "expandable_segments"
CAPTURE_REUSE_SINCE = (2, 9)
"""The PyTorch release whose allocator knows the option (an older one refuses any option it does not know)."""


def torch_release(version: str) -> Tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def user_value(name: str, env_vars: Mapping[str, str], environ: Mapping[str, str]) -> str:
    """What the user set for ``name``: the config's env_vars win over the starting environment."""
    return str(env_vars[name]) if name in env_vars else environ.get(name, "")


def option_names(alloc_conf: str) -> set:
    return {item.split(":")[0].strip() for item in alloc_conf.split(",") if item.strip()}


def graph_allocator_settings(cfg, environ: Mapping[str, str], torch_version: str) -> Dict[str, str]:
    """The variables to set for this job (with what the user set kept in them); empty when nothing is added."""
    impl = graph_impl(cfg.model.cuda_graph_impl)
    if not impl.graphed:
        return {}
    alloc_conf = user_value(ALLOC_CONF, cfg.env_vars, environ)
    named, added = option_names(alloc_conf), []
    if CAPTURE_REUSE not in named and torch_release(torch_version) >= CAPTURE_REUSE_SINCE:
        added.append(f"{CAPTURE_REUSE}:True")
    settings = {}
    register = user_value(NCCL_GRAPH_REGISTER, cfg.env_vars, environ)
    if impl.impl == CudaGraphImpl.full_iteration and EXPANDABLE not in named and register in ("", "0"):
        added.append(f"{EXPANDABLE}:True")
        settings[NCCL_GRAPH_REGISTER] = "0"
    if added:
        settings[ALLOC_CONF] = ",".join(filter(None, [alloc_conf, *added]))
    return settings
