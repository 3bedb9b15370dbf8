"""megatron-core releases: graphbridge's version table, translation and rule catalogue against what
each supported release is and accepts, recorded from the real package (scripts/megatron_fixture.py
writes tests/fixtures/); the target release through the real CLI; the pip extras.

CI runs Python 3.11, where megatron-core >= 0.17 cannot be installed: the fixtures stand in for it.
The installed release is also checked live against its fixture, and any other release importable
from GRAPHBRIDGE_MEGATRON_CORE_PATH (a PYTHONPATH, e.g. /tmp/mc19/site:/tmp/mc19/tsite) is
regenerated and compared, with the megatron engine imported against it.
"""

import dataclasses
import json
import os
import subprocess
import sys
import tomllib
from functools import lru_cache
from pathlib import Path

import megatron_fixture
import pytest
import version_table
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from sections import with_section

import bridge
from bridge.config.migration import DEPRECATED_VALUES
from bridge.config.schema import CUDA_GRAPH_MODULES, CudaGraphImpl
from bridge.machine import probe
from bridge.config.releases import RELEASES, SUPPORTED
from bridge.translate import megatron_arguments
from bridge.validation import resolve_target, validate
from tests.rule_cases import RULE_CASES, build
from tests.sampling import split

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = {version: json.loads(megatron_fixture.fixture_path(version).read_text()) for version in SUPPORTED}
CASES = dict(megatron_fixture.case_ids())
MEGATRON_CHECKED = {rule for rule, cases in RULE_CASES.items() if any(case.megatron for case in cases)}
"""Rules whose verdict megatron-core's config classes share (a case marked megatron=True)."""
OTHER_RELEASE_PATH = os.environ.get("GRAPHBRIDGE_MEGATRON_CORE_PATH")


def fields(version: str, config: str) -> set:
    return set(FIXTURES[version]["fields"][config])


@lru_cache(maxsize=None)
def built(case_id: str):
    return build(CASES[case_id])


def config_violations(case_id: str, version: str) -> set:
    """The rules that refuse the case as a configuration when planned for ``version``."""
    case, cfg = CASES[case_id], built(case_id)
    target = dataclasses.replace(resolve_target(cfg, case.machine, case.processes, case.graphs_measured),
                                 megatron_core=version)
    return {violation.rule for violation in validate(cfg, target) if violation.in_config}


# --- the table against the releases --------------------------------------------------------------------

@pytest.mark.parametrize("version", SUPPORTED)
def test_the_table_names_the_fields_the_release_has(version):
    row, tc_fields = RELEASES[version], fields(version, "TransformerConfig")
    for key, carrier in row.carriers.items():
        own_name = key.split(".")[-1]
        assert (carrier in tc_fields) if carrier else own_name not in tc_fields, key
    assert row.modules_field in tc_fields


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_table_speaks_the_releases_cuda_graph_vocabulary(version):
    row, vocabulary = RELEASES[version], FIXTURES[version]["cuda_graph"]
    impls = {row.full_iteration[0]} | {impl.value for impl in CudaGraphImpl if impl != CudaGraphImpl.full_iteration}
    assert impls <= set(vocabulary["impls"])
    assert set(row.full_iteration[1]) | set(CUDA_GRAPH_MODULES) <= set(vocabulary["modules"])
    assert {impl: sorted(scopes) for impl, scopes in row.inference_scopes.items()} == vocabulary["inference_scopes"]
    assert {impl: scopes[0] for impl, scopes in row.inference_scopes.items()} == \
        vocabulary.get("inference_scope_defaults", {})
    # Migration carries every deprecated value the release still accepts.
    assert set(vocabulary["deprecated_values"]) <= set(DEPRECATED_VALUES)


REPRESENTATIVE = {
    "llama/tiny full_iteration PP2": ["recipe=llama/tiny", "cuda_graph=full_iteration",
                                      "model.pipeline_model_parallel_size=2", "train.num_gpus=2"],
    "deepseek/tiny (MLA, MoE, MTP)": ["recipe=deepseek/tiny", "cuda_graph=te_attn_moe_router"],
    "qwen/tiny local_layer": ["recipe=qwen/tiny", "cuda_graph=local_layer"],
    "gpt_oss/tiny te_attn": ["recipe=gpt_oss/tiny", "cuda_graph=te_attn"],
    "llama/tiny Megatron-FSDP full_iteration": ["recipe=llama/tiny", "cuda_graph=full_iteration",
                                                "ddp.use_megatron_fsdp=true", "ddp.use_distributed_optimizer=true"],
}


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("name", sorted(REPRESENTATIVE))
def test_translation_gives_only_fields_the_release_has(version, name):
    cfg = bridge.load(REPRESENTATIVE[name])
    arguments = megatron_arguments(cfg, version)
    config_class = "MLATransformerConfig" if cfg.model.multi_latent_attention else "TransformerConfig"
    assert set(arguments["transformer_config"]) <= fields(version, config_class)
    assert set(arguments["ddp_config"]) <= fields(version, "DistributedDataParallelConfig")
    assert set(arguments["optimizer_config"]) <= fields(version, "OptimizerConfig")
    assert set(arguments["gpt_model"]) <= fields(version, "GPTModel")


