"""The GPU differential's harness on the CPU: its draws are overrides the CLI takes, its grouping of failures and
its eager-twin comparison (benchmarks/gpu_differential.py; the GPU runs it through scripts/gpu_check.sh)."""

import argparse
import contextlib
import io
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import differential_launch  # noqa: E402
import gpu_differential  # noqa: E402
from differential_draw import draw  # noqa: E402
from gpu_differential import EAGER_TWIN, Run, eager_agreement, failure_class, plan_verdict  # noqa: E402

from perf import preloaded  # noqa: E402


def test_every_draw_is_a_set_of_overrides_the_cli_takes():
    rng = random.Random(7)
    verdicts = [plan_verdict(draw(rng)) for _ in range(12)]
    assert not [v for v in verdicts if "error" in v]
    assert any(v["valid"] for v in verdicts) and any(not v["valid"] for v in verdicts)


def witness_cases_the_cli_refuses(keep) -> dict:
    from differential_witnesses import WITNESS_CASES

    return {label: verdict["error"] for index, (label, overrides) in enumerate(sorted(WITNESS_CASES.items()))
            if keep(index) and "error" in (verdict := plan_verdict([*overrides, "gpu=h100"]))}


def test_every_witness_case_is_a_set_of_overrides_the_cli_takes():
    """A third of the cases, every third in label order; the rest under -m slow (a plan each: ~0.3 s)."""
    assert not witness_cases_the_cli_refuses(lambda index: index % 3 == 0)


@pytest.mark.slow
def test_every_other_witness_case_is_a_set_of_overrides_the_cli_takes():
    assert not witness_cases_the_cli_refuses(lambda index: index % 3 != 0)


def test_failures_group_by_cause_without_their_numbers_and_paths():
    first = "CUDA graph capture of x failed at step 3: NCCL error in: /pytorch/a.cpp:253, version 2.28.9"
    second = "CUDA graph capture of x failed at step 4: NCCL error in: /other/b.cpp:12, version 2.21.5"
    assert failure_class(first) == failure_class(second)
    assert failure_class(first) != failure_class("RuntimeError: Checkpointing is not compatible with .grad()")


def test_a_graphed_run_whose_losses_leave_its_eager_twin_is_reported():
    graphed = Run(0, ["recipe=llama/tiny", "cuda_graph=te_attn"], status="completed", losses=[8.3, 8.1, 7.9])
    close = Run(1, ["recipe=llama/tiny", "cuda_graph=none"], EAGER_TWIN, twin_of=0, status="completed",
                losses=[8.3, 8.1, 7.91])
    far = Run(3, ["recipe=llama/tiny", "cuda_graph=none"], EAGER_TWIN, twin_of=2, status="completed",
              losses=[8.3, 8.1, 7.9])
    stale = Run(2, ["recipe=llama/tiny", "cuda_graph=full_iteration"], status="completed", losses=[8.3, 8.3, 8.3])
    agreement = eager_agreement([graphed, close, stale, far])
    assert agreement["compared"] == 2
    assert [pair["graphed"] for pair in agreement["differ"]] == [2]


def test_a_twin_gap_beyond_rounding_differs_without_dropout_and_agrees_with_it():
    # 0.79 % from the capture step on: TE's graphs on the local spec (gpu_witnesses.json at 0d3b80c)
    eager_losses, graphed_losses = [8.3776, 8.4684, 7.9869], [8.3776, 8.4684, 8.0479]
    runs = []
    for index, dropout in ((0, []), (2, ["model.hidden_dropout=0.1"])):
        overrides = ["recipe=llama/tiny", "model.transformer_impl=local", *dropout]
        runs += [Run(index, [*overrides, "cuda_graph=te_layer"], status="completed", losses=graphed_losses),
                 Run(index + 1, [*overrides, "cuda_graph=none"], EAGER_TWIN, twin_of=index, status="completed",
                     losses=eager_losses)]
    agreement = eager_agreement(runs)
    assert agreement["compared"] == 2
    assert [(pair["graphed"], pair["tolerance"]) for pair in agreement["differ"]] == [
        (0, gpu_differential.ROUNDING_TOLERANCE)]


