"""Where the installed megatron-core's TransformerConfig checks a rule too, both verdicts agree.

The translated arguments build the real TransformerConfig on CPU, so megatron-core's own
``__post_init__`` passes judgement on exactly what the training process would give it. Cases that
target another release are judged against its recorded verdicts (tests/test_versions.py).
"""

import warnings

import pytest

from bridge.machine import probe
from bridge.validation import resolve_target, validate
from bridge.validation.target import default_release
from tests.rule_cases import RULE_CASES, build

pytest.importorskip("megatron.core")

INSTALLED = probe().version("megatron-core")
# The release a case targets, read from its changes as resolve_target reads the config (the test asserts they
# agree): building every case's config here, at collection, cost each pytest worker two seconds.
AGREEMENT_CASES = [
    (rule, verdict, case)
    for rule, (reject, accept) in sorted(RULE_CASES.items())
    for verdict, case in (("reject", reject), ("accept", accept))
    if case.megatron and (case.changes.get("plan.megatron_core") or default_release(case.machine).version) == INSTALLED
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
    target = resolve_target(cfg, case.machine)
    assert target.megatron_core == INSTALLED
    ours = rule in {violation.rule for violation in validate(cfg, target)}
    assert ours == (verdict == "reject")
    assert megatron_rejects(cfg) == ours


def test_valid_default_translates():
    assert not megatron_rejects(build(RULE_CASES["te_rng_tracker"][1]))
