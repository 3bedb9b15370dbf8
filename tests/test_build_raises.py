"""graphbridge's own checks live in plan: every exception the engines, the trainer, the data and translate raise
for a configuration has a rule that refuses the same configurations first, so plan's VALID never ends in one of
them. The raises are found in the source, not listed by hand: a new one fails here until it is mapped."""

import ast
from pathlib import Path

from bridge.validation import RULES
from tests.extra_rejects import EXTRA_REJECTS
from tests.rule_cases import RULE_CASES, fired

BRIDGE = Path(__file__).resolve().parents[1] / "bridge"
BUILD_AND_RUN = [*sorted((BRIDGE / "engines").rglob("*.py")), *sorted((BRIDGE / "translate").glob("*.py")),
                 BRIDGE / "trainer.py", BRIDGE / "data.py", BRIDGE / "steps.py"]
# (module, a fragment of the raise's source) -> the rules that refuse its configurations in plan
COVERED = {
    ("engines/megatron/transformer_engine.py", "found no layer matching"):
        ("moe_modules_need_moe_model", "mlp_needs_dense_layers", "module_names"),
    ("engines/megatron/local.py", "found no graphable layer"): ("local_graphs_layerless_stage", "local_scoped_modules"),
    ("data.py", "is not a multiple of"): ("global_batch",),
    ("translate/arguments.py", "is not supported by graphbridge"): ("megatron_core_version", "megatron_core_installed"),
}
# (module, fragment) -> why it is no configuration's fault, which plan could see
OF_THE_RUN = {
    ("steps.py", "NonFiniteError(f\"loss is"): "a loss that turns non-finite while training",
    ("steps.py", "NonFiniteError(f\"non-finite loss or grad norm"): "the same, found by the on-device check",
}


def raises():
    """(module, source of the raise) of every raise statement with an exception, outside except blocks (a bare
    re-raise passes on what something else raised)."""
    for path in BUILD_AND_RUN:
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                yield str(path.relative_to(BRIDGE)), ast.get_source_segment(source, node)


def mapping_of(module: str, source: str):
    found = [key for key in (*COVERED, *OF_THE_RUN) if key[0] == module and key[1] in source]
    assert len(found) == 1, f"{module}: {source[:120]!r} matches {found}: map it to the rule that refuses it first"
    return found[0]


def test_every_raise_for_a_configuration_has_its_rule():
    seen = {mapping_of(module, source) for module, source in raises()}
    assert seen == set(COVERED) | set(OF_THE_RUN), f"mapped raises no longer in the source: {set(COVERED) - seen}"


def test_the_covering_rules_exist_and_refuse_their_cases():
    for rules in COVERED.values():
        for name in rules:
            assert name in RULES, name
            for case in (RULE_CASES[name][0], *EXTRA_REJECTS.get(name, [])):
                assert name in fired(case), (name, case)
