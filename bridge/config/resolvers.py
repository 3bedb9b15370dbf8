"""The OmegaConf resolvers behind the schema's derived defaults.

A field that graphbridge derives from others (the TE RNG tracker from the graph impl, the NaN
checks, the warmup length, the weak-scaled global batch, the node count) has an interpolation as
its default, ``${graphbridge.<name>:...}``. So ``graphbridge --cfg job`` shows where a value comes from,
``--resolve`` shows the value, and a value the user sets anywhere (command line, recipe, preset,
Python) replaces the interpolation: it is never flipped by a derivation.
"""

from typing import Optional

from omegaconf import ListConfig, OmegaConf

from bridge.config.graphs import graph_impl


def graphed(impl) -> bool:
    """Any graph impl needs the TE RNG tracker (Megatron-Bridge asserts it for every impl)."""
    return graph_impl(impl).graphed


def host_checks(impl) -> bool:
    """Host-side checks (NaN checks, the device sync after pipeline sends) stay on unless the
    whole step is one graph, which cannot contain a host read."""
    return graph_impl(impl).host_syncs_allowed


def lr_warmup(train_iters: int) -> int:
    """A tenth of the run, so that a short run stays below the decay length megatron-core's
    scheduler asserts on without a second override."""
    return max(0, int(train_iters) // 10)


def global_batch(*, _root_) -> int:
    """Bridge's weak scaling of a preset's global batch to another GPU count (the global batch per
    GPU stays), or one micro-batch per data-parallel rank when no preset names a global batch."""
    train, workload, model = _root_.train, _root_.workload, _root_.model
    if workload.preset_global_batch_size is not None:
        preset_gpus = workload.preset_num_gpus or train.num_gpus
        return workload.preset_global_batch_size * train.num_gpus // max(1, preset_gpus)
    model_parallel = model.tensor_model_parallel_size * model.pipeline_model_parallel_size * model.context_parallel_size
    return train.micro_batch_size * max(1, train.num_gpus // max(1, model_parallel))


MAX_PATTERN_LAYERS = 1024
"""The longest layer pattern dense_first writes out. megatron-core reads moe_layer_freq as a list of num_layers
entries (get_gpt_decoder_layer_specs asserts its length), so the pattern is written out, one OmegaConf node per
layer, and a plan builds and reads those nodes about ten times: ~0.8 ms a layer on the 2-core CI machine (10000
layers planned in 9 s), so 1024 layers keep a plan near its 2 s budget (issue 79) where 2**31-1 would take weeks
and terabytes. The deepest model
megatron-core's recipes train has 126 layers (Llama 3.1 405B); DeepSeek-V3, whose pattern this is, 61."""


def dense_first(dense: int, layers: int) -> ListConfig:
    """A moe_layer_freq pattern of ``dense`` dense layers, then MoE layers up to ``layers`` (DeepSeek's
    first_k_dense_replace): it follows model.num_layers, so a shorter model keeps its dense layers.
    A ListConfig, not a list: OmegaConf.resolve (Hydra's --cfg job --resolve) cannot put a plain
    list into the schema's Any-typed field."""
    dense, layers = int(dense), int(layers)
    if layers > MAX_PATTERN_LAYERS:  # the resolvable rule refuses the config with this line
        raise ValueError(f"model.num_layers={layers} would write out a moe_layer_freq pattern of {layers} entries; "
                         f"set model.num_layers to at most {MAX_PATTERN_LAYERS}, or model.moe_layer_freq to an int")
    return OmegaConf.create([0] * min(dense, layers) + [1] * max(0, layers - dense))


def num_nodes(gpus: int, gpus_per_node: Optional[int]) -> int:
    """As few nodes as hold the job's GPUs (Bridge rounds up the same way), each at most the preset
    GPU's machine (workload.gpus_per_node); one node when no gpu= names the machine."""
    if gpus_per_node is None:
        return 1
    return max(1, -(-int(gpus) // max(1, int(gpus_per_node))))


def gpus_per_node(gpus: int, nodes: int) -> int:
    """conf/hydra/launcher/submitit_slurm.yaml asks Slurm for the GPUs of one node."""
    return gpus // max(1, nodes)


def hydra_subdir(mode) -> Optional[str]:
    """Hydra's .hydra/ record of a job; a plan runs no job, so it leaves none (conf/config.yaml).

    ``mode`` is the job's mode, or, where the hydra node is resolved on its own (``--cfg hydra
    --resolve``) and the job's keys are out of reach, the command line's overrides (hydra.overrides.task),
    of which the last ``mode=`` counts (the default is train)."""
    if isinstance(mode, (list, ListConfig)):
        given = [override.split("=", 1)[1] for override in mode if str(override).startswith("mode=")]
        mode = given[-1] if given else "train"
    return None if str(getattr(mode, "value", mode)) == "plan" else ".hydra"


RESOLVERS = {
    "graphbridge.graphed": graphed,
    "graphbridge.host_checks": host_checks,
    "graphbridge.lr_warmup": lr_warmup,
    "graphbridge.global_batch": global_batch,
    "graphbridge.dense_first": dense_first,
    "graphbridge.num_nodes": num_nodes,
    "graphbridge.gpus_per_node": gpus_per_node,
    "graphbridge.hydra_subdir": hydra_subdir,
}


def register_resolvers() -> None:
    for name, resolver in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
