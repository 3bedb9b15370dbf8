"""Every validation rule has a reject test and an accept test."""

import pytest

from bridge.validation import RULES, validate
from tests.rule_cases import EXTRA_REJECTS, RULE_CASES, build


def fired(cfg):
    return {violation.rule for violation in validate(cfg)}


def test_every_rule_has_cases():
    assert set(RULE_CASES) == set(RULES)


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_rule_rejects(rule):
    reject, _ = RULE_CASES[rule]
    assert rule in fired(build(reject))


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_rule_accepts(rule):
    _, accept = RULE_CASES[rule]
    assert rule not in fired(build(accept))


@pytest.mark.parametrize(
    "rule,case", [(rule, case) for rule, cases in sorted(EXTRA_REJECTS.items()) for case in cases]
)
def test_rule_rejects_other_forms(rule, case):
    assert rule in fired(build(case))


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_messages_name_keys_and_fix(rule):
    reject, _ = RULE_CASES[rule]
    for violation in validate(build(reject)):
        if violation.rule == rule:
            assert violation.keys and all("." in key or key in ("engine", "torch_compile") for key in violation.keys)
            assert any(word in violation.message for word in ("set ", "use ", "add ", "drop ", "raise ", "remove ", "change", "keep "))


def test_all_violations_reported_at_once():
    case = RULE_CASES["cpu_offloading"][0]
    cfg = build(case)
    cfg.model.cuda_graph_modules = ["attn", "bogus"]
    cfg.train.train_iters = 0
    assert {"cpu_offloading", "module_names", "positive_sizes"} <= fired(cfg)
