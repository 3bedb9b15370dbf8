"""scripts/gpu_check.sh's dispatch on the CPU, with a stand-in for the GPU machine's release set-up (GPU_ENV):
a mode that starts other modes reaches the harness with the arguments meant for it, once per release. (A
mistake in that mapping once started gpu_check.sh from itself without end and spent a session's device time.)"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import host_noise  # noqa: E402  (benchmarks/ is a directory of scripts)


def stand_in_environment(tmp_path: Path, **extra: str) -> dict:
    """gpu_check.sh's environment with a stand-in for the release set-up (the releases are this Python's) and
    its output under ``tmp_path``/out."""
    stand_in = tmp_path / "env.sh"
    stand_in.write_text("# the releases are whatever this Python has\n")
    return {**os.environ, "GPU_ENV": str(stand_in), "OUT": str(tmp_path / "out"), **extra}


@pytest.mark.harness
def test_both_releases_two_gpu_differentials_start_the_harness_once_each(tmp_path):
    """differentials2 hands each release to differential2 (differentials to differential, by the same line)."""
    env = stand_in_environment(tmp_path)
    command = ["bash", "scripts/gpu_check.sh", "differentials2", "--seed", "3", "--count", "2", "--eager-twins", "0",
               "--witnesses", "timeout_b15bb2a_320", "--deadline-s", "0"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    for release in ("0.16.1", "0.19.2"):
        record = tmp_path / "out" / f"mcore-{release}" / "gpu_differential_2gpu.json"
        summary = json.loads(record.read_text())["summary"]
        assert summary["drawn"] == 2 and summary["num_gpus"] == 2
        assert "--gpus 2 --workers" in summary["command"] and "--seed 3 --count 2" in summary["command"]
        assert [witness["label"] for witness in summary["witnesses"]] == ["timeout_b15bb2a_320"]


@pytest.mark.harness
def test_the_witnesses_mode_queues_each_graphed_case_beside_its_eager_twin(tmp_path):
    """witnesses trains the cases named and, after them, each graphed one with cuda_graph=none; none trains here
    (--deadline-s 0), but the record names every run and which case each twin belongs to."""
    env = stand_in_environment(tmp_path, MCORE="0.16.1")
    labels = ["te_graphs_local_spec_te_layer", "fp8_mx"]
    command = ["bash", "scripts/gpu_check.sh", "witnesses", *labels, "--deadline-s", "0"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "out" / "mcore-0.16.1" / "gpu_witnesses.json").read_text())
    assert record["summary"]["drawn"] == 0 and "--witness-twins" in record["summary"]["command"]
    cases = {run["label"]: run for run in record["runs"] if run["kind"] == "witness"}
    twins = [run for run in record["runs"] if run["kind"] == "eager_twin"]
    assert sorted(cases) == ["fp8_mx", "te_graphs_local_spec_te_layer"]  # fp8_mx sets no graph: no twin
    assert [twin["twin_of"] for twin in twins] == [cases["te_graphs_local_spec_te_layer"]["index"]]
    assert "cuda_graph=none" in twins[0]["overrides"] and "model.transformer_impl=local" in twins[0]["overrides"]


@pytest.mark.harness
def test_the_launchers_mode_starts_both_launchers_on_gpus_of_their_own_and_fails_without_evidence(tmp_path):
    """launchers2 trains the cases named by fresh processes and by the preloaded launcher; with nothing trained
    (--deadline-s 0) there is nothing to rely on, so it exits 1, and a block falls back to fresh processes."""
    env = stand_in_environment(tmp_path, MCORE="0.16.1")
    command = ["bash", "scripts/gpu_check.sh", "launchers2", "moe_tp_with_sp", "--deadline-s", "0"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out" / "mcore-0.16.1"
    for launcher, port in (("process", 20000), ("preloaded", 26000)):
        summary = json.loads((out / f"launcher_{launcher}_2gpu.json").read_text())["summary"]
        assert f"--launcher {launcher} --port-base {port}" in summary["command"] and summary["num_gpus"] == 2
        assert [witness["label"] for witness in summary["witnesses"]] == ["moe_tp_with_sp"]
    assert json.loads((out / "launchers_2gpu.json").read_text())["holds"] is False


@pytest.mark.harness
def test_the_auto_mode_runs_auto_from_an_empty_cache_and_says_what_the_probe_cost(tmp_path):
    """On this CPU there is nothing to probe: the run trains eagerly and says so; its run directory stays in $out,
    its result.json and output beside it as flat files."""
    env = stand_in_environment(tmp_path, MCORE="0.16.1")
    command = ["bash", "scripts/gpu_check.sh", "auto", "recipe=llama/tiny", "model.num_layers=1", "train.train_iters=2"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "auto chose none (no_cuda_device): probe None s" in done.stdout
    runs = sorted((tmp_path / "out" / "mcore-0.16.1").glob("auto_*"), key=lambda path: path.suffix)
    assert [run.suffix for run in runs] == ["", ".json", ".log"]  # its decision cache is gone
    run_dir, result, log = runs
    assert json.loads((run_dir / "result.json").read_text())["auto"]["source"] == "no_cuda_device"
    assert result.read_text() == (run_dir / "result.json").read_text()
    assert "auto chose none (no_cuda_device)" in log.read_text()


@pytest.mark.harness
def test_the_host_noise_mode_runs_the_harness_and_binding_to_every_cpu_runs_unbound_only_and_says_why(tmp_path):
    """gpu_check.sh host_noise reaches benchmarks/host_noise.py with its arguments and leaves the record in $out. A GPU
    whose NUMA-local CPUs are all the process's (one node) leaves binding nothing to change: half the runs would
    measure the same thing twice, so there is one mode, and the record and the first line say why. The record keeps,
    per run, what a virtual machine's neighbours took, and which CPUs share a core. Nine steps are the fewest the
    suite's profile window leaves a timed step in."""
    env = stand_in_environment(tmp_path, MCORE="0.16.1")
    every_cpu = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    # The runs' job directories under tmp_path, not in host_noise.py's default scratch (/tmp/graphbridge-host-noise).
    command = ["bash", "scripts/gpu_check.sh", "host_noise", "llama_tiny_local", "--runs", "1", "--steps", "9",
               "--cpus", every_cpu, "--scratch", str(tmp_path / "scratch")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out" / "mcore-0.16.1"
    record = json.loads((out / "host_noise_llama_tiny_local.json").read_text())
    why = f"the CPUs to bind to hold all {len(os.sched_getaffinity(0))} of this process's"
    assert record["binding_changes_nothing"].startswith(why)
    assert (out / "host_noise_llama_tiny_local.log").read_text().startswith(why)
    assert record["cpus_bound"] == sorted(os.sched_getaffinity(0)) and record["variant"] == "eager"
    assert list(record["modes"]) == ["unbound"] and len(record["modes"]["unbound"]["medians_ms"]) == 1
    # What else could set the run's speed: the CPU time the hypervisor gave others meanwhile (0 on bare metal),
    # and which CPUs share a core.
    assert [stolen >= 0 for stolen in record["modes"]["unbound"]["steal_s"]] == [True]
    assert os.sched_getaffinity(0) <= {cpu for core in record["core_siblings"] for cpu in core}
    # And its timed steps in step order, as result.json keeps them: whether the step moved while it ran.
    (steps_ms,) = record["modes"]["unbound"]["timed_step_ms"]
    assert steps_ms and all(ms > 0 for ms in steps_ms)
    assert record["modes"]["unbound"]["window_medians_ms"] == [host_noise.window_medians(steps_ms)]


@pytest.mark.harness
def test_host_noise_trains_a_variant_unbound_and_bound_turn_by_turn(tmp_path, monkeypatch, capsys):
    """One run of each mode, the bound one on CPU 0 (a GPU would name its own CPUs): both median step times and the
    CPUs bound are in the record. host_noise.py's main in this process (the command line above runs the script), on
    llama_tiny_local cut to one narrow layer: each run is still a `graphbridge` process of its own."""
    workload = host_noise.WORKLOADS["llama_tiny_local"]
    monkeypatch.setitem(host_noise.WORKLOADS, "llama_tiny_local", dataclasses.replace(workload, base=(
        *workload.base, "model.num_layers=1", "model.hidden_size=64", "dataset.seq_length=32")))
    assert host_noise.main(["llama_tiny_local", "--runs", "1", "--steps", "9", "--cpus", "0",
                            "--out", str(tmp_path / "noise.json"), "--scratch", str(tmp_path / "scratch")]) == 0
    record = json.loads((tmp_path / "noise.json").read_text())
    assert record["cpus_bound"] == [0] and record["variant"] == "eager" and record["binding_changes_nothing"] is None
    assert list(record["modes"]) == ["unbound", "bound"]
    assert all(len(mode["medians_ms"]) == 1 and mode["median_ms"] > 0 for mode in record["modes"].values())
    assert "run 0 unbound: completed" in capsys.readouterr().out


def test_host_noise_takes_a_median_per_window_of_steps_and_a_last_one_holding_half():
    steps = [float(step) for step in range(2 * host_noise.WINDOW_STEPS + host_noise.WINDOW_STEPS // 2)]
    assert host_noise.window_medians(steps) == [9.5, 29.5, 44.5]
    assert host_noise.window_medians(steps[:-1]) == [9.5, 29.5]  # a last window under half is left out


def test_host_noise_without_a_gpu_to_name_its_cpus_says_so_in_one_line_and_exits_2(tmp_path):
    done = subprocess.run([sys.executable, "benchmarks/host_noise.py", "llama_tiny_local", "--out",
                           str(tmp_path / "noise.json")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": os.path.dirname(sys.executable)})  # no nvidia-smi
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "no GPU says which CPUs are beside it here: name them with --cpus"]
    assert not (tmp_path / "noise.json").exists()
