"""What users type: the real `graphbridge` command in a subprocess, from a foreign directory (the plans and
refusals that only print, one after another in one process a session: conftest.py's cli_batch)."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import schema_reference
import surface
from sections import with_section

ROOT = Path(__file__).resolve().parent.parent


def test_plan_prints_what_is_graphed_and_leaves_no_output_dir(cli, tmp_path):
    result = cli("mode=plan", "cuda_graph=te_attn_mlp", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "graphbridge plan: VALID" in result.stdout
    assert "cuda_graph_scope = ['attn', 'mlp']" in result.stdout
    assert list(tmp_path.iterdir()) == []


LOCAL_WITH_MODULES = ("mode=plan", "engine=torch", "cuda_graph=local_layer", "model.cuda_graph_modules=[attn,mlp]")


def test_the_plan_of_local_graphs_with_modules_names_the_modules_and_what_graphs_them(printed):
    result = printed[LOCAL_WITH_MODULES]
    assert result.returncode == 0, result.stderr
    graphed = next(line for line in result.stdout.splitlines() if line.startswith("  graphed:"))
    assert graphed.startswith("  graphed:   attn, mlp of each layer; captured at step 3, after 3 eager steps by "
                              "torch.cuda.make_graphed_callables") and "whole layer" not in graphed


def test_a_plan_read_by_a_reader_that_stops_early_ends_quietly(tmp_path):
    """graphbridge mode=plan | head: the reader is gone before the plan is written; no traceback."""
    command = [str(Path(sys.executable).with_name("graphbridge")), "mode=plan", "plan.format=json"]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    stderr = process.stderr.read()
    assert process.wait(timeout=120) == 0 and stderr == ""


AUTO_JSON = ("mode=plan", "plan.format=json", "recipe=llama/tiny", "gpu=h100", "cuda_graph=auto")


def test_every_key_of_the_plan_json_is_documented(printed):
    result = printed[AUTO_JSON]
    plan = json.loads(result.stdout)
    auto = plan["auto"]
    keys = {*plan, *plan["target"], *plan["graphs"], *plan["memory"], *auto, *auto["probe"], *auto["cache"],
            *auto["candidates"][0]}
    documented = (ROOT / "docs" / "schema.md").read_text().split("## The plan as JSON")[1]
    assert not [key for key in sorted(keys) if f"`{key}`" not in documented]


FULL_ITERATION_JSON = ("mode=plan", "plan.format=json", "cuda_graph=full_iteration")


def test_plan_json_carries_verdict_config_and_megatron_arguments(printed):
    result = printed[FULL_ITERATION_JSON]
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["valid"] is True and plan["violations"] == []
    assert plan["config"]["model"]["cuda_graph_impl"] == "full_iteration"
    assert plan["megatron"]["transformer_config"]["cuda_graph_impl"] == "local"
    assert plan["megatron"]["transformer_config"]["cuda_graph_scope"] == ["full_iteration"]


YARN = [((), False), (("model.yarn_correction_range_round_to_int=true",), True)]


def yarn_plan(override) -> tuple:
    return ("recipe=gpt_oss/gpt_oss_20b", "mode=plan", "plan.format=json", *override)


@pytest.mark.parametrize("override, rounded", YARN)
def test_gpt_oss_gives_megatron_its_unrounded_yarn_ramp_unless_the_user_rounds_it(printed, override, rounded):
    # GPT-OSS's rope_scaling says truncate: false, as Megatron-Bridge builds it; megatron-core rounds by default.
    result = printed[yarn_plan(override)]
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["megatron"]["config_attributes"]["yarn_correction_range_round_to_int"] is rounded


@pytest.mark.parametrize("mode", ["plan", "train"])
def test_invalid_config_exits_2_with_every_violation_and_no_traceback(cli, tmp_path, mode):
    result = cli(
        f"mode={mode}", "plan.format=json", "cuda_graph=full_iteration", "ddp.check_for_nan_in_grad=true",
        "model.cpu_offloading=true", cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "full_iteration_nan_checks" in result.stderr and "cpu_offloading" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert list(tmp_path.iterdir()) == []
    if mode == "plan":
        plan = json.loads(result.stdout)
        assert {v["rule"] for v in plan["violations"]} == {"full_iteration_nan_checks", "cpu_offloading"}
        assert all(set(v) == {"rule", "keys", "message", "where"} for v in plan["violations"])


SHORT_RUN = ("mode=plan", "plan.format=json", "train.train_iters=5")
TOO_LONG_WARMUP = ("mode=plan", "train.train_iters=8", "optimizer.lr_warmup_iters=10")


def test_a_short_run_gets_a_warmup_that_fits_and_an_explicit_one_that_cannot_is_rejected(printed):
    short = printed[SHORT_RUN]
    assert short.returncode == 0, short.stderr
    assert json.loads(short.stdout)["config"]["optimizer"]["lr_warmup_iters"] == 0
    # megatron-core's scheduler would assert warmup < train_iters, without a message, at engine build.
    too_long = printed[TOO_LONG_WARMUP]
    assert too_long.returncode == 2
    assert "[lr_schedule]" in too_long.stderr and "set optimizer.lr_warmup_iters=0" in too_long.stderr
    assert "Traceback" not in too_long.stderr


BAD_KEYS_AND_TYPES = [
    ("model.bogus=1", "model.bogus: no key 'bogus' in model"),
    ("model.num_layers=abc", "model.num_layers takes an integer, e.g. model.num_layers=8"),
    ("model.cuda_graph_impl=graph", "model.cuda_graph_impl takes one of none, local, transformer_engine, full_iteration"),
]


@pytest.mark.parametrize("override,expected", BAD_KEYS_AND_TYPES)
def test_bad_keys_and_types_fail_at_composition_with_the_full_path(printed, override, expected):
    result = printed[("mode=plan", override)]
    assert result.returncode == 2  # bad input, refused before the job
    assert expected in result.stderr and "Traceback" not in result.stderr and result.stderr.count("\n") == 1


INTROSPECTION = [
    (["--help"], "cuda_graph: auto, full_iteration, local_layer, none"), (["--cfg", "job"], "cuda_graph_impl: none"),
    (["--info", "defaults"], "recipe/llama/tiny"), (["--info", "searchpath"], "conf"),
    # The hydra node resolved without the job's keys: the mode comes from the command line.
    (["--cfg", "hydra", "--resolve"], "output_subdir: .hydra"),
    (["--cfg", "hydra", "--resolve", "mode=plan"], "output_subdir: null"),
]


@pytest.mark.parametrize("args,expected", INTROSPECTION)
def test_hydra_introspection_works_from_any_directory(printed, args, expected):
    result = printed[tuple(args)]
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


PRINTED = [LOCAL_WITH_MODULES, AUTO_JSON, FULL_ITERATION_JSON, *(yarn_plan(override) for override, _ in YARN),
           SHORT_RUN, TOO_LONG_WARMUP, *(("mode=plan", override) for override, _ in BAD_KEYS_AND_TYPES),
           *(tuple(args) for args, _ in INTROSPECTION)]


@pytest.fixture(scope="session")
def printed(cli_batch) -> dict:
    """Each command line of PRINTED -> its `graphbridge` result, all run by one process a session (cli_batch) in a
    directory of their own that they leave empty."""
    return cli_batch("cli_printed", PRINTED)


def test_installed_wheel_ships_the_config_tree(cli, tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("graphbridge-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "bridge/conf/config.yaml" in names and "bridge/conf/recipe/llama/tiny.yaml" in names
    zipfile.ZipFile(wheel).extractall(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    result = cli("--info", "searchpath", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert f"file://{tmp_path / 'site' / 'bridge' / 'conf'}" in result.stdout
    plan = cli("mode=plan", "cuda_graph=te_attn", cwd=tmp_path, env=env)
    assert plan.returncode == 0 and "VALID" in plan.stdout


def test_the_user_facing_surface_is_frozen():
    """Config keys, group options and console scripts match tests/surface.txt: a rename is a reviewed diff."""
    assert surface.surface() == (ROOT / "tests" / "surface.txt").read_text(), (
        "the user-facing surface changed: review `python scripts/surface.py --check`, then run python scripts/surface.py")


def test_the_schema_reference_documents_every_key_and_is_up_to_date():
    reference = (ROOT / "docs" / "schema.md").read_text()
    assert with_section(reference, "schema", schema_reference.markdown()) == reference, (
        "docs/schema.md is out of date: run python scripts/schema_reference.py")


def test_only_the_rule_catalogue_builds_violations():
    """A violation made elsewhere would bypass the catalogue's shape (rule name, keys, message); the
    command line's own refusals use its helper (bridge.validation.registry.violation)."""
    outside = [path for folder in ("bridge", "perf") for path in (ROOT / folder).rglob("*.py")
               if "validation" not in path.parts and "Violation(" in path.read_text()]
    assert outside == []
