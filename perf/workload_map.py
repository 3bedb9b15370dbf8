"""What the mapped Bridge flags (perf.bridge_flags) become: Hydra overrides of graphbridge keys.

``flag_overrides`` takes the flags the user gave, by their long names, and returns overrides in
a fixed order; flags that only mean something together (-m with -mr, -ng with -gn, the graph
impl with its scope) are translated together. A combination with no
meaning raises ValueError with the flags to change.
"""

from typing import Any, Dict, List

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig, PerfConfig
from bridge.overrides import set_cuda_graph_overrides
from bridge.recipes import recipe_names
from perf.bridge_flags import VALID_CUDA_GRAPH_SCOPES

Given = Dict[str, Any]

ONE_KEY = {  # flags that set exactly one key to their value
    "num_gpus": "train.num_gpus",
    "hidden_size": "model.hidden_size",
    "num_layers": "model.num_layers",
    "pipeline_model_parallel_layout": "model.pipeline_model_parallel_layout",
    "tensor_model_parallel_size": "model.tensor_model_parallel_size",
    "pipeline_model_parallel_size": "model.pipeline_model_parallel_size",
    "context_parallel_size": "model.context_parallel_size",
    "virtual_pipeline_model_parallel_size": "model.virtual_pipeline_model_parallel_size",
    "expert_model_parallel_size": "model.expert_model_parallel_size",
    "expert_tensor_parallel_size": "model.expert_tensor_parallel_size",
    "micro_batch_size": "train.micro_batch_size",
    "global_batch_size": "train.global_batch_size",
    "seq_length": "dataset.seq_length",
    "max_steps": "train.train_iters",
    "lr": "optimizer.lr",
    "min_lr": "optimizer.min_lr",
    "warmup_iters": "optimizer.lr_warmup_iters",
    "vocab_size": "model.vocab_size",
    "pytorch_profiler": "perf.profile",
    "account": "hydra.launcher.account",
    "partition": "hydra.launcher.partition",
    "time_limit": "hydra.launcher.timeout_min",
    "gres": "hydra.launcher.gres",
}
BRIDGE_PROFILING_WINDOW = (10, 11)
"""Bridge's --profiling_start_step and --profiling_stop_step defaults: it profiles steps start..stop-1."""
SLURM_FLAGS = ("account", "partition", "time_limit", "gres", "additional_slurm_params", "custom_bash_cmds")
OVERRIDES = OverridesParser.create()


def flag_overrides(given: Given) -> List[str]:
    overrides = _recipe(given)
    if "gpu" in given:
        overrides.append(f"gpu={given['gpu']}")
    if "compute_dtype" in given:
        overrides.append(f"precision={given['compute_dtype']}")
    overrides += [f"{key}={value_text(given[flag])}" for flag, key in ONE_KEY.items() if flag in given]
    if "tensor_model_parallel_size" in given:
        # Bridge couples them: sequence parallelism is on exactly when TP splits the layers.
        overrides.append(f"model.sequence_parallel={value_text(given['tensor_model_parallel_size'] > 1)}")
    if "first_k_dense_replace" in given:
        # Quoted: Hydra's override grammar does not take a resolver call with arguments unquoted.
        dense_first = f"${{graphbridge.dense_first:{given['first_k_dense_replace']},${{model.num_layers}}}}"
        overrides.append(f"model.moe_layer_freq={quoted(dense_first, literal_text=False)}")
    for part in (_data, _nodes, _slurm, _profiling, _graphs, _recompute, _moe, _megatron_fsdp, _log_dir):
        overrides += part(given)
    if given.get("dryrun"):
        overrides.append("mode=plan")
    if given.get("multirun"):
        overrides.append("hydra.mode=MULTIRUN")
    return overrides


def _recipe(given: Given) -> List[str]:
    family, name, task = given.get("model_family_name"), given.get("model_recipe_name"), given.get("task")
    overrides = [f"workload.task={task}"] if task else []
    if family is None and name is None:
        return overrides
    if family is None or name is None:
        raise ValueError("-m/--model_family_name and -mr/--model_recipe_name go together "
                         "(e.g. -m llama -mr llama3_8b), or use recipe=<family>/<name>")
    # Bridge picks <name>_<task>_config; graphbridge keeps each fine-tuning recipe as <name>_<task>.
    recipe = f"{family}/{name}" if task in (None, "pretrain") else f"{family}/{name}_{task}"
    known = recipe_names()
    if recipe not in known:
        same_family = [candidate for candidate in known if candidate.startswith(f"{family}/")]
        listing = f"recipes of {family}: {', '.join(same_family)}" if same_family else f"recipes: {', '.join(known)}"
        raise ValueError(f"-m {family} -mr {name}{f' --task {task}' if task else ''}: no recipe {recipe}; {listing}")
    return [f"recipe={recipe}"] + overrides


