"""Where megatron-core 0.16.1's TransformerConfig checks a rule too, both verdicts agree.

The translated arguments build the real TransformerConfig on CPU, so megatron-core's own
``__post_init__`` passes judgement on exactly what the training process would give it.
"""

import warnings

import pytest

from bridge.validation import validate
from tests.rule_cases import RULE_CASES, build

pytest.importorskip("megatron.core")

AGREEMENT_CASES = [
    (rule, verdict, case)
    for rule, (reject, accept) in sorted(RULE_CASES.items())
    for verdict, case in (("reject", reject), ("accept", accept))
    if case.megatron
]


def megatron_rejects(cfg) -> bool:
    from bridge.translate import build_megatron_configs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            build_megatron_configs(cfg)
        except (AssertionError, ValueError, KeyError):
            return True
    return False


@pytest.mark.parametrize("rule,verdict,case", AGREEMENT_CASES, ids=[f"{r}-{v}" for r, v, _ in AGREEMENT_CASES])
def test_megatron_core_agrees(rule, verdict, case):
    cfg = build(case)
    ours = rule in {violation.rule for violation in validate(cfg)}
    assert ours == (verdict == "reject")
    assert megatron_rejects(cfg) == ours


def test_valid_default_translates():
    assert not megatron_rejects(build(RULE_CASES["te_rng_tracker"][1]))
