"""Megatron-Bridge ConfigContainer YAML in (``graphbridge bridge_config=<path>``) and out
(``mode=plan plan.format=bridge``), on configs built by Bridge 0.3.1's own recipe functions.

CI has no Bridge: tests/fixtures/bridge/ holds what Bridge's recipes write (scripts/bridge_fixture.py
records them from the real package). Where Bridge imports (GRAPHBRIDGE_BRIDGE_PATH, a PYTHONPATH
with Bridge 0.3.1 and its dependencies, e.g. /tmp/mb/site:/tmp/mb/deps), the live tests check that
the fixtures are current and that Bridge's own ConfigContainer.from_yaml loads every export and
gives back a config that imports unchanged.
"""

import copy
import dataclasses
import json
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

import bridge
from perf.bridge_config_export import container, to_yaml
from perf.bridge_config_fields import ALIKE_BUT_NOT_MAPPED, HANDLED, same_name_keys
from perf.bridge_config_import import SCHEMA_TYPES, accepts_null, import_container, read_file
from perf.bridge_config_read import BridgeConfigError
from tests.sampling import every

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "bridge"
FAMILIES = {"llama3_8b": 8, "qwen3_30b_a3b": 8, "deepseek_v3": 2048, "gpt_oss_120b": 64}
"""Each fixture with a GPU count its parallel sizes fit (Bridge takes it from the launcher, not the file)."""
BRIDGE_PATH = os.environ.get("GRAPHBRIDGE_BRIDGE_PATH")
GRAPHED = {  # graphbridge configs whose graphs an export must carry (in megatron-core 0.16.1's spelling)
    "full_iteration": ("recipe=llama/tiny", "cuda_graph=full_iteration"),
    "te_attn_mlp": ("recipe=llama/tiny", "cuda_graph=te_attn_mlp"),
    "local_layer": ("recipe=llama/tiny", "cuda_graph=local_layer"),
    "te_attn_moe_router": ("recipe=qwen/tiny", "cuda_graph=te_attn_moe_router"),
    "parked": ("recipe=llama/tiny", "model.cuda_graph_impl=none", "model.cuda_graph_scope=[full_iteration]"),
    "deepseek_tiny": ("recipe=deepseek/tiny", "cuda_graph=te_attn"),
    "gpt_oss_tiny": ("recipe=gpt_oss/tiny", "precision=fp8_cs"),
    "lora": ("recipe=llama/tiny_lora", "cuda_graph=full_iteration", "peft.dim=8", "peft.target_modules=[linear_qkv]"),
}


@lru_cache(maxsize=None)
def recorded(family: str) -> dict:
    return yaml.safe_load((FIXTURES / f"{family}.yaml").read_text())


def fixture(family: str) -> dict:
    """The container Bridge's recipe wrote for the family, as plain data (a fresh copy to change)."""
    return copy.deepcopy(recorded(family))


def plan_json(result) -> dict:
    assert result.returncode in (0, 2), result.stderr[-2000:]
    return json.loads(result.stdout)


@pytest.fixture(scope="session")
def round_trips(cli, tmp_path_factory, across_workers):
    """Per family: the plan of the fixture, its export, and the plan of the export: the plans and exports of every
    family made by one process and the plans of the exports by another (cli.many), by one worker a session, read
    back by the others (conftest.py's across_workers)."""
    def given(family: str, path) -> tuple:
        return f"bridge_config={path}", f"train.num_gpus={FAMILIES[family]}", "mode=plan"

    def make():
        work = tmp_path_factory.mktemp("bridge_round_trips")
        formats = ("plan.format=json", "plan.format=bridge")
        done = cli.many([(*given(family, f"{FIXTURES / family}.yaml"), form) for family in FAMILIES
                         for form in formats], cwd=work)
        imported, exported = dict(zip(FAMILIES, done[0::2])), dict(zip(FAMILIES, done[1::2]))
        for family in FAMILIES:
            (work / f"{family}_export.yaml").write_text(exported[family].stdout)
        again = cli.many([(*given(family, work / f"{family}_export.yaml"), "plan.format=json")
                          for family in FAMILIES], cwd=work)
        return {family: {"imported": imported[family], "exported": exported[family], "again": trip}
                for family, trip in zip(FAMILIES, again)}

    return across_workers("bridge_round_trips", make)


