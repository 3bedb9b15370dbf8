"""Every flag of Megatron-Bridge v0.3.1's ``scripts/performance`` argument parser, by its real
short and long names, and what each one becomes in graphbridge.

A flag is either *mapped*, becoming Hydra overrides of graphbridge keys (``perf.workload_map``
turns the given ones into overrides), or *refused*: the command stops before anything runs,
naming the flag and what to use instead. A refused flag still accepts the value that already
is graphbridge's behaviour (``-vb false``, ``-cv v1``), so a pasted Bridge command line that
asks for nothing graphbridge lacks keeps working.
"""

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from bridge.config.paths import config_dir

VALID_CUDA_GRAPH_IMPLS = ["none", "local", "transformer_engine"]  # Bridge's list: full_iteration is a scope there
VALID_CUDA_GRAPH_SCOPES = ["full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]


def group_options(group: str) -> List[str]:
    """The options of one of graphbridge's config groups (gpu, precision), as Bridge's choices."""
    return sorted(path.stem for path in (config_dir() / group).glob("*.yaml"))


# Value parsers, in Bridge's spellings; each error message names what would have been right.
def whole_number_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


positive_int = whole_number_at_least(1)
non_negative_int = whole_number_at_least(0)


def positive_int_or_none(text: str) -> Optional[int]:
    return None if text == "None" else positive_int(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def bool_arg(text: str) -> bool:
    if text.lower() in ("true", "1", "t", "yes", "y"):
        return True
    if text.lower() in ("false", "0", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def lower_str(text: str) -> str:
    return text.lower()


def comma_list(text: str) -> List[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def comma_ints(text: str) -> List[int]:
    try:
        return [int(item, 10) for item in comma_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None


def key_values(text: str) -> Dict[str, str]:
    """-ce's "K=V,K2=V2"."""
    pairs = comma_list(text)
    if not all("=" in pair and pair.split("=", 1)[0] for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE pairs separated by commas, got {text!r}")
    return dict(pair.split("=", 1) for pair in pairs)


def slurm_parameters(text: str) -> Dict[str, Any]:
    """--additional_slurm_params: "k=v;k2=v2", or space-separated, or one "k=v1,v2"; a bare k is true."""
    separator = ";" if ";" in text else None
    parts = [part.strip() for part in text.split(separator)] if (separator or " " in text) else [text.strip()]
    parameters: Dict[str, Any] = {}
    for part in filter(None, parts):
        name, has_value, value = part.partition("=")
        parameters[name.strip()] = value.strip() if has_value else True
    if not parameters:
        raise argparse.ArgumentTypeError("expected key=value pairs separated by semicolons")
    return parameters


def slurm_minutes(text: str) -> int:
    """A Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in whole minutes."""
    days, _, clock = text.rpartition("-")
    try:
        fields = [int(part) for part in clock.split(":")]
        day_count = int(days) if days else 0
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a Slurm time such as 00:30:00, got {text!r}") from None
    if days:  # D-HH[:MM[:SS]]
        fields += [0] * (3 - len(fields))
        hours, minutes, seconds = fields[:3]
    elif len(fields) == 3:
        hours, minutes, seconds = fields
    elif len(fields) == 2:
        hours, (minutes, seconds) = 0, fields
    else:
        hours, minutes, seconds = 0, fields[0], 0
    total = day_count * 1440 + hours * 60 + minutes + (1 if seconds else 0)
    if len(fields) > 3 or total < 1 or min(fields) < 0:
        raise argparse.ArgumentTypeError(f"expected a Slurm time of a minute or more, got {text!r}")
    return total


@dataclass(frozen=True)
class Flag:
    names: Tuple[str, ...]
    """Bridge's short and long forms; the long one names the value (``dest``)."""
    group: str
    help: str
    parse: Dict[str, Any] = field(default_factory=dict)
    """argparse keywords: type, choices, nargs, action, metavar."""
    refusal: Optional[str] = None
    """For a refused flag: why, and what to use instead."""
    keeps: Callable[[Any], bool] = lambda value: False
    """For a refused flag: the values that are already graphbridge's behaviour."""
    secret: bool = False
    """A credential: its value is never echoed (the terminal, main.log, a shared screen)."""

    @property
    def dest(self) -> str:
        return self.names[-1].lstrip("-")

    @property
    def label(self) -> str:
        return "/".join(self.names)


def mapped(names, group, help, **parse) -> Flag:
    return Flag(tuple(names), group, help, parse)


def refused(names, group, refusal, keeps=lambda value: False, secret=False, **parse) -> Flag:
    return Flag(tuple(names), group, f"refused: {refusal}", parse, refusal, keeps, secret)


def is_false(value) -> bool:
    return value is False


WORKLOAD, SIZES, TRAINING, DATA, SLURM, PROFILE, PERFORMANCE, LOGGING = (
    "workload", "model size, parallelism, batch and length", "training", "data and tokenizer",
    "Slurm (hydra/launcher=submitit_slurm)", "profiling", "CUDA graphs, recompute, MoE", "logging and checks")
NO_CHECKPOINTS = "graphbridge measures training speed and writes no checkpoints; drop the flag"
MOCK_DATA_ONLY = "graphbridge trains on mock data only (dataset.mock=true); drop the flag"
NO_SRUN = ("graphbridge runs in the Python environment it is started from and Hydra's Slurm launcher "
           "passes no srun options; start graphbridge inside your container instead")
NOT_DGXC = "DGX Cloud launching is not supported; use -p/-a (Hydra's Slurm launcher) or run on the node"
GOLDEN_VALUES = "Bridge's golden-value check is not part of graphbridge; compare runs with graphbridge-report"
NO_WANDB = "graphbridge logs no Weights & Biases; every job's result.json holds its step times, losses and memory"
FLAGS: List[Flag] = [
    mapped(["--domain"], WORKLOAD, "llm only: graphbridge's recipes are language models",
           type=lower_str, choices=["llm"]),
    mapped(["-m", "--model_family_name"], WORKLOAD, "recipe family, e.g. llama (with -mr)", type=lower_str),
    mapped(["-mr", "--model_recipe_name"], WORKLOAD, "recipe name, e.g. llama3_8b (with -m) -> recipe=<m>/<mr>",
           type=lower_str),
    mapped(["--task"], WORKLOAD, "-> workload.task; sft and lora pick the recipe <mr>_<task>",
           choices=["pretrain", "sft", "lora"]),
    mapped(["-g", "--gpu"], WORKLOAD, "-> gpu=<preset>; h200 is graphbridge's (the H100 presets, 141 GB)",
           choices=group_options("gpu")),
    mapped(["-c", "--compute_dtype"], WORKLOAD, "-> precision=<preset>", choices=group_options("precision")),
    refused(["-cv", "--config_variant"], WORKLOAD,
            "graphbridge's presets are Bridge's v1 workload configs; pass -cv v1 or set the keys that differ",
            keeps=lambda value: value == "v1"),
    refused(["--list_config_variants"], WORKLOAD,
            "graphbridge has one preset per recipe, GPU and precision: conf/preset/<family>/<recipe>/",
            action="store_true"),
    refused(["--use_recipes"], WORKLOAD, "graphbridge's recipes are its only configs; use -m/-mr",
            action="store_true"),
    refused(["--optimizer_type"], WORKLOAD, "graphbridge has Adam only (optimizer.optimizer=adam)",
            keeps=lambda value: value == "adam", choices=["adam", "muon"]),
    mapped(["-d", "--dryrun"], WORKLOAD, "-> mode=plan: print the plan; exit 2 when invalid", action="store_true"),

    mapped(["-ng", "--num_gpus"], SIZES, "-> train.num_gpus", type=positive_int),
    mapped(["--hidden_size"], SIZES, "-> model.hidden_size", type=positive_int),
    mapped(["--num_layers"], SIZES, "-> model.num_layers (MoE recipes keep their dense first layers)",
           type=positive_int),
    mapped(["--first_k_dense_replace"], SIZES, "-> model.moe_layer_freq: this many dense layers first",
           type=non_negative_int),
    mapped(["--pipeline_model_parallel_layout"], SIZES, "-> model.pipeline_model_parallel_layout"),
    mapped(["-tp", "--tensor_model_parallel_size"], SIZES,
           "-> model.tensor_model_parallel_size, and model.sequence_parallel when > 1", type=positive_int),
    mapped(["-pp", "--pipeline_model_parallel_size"], SIZES, "-> model.pipeline_model_parallel_size",
           type=positive_int),
    mapped(["-cp", "--context_parallel_size"], SIZES, "-> model.context_parallel_size", type=positive_int),
    mapped(["-vp", "--virtual_pipeline_model_parallel_size"], SIZES,
           "-> model.virtual_pipeline_model_parallel_size (None: unset)", type=positive_int_or_none, metavar="N|None"),
    mapped(["-ep", "--expert_model_parallel_size"], SIZES, "-> model.expert_model_parallel_size", type=positive_int),
    mapped(["-et", "--expert_tensor_parallel_size"], SIZES,
           "-> model.expert_tensor_parallel_size (bare or None: unset)", type=positive_int_or_none, nargs="?",
           metavar="N|None"),
    mapped(["-mb", "--micro_batch_size"], SIZES, "-> train.micro_batch_size", type=positive_int),
    mapped(["-gb", "--global_batch_size"], SIZES, "-> train.global_batch_size", type=positive_int),
    mapped(["-sl", "--seq_length"], SIZES, "-> dataset.seq_length (the model's follows)", type=positive_int),

    mapped(["-ms", "--max_steps"], TRAINING, "-> train.train_iters", type=positive_int),
    mapped(["--lr"], TRAINING, "-> optimizer.lr", type=positive_float),
    mapped(["--min_lr"], TRAINING, "-> optimizer.min_lr", type=positive_float),
    mapped(["--warmup_iters"], TRAINING, "-> optimizer.lr_warmup_iters", type=non_negative_int),
    refused(["--pretrained_checkpoint"], TRAINING,
            "graphbridge trains from random weights (the step time does not depend on them); drop the flag"),
    refused(["--save_dir"], TRAINING, NO_CHECKPOINTS),
    refused(["--load_dir"], TRAINING, NO_CHECKPOINTS),
    refused(["--save_interval"], TRAINING, NO_CHECKPOINTS, type=int),
    refused(["--most_recent_k"], TRAINING, NO_CHECKPOINTS, type=int),

    mapped(["--data"], DATA, "mock -> dataset.mock=true", choices=["mock", "rp2", "squad", "squad_packed"]),
    refused(["--dataset_paths"], DATA, MOCK_DATA_ONLY, nargs="*"),
    refused(["--dataset_root"], DATA, MOCK_DATA_ONLY),
    refused(["--index_mapping_dir"], DATA, MOCK_DATA_ONLY),
    refused(["--dataset_name"], DATA, MOCK_DATA_ONLY),
    refused(["--head_only"], DATA, MOCK_DATA_ONLY, action="store_true"),
    mapped(["--packed_sequence"], DATA, "-> dataset.packed_sequence=true", action="store_true"),
    refused(["--tokenizer_type"], DATA, "graphbridge uses a null tokenizer over mock data; set --vocab_size",
            keeps=lambda value: value == "NullTokenizer",
            choices=["NullTokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer"]),
    refused(["--tokenizer_model"], DATA, "graphbridge uses a null tokenizer over mock data; set --vocab_size"),
    mapped(["--vocab_size"], DATA, "-> model.vocab_size", type=positive_int),
    refused(["-hf", "--hf_token"], DATA, "graphbridge downloads nothing from Hugging Face; drop the flag", secret=True),

    mapped(["-a", "--account"], SLURM, "-> hydra.launcher.account"),
    mapped(["-p", "--partition"], SLURM, "-> hydra.launcher.partition"),
    mapped(["-t", "--time_limit"], SLURM, "-> hydra.launcher.timeout_min (from HH:MM:SS)", type=slurm_minutes),
    mapped(["-gn", "--gpus_per_node"], SLURM, "with -ng: train.num_nodes = num_gpus / gpus_per_node",
           type=positive_int),
    mapped(["--gres"], SLURM, "-> hydra.launcher.gres"),
    mapped(["--additional_slurm_params"], SLURM, "'k=v;k2=v2' -> hydra.launcher.additional_parameters",
           type=slurm_parameters),
    mapped(["-cb", "--custom_bash_cmds"], SLURM, "-> hydra.launcher.setup (run before each job)",
           action="append", nargs="*"),
    mapped(["-ce", "--custom_env_vars"], SLURM, "'K=V,K2=V2' -> env_vars.K=V (every rank's environment)",
           type=key_values),
    refused(["-i", "--container_image"], SLURM, NO_SRUN),
    refused(["-cm", "--custom_mounts"], SLURM, NO_SRUN, type=comma_list),
    refused(["-cs", "--custom_srun_args"], SLURM,
            "Hydra's Slurm launcher passes no srun options; sbatch options go in --additional_slurm_params",
            type=comma_list),
    refused(["-nh", "--nemo_home"], SLURM, "graphbridge reads no NeMo home; outputs go to -l/--log_dir"),
    refused(["--detach"], SLURM,
            "Hydra's Slurm launcher waits for its jobs; run graphbridge-workload under nohup or tmux to leave it",
            keeps=is_false, type=bool_arg),
    refused(["--max_retries"], SLURM,
            "graphbridge retries nothing; hydra.launcher.max_num_timeout requeues a job that hit its time limit",
            type=int),
    *(refused([f"--dgxc_{name}"], SLURM, NOT_DGXC, secret=name == "app_secret") for name in (
        "cluster", "base_url", "kube_apiserver_url", "app_id", "app_secret", "project_name", "pvc_claim_name",
        "pvc_mount_path")),

    mapped(["-en", "--enable_nsys"], PROFILE, "-> perf.nsys: each training process under `nsys profile`, "
           "NVTX step ranges, recording the profiling window", action="store_true"),
    mapped(["-pyp", "--pytorch_profiler"], PROFILE, "-> perf.profile (torch.profiler trace of the profiling window)",
           type=bool_arg),
    mapped(["--profiling_start_step"], PROFILE, "-> perf.profile_start_step (Bridge's default 10 when only the stop "
           "step is given; without either, the window is the last perf.profile_steps steps)",
           type=non_negative_int),
    mapped(["--profiling_stop_step"], PROFILE, "-> perf.profile_steps = stop - start: steps start..stop-1 "
           "(Bridge's default 11 when only the start step is given)", type=positive_int),
    mapped(["--profiling_gpu_metrics"], PROFILE, "-> perf.nsys_extra_args += --gpu-metrics-devices=all",
           action="store_true"),
    mapped(["--nsys_trace"], PROFILE, "comma list -> perf.nsys_trace (nsys --trace)", type=comma_list),
    mapped(["--nsys_extra_args"], PROFILE, "comma list -> perf.nsys_extra_args: these, then its defaults (as Bridge)",
           type=comma_list),
    refused(["--profiling_ranks"], PROFILE,
            "perf.nsys traces every rank of the job and perf.profile rank 0; drop the flag", type=comma_ints),
    refused(["-mh", "--record_memory_history"], PROFILE,
            "graphbridge records no memory history; result.json has peak_allocated_gb and peak_reserved_gb",
            keeps=is_false, type=bool_arg),
    refused(["-vb", "--enable_vboost"], PROFILE,
            "VBoost is set on the node with `sudo nvidia-smi boost-slider --vboost 1` before the run",
            keeps=is_false, type=bool_arg),

    mapped(["--cuda_graph_impl"], PERFORMANCE,
           f"one of {VALID_CUDA_GRAPH_IMPLS} -> model.cuda_graph_impl; without a scope the recipe's modules stay",
           choices=VALID_CUDA_GRAPH_IMPLS),
    mapped(["--cuda_graph_scope"], PERFORMANCE,
           f"comma list of {VALID_CUDA_GRAPH_SCOPES} -> model.cuda_graph_modules; full_iteration alone: "
           "forward and backward of the whole iteration", type=comma_list),
    mapped(["--recompute_modules"], PERFORMANCE, "comma list -> selective recompute", type=comma_list),
    mapped(["-rl", "--recompute_num_layers"], PERFORMANCE, "-> full recompute, block method, this many layers",
           type=positive_int),
    mapped(["-ol", "--activation_offload_layers"], PERFORMANCE,
           "-> model.cpu_offloading of this many layers; 0 turns offloading off", type=non_negative_int),
    mapped(["--use_tokendrop"], PERFORMANCE,
           "true: capacity factor 1.0 + padding; false: dropless with forced balancing", type=bool_arg),
    mapped(["--moe_a2a_overlap"], PERFORMANCE,
           "true: EP all-to-all overlap + delayed wgrad, no shared-expert overlap", type=bool_arg),
    mapped(["--use_megatron_fsdp"], PERFORMANCE,
           "true: Megatron-FSDP as Bridge sets it (ddp.use_megatron_fsdp, optim_grads_params, the distributed "
           "optimizer, no average_in_collective or gradient_accumulation_fusion)", type=bool_arg),
    refused(["--nccl_ub"], PERFORMANCE, "NCCL user buffers (Megatron-FSDP's registered buffers) are not supported",
            keeps=is_false, type=bool_arg),

    mapped(["-l", "--log_dir"], LOGGING, "-> hydra.run.dir and hydra.sweep.dir under this directory"),
    refused(["--save_config_filepath"], LOGGING,
            "the composed config is saved as .hydra/config.yaml in the run directory; drop the flag"),
    *(refused(name.split("/"), LOGGING, NO_WANDB, secret=name.endswith("wandb_key")) for name in (
        "-wdk/--wandb_key", "-wdp/--wandb_project_name", "-wde/--wandb_entity_name",
        "-wdj/--wandb_experiment_name", "-wds/--wandb_save_dir")),
    refused(["--is_long_convergence_run"], LOGGING, GOLDEN_VALUES, action="store_true"),
    refused(["--golden_values_path"], LOGGING, GOLDEN_VALUES),
    *(refused([f"--{name}"], LOGGING, GOLDEN_VALUES, type=float) for name in (
        "timing_threshold", "skip_first_percent_time", "correlation_threshold", "high_loss_tolerance",
        "medium_loss_tolerance", "low_loss_tolerance", "final_loss_tolerance", "max_outlier_ratio",
        "outlier_threshold", "skip_first_percent_loss", "memory_threshold")),
]
