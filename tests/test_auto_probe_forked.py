"""cuda_graph=auto's real probe on this CPU, on a machine described as a GPU one: each run forked from the
preloaded launcher with its own log, table and plot; the next run starting once the one before wrote its result; a
run that failed beside others trained again alone, one alone never; a run at its gate giving up once its probe
ended; a job of several GPUs probed at its own layout, one forked rank per GPU. The probe's decisions on
synthesized timings: test_auto_probe.py."""

import json
import os
import time
from pathlib import Path

import pytest

from bridge.machine import Machine
from bridge.start_gate import GATE_ENV
from perf import auto_probe
from perf.auto_probe import ProbeRuns, choose_graphs
from tests.auto_probe_kit import H100, OPTIMIZER_IN_GRAPH, SMALL, Finished, gpu_plan, synthesized_trainer

# The probe plans its candidates again for every plan: each is composed and judged once a process (conftest.py).
pytestmark = pytest.mark.usefixtures("judged_once")


def test_the_probe_forks_each_run_and_leaves_its_table_and_plot_in_the_run_directory(tmp_path, cache_home):
    """The real probe on a machine described as a GPU one: the torch engine's graph choices run eagerly on this
    CPU, so they are recorded as ran_eagerly, none goes on to a second round and eager is kept; every run was a
    process forked from the preloaded launcher, with its own log."""
    tiny = ("engine=torch", "model.num_layers=1", "model.hidden_size=64", "model.ffn_hidden_size=128",
            "model.vocab_size=256", "dataset.seq_length=32")
    plan = gpu_plan(*tiny, machine=Machine(gpus=H100.gpus, packages={"torch": "2.13.0"}))
    assert plan.auto.probe_order == ["none", "full_iteration", "local_layer", OPTIMIZER_IN_GRAPH, "none"]
    config = choose_graphs(plan, tmp_path)
    assert config.model.cuda_graph_impl.value == "none"
    probe_dir = tmp_path / "auto"
    assert {"summary.md", "summary.png", "round1"} <= {p.name for p in probe_dir.iterdir()}
    assert not (probe_dir / "round2").exists()
    record = json.loads((tmp_path / "auto.json").read_text())
    assert [(c["choice"], c["status"]) for c in record["candidates"]] == [
        ("none", "completed"), ("full_iteration", "ran_eagerly"), ("local_layer", "ran_eagerly"),
        (OPTIMIZER_IN_GRAPH, "ran_eagerly"), ("none", "completed")]
    assert record["probe"]["wall_s"] > record["probe"]["imports_s"] >= 0  # 0 once an earlier test started the server
    # A run starts in about a second here and steps in milliseconds: one round of full runs decides.
    together = plan.auto.runs_at_once
    assert record["probe"]["rounds"] == [{"runs": 5, "timed_steps": 30, "train_iters": 34, "runs_at_once": together}]
    # Runs 1-4 started `together` at a time: each batch built side by side before the first of it timed a step, and
    # each was let go once the one before had ended.
    runs = [probe_dir / "round1" / str(number) for number in range(5)]
    for batch in (runs[start:start + together] for start in range(1, 5, together)):
        assert max(mtime(run / "gate" / "ready.0") for run in batch) <= mtime(batch[0] / "gate" / "open")
    for earlier, later in zip(runs, runs[1:]):
        assert mtime(earlier / "result.json") <= mtime(later / "gate" / "open")
    for number, eager in ((0, record["candidates"][0]), (4, record["candidates"][4])):
        run_dir = probe_dir / "round1" / str(number)
        result = json.loads((run_dir / "result.json").read_text())
        assert result["train_iters"] == 34 and result["step_time_ms"]["count"] == 31
        assert eager["median_ms"] == result["step_time_ms"]["median"] > 0 and eager["spread_ms"] >= 0
        assert eager["wall_s"] > 0 and (run_dir / "train.log").stat().st_size > 0


class TearingDown:
    """A probe run whose result is written and whose process has not ended: it tears down until killed."""

    def __init__(self):
        self.killed = False

    def ended(self) -> bool:
        return self.killed

    def kill(self) -> None:
        self.killed = True


def test_the_next_probe_run_goes_once_the_one_before_wrote_its_result_not_once_it_tore_down(tmp_path, cache_home,
                                                                                            monkeypatch):
    monkeypatch.setattr(auto_probe, "RUN_TIMEOUT_S", 60.0)
    trained, launched = [], []
    synthesized = synthesized_trainer({"none": (20.0, 20.1), "te_attn": 12.0}, trained)

    def launch(config, run_dir, gate, port):
        synthesized.launch(config, run_dir, gate, port)  # writes its result.json
        gate.mkdir(parents=True, exist_ok=True)
        (gate / "ready.0").touch()  # and waits at its gate
        launched.append(TearingDown())
        return launched[-1]

    started = time.monotonic()
    config = choose_graphs(gpu_plan(*SMALL), tmp_path, ProbeRuns(lambda: 0.0, launch))
    assert config.model.cuda_graph_modules == ["attn"]
    assert time.monotonic() - started < 30  # no run waited out RUN_TIMEOUT_S for a process to end
    assert launched and all(job.killed for job in launched)


