"""The CUDA-graph override helper (Bridge's ``_set_cuda_graph_overrides``, made total).

It runs after every composition (Hydra CLI, compose API, ``bridge.load``, the workload
flags) and is importable for Python users:

    from bridge.overrides import set_cuda_graph_overrides
    set_cuda_graph_overrides(cfg, impl="transformer_engine", modules=["attn"])

Effects, on the *effective* impl after the arguments are applied:
- any graph impl turns on ``rng.te_rng_tracker`` and ``model.use_te_rng_tracker``;
- impl none turns both off and parks ``model.cuda_graph_modules`` (kept, not passed on);
- full_iteration turns the loss and grad NaN checks off unless the user set them (a NaN
  check left on explicitly is then rejected by validation, never silently changed), and for
  the same reason the device sync after pipeline sends and receives (model.batch_p2p_sync).
"""

from typing import List, Optional, Sequence, Union

from bridge.config.schema import CudaGraphImpl


def set_cuda_graph_overrides(
    cfg, impl: Optional[Union[str, CudaGraphImpl]] = None, modules: Optional[Union[str, Sequence[str]]] = None
):
    """Apply an impl and/or module list to ``cfg`` and derive the coupled settings."""
    model = cfg.model
    if modules is not None:
        names = _module_list(modules)
        if "full_iteration" in names:
            if names != ["full_iteration"]:
                raise ValueError(f"full_iteration cannot be combined with other scopes: {names}")
            if impl is not None and CudaGraphImpl(impl) == CudaGraphImpl.transformer_engine:
                raise ValueError("full_iteration cannot use cuda_graph_impl=transformer_engine; use local")
            impl, names = CudaGraphImpl.full_iteration, []
        model.cuda_graph_modules = names
    if impl is not None:
        model.cuda_graph_impl = CudaGraphImpl(impl)

    graphed = CudaGraphImpl(model.cuda_graph_impl) != CudaGraphImpl.none
    cfg.rng.te_rng_tracker = graphed
    model.use_te_rng_tracker = graphed

    nan_checks_default = CudaGraphImpl(model.cuda_graph_impl) != CudaGraphImpl.full_iteration
    if cfg.rerun_state_machine.check_for_nan_in_loss is None:
        cfg.rerun_state_machine.check_for_nan_in_loss = nan_checks_default
    if cfg.ddp.check_for_nan_in_grad is None:
        cfg.ddp.check_for_nan_in_grad = nan_checks_default
    if model.batch_p2p_sync is None:
        model.batch_p2p_sync = nan_checks_default  # the same condition: no host sync in a full graph
    return cfg


def _module_list(modules: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(modules, str):
        modules = modules.split(",")
    names = [str(name).strip() for name in modules]
    return [] if names == ["full"] else names