# --- the field table against Bridge 0.3.1 ------------------------------------------------------------------

def test_the_table_names_only_fields_bridge_has_and_every_field_graphbridge_has():
    bridge_fields = {f"{section}.{name}" for family in FAMILIES for section, fields in fixture(family).items()
                     if isinstance(fields, dict) for name in fields}
    assert set(same_name_keys()) <= bridge_fields
    named_alike = bridge_fields & set(SCHEMA_TYPES)  # Bridge's fields that graphbridge has a key of the same name for
    assert named_alike <= set(same_name_keys()) | set(HANDLED) | set(ALIKE_BUT_NOT_MAPPED)


# --- Bridge -> graphbridge: every field graphbridge has comes over ------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_a_bridge_recipe_imports_and_plans(round_trips, family):
    result = round_trips[family]["imported"]
    assert result.returncode == 0, result.stderr[-3000:]
    plan = plan_json(result)
    assert plan["valid"], plan["violations"]
    assert f"bridge_config={FIXTURES / family}.yaml: ignored, no graphbridge key" in result.stderr
    assert re.search(r"\n  checkpoint \(\d+\): \w+, \w+", result.stderr)  # a line per section
    assert "apply_query_key_layer_scaling" in result.stderr


@pytest.mark.parametrize("family", FAMILIES)
def test_every_field_graphbridge_has_keeps_bridges_value(round_trips, family):
    source, config = fixture(family), plan_json(round_trips[family]["imported"])["config"]
    for key in same_name_keys():
        section, name = key.split(".")
        if name not in source[section] or (source[section][name] is None and not accepts_null(key)):
            continue  # MLA's fields on another provider; Bridge's null where graphbridge needs a value (named)
        assert config[section][name] == source[section][name], key
    model, scheduler = source["model"], source["scheduler"]
    assert config["dataset"]["seq_length"] == source["dataset"]["sequence_length"] == config["model"]["seq_length"]
    assert config["model"]["vocab_size"] == model["vocab_size"]
    assert config["model"]["moe_layer_freq"] == model["moe_layer_freq"]
    assert config["optimizer"]["lr_warmup_iters"] == scheduler["lr_warmup_iters"]
    assert config["optimizer"]["lr_decay_style"] == scheduler["lr_decay_style"]
    # Bridge's scheduler, not the optimizer section, decides the (constant) weight decay.
    assert config["optimizer"]["weight_decay"] == scheduler["start_weight_decay"] == scheduler["end_weight_decay"]
    assert config["ddp"]["use_distributed_optimizer"] == source["ddp"]["use_distributed_optimizer"]
    # Every recipe is eager as shipped; the derived checks keep Bridge's values.
    assert (config["model"]["cuda_graph_impl"], config["model"]["cuda_graph_modules"]) == ("none", [])
    assert config["rng"]["te_rng_tracker"] is False
    assert config["rerun_state_machine"]["check_for_nan_in_loss"] == source["rerun_state_machine"][
        "check_for_nan_in_loss"]
    assert config["ddp"]["check_for_nan_in_grad"] == source["ddp"]["check_for_nan_in_grad"]


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_precision_is_laid_over_the_model_as_bridge_does(round_trips, family):
    source, config = fixture(family), plan_json(round_trips[family]["imported"])["config"]
    precision = source["mixed_precision"]
    if precision == "bf16_mixed":  # Bridge's recipe: bf16 params, fp32 gradient reduction, no fp8
        precision = {"bf16": True, "fp16": False, "fp8": None, "fp4": None, "grad_reduce_in_fp32": True}
    for name in ("bf16", "fp16", "fp8", "fp4"):
        assert config["model"][name] == precision[name], name
    assert config["ddp"]["grad_reduce_in_fp32"] == precision["grad_reduce_in_fp32"]


