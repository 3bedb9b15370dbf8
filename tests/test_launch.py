"""How a job starts on one GPU, one node or several: the training command and its environment
(table tests, then torchrun for real with a probe in place of bridge.run), the Slurm launcher
presets, and every command of the README's Slurm section through the real `graphbridge`."""

import csv
import json
import math
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from bridge.config.schema import GraphBridgeConfig
from bridge.machine import RENDEZVOUS_SPAN, free_port, free_ports
from perf import launch
from perf.launch import LaunchError, first_host, training_command

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
JOB = Path("/shared/sweep/0")
LOGS = ["--tee=3", "--local-ranks-filter=0"]
TRAIN = ["-m", "bridge.run", str(JOB)]
TORCHRUN = [PY, "-m", "torch.distributed.run"]
SLURM_NODE1 = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-[017-018]", "SLURM_JOB_NUM_NODES": "2",
               "SLURM_NODEID": "1"}
EXPLICIT_NODE0 = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000", "NODE_RANK": "0"}
RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "SLURM_NODEID", "SLURM_JOB_NODELIST",
                        "SLURM_JOB_NUM_NODES", "SLURM_JOB_ID")


def config(gpus: int = 1, nodes: int = 1, **env_vars: str) -> GraphBridgeConfig:
    cfg = GraphBridgeConfig()
    cfg.train.num_gpus, cfg.train.num_nodes, cfg.env_vars = gpus, nodes, dict(env_vars)
    return cfg


@pytest.mark.parametrize("gpus, nodes, environ, expected", [
    pytest.param(1, 1, {}, [PY, *TRAIN], id="1 GPU"),
    pytest.param(8, 1, {}, [*TORCHRUN, "--standalone", "--nproc-per-node=8", f"--log-dir={JOB}/ranks/node0", *LOGS,
                            *TRAIN], id="1 node x 8"),
    pytest.param(8, 1, {**SLURM_NODE1, "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"},
                 [*TORCHRUN, "--standalone", "--nproc-per-node=8", f"--log-dir={JOB}/ranks/node0", *LOGS, *TRAIN],
                 id="1 node x 8 under Slurm"),
    pytest.param(16, 2, SLURM_NODE1, [*TORCHRUN, "--nnodes=2", "--nproc-per-node=8", "--node-rank=1",
                                      "--master-addr=gpu-017", "--master-port=29742",
                                      f"--log-dir={JOB}/ranks/node1", *LOGS, *TRAIN], id="2 nodes x 8 under Slurm"),
    pytest.param(16, 2, EXPLICIT_NODE0, [*TORCHRUN, "--nnodes=2", "--nproc-per-node=8", "--node-rank=0",
                                         "--master-addr=10.0.0.1", "--master-port=6000",
                                         f"--log-dir={JOB}/ranks/node0", *LOGS, *TRAIN], id="2 nodes x 8 by MASTER_ADDR"),
    pytest.param(16, 2, {"MASTER_ADDR": "10.0.0.1", "NODE_RANK": "1"},
                 [*TORCHRUN, "--nnodes=2", "--nproc-per-node=8", "--node-rank=1", "--master-addr=10.0.0.1",
                  "--master-port=29500", f"--log-dir={JOB}/ranks/node1", *LOGS, *TRAIN], id="default port"),
    pytest.param(16, 2, {**SLURM_NODE1, **EXPLICIT_NODE0},
                 [*TORCHRUN, "--nnodes=2", "--nproc-per-node=8", "--node-rank=0", "--master-addr=10.0.0.1",
                  "--master-port=6000", f"--log-dir={JOB}/ranks/node0", *LOGS, *TRAIN], id="explicit beats Slurm"),
])
def test_training_command(gpus, nodes, environ, expected):
    assert training_command(config(gpus, nodes), JOB, environ) == expected