# --- the catalogue against the releases' verdicts --------------------------------------------------------

VERDICTS = [(version, case_id) for version in SUPPORTED for case_id in sorted(CASES)]


def verdict_by_default(index: int, verdict: tuple) -> bool:
    """Every case whose verdict megatron-core shares (megatron=True), and every eighth of the others: the rest are
    the same comparison with the recorded fixture, under -m slow."""
    return CASES[verdict[1]].megatron or index % 8 == 0


@pytest.mark.parametrize("version,case_id", split(VERDICTS, verdict_by_default, ids="-".join, several=True))
def test_a_valid_plan_builds_and_shared_rules_agree(version, case_id):
    """Plan equals run: every configuration the catalogue accepts for a release, that release's config
    classes accept; where they check a rule too (megatron=True), both verdicts agree."""
    case, recorded = CASES[case_id], FIXTURES[version]["verdicts"][case_id]
    ours = config_violations(case_id, version)
    if not recorded.get("translates", True):
        assert ours, "a configuration translation cannot read must be refused"
        return
    assert recorded["digest"] == megatron_fixture.arguments_digest(built(case_id), version), (
        f"tests/fixtures/megatron_core_{version}.json is out of date for {case_id}: run "
        f"python scripts/megatron_fixture.py with megatron-core {version} importable")
    if not ours:
        assert recorded["accepts"], f"planned valid, megatron-core {version} refuses it: {recorded.get('error')}"
    if case.megatron:
        assert bool(ours & MEGATRON_CHECKED) == (not recorded["accepts"]), (ours, recorded.get("error"))


def test_every_configuration_of_the_rule_cases_is_recorded():
    for version in SUPPORTED:
        assert set(FIXTURES[version]["verdicts"]) == set(CASES), f"regenerate the {version} fixture"


def test_the_installed_release_matches_its_fixture():
    pytest.importorskip("megatron.core")
    recorded = megatron_fixture.fixture()
    assert recorded == FIXTURES[recorded["megatron_core"]], (
        "run python scripts/megatron_fixture.py: the fixture of the installed release is out of date")