def test_objects_in_bridges_yaml_become_graphbridge_values(round_trips):
    deepseek = plan_json(round_trips["deepseek_v3"]["imported"])["config"]["model"]
    stages = fixture("deepseek_v3")["model"]["pipeline_model_parallel_layout"]
    assert deepseek["pipeline_model_parallel_layout"].split("|")[0] == "E" + "t" * (len(stages[0]) - 1)
    assert deepseek["pipeline_model_parallel_layout"].endswith("|tmL")
    assert deepseek["pipeline_model_parallel_layout"].count("|") == len(stages) - 1
    assert deepseek["position_embedding_type"] == "yarn"  # MLA: Bridge's rope_type
    assert deepseek["activation_func"] == "silu"
    gpt_oss = plan_json(round_trips["gpt_oss_120b"]["imported"])["config"]["model"]
    assert gpt_oss["activation_func"] == "quick_gelu"


# --- graphbridge -> Bridge -> graphbridge ---------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_export_then_import_is_identity(round_trips, family):
    exported, again = round_trips[family]["exported"], round_trips[family]["again"]
    assert exported.returncode == 0, exported.stderr[-2000:]
    written = yaml.safe_load(exported.stdout)
    assert written["_target_"] == "megatron.bridge.training.config.ConfigContainer"
    assert again.returncode == 0, again.stderr[-2000:]
    assert plan_json(again)["config"] == plan_json(round_trips[family]["imported"])["config"]


@pytest.mark.parametrize("name", GRAPHED)
def test_graphbridge_configs_survive_the_trip_through_bridges_yaml(name):
    original = bridge.load(GRAPHED[name])
    overrides = import_container(yaml.safe_load(to_yaml(original))).overrides
    assert carried(bridge.load([GRAPHED[name][0], *overrides])) == carried(original)


def carried(config) -> dict:
    """What a Bridge ConfigContainer can say: everything but graphbridge's preset bookkeeping (workload.*)."""
    return {name: value for name, value in dataclasses.asdict(config).items() if name != "workload"}


def test_the_export_speaks_megatron_core_0_16_1():
    full = container(bridge.load(["cuda_graph=full_iteration"]))["model"]
    assert (full["cuda_graph_impl"], full["cuda_graph_scope"]) == ("local", ["full_iteration"])
    layer = container(bridge.load(["cuda_graph=te_layer"]))["model"]
    assert (layer["cuda_graph_impl"], layer["cuda_graph_scope"]) == ("transformer_engine", "full")
    parked = container(bridge.load(GRAPHED["parked"]))["model"]
    assert (parked["cuda_graph_impl"], parked["cuda_graph_scope"]) == ("none", ["full_iteration"])


def test_the_export_says_what_a_container_cannot(tmp_path):
    carried = to_yaml(bridge.load(["cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true",
                                   "ddp.use_distributed_optimizer=false", "train.num_gpus=2",
                                   "train.global_batch_size=4", "+env_vars.NCCL_GRAPH_REGISTER=0"]))
    header = [line for line in carried.splitlines() if line.startswith("#")]
    assert any("Launch it on 2 GPUs" in line for line in header)
    assert any("NCCL_GRAPH_REGISTER=0" in line for line in header)
    assert any("Not carried: optimizer.optimizer_in_graph=true" in line for line in header)
    assert yaml.safe_load(carried)["train"]["global_batch_size"] == 4
    lora = to_yaml(bridge.load(["recipe=llama/tiny_lora"]))
    assert "# Set checkpoint.pretrained_checkpoint: Bridge's LoRA loads its frozen base weights" in lora
    assert yaml.safe_load(lora)["peft"]["_target_"] == "megatron.bridge.peft.lora.LoRA"