def _data(given: Given) -> List[str]:
    overrides = []
    if "data" in given:
        if given["data"] != "mock":
            raise ValueError(f"--data {given['data']}: graphbridge trains on mock data only; use --data mock")
        overrides.append("dataset.mock=true")
    if given.get("packed_sequence"):
        overrides.append("dataset.packed_sequence=true")
    return overrides


def _nodes(given: Given) -> List[str]:
    if "gpus_per_node" not in given:
        return []
    per_node, gpus = given["gpus_per_node"], given.get("num_gpus")
    if gpus is None:
        raise ValueError(f"-gn/--gpus_per_node {per_node} needs -ng/--num_gpus (the job's GPUs in all)")
    if gpus % per_node and gpus > per_node:
        raise ValueError(f"-ng {gpus} is not a multiple of -gn {per_node}: every node runs the same number of ranks")
    return [f"train.num_nodes={max(1, gpus // per_node)}"]


def _slurm(given: Given) -> List[str]:
    """A Slurm flag means what it means in Bridge: the job is submitted to Slurm (one Hydra
    multirun job through the submitit launcher). A dry run only plans, on this machine."""
    overrides = [f"++env_vars.{name}={quoted(value)}" for name, value in given.get("custom_env_vars", {}).items()]
    if not any(flag in given for flag in SLURM_FLAGS):
        return overrides
    overrides.append("hydra/launcher=submitit_slurm")
    if not given.get("dryrun"):
        overrides.append("hydra.mode=MULTIRUN")
    for name, value in given.get("additional_slurm_params", {}).items():
        overrides.append(f"++hydra.launcher.additional_parameters.{name}={value_text(value)}")
    commands = [" ".join(group) for group in given.get("custom_bash_cmds", []) if group]
    if commands:
        overrides.append(f"hydra.launcher.setup={value_text(commands)}")
    return overrides


def _profiling(given: Given) -> List[str]:
    """-en and the window flags: Bridge profiles steps start..stop-1, graphbridge profile_steps
    steps from profile_start_step (0-based, as Bridge counts iterations)."""
    overrides = ["perf.nsys=true"] if given.get("enable_nsys") else []
    if "profiling_start_step" in given or "profiling_stop_step" in given:
        start = given.get("profiling_start_step", BRIDGE_PROFILING_WINDOW[0])
        stop = given.get("profiling_stop_step", BRIDGE_PROFILING_WINDOW[1])
        if stop <= start:
            raise ValueError(f"--profiling_start_step {start} --profiling_stop_step {stop}: the window is steps "
                             f"start..stop-1, so the stop step must be greater; e.g. --profiling_stop_step {start + 1}")
        overrides += [f"perf.profile_start_step={start}", f"perf.profile_steps={stop - start}"]
    if "nsys_trace" in given:
        overrides.append(f"perf.nsys_trace={value_text(given['nsys_trace'])}")
    extra = list(given.get("nsys_extra_args", []))
    if given.get("profiling_gpu_metrics"):
        extra.append("--gpu-metrics-devices=all")
    if extra:  # as in Bridge: the user's arguments first, then the launcher's defaults the user did not set
        given_options = {argument.split("=")[0] for argument in extra}
        defaults = [argument for argument in PerfConfig().nsys_extra_args if argument.split("=")[0] not in given_options]
        overrides.append(f"perf.nsys_extra_args={value_text(extra + defaults)}")
    return overrides


def _graphs(given: Given) -> List[str]:
    """Bridge's (impl, scope) pair in graphbridge's impl + modules, decided by the override
    helper on a blank config so that the flags and the Python API cannot drift apart. Only what
    the flags decide is emitted: an impl without a scope keeps the recipe's modules."""
    impl, scopes = given.get("cuda_graph_impl"), given.get("cuda_graph_scope")
    if impl is None and scopes is None:
        return []
    unknown = [scope for scope in scopes or [] if scope not in VALID_CUDA_GRAPH_SCOPES]
    if unknown:
        raise ValueError(f"--cuda_graph_scope: unknown scope {', '.join(unknown)}; "
                         f"choose from {', '.join(VALID_CUDA_GRAPH_SCOPES)}")
    blank = GraphBridgeConfig()
    try:
        set_cuda_graph_overrides(blank, impl, scopes)
    except ValueError as error:
        raise ValueError(f"--cuda_graph_impl/--cuda_graph_scope: {error}") from None
    decided = blank.model
    overrides = []
    if impl is not None or decided.cuda_graph_impl != CudaGraphImpl.none:
        overrides.append(f"model.cuda_graph_impl={CudaGraphImpl(decided.cuda_graph_impl).value}")
    if scopes is not None:
        overrides.append(f"model.cuda_graph_modules={value_text(list(decided.cuda_graph_modules))}")
    return overrides