class Gated:
    """A probe run as the real ones go: it waits at its gate and writes its result only once the gate opens."""

    def __init__(self, gate: Path, write_result):
        gate.mkdir(parents=True, exist_ok=True)
        (gate / "ready.0").touch()
        self.gate, self.write_result, self.done = gate, write_result, False

    def ended(self) -> bool:
        if not self.done and (self.gate / "open").exists():
            self.write_result()
            self.done = True
        return self.done

    def kill(self) -> None:
        self.done = True


@pytest.mark.parametrize("error", [
    "CUDA out of memory. Tried to allocate 2.00 GiB",
    # An allocation that failed inside a capture surfaces as the capture's error, naming no memory.
    "RuntimeError: CUDA error: operation failed due to a previous error during capture"])
def test_a_run_that_failed_beside_others_trains_again_alone_whatever_its_error(error, tmp_path, cache_home,
                                                                               monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    plan, trained, alone = gpu_plan(*SMALL), [], []
    synthesized = synthesized_trainer({"none": (20.0, 20.1), "te_attn": 12.0}, trained)
    te_attn = tmp_path / "auto" / "round1" / "3"

    def launch(config, run_dir, gate, port):
        if run_dir == te_attn and not alone:  # beside the others
            alone.append(run_dir)
            (run_dir / "result.json").write_text(json.dumps({"status": "failed", "job": {}, "reason": error}))
            (run_dir / "train.log").write_text(error)
            return Finished()
        if run_dir == te_attn:  # alone: its first attempt's result must not pass for this one's
            alone.append(run_dir)
            return Gated(gate, lambda: synthesized.launch(config, run_dir, gate, port))
        return synthesized.launch(config, run_dir, gate, port)

    config = choose_graphs(plan, tmp_path, ProbeRuns(lambda: 0.0, launch))
    assert config.model.cuda_graph_modules == ["attn"] and len(alone) == 2
    assert [c["status"] for c in json.loads((tmp_path / "auto.json").read_text())["candidates"]
            if c["choice"] == "te_attn"] == ["completed"]
    kept = te_attn / auto_probe.BESIDE_OTHERS
    assert json.loads((kept / "result.json").read_text())["reason"] == error and (kept / "train.log").is_file()


def test_a_run_alone_that_failed_is_not_tried_again(tmp_path, cache_home, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one run at a time
    plan, trained, tries = gpu_plan(*SMALL), [], []
    synthesized = synthesized_trainer({"none": (20.0, 20.1), "te_attn": 12.0}, trained)

    def launch(config, run_dir, gate, port):
        if run_dir.match("round1/3"):  # te_attn
            tries.append(run_dir)
            (run_dir / "result.json").write_text(json.dumps({"status": "failed", "job": {}, "reason": "a bug"}))
            return Finished()
        return synthesized.launch(config, run_dir, gate, port)

    config = choose_graphs(plan, tmp_path, ProbeRuns(lambda: 0.0, launch))
    assert plan.auto.runs_at_once == 1 and len(tries) == 1
    assert config.model.cuda_graph_modules != ["attn"]


def test_a_run_waiting_at_its_gate_gives_up_once_the_probe_that_started_it_ended(tmp_path, monkeypatch):
    from bridge.start_gate import GateAbandoned, wait_for_turn

    parents = iter([100, 100, 1])  # the launcher's pid twice, then init's: reparented
    monkeypatch.setattr(os, "getppid", lambda: next(parents))
    with pytest.raises(GateAbandoned, match="ended before letting it time its steps"):
        wait_for_turn(tmp_path / "gate", 0)
    assert (tmp_path / "gate" / "ready.0").is_file()


def mtime(path: Path) -> int:
    return path.stat().st_mtime_ns


def test_a_job_of_several_gpus_is_probed_at_its_own_layout_one_forked_rank_per_gpu(tmp_path, cache_home, monkeypatch):
    import perf.auto_probe
    from bridge.run import load_resolved
    from perf.preloaded import rank_environment

    monkeypatch.setattr(os, "cpu_count", lambda: 64)  # every run after the first eager one starts together
    two_gpus = Machine(gpus=H100.gpus * 2, packages=H100.packages)
    plan = gpu_plan(*SMALL, "model.tensor_model_parallel_size=2", "train.num_gpus=2", machine=two_gpus)
    launched, ports, synthesized = [], [], synthesized_trainer({"none": (20.0, 20.1), "te_attn": 10.0}, [])

    def start(run_dir, log, env, ranks, port):
        config = load_resolved(run_dir)
        launched.append((ranks, config.model.tensor_model_parallel_size, env[GATE_ENV] == str(run_dir / "gate")))
        ports.append(port)
        return synthesized.launch(config, run_dir, Path(env[GATE_ENV]), port)

    monkeypatch.setattr(perf.auto_probe.preloaded, "start", start)
    monkeypatch.setattr(perf.auto_probe, "FORKED", ProbeRuns(lambda: 0.0, perf.auto_probe.launch_forked))
    assert choose_graphs(plan, tmp_path).model.cuda_graph_modules == ["attn"]
    assert launched and set(launched) == {(2, 2, True)}
    # The runs that start together meet at ports of their own.
    together = ports[1:]
    assert len(set(together)) == len(together) > 1
    ranks = [rank_environment(rank, 2, 29555) for rank in range(2)]
    assert [(env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) for env in ranks] == [("0", "0", "2"), ("1", "1", "2")]
    assert {env["MASTER_PORT"] for env in ranks} == {"29555"} and rank_environment(0, 1, 29555) == {}
