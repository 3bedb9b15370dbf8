"""graphbridge-workload: a Megatron-Bridge ``scripts/performance`` command line, run by graphbridge.

    graphbridge-workload -m llama -mr llama3_8b -g h100 -c bf16 -ng 8 \\
        --cuda_graph_impl transformer_engine --cuda_graph_scope attn,mlp -ms 100 \\
        dataset.seq_length=4096

Every flag of Bridge v0.3.1 is known by its real short and long names (perf.bridge_flags); no
abbreviation is accepted. Given flags become Hydra overrides, appended after the trailing
key=value overrides so that a flag wins over an override of the same key (Bridge also applies
its argparse flags after its Hydra overrides); a flag graphbridge has no equivalent for stops
the command, naming the key to use. Then ``graphbridge`` runs in this process with that command
line (printed on stderr), so plans, runs, sweeps, run directories and exit codes are exactly
graphbridge's. ``-d/--dryrun`` is ``mode=plan``, and a trailing ``mode=plan`` is ``-d``: a Slurm job is
planned on this machine and submitted only without them.

Three Bridge v0.3.1 behaviours are deliberately fixed: ``--cuda_graph_impl transformer_engine``
without ``--cuda_graph_scope`` keeps the recipe's modules (Bridge crashes), ``-ol 0`` means no
activation offloading (Bridge still turns offloading on), and ``-rl`` with ``--recompute_modules``
is refused (Bridge lets the later one silently decide the recompute granularity).
"""

import argparse
import difflib
import shlex
import sys
from typing import Dict, List, NoReturn, Optional, Sequence

from perf.bridge_flags import FLAGS
from perf.main import main as graphbridge
from perf.workload_map import flag_overrides

EXAMPLES = """examples:
  graphbridge-workload -m llama -mr llama3_8b -g h100 -c bf16 -d            # the plan of Bridge's preset
  graphbridge-workload -m llama -mr tiny -ms 20 --cuda_graph_impl local --cuda_graph_scope full_iteration
  graphbridge-workload -m qwen -mr tiny --cuda_graph_impl transformer_engine --cuda_graph_scope attn,moe_router
  graphbridge-workload -m llama -mr tiny sweep=dense_scopes                 # a sweep of graph scopes
  graphbridge-workload -m llama -mr llama3_8b -g h100 -ng 16 -gn 8 -p batch -a my_account -t 01:00:00

Trailing key=value are graphbridge's Hydra overrides (graphbridge --help lists the groups); -m is
Bridge's --model_family_name here, so a sweep is sweep=<preset> or --multirun."""


class OneLineParser(argparse.ArgumentParser):
    """Bad input is one line and exit status 2, as everywhere in graphbridge."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (--help lists every flag)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="graphbridge-workload", allow_abbrev=False, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [-h] [Bridge flags ...] [key=value ...]",
        description="Megatron-Bridge v0.3.1 performance-script flags, run by graphbridge. Each flag maps to "
        "graphbridge keys (shown as ->) or is refused with what to use instead.")
    groups: Dict[str, argparse._ArgumentGroup] = {}
    for flag in FLAGS:
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        # Absent unless given: only what the user typed becomes an override.
        groups[flag.group].add_argument(*flag.names, dest=flag.dest, default=argparse.SUPPRESS, help=flag.help,
                                        **flag.parse)
    parser.add_argument("--multirun", action="store_true", default=argparse.SUPPRESS,
                        help="graphbridge's (Hydra's) multirun: sweep the comma lists of the overrides")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="graphbridge's Hydra overrides")
    return parser


def flags_to_overrides(argv: Sequence[str]) -> List[str]:
    """graphbridge's command line for a Bridge-style one: trailing overrides first, then the flags'."""
    parser = build_parser()
    known, unknown = parser.parse_known_intermixed_args(argv)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{did_you_mean(parser, unknown)}")
    args = vars(known)
    overrides = args.pop("overrides")
    for override in overrides:
        if "=" not in override and not override.startswith("~"):
            parser.error(f"unrecognized argument {override!r}: trailing overrides are key=value, "
                         "e.g. model.num_layers=4")
    refusals = [f"{flag.label} {'<hidden>' if flag.secret else _shown(args[flag.dest])}: {flag.refusal}"
                for flag in FLAGS if flag.refusal and flag.dest in args and not flag.keeps(args[flag.dest])]
    if refusals:
        parser.error("no graphbridge equivalent: " + "; ".join(refusals))
    if plans(overrides):  # Bridge's -d: a plan of a Slurm job is made here, with nothing submitted
        overrides = [override for override in overrides if not is_mode(override)]
        args["dryrun"] = True
    try:
        return overrides + flag_overrides(args)
    except ValueError as error:
        parser.error(str(error))


def did_you_mean(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """The flags closest to the unknown ones (argparse abbreviates nothing here, and suggests nothing)."""
    flags = [name for action in parser._actions for name in action.option_strings]
    close = [match for word in unknown for match in difflib.get_close_matches(word.split("=")[0], flags, n=1)]
    return f"; did you mean {' '.join(close)}?" if close else ""


def is_mode(override: str) -> bool:
    return override.split("=", 1)[0].lstrip("+") == "mode"


def plans(overrides: Sequence[str]) -> bool:
    """Whether the trailing overrides end in mode=plan (the last mode= counts, as in Hydra)."""
    modes = [override.split("=", 1)[1] for override in overrides if is_mode(override) and "=" in override]
    return bool(modes) and modes[-1] == "plan"


def shell_word(argument: str) -> str:
    """``argument`` as a POSIX shell reads it back; a Hydra-quoted value goes in double quotes where the
    shell expands nothing in them, so the printed command stays readable."""
    word = shlex.quote(argument)
    if word != argument and "'" in argument and not set('"$`\\!') & set(argument):
        return f'"{argument}"'
    return word


def _shown(value) -> str:
    if value is True:
        return ""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    overrides = flags_to_overrides(sys.argv[1:] if argv is None else argv)
    # On stderr, so that a plan on stdout stays machine-readable (plan.format=json).
    print(f"graphbridge {' '.join(map(shell_word, overrides))}", file=sys.stderr, flush=True)
    sys.argv[1:] = overrides
    graphbridge()
