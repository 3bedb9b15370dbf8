"""benchmarks/vs_bridge.py: its rows, and (where Bridge 0.3.1 imports, GRAPHBRIDGE_BRIDGE_PATH) the configs it
builds for both sides, checked without a GPU: Bridge's container of each row passes Bridge's own validate()
with the mock batches both sides train on, and graphbridge's catalogue accepts the same container imported.
Nothing here measures: the benchmark runs on the GPU machine (scripts/gpu/README.md)."""

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
BRIDGE_PATH = os.environ.get("GRAPHBRIDGE_BRIDGE_PATH")
# Bridge 0.3.1's (impl, scope) -> graphbridge's (impl, modules), as megatron-core 0.16.1 reads them.
GRAPHS = {("none", "full"): ("none", []), ("local", ("full_iteration",)): ("full_iteration", []),
          ("local", "full"): ("local", [])}


def script(*args: str, bridge: bool = False) -> subprocess.CompletedProcess:
    """vs_bridge.py; with ``bridge`` through scripts/bridge_fixture.py --run, which makes Bridge import here."""
    command = [sys.executable, "-W", "ignore", str(ROOT / "benchmarks" / "vs_bridge.py"), *args]
    env = dict(os.environ)
    if bridge:
        command[3:3] = [str(ROOT / "scripts" / "bridge_fixture.py"), "--run"]
        env["PYTHONPATH"] = os.pathsep.join([BRIDGE_PATH, str(ROOT)])
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_rows_are_listed_with_what_runs_them(tmp_path):
    listed = script("--list", "--work", str(tmp_path))
    assert listed.returncode == 0
    runs = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()}
    for shared in ("llama_tiny_eager", "llama_tiny_full_iteration", "llama_tiny_te_attn_mlp", "llama32_1b_eager",
                   "qwen3_proxy_te_attn_moe_router", "llama_tiny_lora_eager", "llama_tiny_packed_te_mlp"):
        assert runs.get(shared) == "both", shared
    assert runs["llama_tiny_full_iteration_optimizer"] == "ours"  # "ours only": Bridge 0.3.1 cannot
    assert script("no_such_row", "--work", str(tmp_path)).returncode == 2


def test_bridge_is_a_benchmark_extra_that_graphbridge_never_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert [str(Requirement(line)) for line in extras["megatron-bridge"]] == ["megatron-bridge==0.3.1"]
    needed = project["dependencies"] + extras["dev"]
    assert not [line for line in needed if Requirement(line).name == "megatron-bridge"]
    importers = [path for package in ("bridge", "perf") for path in (ROOT / package).rglob("*.py")
                 if re.search(r"^\s*(from|import) megatron\.bridge", path.read_text(), re.M)]
    assert importers == []


@pytest.mark.skipif(not BRIDGE_PATH, reason="GRAPHBRIDGE_BRIDGE_PATH names no Bridge 0.3.1 to import")
def test_every_row_is_one_config_that_bridge_and_graphbridge_accept(cli, tmp_path):
    configs = tmp_path / "configs"
    written = script("--configs", str(configs), "--work", str(tmp_path), bridge=True)
    assert written.returncode == 0, written.stderr[-3000:]
    rows = {path.stem: json.loads(path.read_text()) for path in configs.glob("*.json")}
    assert len(rows) >= 14
    for name, row in rows.items():
        result = cli(*row["graphbridge"], "mode=plan", "plan.format=json", cwd=tmp_path)
        plan = json.loads(result.stdout)
        assert plan["valid"], (name, plan["violations"])
        model, (impl, scope) = plan["config"]["model"], row["graphs"]
        expected = GRAPHS.get((impl, tuple(scope) if isinstance(scope, list) else scope), (impl, scope))
        assert (model["cuda_graph_impl"], model["cuda_graph_modules"]) == expected, name
        assert (plan["config"]["peft"]["scheme"] == "lora") == ("_lora_" in name), name
        assert plan["config"]["dataset"]["packed_sequence"] == ("_packed_" in name), name


@pytest.mark.skipif(not BRIDGE_PATH, reason="GRAPHBRIDGE_BRIDGE_PATH names no Bridge 0.3.1 to import")
def test_bridges_side_validates_with_the_shared_mock_batches(tmp_path):
    check = tmp_path / "check.py"
    check.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import vs_bridge\n"
        "from megatron.bridge.training.config import DatasetBuildContext\n"
        "from bridge.data import MockData\n"
        "for name, row in vs_bridge.ROWS.items():\n"
        "    cfg = vs_bridge.bridge_container(row, 20)\n"
        "    cfg.dataset = vs_bridge.same_batches(cfg, row.packed)\n"
        "    cfg.validate()\n"
        "    train, _, _ = cfg.dataset.build_datasets(DatasetBuildContext(40, 0, 0, None))\n"
        "    sample = train[5]\n"
        "    assert sample['tokens'].shape == sample['labels'].shape == (cfg.model.seq_length,)\n"
        "    if row.packed:  # Bridge's packed keys: the boundaries closing at seq_length, their count, the longest\n"
        "        ends = sample['cu_seqlens'].tolist()\n"
        "        assert ends[-1] == cfg.model.seq_length and int(sample['cu_seqlens_argmin']) == len(ends)\n"
        "        assert int(sample['max_seqlen']) == max(b - a for a, b in zip(ends, ends[1:]))\n"
        "    else:\n"
        "        assert (sample['labels'][:-1] == sample['tokens'][1:]).all()\n"
        "    print(name, 'validated')\n"
        "print(len(vs_bridge.ROWS), 'rows')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([BRIDGE_PATH, str(ROOT)])}
    done = subprocess.run([sys.executable, "-W", "ignore", str(ROOT / "scripts" / "bridge_fixture.py"), "--run",
                           str(check)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{done.stdout.count('validated')} rows" in done.stdout


def test_the_table_shows_each_sides_trainable_parameters():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vs_bridge

    lora = {"row": "llama_tiny_lora_eager",
            "bridge": {"step_time_ms": {"median": 10.0, "p10": 9.0, "p90": 11.0}, "loss": [8.0, 7.5],
                       "parameters": {"total": 30_000_000, "trainable": 1_998_848}},
            "graphbridge": {"step_time_ms": {"median": 8.0, "p10": 7.0, "p90": 9.0}, "loss": [8.0, 7.5],
                            "parameters": {"total": 30_000_000, "trainable": 1_998_848}}}
    row = vs_bridge.table([lora], 0.02).splitlines()[-1]
    assert "| 1.25x |" in row and "| 1,998,848 / 1,998,848 |" in row and "yes (max 0.0% over 2 steps)" in row
    older = {**lora, "bridge": {key: value for key, value in lora["bridge"].items() if key != "parameters"}}
    assert "| - / 1,998,848 |" in vs_bridge.table([older], 0.02)  # a record from before Bridge's side counted them
