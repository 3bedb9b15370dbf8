"""Megatron-Bridge's performance-script flags on top of graphbridge's Hydra config.

    graphbridge-workload -m llama -mr llama3_8b -g b200 -c bf16 -ng 8 \\
        --cuda_graph_impl transformer_engine --cuda_graph_scope attn,mlp -ms 100 \\
        dataset.seq_length=4096

Each flag becomes Hydra overrides, appended after the trailing key=value overrides so that a
flag wins over an override of the same key (Bridge's argparse also runs after its Hydra
overrides). The result is graphbridge's own command line: compose, migration, override helper,
validation, then plan or run, sweeps included. ``--dryrun`` is ``mode=plan``: print the plan,
exit 2 when the configuration is invalid.

Two Bridge v0.3.1 behaviours are deliberately fixed: ``--cuda_graph_impl transformer_engine``
without ``--cuda_graph_scope`` keeps the recipe's modules (Bridge crashes), and ``-ol 0`` means
no activation offloading (Bridge still turns offloading on).
"""

import argparse
import shlex
import sys
from typing import List, Optional, Sequence

from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.overrides import set_cuda_graph_overrides
from bridge.recipes import recipe_names
from perf.main import main as graphbridge_main

# Bridge's argument_parser.py lists, kept verbatim: full_iteration is a scope there, not an impl.
VALID_CUDA_GRAPH_IMPLS = ["none", "local", "transformer_engine"]
VALID_CUDA_GRAPH_SCOPES = ["full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
GPUS = ["h100", "b200", "b300", "gb200", "gb300"]
COMPUTE_DTYPES = ["bf16", "fp8_cs", "fp8_mx", "fp8_sc", "nvfp4"]
TASKS = ["pretrain", "sft", "lora"]

# Flags that set exactly one config key: (flags, key). The long flag names the argparse dest.
SIZE_FLAGS = [
    (("-tp", "--tensor_model_parallel_size"), "model.tensor_model_parallel_size"),
    (("-pp", "--pipeline_model_parallel_size"), "model.pipeline_model_parallel_size"),
    (("-cp", "--context_parallel_size"), "model.context_parallel_size"),
    (("-ep", "--expert_model_parallel_size"), "model.expert_model_parallel_size"),
    (("-ng", "--num_gpus"), "train.num_gpus"),
    (("-mb", "--micro_batch_size"), "train.micro_batch_size"),
    (("-gb", "--global_batch_size"), "train.global_batch_size"),
    (("-sl", "--seq_length"), "dataset.seq_length"),
    (("-ms", "--max_steps"), "train.train_iters"),
]
# These also take None (Bridge's spelling of "unset").
OPTIONAL_SIZE_FLAGS = [
    (("-vp", "--virtual_pipeline_model_parallel_size"), "model.virtual_pipeline_model_parallel_size"),
    (("-et", "--expert_tensor_parallel_size"), "model.expert_tensor_parallel_size"),
]


def _whole_number_at_least(minimum: int):
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return convert


_positive_int = _whole_number_at_least(1)
_non_negative_int = _whole_number_at_least(0)


def _positive_int_or_none(text: str) -> Optional[int]:
    return None if text == "None" else _positive_int(text)


def _bool_arg(text: str) -> bool:
    if text.lower() in ("true", "1", "t", "yes", "y"):
        return True
    if text.lower() in ("false", "0", "f", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"Invalid value for boolean argument: {text}; use true or false")


def _cuda_graph_impl(text: str) -> str:
    if text in VALID_CUDA_GRAPH_IMPLS:
        return text
    raise argparse.ArgumentTypeError(
        f"Invalid value for cuda_graph_impl: {text}. Valid options are: {VALID_CUDA_GRAPH_IMPLS}"
    )


def _cuda_graph_scope(text: str) -> List[str]:
    scopes = text.split(",")
    if all(scope in VALID_CUDA_GRAPH_SCOPES for scope in scopes):
        return scopes
    raise argparse.ArgumentTypeError(
        f"Invalid value for cuda_graph_scope: {text}. Valid options are: {VALID_CUDA_GRAPH_SCOPES}. "
        "Comma separated list of scopes is allowed."
    )


def _name_list(text: str) -> List[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="graphbridge-workload",
        usage="%(prog)s [-h] [Bridge flags ...] [--dryrun] [key=value ...]",
        description="Megatron-Bridge performance-script flags for graphbridge. Flags win over the "
        "trailing key=value Hydra overrides; every flag is also reachable as an override.",
        epilog="Sweeps: add sweep=dense_scopes (or any Hydra sweep override) as a trailing override; "
        "-m is Bridge's --model_family_name here, not Hydra's --multirun.",
    )
    workload = parser.add_argument_group("workload (recipe and preset)")
    workload.add_argument("-m", "--model_family_name", help="recipe family, e.g. llama (with -mr)")
    workload.add_argument("-mr", "--model_recipe_name", help="recipe name, e.g. llama3_8b (with -m)")
    workload.add_argument("--task", choices=TASKS, help="-> workload.task; with -mr, sft and lora pick <name>_<task>")
    workload.add_argument("-g", "--gpu", choices=GPUS, help="-> gpu=<preset>")
    workload.add_argument("-c", "--compute_dtype", choices=COMPUTE_DTYPES, help="-> precision=<preset>")
    workload.add_argument("--data", choices=["mock"], help="-> dataset.mock=true (the only dataset graphbridge has)")

    # Absent unless given, so that "-vp None" (set it to null) differs from no -vp (keep the recipe's).
    sizes = parser.add_argument_group("parallelism, batch and length")
    for flags, key in SIZE_FLAGS:
        sizes.add_argument(*flags, type=_positive_int, default=argparse.SUPPRESS, help=f"-> {key}")
    for flags, key in OPTIONAL_SIZE_FLAGS:
        sizes.add_argument(*flags, type=_positive_int_or_none, default=argparse.SUPPRESS, metavar="N|None",
                           help=f"-> {key}")

    graphs = parser.add_argument_group("CUDA graphs")
    graphs.add_argument("--cuda_graph_impl", type=_cuda_graph_impl,
                        help=f"one of {VALID_CUDA_GRAPH_IMPLS}; without a scope the recipe's modules stay")
    graphs.add_argument("--cuda_graph_scope", type=_cuda_graph_scope,
                        help=f"comma list of {VALID_CUDA_GRAPH_SCOPES}; full_iteration alone = the whole iteration")

    memory = parser.add_argument_group("recompute, offloading, MoE")
    memory.add_argument("--recompute_modules", type=_name_list, help="comma list -> selective recompute")
    memory.add_argument("-rl", "--recompute_num_layers", type=_positive_int,
                        help="-> full recompute, block method, this many layers")
    memory.add_argument("-ol", "--activation_offload_layers", type=_non_negative_int,
                        help="-> cpu_offloading of this many layers; 0 turns offloading off")
    memory.add_argument("--use_tokendrop", type=_bool_arg, metavar="BOOL",
                        help="true: capacity factor 1.0 + padding; false: dropless with forced balancing")
    memory.add_argument("--moe_a2a_overlap", type=_bool_arg, metavar="BOOL",
                        help="true: EP all-to-all overlap + delayed wgrad, no shared-expert overlap")

    parser.add_argument("--dryrun", action="store_true", help="-> mode=plan: print the plan, exit 2 when invalid")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Hydra overrides, applied before the flags")
    return parser


def flags_to_overrides(argv: Sequence[str]) -> List[str]:
    """Hydra overrides for a Bridge-style command line: trailing overrides first, flags last so
    they win. Bad flags exit with status 2 and a message naming the flag (argparse's way)."""
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)
    for override in args.overrides:
        if "=" not in override and not override.startswith("~"):
            parser.error(f"unrecognized argument {override!r}: trailing Hydra overrides are key=value, "
                         "e.g. model.num_layers=4")
    try:
        return list(args.overrides) + _flag_overrides(args)
    except ValueError as error:
        parser.error(str(error))