def _recompute(given: Given) -> List[str]:
    layers, modules = given.get("recompute_num_layers"), given.get("recompute_modules")
    if layers is not None and modules is not None:
        raise ValueError("-rl/--recompute_num_layers (full recompute) and --recompute_modules (selective "
                         "recompute) are alternatives; pass one of them")
    overrides = []
    if layers is not None:
        overrides += ["model.recompute_granularity=full", "model.recompute_method=block",
                      f"model.recompute_num_layers={layers}"]
    if modules is not None:
        overrides += ["model.recompute_granularity=selective", f"model.recompute_modules={value_text(modules)}"]
    if "activation_offload_layers" in given:
        offloaded = given["activation_offload_layers"]
        overrides += [f"model.cpu_offloading={value_text(offloaded > 0)}", f"model.cpu_offloading_num_layers={offloaded}"]
    return overrides


def _moe(given: Given) -> List[str]:
    overrides = []
    if given.get("use_tokendrop") is True:
        overrides += ["model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true",
                      "model.moe_router_force_load_balancing=false"]
    if given.get("use_tokendrop") is False:
        overrides += ["model.moe_expert_capacity_factor=null", "model.moe_pad_expert_input_to_capacity=false",
                      "model.moe_router_force_load_balancing=true"]
    if "moe_a2a_overlap" in given:
        overlap = value_text(given["moe_a2a_overlap"])
        overrides += [f"model.overlap_moe_expert_parallel_comm={overlap}", f"model.delay_wgrad_compute={overlap}"]
        if given["moe_a2a_overlap"]:
            # megatron-core refuses shared-expert overlap together with the EP A2A overlap.
            overrides.append("model.moe_shared_expert_overlap=false")
    return overrides


def _megatron_fsdp(given: Given) -> List[str]:
    """--use_megatron_fsdp true: what Bridge's _set_megatron_fsdp_overrides and its config check set with it."""
    if "use_megatron_fsdp" not in given:
        return []
    if not given["use_megatron_fsdp"]:
        return ["ddp.use_megatron_fsdp=false"]
    return ["ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads_params",
            "ddp.use_distributed_optimizer=true", "ddp.average_in_collective=false",
            "model.gradient_accumulation_fusion=false"]


def _log_dir(given: Given) -> List[str]:
    """-l DIR: run and sweep directories under DIR, named as graphbridge names them."""
    if "log_dir" not in given:
        return []
    base = literal(given["log_dir"].rstrip("/") or "/")
    return [f"hydra.run.dir={quoted(base + '/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}', literal_text=False)}",
            f"hydra.sweep.dir={quoted(base + '/multirun/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}', literal_text=False)}"]


def value_text(value: Any) -> str:
    """A Python value as a Hydra override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list):  # items quoted: a list element's grammar is not a value's
        return "[" + ",".join(quoted(item, bare=False) if isinstance(item, str) else value_text(item)
                              for item in value) + "]"
    return quoted(str(value))


def literal(text: str) -> str:
    """Text that OmegaConf keeps as typed: no ${...} interpolation."""
    return text.replace("${", "\\${")


def quoted(text: str, literal_text: bool = True, bare: bool = True) -> str:
    """A Hydra string value: with ``bare``, as typed where Hydra reads it back as that very string (the
    printed command stays readable: partition=batch), else quoted, a quote escaped, a trailing backslash
    doubled."""
    text = literal(text) if literal_text else text
    if bare and reads_back(text, interpolation=not literal_text):
        return text
    if text.endswith("\\"):
        text += "\\"
    return "'" + text.replace("'", "\\'") + "'"


def reads_back(text: str, interpolation: bool = False) -> bool:
    """Whether Hydra's override grammar reads ``text``, unquoted, as the string ``text`` (not a number,
    a bool, null, a list or a sweep; an interpolation only where one is meant)."""
    if not text or "\\" in text or ("$" in text and not interpolation):
        return False
    try:
        value = OVERRIDES.parse_override(f"key={text}").value()
    except HydraException:
        return False
    return isinstance(value, str) and value == text