def test_a_witness_case_beside_its_eager_twin_records_their_gap_and_one_without_a_twin_none():
    twinned = Run(0, ["recipe=llama/tiny", "cuda_graph=te_layer"], gpu_differential.WITNESS, label="twinned",
                  status="completed", losses=[8.3, 8.1, 7.5])
    alone = Run(1, ["recipe=llama/tiny", "cuda_graph=te_attn"], gpu_differential.WITNESS, label="alone",
                status="completed", losses=[8.3, 8.1, 7.9])
    twin = Run(2, ["recipe=llama/tiny", "cuda_graph=none"], EAGER_TWIN, twin_of=0, status="completed",
               losses=[8.3, 8.1, 7.9])
    arguments = argparse.Namespace(gpus=1, seed=0, launcher="preloaded")
    witnesses = gpu_differential.summary([twinned, alone, twin], arguments, {}, 1.0, [])["witnesses"]
    assert [w["label"] for w in witnesses] == ["twinned", "alone"]
    assert witnesses[0]["eager_gap"] == pytest.approx(0.4 / 7.9) and witnesses[1]["eager_gap"] is None


@pytest.mark.slow
def test_the_harness_plans_trains_and_records_through_the_cli(tmp_path):
    out = tmp_path / "record.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_differential.py"), "--count", "3", "--workers", "2",
                    "--eager-twins", "0", "--bypass-per-rule", "1", "--out", str(out)], check=True, timeout=1200)
    record = json.loads(out.read_text())
    summary = record["summary"]
    assert summary["drawn"] == 3 and summary["trained"] == summary["accepted"]
    assert {run["kind"] for run in record["runs"]} <= {"accepted", "bypass"}
    assert gpu_differential.STEPS == summary["steps"]
    run_lines = [line for line in out.read_text().splitlines() if line.startswith('    {"index": ')]
    assert len(run_lines) == len(record["runs"])  # a run a line, not an indented run's dozens


@pytest.mark.harness
def test_the_preloaded_launcher_trains_a_job_as_the_cli_would_and_says_why_one_fails(tmp_path):
    # On the CPU with the torch engine: the forkserver's child writes result.json as `python -m bridge.run` does,
    # and a run it cannot start leaves its last line as the error.
    overrides = ["recipe=llama/tiny", "device=cpu", "engine=torch", "train.train_iters=2"]
    launch = differential_launch.Launch("preloaded", {}, 21000)
    trained = Run(0, overrides)
    differential_launch.attempt(trained, tmp_path, launch)
    assert trained.status == "completed" and len(trained.losses) == 2
    refused = Run(1, [*overrides[:-1], "train.train_iters=0"])
    differential_launch.attempt(refused, tmp_path, launch)
    assert refused.status != "completed" and refused.error
    # A run of two GPUs: a child a rank, told its rank and the run's own rendezvous port as torchrun would, and
    # forked from a server whose imports asked NVML, not the CUDA driver, whether there is a GPU (a driver
    # initialised before fork fails in every child; perf/training_imports.py).
    code = preloaded.train(tmp_path / "job", tmp_path / "ranks.log", {}, ranks=2, entry=report_rank,
                           entry_args=(str(tmp_path),), port=23456)
    assert code == 0
    assert [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)] == [
        {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_PORT": "23456", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        for rank in (0, 1)]


def report_rank(job_dir: str, out: str) -> int:
    """A preloaded child's work in the test above: what it was told."""
    told = {key: os.environ.get(key) for key in ("RANK", "WORLD_SIZE", "MASTER_PORT", "PYTORCH_NVML_BASED_CUDA_CHECK")}
    (Path(out) / f"rank{told['RANK']}.json").write_text(json.dumps(told))
    return 0


def test_the_footprint_tool_reads_its_variants_and_counts_the_processes_a_run_starts():
    import run_footprint

    assert run_footprint.parse_variant("default") == ("default", {})
    assert run_footprint.parse_variant("lean:TORCHINDUCTOR_COMPILE_THREADS=1,NCCL_DEBUG=WARN") == \
        ("lean", {"TORCHINDUCTOR_COMPILE_THREADS": "1", "NCCL_DEBUG": "WARN"})
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '5']); "
                               "subprocess.Popen(['sleep', '5']); time.sleep(5)"])
    try:
        deadline = time.monotonic() + 4
        while run_footprint.descendants(parent.pid) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run_footprint.descendants(parent.pid) == 2
    finally:
        parent.kill()