def _flag_overrides(args: argparse.Namespace) -> List[str]:
    overrides = _recipe_overrides(args)
    if args.task:
        overrides.append(f"workload.task={args.task}")
    if args.gpu:
        overrides.append(f"gpu={args.gpu}")
    if args.compute_dtype:
        overrides.append(f"precision={args.compute_dtype}")
    if args.data:
        overrides.append("dataset.mock=true")
    given = vars(args)
    for flags, key in SIZE_FLAGS + OPTIONAL_SIZE_FLAGS:
        dest = flags[1].lstrip("-")
        if dest in given:
            overrides.append(f"{key}={_yaml(given[dest])}")
    if "tensor_model_parallel_size" in given:
        # Bridge couples them: sequence parallelism is on exactly when TP splits the layers.
        overrides.append(f"model.sequence_parallel={_yaml(given['tensor_model_parallel_size'] > 1)}")
    overrides += _cuda_graph_overrides(args.cuda_graph_impl, args.cuda_graph_scope)
    overrides += _recompute_overrides(args)
    overrides += _moe_overrides(args)
    if args.dryrun:
        overrides.append("mode=plan")
    return overrides


def _recipe_overrides(args: argparse.Namespace) -> List[str]:
    family, name = args.model_family_name, args.model_recipe_name
    if family is None and name is None:
        return []
    if family is None or name is None:
        raise ValueError("-m/--model_family_name and -mr/--model_recipe_name go together "
                         "(e.g. -m llama -mr llama3_8b), or use recipe=<family>/<name>")
    family, name = family.lower(), name.lower()
    # Bridge picks <name>_<task>_config; graphbridge keeps each fine-tuning recipe as <name>_<task>.
    recipe = f"{family}/{name}" if args.task in (None, "pretrain") else f"{family}/{name}_{args.task}"
    known = recipe_names()
    if recipe not in known:
        same_family = [candidate for candidate in known if candidate.startswith(f"{family}/")]
        listing = f"recipes of {family}: {same_family}" if same_family else f"recipes: {known}"
        task = f" --task {args.task}" if args.task else ""
        raise ValueError(f"-m {family} -mr {name}{task}: no recipe {recipe}; {listing}")
    return [f"recipe={recipe}"]