@pytest.mark.parametrize("environ, names", [
    ({}, ["NODE_RANK or SLURM_NODEID", "MASTER_ADDR=", "MASTER_PORT=", "NODE_RANK=<0..1>", "hydra/launcher=submitit_slurm"]),
    ({"NODE_RANK": "1"}, ["node 0's address (MASTER_ADDR or SLURM_JOB_NODELIST)", "MASTER_ADDR="]),
    ({**SLURM_NODE1, "SLURM_JOB_NUM_NODES": "1"}, ["Slurm job 4242 has 1 node(s)", "train.num_nodes"]),
], ids=["nothing", "no address", "allocation too small"])
def test_a_multi_node_job_without_a_rendezvous_names_what_to_set(environ, names):
    with pytest.raises(LaunchError) as error:
        training_command(config(16, 2), JOB, environ)
    assert all(name in str(error.value) for name in names), str(error.value)


@pytest.mark.parametrize("nodelist, host", [
    ("node01", "node01"), ("node[01-02]", "node01"), ("gpu-[017-020,031],cpu01", "gpu-017"),
    ("host1,host2", "host1"), ("rack[3,5]-n[07-08]", "rack3-n07"),
])
def test_first_host_of_a_slurm_node_list(nodelist, host):
    assert first_host(nodelist) == host


@pytest.fixture
def no_rendezvous(monkeypatch):
    for name in RENDEZVOUS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_run_job_without_a_rendezvous_fails_before_starting_anything(read_result, tmp_path, no_rendezvous):
    job = {"choices": {}, "overrides": ["train.num_nodes=2"]}
    assert launch.run_job(config(16, 2), tmp_path, job) == launch.LAUNCH_FAILED
    result = read_result(tmp_path)
    assert result["status"] == "failed" and "MASTER_ADDR" in result["reason"]
    assert not (tmp_path / launch.RESOLVED).exists() and not (tmp_path / launch.RANKS).exists()


@pytest.mark.parametrize("node, result_written", [("0", True), ("1", False)])
def test_only_node_0_stands_in_for_a_missing_result(tmp_path, no_rendezvous, node, result_written):
    for name, value in {**EXPLICIT_NODE0, "NODE_RANK": node}.items():
        no_rendezvous.setenv(name, value)
    no_rendezvous.setattr(launch, "training_command", lambda cfg, job_dir, environ: [PY, "-c", "raise SystemExit(3)"])
    assert launch.run_job(config(16, 2), tmp_path, {"choices": {}, "overrides": []}) == 3
    assert (tmp_path / launch.RESULT_FILE).exists() == result_written


# torchrun for real on CPU, with a probe in place of bridge.run that records what each rank sees.
PROBE = '''import json, os, sys
from pathlib import Path
seen = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "GRAPHBRIDGE_PROBE",
                                        "CUDA_DEVICE_MAX_CONNECTIONS")}
Path(sys.argv[1], f"rank{seen['RANK']}.json").write_text(json.dumps(seen))
print(f"probe rank {seen['RANK']}", flush=True)
'''


def start_probe(cfg: GraphBridgeConfig, job_dir: Path, environ: dict) -> subprocess.Popen:
    probe_dir = job_dir.parent / "probe"
    probe_dir.mkdir(exist_ok=True)
    (probe_dir / "graphbridge_probe.py").write_text(PROBE)
    env = {**os.environ, **environ, "PYTHONPATH": str(probe_dir)}
    command = ["graphbridge_probe" if arg == "bridge.run" else arg for arg in training_command(cfg, job_dir, env)]
    assert command != training_command(cfg, job_dir, env)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output
    return output


def rank_log(job_dir: Path, node: int, local_rank: int) -> str:
    [log] = (job_dir / launch.RANKS / f"node{node}").glob(f"*/attempt_0/{local_rank}/stdout.log")
    return log.read_text()


def seen_by(job_dir: Path, rank: int) -> dict:
    return json.loads((job_dir / f"rank{rank}.json").read_text())