@pytest.mark.harness
def test_draws_at_two_gpus_take_every_parallel_layout_and_plan_on_a_cluster_gpu():
    from differential_draw import LAYOUTS

    rng = random.Random(11)
    draws = [draw(rng, gpus=2) for _ in range(30)]
    keys = {item.split("=")[0] for overrides in draws for item in overrides}
    assert all("train.num_gpus=2" in overrides for overrides in draws)
    assert {"model.tensor_model_parallel_size", "model.pipeline_model_parallel_size", "model.context_parallel_size",
            "model.expert_model_parallel_size", "model.virtual_pipeline_model_parallel_size"} <= keys, LAYOUTS
    # This CPU machine cannot run them (the GPU machine plans them itself); the configuration rules judge them here.
    verdicts = [plan_verdict(overrides) for overrides in draws]
    assert not [v for v in verdicts if "error" in v]
    assert any(v["valid"] for v in verdicts) and not any(v["runnable_here"] for v in verdicts)


@pytest.mark.harness
def test_draws_at_four_gpus_combine_two_parallelisms_and_the_cli_takes_them():
    from differential_draw import TINY_RECIPES, layout

    rng = random.Random(5)
    # The layouts alone: the schema's mutations drawn after them may change a parallel size on purpose.
    layouts = [layout(rng, rng.choice(TINY_RECIPES), 4)[0] for _ in range(60)]
    sizes = [{key: value for key, value in overrides.items() if key.endswith("_parallel_size")
              and key != "model.virtual_pipeline_model_parallel_size"} for overrides in layouts]
    draws = [dict(item.split("=", 1) for item in draw(rng, gpus=4)) for _ in range(60)]
    assert all(overrides["train.num_gpus"] == "4" for overrides in draws)
    assert all(math.prod(layout.values()) in (1, 2, 4) for layout in sizes)
    combined = [tuple(sorted(layout)) for layout in sizes if sorted(layout.values()) == [2, 2]]
    assert len(set(combined)) >= 4, combined  # TP2xPP2, CP2xTP2, PP2xEP2, ...
    assert any("model.virtual_pipeline_model_parallel_size" in overrides
               and overrides["model.pipeline_model_parallel_size"] == 2 for overrides in layouts)
    verdicts = [plan_verdict([f"{key}={value}" for key, value in overrides.items()]) for overrides in draws[:12]]
    assert not [v for v in verdicts if "error" in v]
    assert any(v["valid"] for v in verdicts)


def test_a_failed_runs_log_tail_is_the_failing_ranks_traceback(tmp_path):
    run_dir = tmp_path / "run1"
    rank_log = run_dir / "ranks" / "node0" / "attempt_0" / "1" / "stderr.log"
    rank_log.parent.mkdir(parents=True)
    (tmp_path / "run1.log").write_text("torchrun's summary: bridge.run FAILED\n")
    rank_log.write_text("started\nTraceback (most recent call last):\nAssertionError: the rank's own error\n")
    assert differential_launch.failure_log_tail(tmp_path / "run1.log", run_dir).endswith("the rank's own error")
    (tmp_path / "run2.log").write_text("one process: its traceback is in its log\n")
    assert differential_launch.failure_log_tail(tmp_path / "run2.log", tmp_path / "run2").startswith("one process")
    (tmp_path / "run3.log").write_text("the preloaded launcher's rank 0, waiting for its peer\n")
    second_rank = preloaded.rank_log(tmp_path / "run3.log", 1)
    second_rank.write_text("Traceback (most recent call last):\nValueError: rank 1's own\n")
    assert differential_launch.failure_log_tail(tmp_path / "run3.log", tmp_path / "run3").endswith("rank 1's own")


