"""Record every flag of Megatron-Bridge's scripts/performance argument parser, from Bridge's own source,
so that tests check graphbridge-workload's flag table (perf/bridge_flags.py) against the real parser
without installing Bridge.

    git -C <Megatron-Bridge clone> show v0.3.1:scripts/performance/argument_parser.py > /tmp/argument_parser.py
    python scripts/bridge_flags_fixture.py /tmp/argument_parser.py v0.3.1

It writes tests/fixtures/megatron_bridge_<tag>_flags.json: per flag its option strings, argparse action,
nargs and choices, and the CUDA-graph impls and scopes the parser accepts. The parser imports nemo_run
only for a default directory, which is stood in for here.
"""

import argparse
import importlib.util
import json
import sys
import types
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
ACTIONS = {argparse._StoreAction: "store", argparse._StoreTrueAction: "store_true",
           argparse._AppendAction: "append"}


def bridge_module(source: Path) -> types.ModuleType:
    config = types.ModuleType("nemo_run.config")
    config.get_nemorun_home = lambda: "~/.nemo_run"
    sys.modules.update({"nemo_run": types.ModuleType("nemo_run"), "nemo_run.config": config})
    spec = importlib.util.spec_from_file_location("bridge_argument_parser", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flags(parser: argparse.ArgumentParser) -> list:
    return [{"names": action.option_strings, "action": ACTIONS[type(action)], "nargs": action.nargs,
             "choices": list(action.choices) if action.choices else None}
            for action in parser._actions if action.option_strings and action.dest != "help"]


def main() -> None:
    source, tag = Path(sys.argv[1]), sys.argv[2]
    path = FIXTURES / f"megatron_bridge_{tag}_flags.json"
    module = bridge_module(source)
    rows = ",\n  ".join(json.dumps(flag) for flag in flags(module.parse_cli_args()))  # one flag a line
    # --cuda_graph_impl and --cuda_graph_scope check their values in a type function, against these lists.
    path.write_text(f'{{"source": "Megatron-Bridge {tag} scripts/performance/argument_parser.py",\n'
                    f' "cuda_graph_impls": {json.dumps(module.VALID_CUDA_GRAPH_IMPLS)},\n'
                    f' "cuda_graph_scopes": {json.dumps(module.VALID_CUDA_GRAPH_SCOPES)},\n'
                    f' "flags": [\n  {rows}\n ]}}\n')
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