def test_an_invalid_config_writes_no_bridge_yaml(cli, tmp_path):
    result = cli("mode=plan", "plan.format=bridge", "cuda_graph=full_iteration",
                 "rerun_state_machine.check_for_nan_in_loss=true", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == "" and "check_for_nan_in_loss" in result.stderr


# --- how the file sits among the other overrides ----------------------------------------------------------------

def test_what_is_typed_after_the_file_wins_and_before_it_loses(cli, tmp_path):
    llama = f"bridge_config={FIXTURES / 'llama3_8b'}.yaml"
    after = plan_json(cli(llama, "train.num_gpus=8", "model.num_layers=4", "mode=plan", "plan.format=json",
                          cwd=tmp_path))["config"]
    before = plan_json(cli("model.num_layers=4", llama, "train.num_gpus=8", "mode=plan", "plan.format=json",
                           cwd=tmp_path))["config"]
    assert (after["model"]["num_layers"], before["model"]["num_layers"]) == (4, 32)


def test_a_graph_choice_after_the_file_replaces_the_files_graph_keys(cli, tmp_path):
    result = cli(f"bridge_config={FIXTURES / 'llama3_8b'}.yaml", "train.num_gpus=8", "cuda_graph=full_iteration",
                 "mode=plan", "plan.format=json", cwd=tmp_path)
    plan = plan_json(result)
    assert plan["valid"], plan["violations"]
    # The file's NaN checks equal their derivation for its eager impl, so they follow the new impl.
    assert plan["config"]["model"]["cuda_graph_impl"] == "full_iteration"
    assert plan["config"]["rerun_state_machine"]["check_for_nan_in_loss"] is False
    assert "graphbridge <" in result.stderr and "model.cuda_graph_impl=" not in result.stderr


def test_a_sweep_runs_over_an_imported_file(cli, tmp_path):
    exported = cli("mode=plan", "plan.format=bridge", "model.num_layers=2", cwd=tmp_path)
    (tmp_path / "tiny.yaml").write_text(exported.stdout)
    result = cli("-m", "bridge_config=tiny.yaml", "cuda_graph=none,full_iteration", "mode=plan", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "#0 : model.num_layers=2" in result.stdout + result.stderr
    assert result.stdout.count("graphbridge plan: VALID") == 2


def test_a_partial_overrides_file_lands_on_the_recipe_and_names_what_it_ignores(cli, tmp_path):
    (tmp_path / "overrides.yaml").write_text("model:\n  num_layers: 4\ncheckpoint:\n  save: /ckpt\n"
                                             "train:\n  train_iters: 7\n")
    result = cli("recipe=qwen/tiny", "bridge_config=overrides.yaml", "mode=plan", "plan.format=json", cwd=tmp_path)
    config = plan_json(result)["config"]
    assert (config["model"]["num_layers"], config["train"]["train_iters"]) == (4, 7)
    assert config["model"]["num_moe_experts"] is not None  # the rest is qwen/tiny's
    assert "bridge_config=overrides.yaml: ignored, no graphbridge key (1 field):\n  checkpoint: save\n" in result.stderr


def test_a_fine_tuning_dataset_gives_its_length_and_packing(cli, tmp_path):
    (tmp_path / "sft.yaml").write_text(
        "dataset:\n  _target_: megatron.bridge.training.config.FinetuningDatasetConfig\n  seq_length: 512\n"
        "  packed_sequence_specs:\n    packed_sequence_size: 512\n  dataset_kwargs:\n    pad_to_max_length: true\n")
    config = plan_json(cli("bridge_config=sft.yaml", "mode=plan", "plan.format=json", cwd=tmp_path))["config"]
    assert config["dataset"] == {**config["dataset"], "seq_length": 512, "packed_sequence": True,
                                 "pad_to_max_length": True}


def test_a_lora_run_config_as_bridge_writes_it_imports_its_adapters(cli, tmp_path):  # params_to_save: a YAML set
    (tmp_path / "lora.yaml").write_text(
        "peft:\n  _target_: megatron.bridge.peft.lora.LoRA\n  alpha: 16\n  canonical_mapping: {}\n  dim: 8\n"
        "  lora_A_init_method: xavier\n  params_to_save: !!set {}\n  target_modules: [linear_qkv, linear_proj]\n")
    result = cli("bridge_config=lora.yaml", "mode=plan", "plan.format=json", cwd=tmp_path)
    peft = plan_json(result)["config"]["peft"]
    assert peft == {**peft, "scheme": "lora", "dim": 8, "alpha": 16, "target_modules": ["linear_qkv", "linear_proj"]}
    assert "params_to_save" in result.stderr  # named among the fields graphbridge has no key for


def test_a_parked_scope_wakes_up_when_an_impl_is_typed_after_the_file(cli, tmp_path):
    (tmp_path / "parked.yaml").write_text("model:\n  cuda_graph_impl: none\n  cuda_graph_scope: full_iteration\n")
    config = plan_json(cli("bridge_config=parked.yaml", "model.cuda_graph_impl=local", "mode=plan",
                           "plan.format=json", cwd=tmp_path))["config"]
    assert config["model"]["cuda_graph_impl"] == "full_iteration"  # as megatron-core 0.16.1 reads local + scope


def test_the_rule_catalogue_judges_the_files_values(cli, tmp_path):
    (tmp_path / "nan.yaml").write_text("model:\n  cuda_graph_impl: local\n  cuda_graph_scope: [full_iteration]\n"
                                       "ddp:\n  check_for_nan_in_grad: true\n")
    result = cli("bridge_config=nan.yaml", "mode=plan", cwd=tmp_path)
    assert result.returncode == 2
    assert "ddp.check_for_nan_in_grad" in result.stderr


# --- what cannot be read: one line, exit status 2 -----------------------------------------------------------------

UNREADABLE = {
    "not_yaml": ("model: [1\n", "line 2, column 1: not valid YAML"),
    "a_list": ("- model\n", "is a list, not a ConfigContainer mapping"),
    "another_target": ("_target_: megatron.bridge.training.config.TrainingConfig\n", "not a ConfigContainer"),
    "unknown_section": ("modle:\n  num_layers: 2\n", "'modle' (did you mean model?) is not a section"),
    "unknown_enum_value": ("model:\n  cuda_graph_scope:\n  - _target_: megatron.core.transformer.enums.CudaGraphScope\n"
                           "    _call_: true\n    _args_: [9]\n", "CudaGraphScope(9) is no member"),
    "unknown_impl": ("model:\n  cuda_graph_impl: everything\n", "model.cuda_graph_impl: unknown value 'everything'"),
    "unknown_recipe": ("mixed_precision: bf16_mixd\n", "mixed_precision: no recipe 'bf16_mixd'"),
    "unknown_activation": ("model:\n  activation_func:\n    _target_: torch.nn.functional.relu\n    _call_: false\n",
                           "model.activation_func: torch.nn.functional.relu has no graphbridge equivalent"),
    "wrong_type": ("train:\n  micro_batch_size: two\n", "train.micro_batch_size: 'two' does not fit"),
    "section_no_mapping": ("model: 3\n", "section model is 3"),
}


@pytest.mark.parametrize("case", UNREADABLE)
def test_a_file_that_cannot_be_read_is_refused_with_its_reason(tmp_path, case):
    text, reason = UNREADABLE[case]
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(BridgeConfigError, match=None) as refused:
        read_file(str(tmp_path / "bad.yaml"))
    assert str(refused.value).startswith(f"{tmp_path / 'bad.yaml'}: ") and reason in str(refused.value)


READ_BY_CODE = [path for path in HANDLED if not path.startswith(("tokenizer.", "optimizer.use_"))] + [
    "mixed_precision", "comm_overlap", "model", "scheduler"]


# Every other field by default (each the same import of values of every kind); the rest under -m slow.
@pytest.mark.parametrize("path", every(READ_BY_CODE, 2))
def test_a_field_the_import_reads_with_any_value_is_read_or_refused_in_one_line(path):
    """Every field read by code (not copied) set to values of other kinds: overrides, or a BridgeConfigError."""
    section, _, name = path.partition(".")
    for value in (None, "text", 2.5, [[1]], {"_target_": "x.y", "_call_": False}):
        source = fixture("deepseek_v3")
        if name:
            source[section][name] = value
        else:
            source[section] = value
        try:
            import_container(source)
        except BridgeConfigError as refused:
            assert "\n" not in str(refused), (path, value)


@pytest.mark.parametrize("args, reason", [
    (("bridge_config=unknown_enum.yaml",), "CudaGraphScope(9) is no member"),
    (("bridge_config=missing.yaml",), "missing.yaml: no such file"),
    (("bridge_config=unknown_enum.yaml", "bridge_config=missing.yaml"), "a second bridge_config"),
])
def test_on_the_command_line_it_is_one_line_and_exit_status_2(cli, tmp_path, args, reason):
    (tmp_path / "unknown_enum.yaml").write_text(UNREADABLE["unknown_enum_value"][0])
    result = cli(*args, "mode=plan", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("graphbridge: bridge_config=") and reason in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# --- with Bridge 0.3.1 importable ------------------------------------------------------------------------------------

def bridge_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([BRIDGE_PATH, str(ROOT)])}
    return subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "scripts" / "bridge_fixture.py"), *args],
                          env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.skipif(not BRIDGE_PATH, reason="GRAPHBRIDGE_BRIDGE_PATH names no Bridge 0.3.1 to import")