def _cuda_graph_overrides(impl: Optional[str], scopes: Optional[List[str]]) -> List[str]:
    """Bridge's (impl, scope) pair in graphbridge's canonical impl + modules API.

    The override helper decides, on a blank config, what the pair means (scope full_iteration
    is the full_iteration impl; full_iteration with other scopes or with the TE impl is an
    error), so the flags and the Python API cannot drift apart. Only what the flags decide is
    emitted: an impl without a scope keeps the modules the recipe composed.
    """
    if impl is None and scopes is None:
        return []
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
        overrides.append(f"model.cuda_graph_modules={_yaml(list(decided.cuda_graph_modules))}")
    return overrides


def _recompute_overrides(args: argparse.Namespace) -> List[str]:
    if args.recompute_num_layers is not None and args.recompute_modules is not None:
        # Bridge applies both and the last one silently sets the granularity.
        raise ValueError("-rl/--recompute_num_layers (full recompute) and --recompute_modules (selective "
                         "recompute) are alternatives; pass one of them")
    overrides = []
    if args.recompute_num_layers is not None:
        overrides += ["model.recompute_granularity=full", "model.recompute_method=block",
                      f"model.recompute_num_layers={args.recompute_num_layers}"]
    if args.recompute_modules is not None:
        overrides += ["model.recompute_granularity=selective",
                      f"model.recompute_modules={_yaml(args.recompute_modules)}"]
    if args.activation_offload_layers is not None:
        offloading = args.activation_offload_layers > 0
        overrides += [f"model.cpu_offloading={_yaml(offloading)}",
                      f"model.cpu_offloading_num_layers={args.activation_offload_layers}"]
    return overrides


def _moe_overrides(args: argparse.Namespace) -> List[str]:
    overrides = []
    if args.use_tokendrop is True:
        overrides += ["model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true",
                      "model.moe_router_force_load_balancing=false"]
    if args.use_tokendrop is False:
        overrides += ["model.moe_expert_capacity_factor=null", "model.moe_pad_expert_input_to_capacity=false",
                      "model.moe_router_force_load_balancing=true"]
    if args.moe_a2a_overlap is not None:
        overlap = _yaml(args.moe_a2a_overlap)
        overrides += [f"model.overlap_moe_expert_parallel_comm={overlap}", f"model.delay_wgrad_compute={overlap}"]
        if args.moe_a2a_overlap:
            # megatron-core refuses shared-expert overlap together with the EP A2A overlap.
            overrides.append("model.moe_shared_expert_overlap=false")
    return overrides


def _yaml(value) -> str:
    """A Python value as a Hydra override value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(str(item) for item in value) + "]"
    return str(value)


def main(argv: Optional[Sequence[str]] = None) -> None:
    overrides = flags_to_overrides(sys.argv[1:] if argv is None else argv)
    # On stderr, so that the plan on stdout stays machine-readable (plan.format=json).
    print(f"graphbridge {shlex.join(overrides)}", file=sys.stderr, flush=True)
    # graphbridge's Hydra entry point reads sys.argv: the translated overrides become its command
    # line, so plans, runs, sweeps, job directories and exit codes are exactly graphbridge's.
    sys.argv = ["graphbridge", *overrides]
    graphbridge_main()