def test_a_rank_that_aborted_in_cuda_is_the_reason_not_torchruns_own_traceback(tmp_path):
    # A rank that aborts in C++ leaves no Python traceback; the launcher's log ends with torchrun's own.
    (tmp_path / "run4.log").write_text("Traceback (most recent call last):\n  File \"torch/distributed/run.py\"\n"
                                       "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                                       "=====\nunchecked_run.py FAILED\n=====\n")
    rank_log = tmp_path / "run4" / "ranks" / "run_x" / "attempt_0" / "0" / "stderr.log"
    rank_log.parent.mkdir(parents=True)
    rank_log.write_text("terminate called after throwing an instance of 'c10::Error'\n"
                        "  what():  CUDA error: an illegal memory access was encountered\n"
                        "Exception raised from c10_cuda_check_implementation at c10/cuda/CUDAException.cpp:44\n"
                        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98\n")
    tail = differential_launch.failure_log_tail(tmp_path / "run4.log", tmp_path / "run4")
    assert tail.startswith("terminate called")
    assert differential_launch.failure_reason(tail) == "what():  CUDA error: an illegal memory access was encountered"
    assert differential_launch.failure_reason("started\nTraceback (most recent call last):\nValueError: bad\n"
                                              "  during handling\n") == "ValueError: bad"
    assert differential_launch.failure_reason(None) == "no output"


def test_rendezvous_ports_stay_below_the_kernels_ephemeral_ports(tmp_path):
    ephemeral = tmp_path / "ip_local_port_range"
    ephemeral.write_text("32768\t60999\n")
    assert differential_launch.port_range_problem(26000, 3000, ephemeral) is None
    assert "pick a base from 1024 to 29768" in differential_launch.port_range_problem(40000, 3000, ephemeral)
    assert differential_launch.port_range_problem(31000, 3000, ephemeral)  # its last ports reach 32768
    assert differential_launch.port_range_problem(40000, 3000, tmp_path / "not_linux") is None


@pytest.mark.parametrize("arguments, says", [
    (["--port-base", "40000"], "--port-base 40000: its 4 ports reach the kernel's ephemeral ports"),
    (["--witnesses", "no_such_case"], "--witnesses no_such_case: no such case"),
    (["--witnesses", "moe_tp_with_sp"], "--witnesses moe_tp_with_sp: it trains on 2 GPUs; run it with --gpus 2"),
    (["--resume", "no_such_record.json"], "--resume no_such_record.json: no such record"),
])
def test_the_harness_refuses_what_it_cannot_run_in_one_line_and_exit_2(tmp_path, arguments, says):
    if arguments[0] == "--port-base" and not differential_launch.EPHEMERAL_PORTS.exists():
        pytest.skip("no ephemeral port range to check against (not Linux)")
    out = tmp_path / "record.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_differential.py"), "--count", "2",
                           "--eager-twins", "0", "--workers", "1", *arguments, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and says in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert not out.exists()


def differential(*arguments: str) -> subprocess.CompletedProcess:
    """benchmarks/gpu_differential.py on two draws and the fp8_mx witness case, nothing else sampled: its main in this
    process, with its command line, output and exit status as a process of its own would have them (the script as a
    command: test_the_harness_refuses_what_it_cannot_run_in_one_line_and_exit_2 above, and scripts/gpu_check.sh's
    modes in tests/test_gpu_check.py). It sets the environment of its runs: put back after it."""
    argv = [str(ROOT / "benchmarks" / "gpu_differential.py"), "--count", "2", "--eager-twins", "0",
            "--bypass-per-rule", "0", "--workers", "1", "--witnesses", "fp8_mx", *arguments]
    out, err, environment, command = io.StringIO(), io.StringIO(), dict(os.environ), sys.argv
    try:
        sys.argv = argv
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = gpu_differential.main()
            except SystemExit as exit:  # argparse's refusals
                code = exit.code
    finally:
        sys.argv = command
        os.environ.clear()
        os.environ.update(environment)
    return subprocess.CompletedProcess([sys.executable, *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def stopped_record_text(tmp_path_factory, across_workers) -> str:
    """A record that stopped before training anything (--deadline-s 0), as a block that ran out of device time:
    made once a session for the tests below (conftest.py's across_workers), each of which changes a copy."""
    def make() -> str:
        first = tmp_path_factory.mktemp("stopped") / "first.json"
        done = differential("--deadline-s", "0", "--out", str(first))
        assert done.returncode == 0, done.stderr[-2000:]
        return first.read_text()

    return across_workers("stopped_differential_record", make)


@pytest.fixture
def stopped_record(tmp_path, stopped_record_text) -> Path:
    """That record, this test's own copy to change."""
    first = tmp_path / "first.json"
    first.write_text(stopped_record_text)
    return first


def test_resume_keeps_what_the_record_trained_and_trains_only_the_rest(tmp_path, stopped_record):
    second = tmp_path / "second.json"
    untrained = differential("--resume", str(stopped_record), "--deadline-s", "0", "--out", str(second))
    assert ", 1 to train," in untrained.stdout, untrained.stdout + untrained.stderr[-2000:]  # the witness case
    record = json.loads(stopped_record.read_text())
    witness = next(run for run in record["runs"] if run["kind"] == "witness")
    witness.update(status="completed", losses=[8.3, 8.1], seconds=12.5)  # as an earlier block trained it
    stopped_record.write_text(json.dumps(record))
    done = differential("--resume", str(stopped_record), "--deadline-s", "0", "--out", str(second))
    assert done.returncode == 0 and ", 0 to train," in done.stdout, done.stdout + done.stderr[-2000:]
    resumed = json.loads(second.read_text())
    kept = next(run for run in resumed["runs"] if run["kind"] == "witness")
    assert (kept["status"], kept["losses"], kept["seconds"]) == ("completed", [8.3, 8.1], 12.5)
    assert resumed["summary"]["witnesses"][0]["status"] == "completed"
    assert [block["commit"] for block in resumed["summary"]["earlier_blocks"]] == [record["summary"]["commit"]]


@pytest.mark.parametrize("arguments, change, says", [
    (["--seed", "5"], None, "--resume: the record has seed 0 and this run 5; resume with the record's"),
    ([], "plan", "--resume: run 0 is not drawn or planned as the record's"),
])
def test_resume_refuses_a_record_of_other_draws_in_one_line_and_exit_2(tmp_path, stopped_record, arguments, change,
                                                                       says):
    if change:  # the catalogue decided run 0 otherwise when the record was made
        record = json.loads(stopped_record.read_text())
        record["runs"][0]["plan"]["valid"] = not record["runs"][0]["plan"]["valid"]
        stopped_record.write_text(json.dumps(record))
    out = tmp_path / "second.json"
    done = differential("--resume", str(stopped_record), *arguments, "--out", str(out))
    assert done.returncode == 2 and says in done.stderr.strip().splitlines()[-1], done.stderr[-2000:]
    assert not out.exists()


def test_the_launchers_comparison_holds_only_where_the_preloaded_runs_end_and_train_as_the_fresh_ones():
    import launchers

    def record(*runs):
        return {"runs": [{"kind": "witness", "label": label, "status": status, "seconds": seconds, "losses": losses}
                         for label, status, seconds, losses in runs]}

    fresh = record(("a", "completed", 60.0, [10.0, 9.0]), ("b", "completed", 40.0, [8.0, 7.0]),
                   ("c", "failed", 30.0, []))
    same = launchers.compared({"process": fresh, "preloaded": record(
        ("a", "completed", 20.0, [10.0, 9.0]), ("b", "completed", 10.0, [8.0, 7.0]), ("c", "failed", 5.0, []))})
    assert same["holds"] and same["trained_by_both"] == 2
    assert same["median_seconds"] == {"process": 50.0, "preloaded": 15.0} and same["speedup"] == 50.0 / 15.0
    crashed = launchers.compared({"process": fresh, "preloaded": record(
        ("a", "failed", 20.0, []), ("b", "completed", 10.0, [8.0, 7.0]), ("c", "failed", 5.0, []))})
    assert not crashed["holds"] and crashed["preloaded_differs"] == ["a"]
    drifted = launchers.compared({"process": fresh, "preloaded": record(
        ("a", "completed", 20.0, [10.0, 9.5]), ("b", "completed", 10.0, [8.0, 7.0]), ("c", "failed", 5.0, []))})
    assert drifted["preloaded_differs"] == ["a"] and not drifted["holds"]