def test_the_fixtures_are_what_bridges_recipes_write_today():
    checked = bridge_script("--check")
    assert checked.returncode == 0, (checked.stdout + checked.stderr)[-3000:]


@pytest.mark.skipif(not BRIDGE_PATH, reason="GRAPHBRIDGE_BRIDGE_PATH names no Bridge 0.3.1 to import")
def test_bridge_loads_every_export_and_what_it_loaded_imports_unchanged(tmp_path):
    configs = {name: bridge.load(overrides) for name, overrides in GRAPHED.items()}
    configs.update({family: bridge.load(read_file(str(FIXTURES / f"{family}.yaml")).overrides
                                        + [f"train.num_gpus={gpus}"]) for family, gpus in FAMILIES.items()})
    for name, config in configs.items():
        (tmp_path / f"{name}.yaml").write_text(to_yaml(config))
    loaded = bridge_script("--load", *(str(tmp_path / f"{name}.yaml") for name in configs))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    for path, text in json.loads(loaded.stdout).items():
        name = Path(path).stem
        back = import_container(yaml.safe_load(text)).overrides
        base = [GRAPHED[name][0]] if name in GRAPHED else [f"train.num_gpus={FAMILIES[name]}"]
        assert finalized(carried(bridge.load([*base, *back]))) == finalized(carried(configs[name])), name