def test_one_node_every_rank_gets_the_environment_and_its_own_log_only_rank_0_prints(tmp_path):
    job_dir = tmp_path / "0"
    job_dir.mkdir()
    console = finish(start_probe(config(2), job_dir, {"GRAPHBRIDGE_PROBE": "from the launcher",
                                                      "CUDA_DEVICE_MAX_CONNECTIONS": "1"}))
    for rank in (0, 1):
        assert seen_by(job_dir, rank) == {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
                                          "WORLD_SIZE": "2", "GRAPHBRIDGE_PROBE": "from the launcher",
                                          "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        assert f"probe rank {rank}" in rank_log(job_dir, 0, rank)
    assert "[default0]:probe rank 0" in console and "probe rank 1" not in console


def test_two_nodes_meet_at_master_addr_and_log_per_node(tmp_path, no_rendezvous):
    """Two 'nodes' on this machine, one rank each, sharing the job directory as a cluster's
    shared filesystem would."""
    job_dir = tmp_path / "0"
    job_dir.mkdir()
    cfg = config(2, 2)
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GRAPHBRIDGE_PROBE": "on every node"}
    nodes = [start_probe(cfg, job_dir, {**rendezvous, "NODE_RANK": str(node)}) for node in (0, 1)]
    consoles = [finish(process) for process in nodes]
    for node in (0, 1):
        seen = seen_by(job_dir, node)
        assert (seen["GROUP_RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == (str(node), "0", "2")
        assert seen["GRAPHBRIDGE_PROBE"] == "on every node"
        assert f"probe rank {node}" in rank_log(job_dir, node, 0) and f"probe rank {node}" in consoles[node]


# The launcher presets and the README's commands, through the real `graphbridge`.
@pytest.fixture
def launcher_config(cli):
    """``launcher_config(args, cwd)``: the composed hydra.launcher node, resolved."""

    def show(args, cwd: Path) -> dict:
        result = cli(*args, "--cfg", "all", "-p", "hydra.launcher", "--resolve", cwd=cwd)
        assert result.returncode == 0, result.stderr
        return yaml.safe_load(result.stdout)

    return show


@pytest.mark.parametrize("preset, target, nodes, gpus_per_node", [
    ("submitit_slurm", "SlurmLauncher", 2, 4), ("submitit_local", "LocalLauncher", 1, 1),
])
def test_launcher_presets_compose_on_the_plugins_schema(launcher_config, tmp_path, preset, target, nodes,
                                                       gpus_per_node):
    size = ["train.num_gpus=8", "train.num_nodes=2", "train.global_batch_size=8"] if preset == "submitit_slurm" else []
    launcher = launcher_config([f"hydra/launcher={preset}", *size], tmp_path)
    assert launcher["_target_"] == f"hydra_plugins.hydra_submitit_launcher.submitit_launcher.{target}"
    assert (launcher["nodes"], launcher["gpus_per_node"], launcher["tasks_per_node"]) == (nodes, gpus_per_node, 1)
    assert launcher["submitit_folder"].endswith("/.submitit/%j")


def readme_commands():
    section = (ROOT / "README.md").read_text().split("## Running on a Slurm cluster")[1].split("\n## ")[0]
    lines = section.replace("\\\n", " ").splitlines()
    return [shlex.split(line)[1:] for line in lines if line.strip().startswith("graphbridge ")]


def kind(args) -> str:
    if "hydra/launcher=submitit_local" in args:
        return "local sweep"
    if "hydra/launcher=submitit_slurm" in args and "-m" in args:
        return "slurm submission"
    return "plan" if "mode=plan" in args else "launcher config" if "--cfg" in args else "untested"


def test_every_readme_command_is_tested_here():
    kinds = [kind(args) for args in readme_commands()]
    assert sorted(kinds) == ["launcher config", "local sweep", "plan", "slurm submission", "slurm submission"]


def submissions():
    return [args for args in readme_commands() if kind(args) == "slurm submission"]


@pytest.mark.parametrize("args", submissions(), ids=lambda args: " ".join(args[-3:]))
def test_readme_slurm_submission_plans_valid_jobs_and_asks_slurm_for_their_nodes(cli, launcher_config, tmp_path,
                                                                                  args):
    """What would be submitted: every job of the sweep plans valid, and the launcher asks for
    train.num_nodes nodes of 8 GPUs with the command's own launcher keys."""
    overrides = [arg for arg in args if arg != "-m"]
    parsed = OverridesParser.create().parse_overrides(overrides)
    jobs = math.prod(len(list(o.sweep_string_iterator())) for o in parsed if o.is_sweep_override())
    plans = cli("-m", "mode=plan", *[arg for arg in overrides if not arg.startswith("hydra")], cwd=tmp_path)
    assert plans.returncode == 0, plans.stderr
    assert plans.stdout.count("graphbridge plan: VALID") == jobs
    one_job = [f"{o.key_or_group}={next(o.sweep_string_iterator())}" if o.is_sweep_override() else o.input_line
               for o in parsed]
    launcher = launcher_config(one_job, tmp_path)
    nodes = next((o.value() for o in parsed if o.key_or_group == "train.num_nodes"), 1)
    assert (launcher["nodes"], launcher["gpus_per_node"], launcher["tasks_per_node"]) == (nodes, 8, 1)
    for o in parsed:
        if o.key_or_group.startswith("hydra.launcher."):
            assert launcher[o.key_or_group.split(".")[-1]] == o.value()


def test_readme_plan_and_launcher_config_commands_work(cli, tmp_path):
    [plan] = [args for args in readme_commands() if kind(args) == "plan"]
    result = cli(*plan, cwd=tmp_path)
    assert result.returncode == 0 and "graphbridge plan: VALID" in result.stdout, result.stderr
    [show] = [args for args in readme_commands() if kind(args) == "launcher config"]
    result = cli(*show, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    launcher = yaml.safe_load(result.stdout)
    assert (launcher["nodes"], launcher["gpus_per_node"], launcher["tasks_per_node"]) == (8, 8, 1)


def test_readme_local_sweep_runs_each_job_through_submitit_and_ends_with_a_summary(cli, tmp_path):
    [args] = [args for args in readme_commands() if kind(args) == "local sweep"]
    result = cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [sweep_dir] = tmp_path.glob("multirun/*/*")
    assert len(list((sweep_dir / ".submitit").glob("*/*_0_log.out"))) == 2  # each job ran as a submitit task
    for job in ("0", "1"):
        assert json.loads((sweep_dir / job / "result.json").read_text())["status"] == "completed"
    assert all((sweep_dir / name).is_file() for name in ("summary.md", "summary.csv", "summary.png"))
    with (sweep_dir / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["cuda_graph"], row["status"]) for row in rows] == [("none", "completed"),
                                                                    ("full_iteration", "completed")]


def test_rendezvous_ports_are_drawn_free_below_the_kernels_ephemeral_ports(tmp_path):
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("32768\t60999\n")
    ports = free_ports(6, ephemeral)
    assert len(set(ports)) == 6 and all(32768 - RENDEZVOUS_SPAN <= port < 32768 for port in ports)
    # Six candidates (1024-1029): with all but one held by listeners, that one comes, then the kernel's own picks.
    ephemeral.write_text("1030 60999")
    held = []
    for port in range(1024, 1030):
        listener = socket.socket()
        try:
            listener.bind(("", port))
        except OSError:
            listener.close()
            continue
        listener.listen()
        held.append(listener)
    assert held, "ports 1024-1029 all taken on this machine"
    freed = held.pop()
    free_now = freed.getsockname()[1]
    freed.close()
    try:
        first, *others = free_ports(3, ephemeral)
        assert first == free_now and len({first, *others}) == 3 and all(port >= 1030 for port in others)
    finally:
        for listener in held:
            listener.close()
    assert len(set(free_ports(2, tmp_path / "not_linux"))) == 2
