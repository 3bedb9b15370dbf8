"""Rules about the run environment that megatron-core asserts only at capture time."""

from bridge.config.schema import CudaGraphImpl
from bridge.validation.registry import rule, violation

# Compute-capability major per preset GPU; the local graph manager's check stops at sm_100.
GPU_SM_MAJOR = {"h100": 9, "b200": 10, "b300": 10, "gb200": 10, "gb300": 10}


@rule("nccl_graph_register")
def nccl_graph_register(cfg):
    impl = CudaGraphImpl(cfg.model.cuda_graph_impl)
    if impl == CudaGraphImpl.none:
        return None
    alloc_conf = cfg.env_vars.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "")
    if "expandable_segments:True" not in alloc_conf or cfg.env_vars.get("NCCL_GRAPH_REGISTER") == "0":
        return None
    gpu = cfg.workload.gpu
    pre_blackwell = GPU_SM_MAJOR.get(gpu, 9) < 10  # unknown GPU: assume the stricter case
    if impl == CudaGraphImpl.transformer_engine or pre_blackwell:
        where = "with TE graphs on every GPU" if impl == CudaGraphImpl.transformer_engine else (
            f"with {impl.value} graphs before sm_100 (gpu={gpu or 'unknown'})"
        )
        return violation(
            "nccl_graph_register",
            ["env_vars.PYTORCH_CUDA_ALLOC_CONF", "env_vars.NCCL_GRAPH_REGISTER"],
            f"expandable_segments:True needs NCCL_GRAPH_REGISTER=0 {where} to avoid illegal "
            "memory access; set +env_vars.NCCL_GRAPH_REGISTER=0",
        )
    return None
