"""The CUDA-graph override helper: Megatron-Bridge's ``_set_cuda_graph_overrides`` for Python users.

    cfg = bridge.compose(["recipe=llama/tiny"])
    set_cuda_graph_overrides(cfg, impl="local", modules="full_iteration")   # Bridge's spelling
    bridge.plan(cfg)

It sets what it is given, in Bridge's spellings: ``modules`` as a list or a comma string,
"full" for the whole layer, "full_iteration" (alone) for the whole iteration. Everything coupled
to the impl is derived, not set: the TE RNG tracker, both NaN checks and the pipeline device sync
are interpolations in the schema (bridge.config.resolvers), so on a composed config
(``bridge.compose``) or a fresh ``GraphBridgeConfig()`` they follow the new impl, while a value
the user set stays as set; a conflict is then a rule violation that names the fix. A finished
config (``bridge.load``) holds its derived values as plain values, so build a new one from
overrides instead.
"""

from typing import List, Optional, Sequence, Union

from bridge.config.schema import CudaGraphImpl


def set_cuda_graph_overrides(
    cfg, impl: Optional[Union[str, CudaGraphImpl]] = None, modules: Optional[Union[str, Sequence[str]]] = None
):
    """Set the impl and/or the module list of ``cfg`` (Bridge's spellings accepted); returns ``cfg``."""
    model = cfg.model
    if modules is not None:
        names = module_list(modules)
        if "full_iteration" in names:
            if names != ["full_iteration"]:
                raise ValueError(f"full_iteration cannot be combined with other scopes: {names}")
            if impl is not None and CudaGraphImpl(impl) == CudaGraphImpl.transformer_engine:
                raise ValueError("full_iteration cannot use cuda_graph_impl=transformer_engine; use local")
            impl, names = CudaGraphImpl.full_iteration, []
        model.cuda_graph_modules = names
    if impl is not None:
        model.cuda_graph_impl = CudaGraphImpl(impl)
    return cfg


def module_list(modules: Union[str, Sequence[str]]) -> List[str]:
    """Bridge's scope argument as a list of names: a comma string or a list; "full" is the whole layer."""
    if isinstance(modules, str):
        modules = modules.split(",")
    names = [str(name).strip() for name in modules]
    return [] if names == ["full"] else names
