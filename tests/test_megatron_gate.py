"""megatron-core's own config classes as the gate before a launch (bridge/translate/gate.py): a refusal is one
violation line, printed like the catalogue's, exit 2; a config they cannot judge here is never refused for it.

No config is known that megatron-core refuses and no rule of the catalogue covers (each one found became a rule),
so the gate is shown refusing a config whose rule it does not see: called directly with the catalogue's verdict
left out, run through the command line with that rule taken out of the catalogue, and planned, where the plan
lists expert_bias_score_function's refusal beside megatron-core's."""

import json
import subprocess

import pytest

import bridge
from bridge.config.releases import RELEASES
from bridge.config.schema import Mode
from bridge.machine import probe
from bridge.translate import gate
from bridge.validation import resolve_target

pytest.importorskip("megatron.core")

INSTALLED = probe().version("megatron-core")
SOFTMAX = ("recipe=deepseek/tiny", "model.moe_router_score_function=softmax")
MEGATRON_WORDS = "Expert bias for aux-loss-free routing only supports sigmoid score function"
CATALOGUE_RULE = "expert_bias_score_function"


def judged(*overrides):
    cfg = bridge.load([*overrides, "plan.check_megatron=true"])  # asked on this CPU too, where torch would train
    return gate.check_megatron_core(cfg, resolve_target(cfg), refused=[])


def test_megatron_core_refuses_in_one_violation_with_its_own_words():
    check = judged(*SOFTMAX)
    assert [v.rule for v in check.violations] == [gate.RULE] and check.violations[0].in_config
    line = str(check.violations[0])
    assert line.startswith(f"[{gate.RULE}] model.*: megatron-core {INSTALLED} (MLATransformerConfig) refuses it: "
                           f"ValueError: {MEGATRON_WORDS}") and "\n" not in line
    assert "graphbridge mode=plan" in line and "refuse it" in check.summary


def test_megatron_core_accepts_a_recipe():
    check = judged("recipe=qwen/tiny")
    assert check.violations == [] and check.summary == f"megatron-core {INSTALLED}'s config classes accept it"


@pytest.mark.skipif(probe().has("transformer-engine"), reason="Transformer Engine is installed: its own version")
def test_a_check_that_reads_transformer_engine_reads_the_gpu_nodes_version():
    # MoE with fp8 asks TE's version: without TE here 0.16.1 crashes comparing None and 0.19.2 reads 0.0.0.
    import megatron.core.utils as megatron_utils

    before = megatron_utils._te_version
    assert judged("recipe=deepseek/tiny", "model.fp8=hybrid").violations == []
    assert megatron_utils._te_version is before


def test_an_import_error_is_this_machine_lacking_a_package_not_a_refusal(monkeypatch):
    def needs_transformer_engine(cfg):  # as OptimizerConfig answers a missing TE FusedAdam
        missing = ImportError("No module named 'transformer_engine'")
        raise RuntimeError("this option requires FusedAdam from TransformerEngine, but not found") from missing

    monkeypatch.setattr(gate, "build_megatron_configs", needs_transformer_engine)
    check = judged("recipe=qwen/tiny")
    assert check.violations == [] and check.summary.startswith("cannot judge it here: RuntimeError")


def test_a_config_for_the_torch_engine_is_not_asked():
    assert judged(*SOFTMAX, "engine=torch").summary.startswith("not run: engine=torch")


def test_training_jobs_are_checked_and_plans_when_asked():
    cfg = bridge.load(["recipe=qwen/tiny"])
    assert cfg.mode == Mode.train and gate.check_wanted(cfg)
    assert not gate.check_wanted(bridge.load(["recipe=qwen/tiny", "mode=plan"]))
    assert gate.check_wanted(bridge.load(["recipe=qwen/tiny", "mode=plan", "plan.check_megatron=true"]))


def test_a_training_run_refused_by_megatron_core_exits_2_before_its_launch(cli, tmp_path):
    python, flag, entry = cli.argv  # the graphbridge command, with the catalogue's own rule for the config left out
    without_rule = f"from bridge.validation import RULES; RULES.pop({CATALOGUE_RULE!r}, None); {entry}"
    # This CPU trains on the torch engine, which megatron-core's configs never reach: the flag asks all the same.
    result = subprocess.run([python, flag, without_rule, *SOFTMAX, "plan.check_megatron=true", "hydra.run.dir=job"],
                            cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    refused = [line for line in result.stderr.splitlines() if line.startswith("  [")]
    assert len(refused) == 1 and refused[0].startswith(f"  [{gate.RULE}] model.*: ") and MEGATRON_WORDS in refused[0]
    assert not (tmp_path / "job" / "result.json").exists() and "Traceback" not in result.stderr


def test_a_training_run_the_catalogue_refuses_is_not_asked_again(cli, tmp_path):
    result = cli(*SOFTMAX, "hydra.run.dir=job", cwd=tmp_path)
    assert result.returncode == 2 and f"[{CATALOGUE_RULE}]" in result.stderr, result.stderr
    assert f"[{gate.RULE}]" not in result.stderr


REFUSED_PLAN = (*SOFTMAX, "mode=plan", "plan.format=json", "plan.check_megatron=true")
ACCEPTED_PLAN = ("mode=plan", "recipe=qwen/tiny", "gpu=h100", "plan.check_megatron=true")


@pytest.fixture(scope="session")
def asked(cli_batch) -> dict:
    """REFUSED_PLAN and ACCEPTED_PLAN -> their `graphbridge` results, planned by one process a session (conftest.py's
    cli_batch): each process of its own imported megatron-core's config classes again (~8 s)."""
    return cli_batch("megatron_gate_plans", [REFUSED_PLAN, ACCEPTED_PLAN])


def test_a_plan_that_asks_shows_the_refusal_in_its_violations(asked):
    result = asked[REFUSED_PLAN]
    assert result.returncode == 2, result.stderr
    plan = json.loads(result.stdout)
    refused = [v for v in plan["violations"] if v["rule"] == gate.RULE]
    assert len(refused) == 1 and MEGATRON_WORDS in refused[0]["message"]
    assert f"  [{gate.RULE}] model.*: " in result.stderr
    assert plan["megatron_core_check"] == f"megatron-core {INSTALLED}'s config classes refuse it"


def test_a_plan_that_asks_says_megatron_core_accepts_it(asked):
    result = asked[ACCEPTED_PLAN]
    assert result.returncode == 0, result.stderr
    assert f"  checked:   megatron-core {INSTALLED}'s config classes accept it" in result.stdout


def test_a_plan_for_a_release_not_installed_skips_the_check(cli, tmp_path):
    other = next(version for version in RELEASES if version != INSTALLED)
    result = cli(*SOFTMAX, "mode=plan", "plan.format=json", "plan.check_megatron=true", f"plan.megatron_core={other}",
                 cwd=tmp_path)
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr, result.stderr
    plan = json.loads(result.stdout)
    assert gate.RULE not in {v["rule"] for v in plan["violations"]}
    assert plan["megatron_core_check"].startswith(f"not run: the plan speaks megatron-core {other} and {INSTALLED}")


def test_a_training_run_on_the_torch_engine_does_not_ask():
    cfg = bridge.load(list(SOFTMAX))
    target = resolve_target(cfg)
    if target.engine == "megatron":
        pytest.skip("this machine trains on megatron-core")
    assert gate.check_megatron_core(cfg, target, refused=[]).summary.startswith("not run: this machine trains it")