@pytest.mark.skipif(not OTHER_RELEASE_PATH, reason="GRAPHBRIDGE_MEGATRON_CORE_PATH names no other release")
def test_another_importable_release_matches_its_fixture_and_runs_the_engine():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([OTHER_RELEASE_PATH, str(ROOT)])}
    checked = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "scripts" / "megatron_fixture.py"),
                              "--check"], env=env, capture_output=True, text=True, timeout=600)
    assert checked.returncode == 0, checked.stderr[-2000:]
    imported = subprocess.run([sys.executable, "-W", "ignore", "-c",
                               "import bridge.engines.megatron.engine, megatron.core as m; print(m.__version__)"],
                              env=env, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert imported.stdout.strip() in SUPPORTED


# --- the target release through the CLI -----------------------------------------------------------------

def test_a_plan_for_a_release_that_is_not_installed_speaks_it(cli, tmp_path):
    result = cli("mode=plan", "plan.format=json", "cuda_graph=full_iteration", "plan.megatron_core=0.19.2",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["target"]["megatron_core"] == "0.19.2"
    assert plan["target"]["megatron_core_source"].startswith("plan.megatron_core")
    graph = {key: plan["megatron"]["transformer_config"][key] for key in
             ("cuda_graph_impl", "cuda_graph_modules", "inference_cuda_graph_scope")}
    assert graph == {"cuda_graph_impl": "full_iteration", "cuda_graph_modules": [],
                     "inference_cuda_graph_scope": "none"}
    assert "cuda_graph_scope" not in plan["megatron"]["transformer_config"]


def test_the_plan_names_the_target_release_and_its_graph_fields(cli, tmp_path):
    result = cli("mode=plan", "cuda_graph=full_iteration", "plan.megatron_core=0.16.1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "  target:    megatron-core 0.16.1 (plan.megatron_core" in result.stdout
    assert "    cuda_graph_impl = 'local'" in result.stdout
    assert "    cuda_graph_scope = ['full_iteration']" in result.stdout


def test_an_unsupported_release_to_plan_for_is_one_line(cli, tmp_path):
    result = cli("mode=plan", "plan.megatron_core=0.18.0", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("  [")]
    assert lines == [lines[0]] and "[megatron_core_version] plan.megatron_core" in lines[0]
    assert "0.16.1, 0.19.2" in lines[0]


def fake_megatron_core(site: Path, version: str) -> dict:
    """An environment where the installed megatron-core distribution reports ``version``."""
    info = site / f"megatron_core-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: megatron-core\nVersion: {version}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def test_an_unsupported_installed_release_is_one_clear_line_at_plan_time(cli, tmp_path):
    env = fake_megatron_core(tmp_path / "site", "0.18.0")
    planned = cli("mode=plan", "engine=megatron", cwd=tmp_path, env=env)
    assert planned.returncode == 0, planned.stderr
    refusals = [line for line in planned.stdout.splitlines() if "[megatron_core_installed]" in line]
    assert len(refusals) == 1 and "megatron-core 0.18.0 is installed here" in refusals[0]
    assert "pip install 'graphbridge[mcore" in refusals[0]
    trained = cli("engine=megatron", cwd=tmp_path, env=env)
    assert trained.returncode == 2 and "[megatron_core_installed]" in trained.stderr
    assert "Traceback" not in trained.stderr
    auto = cli("mode=plan", cwd=tmp_path, env=env)
    assert "note: megatron-core 0.18.0 is installed here, which graphbridge does not support" in auto.stdout


def test_a_plan_for_another_release_than_the_installed_one_cannot_train_here(cli, tmp_path):
    installed = probe().version("megatron-core")
    other = next(version for version in SUPPORTED if version != installed)
    result = cli("engine=megatron", f"plan.megatron_core={other}", cwd=tmp_path)
    assert result.returncode == 2
    assert f"the plan is for megatron-core {other} (plan.megatron_core) and {installed} is installed here" \
        in result.stderr


def test_fields_the_target_release_lacks_are_refused_by_name(cli, tmp_path):
    old = cli("mode=plan", "cuda_graph=local_layer", "model.inference_cuda_graph_scope=layer",
              "plan.megatron_core=0.16.1", cwd=tmp_path)
    assert old.returncode == 2
    assert "[version_fields] model.inference_cuda_graph_scope" in old.stderr and "plan.megatron_core=0.19.2" in old.stderr
    new = cli("mode=plan", "cuda_graph=local_layer", "model.inference_cuda_graph_scope=layer",
              "plan.megatron_core=0.19.2", cwd=tmp_path)
    assert new.returncode == 0, new.stderr


def test_deprecated_values_of_0_19_migrate_with_a_note(cli, tmp_path):
    whole = cli("mode=plan", "plan.format=json", "model.cuda_graph_impl=transformer_engine",
                "model.cuda_graph_modules=[full]", "plan.megatron_core=0.19.2", cwd=tmp_path)
    plan = json.loads(whole.stdout)
    assert plan["config"]["model"]["cuda_graph_modules"] == [] and any("[full]" in n for n in plan["notes"])
    block = cli("mode=plan", "plan.format=json", "model.cuda_graph_impl=local",
                "model.cuda_graph_scope=full_iteration_inference", "plan.megatron_core=0.19.2", cwd=tmp_path)
    plan = json.loads(block.stdout)
    assert plan["config"]["model"]["inference_cuda_graph_scope"] == "block"
    # Whole-layer local graphs under the block inference scope would capture nothing in training.
    assert [v["rule"] for v in plan["violations"]] == ["inference_block_training"]
    mixed = cli("mode=plan", "model.cuda_graph_impl=local", "model.cuda_graph_modules=[full_iteration,"
                "full_iteration_inference]", cwd=tmp_path)
    assert mixed.returncode == 2 and "multiple deprecated values" in mixed.stderr


# --- extras and the README's matrix ---------------------------------------------------------------------

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RELEASED = ("0.16.0", "0.16.1", "0.17.0", "0.17.1", "0.18.0", "0.18.2", "0.19.0", "0.19.2")
"""megatron-core releases on the package index when this was written."""


def requirement(extra_or_base: str, name: str) -> Requirement:
    lines = PYPROJECT["project"]["dependencies"] if extra_or_base == "base" else \
        PYPROJECT["project"]["optional-dependencies"][extra_or_base]
    return next(Requirement(line) for line in lines if Requirement(line).name == name)


def test_the_dependency_admits_exactly_the_supported_releases():
    base = requirement("base", "megatron-core")
    assert [version for version in RELEASED if base.specifier.contains(version)] == list(SUPPORTED)


@pytest.mark.parametrize("version", SUPPORTED)
def test_each_release_has_extras_that_pin_it_with_the_te_it_accepts(version):
    row = RELEASES[version]
    assert str(requirement(row.extra, "megatron-core").specifier) == f"=={version}"
    assert str(requirement(row.te_extra, "megatron-core").specifier) == f"=={version}"
    te = requirement(row.te_extra, "transformer-engine")
    assert te.specifier == SpecifierSet(row.transformer_engine_range)


def test_the_readme_version_matrix_is_up_to_date():
    readme = (ROOT / "README.md").read_text()
    assert with_section(readme, "versions", version_table.markdown()) == readme, (
        "README.md's version matrix is out of date: run python scripts/version_table.py")