def finalized(carried_config: dict) -> dict:
    """The values megatron-core's __post_init__ puts in for None (Bridge's validate() runs it), which mean
    the same as graphbridge's None."""
    model = carried_config["model"]
    model["num_query_groups"] = model["num_query_groups"] or model["num_attention_heads"]
    model["kv_channels"] = model["kv_channels"] or model["hidden_size"] // model["num_attention_heads"]
    model["expert_tensor_parallel_size"] = model["expert_tensor_parallel_size"] or model["tensor_model_parallel_size"]
    model["recompute_modules"] = model["recompute_modules"] or ["core_attn"]
    return carried_config


def test_the_export_keeps_its_gpu_and_tracker_and_the_import_echoes_one_short_line(cli, tmp_path):
    exported = cli("mode=plan", "plan.format=bridge", "recipe=llama/llama3_8b", "gpu=h100", "cuda_graph=full_iteration",
                   cwd=tmp_path)
    (tmp_path / "run_config.yaml").write_text(exported.stdout)
    again = cli("bridge_config=run_config.yaml", "mode=plan", "plan.format=json", cwd=tmp_path)
    plan = plan_json(again)
    assert plan["valid"], plan["violations"]
    assert (plan["config"]["workload"]["gpu"], plan["config"]["train"]["num_gpus"]) == ("h100", 8)
    assert plan["config"]["model"]["use_te_rng_tracker"] is True and "use_te_rng_tracker" not in again.stderr
    [echo] = [line for line in again.stderr.splitlines() if line.startswith("graphbridge <")]
    assert re.fullmatch(r"graphbridge <\d+ overrides from run_config\.yaml> mode=plan plan\.format=json", echo)

