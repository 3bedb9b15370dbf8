"""The benchmark suite plans every variant it would run, and the docs table is built from its raw
results (a synthetic result here; the committed ones in benchmarks/results/)."""

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import benchmark_table
import differential_table
import pytest
from sections import with_section

import bridge
from bridge.config.releases import RELEASES, in_range
from bridge.machine import GPU, host_cpu, stolen_s

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import suite  # noqa: E402  (benchmarks/ is a directory of scripts)
import suite_workloads  # noqa: E402

from tests.sampling import split  # noqa: E402

VARIANTS = [(name, variant) for name, workload in suite.WORKLOADS.items() for variant in workload.variants]


def planned_release(workload) -> tuple:
    """The plan.megatron_core override for a workload measuring some releases only: the newest it measures."""
    if workload.megatron_core is None:
        return ()
    return (f"plan.megatron_core={[v for v in RELEASES if in_range(v, workload.megatron_core)][-1]}",)


# Each workload's first variant and every other one by default (67 plans of ~0.3 s); the rest under -m slow.
@pytest.mark.parametrize("name, variant", split(
    VARIANTS, lambda index, case: index % 2 == 0 or case[1] == next(iter(suite.WORKLOADS[case[0]].variants)),
    ids="-".join, several=True))
def test_every_suite_variant_is_a_valid_configuration_that_fits_its_gpu(name, variant):
    workload = suite.WORKLOADS[name]
    plan = bridge.plan([*workload.base, *workload.variants[variant], "train.train_iters=40", "perf.profile=true",
                        *planned_release(workload)])
    assert plan.valid, plan.config_violations
    assert plan.config.train.num_gpus == workload.gpus
    # A variant planned not to fit is device time spent on an out-of-memory error.
    assert plan.memory().verdict != "does not fit", plan.memory().to_text()


def test_the_table_is_built_from_raw_results(tmp_path):
    record = {"workload": "llama_tiny_local", "description": "tiny", "gpus": 1, "steps": 40, "date": "2026-11-23",
              "gpu": "NVIDIA H100 80GB HBM3", "driver": "580.1", "suite_command": "python benchmarks/suite.py x",
              "versions": {"torch": "2.11", "megatron_core": "0.16.1", "transformer_engine": "2.10.0",
                           "graphbridge": "abc1234", "python": "3.12"},
              "variants": {"eager": {"status": "completed", "reason": None, "median_ms": 40.0, "p10_ms": 39.0,
                                     "p90_ms": 41.0, "speedup": 1.0, "gpu_busy": 0.06, "peak_allocated_gb": 0.6,
                                     "estimate_gb": 0.55, "capture_time_s": None, "graph_count": 0},
                           "full_iteration": {"status": "failed", "reason": "boom", "median_ms": None, "p10_ms": None,
                                              "p90_ms": None, "speedup": None, "gpu_busy": None,
                                              "peak_allocated_gb": None, "capture_time_s": None, "graph_count": 0},
                           "local_layer": {"status": "missing", "reason": None, "median_ms": None, "p10_ms": None,
                                           "p90_ms": None, "speedup": None, "gpu_busy": None, "peak_allocated_gb": None,
                                           "capture_time_s": None, "graph_count": None,
                                           "log_tail": ["cannot run on this machine:", "  [rule] key: why", ""]}}}
    (tmp_path / suite.result_name(record)).write_text(json.dumps(record))
    text = benchmark_table.markdown(tmp_path)
    assert "| eager | 40.00 | 39.00-41.00 | 1.00x | 6% | 0.60 | 0.55 |  | 0 | completed |" in text
    assert "| full_iteration |  |  |  |  |  |  |  | 0 | failed: boom |" in text
    assert "| local_layer |  |  |  |  |  |  |  |  | missing: cannot run on this machine: [rule] key: why |" in text
    assert suite.result_name(record) == "llama_tiny_local_h100_mcore0.16.1.json"


def test_the_table_shows_the_newest_record_of_each_workload_and_release(tmp_path):
    """A workload measured again on a newer machine: its newest record is the table, the newest on the other release
    one line under it, and the record the newer one replaced is only named."""
    def record(gpu, release, date, eager_ms):
        rows = {"eager": {"status": "completed", "median_ms": eager_ms, "p10_ms": None, "p90_ms": None, "speedup": 1.0,
                          "gpu_busy": None, "peak_allocated_gb": None, "capture_time_s": None, "graph_count": 0},
                "full_iteration": {"status": "completed", "median_ms": eager_ms / 8, "p10_ms": None, "p90_ms": None,
                                   "speedup": 8.0, "gpu_busy": None, "peak_allocated_gb": None, "capture_time_s": 0.1,
                                   "graph_count": 1},
                "local_layer": {"status": "failed", "reason": "boom", "median_ms": None, "p10_ms": None,
                                "p90_ms": None, "speedup": None, "gpu_busy": None, "peak_allocated_gb": None,
                                "capture_time_s": None, "graph_count": 0}}
        return {"workload": "llama_tiny_local", "description": "tiny", "gpus": 1, "steps": 40, "date": date, "gpu": gpu,
                "driver": "580.1", "suite_command": "python benchmarks/suite.py llama_tiny_local --steps 40",
                "versions": {"torch": "2.11", "megatron_core": release, "transformer_engine": "2.10.0",
                             "graphbridge": "abc1234", "python": "3.12"}, "variants": rows}
    for each in (record("NVIDIA H100 80GB HBM3", "0.19.2", "2026-11-24", 60.0),
                 record("NVIDIA H200", "0.19.2", "2026-11-29", 50.0),
                 record("NVIDIA H100 80GB HBM3", "0.16.1", "2026-11-25", 70.0)):
        (tmp_path / suite.result_name(each)).write_text(json.dumps(each))
    text = benchmark_table.markdown(tmp_path)
    assert text.count("### llama_tiny_local") == 1 and "| eager | 50.00 |" in text and "| eager | 60.00 |" not in text
    assert ("On megatron-core 0.16.1: `llama_tiny_local_h100_mcore0.16.1.json` (1 x NVIDIA H100 80GB HBM3, Transformer "
            "Engine 2.10.0, graphbridge abc1234, 2026-11-25, `python benchmarks/suite.py llama_tiny_local "
            "--steps 40`): eager 70.00 ms; full_iteration 8.00x; local_layer failed.") in text
    assert text.rstrip().endswith("Older records of the same measurements, not shown: "
                                  "`llama_tiny_local_h100_mcore0.19.2.json` (NVIDIA H100 80GB HBM3, 2026-11-24).")


def test_the_docs_show_only_the_newest_equivalence_and_side_by_side_records():
    equivalence = benchmark_table.equivalence_markdown()
    assert equivalence.startswith("`benchmarks/results/h200/mcore-0.16.1/equivalence.json`: NVIDIA H200")
    assert equivalence.count("| variant | runs completed |") == 2  # a table for each release
    assert "not shown: `benchmarks/results/h100/mcore-0.16.1/equivalence.json`" in equivalence
    side_by_side = benchmark_table.vs_bridge_markdown()
    # llama32_1b_eager ran twice: before graphbridge imported Bridge's loss fusion (0.93x) and after (1.01x)
    assert "| llama32_1b_eager | 1276.04" not in side_by_side
    assert "#### llama32_1b_unfused_loss_h100.json" not in side_by_side
    assert side_by_side.endswith("not shown: `llama32_1b_unfused_loss_h100.json`'s llama32_1b_eager.")


def test_the_differential_section_says_how_each_witness_case_ended_in_a_line_a_kind():
    witnesses = [
        {"label": "refused", "unchecked_rules": ["rule_a", "rule_b"], "status": "failed", "error": "boom",
         "eager_gap": None},
        {"label": "control", "unchecked_rules": [], "status": "completed", "error": None, "eager_gap": 0.0},
        {"label": "over_strict", "unchecked_rules": ["rule_c"], "status": "completed", "error": None,
         "eager_gap": None},
        {"label": "crashed", "unchecked_rules": [], "status": "timeout", "error": "hung\nat step 3", "eager_gap": None}]
    assert differential_table.witness_table({"witnesses": witnesses}) == [
        "- witnesses that failed with their rules unasked (1): `refused` (rule_a, rule_b)",
        "- witnesses that completed (2): `control` (gap to its eager twin 0.0e+00), `over_strict` (trained with "
        "`rule_c` unasked)",
        "- **witnesses that failed with no rule unasked** (1): `crashed` timeout: hung"]
    # the current records only: a witness record replaced by a newer one keeps its commit in its name
    section = differential_table.markdown()
    assert "gpu_witnesses.json`" in section and "gpu_witnesses_0d3b80c.json" not in section
    assert "gpu_witnesses_2gpu_cfa782d.json" not in section and "gpu_differential_0433e38" not in section


@pytest.mark.parametrize("name", ["qwen3_moe_dropless", "qwen3_moe_drop_and_pad", "qwen3_moe_ep2",
                                  "qwen3_moe_ep2_drop_and_pad"])
def test_the_recipe_default_variant_graphs_what_the_h100_preset_graphs(name):
    workload = suite.WORKLOADS[name]
    model = bridge.plan([*workload.base, *workload.variants[suite_workloads.RECIPE_DEFAULT]]).config.model
    assert model.cuda_graph_impl.value == "transformer_engine"
    assert list(model.cuda_graph_modules) == ["moe_router", "moe_preprocess"]


def test_rounds_alternate_the_order_and_keep_the_middle_round(monkeypatch, tmp_path):
    """--rounds: every other round runs the variants in reverse; a row is the variant's middle round,
    with every round's median and the range of the per-round speedups."""
    medians = {("eager", 1): 40.0, ("eager", 2): 60.0, ("eager", 3): 50.0,
               ("full_iteration", 1): 5.0, ("full_iteration", 2): 4.0, ("full_iteration", 3): None}
    order = []

    def run_variant(workload, overrides, job_dir, steps, timeout_s):
        variant, round_number = job_dir.name, int(job_dir.parent.name.removeprefix("round"))
        order.append((round_number, variant))
        median = medians[variant, round_number]
        result = {"status": "completed" if median else "failed", "step_time_ms": {"median": median},
                  "env": {"gpu": "NVIDIA H100 80GB HBM3"}}
        return suite.Measured(["graphbridge", *overrides], result)

    workload = suite.Workload("two variants", ("recipe=llama/tiny",),
                              {"eager": ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",)})
    monkeypatch.setitem(suite.WORKLOADS, "two_variants", workload)
    monkeypatch.setattr(suite, "run_variant", run_variant)
    record = suite.run_workload("two_variants", 40, tmp_path, rounds=3)
    assert order == [(1, "eager"), (1, "full_iteration"), (2, "full_iteration"), (2, "eager"),
                     (3, "eager"), (3, "full_iteration")]
    eager, graphed = record["variants"]["eager"], record["variants"]["full_iteration"]
    assert eager["median_ms"] == 50.0 and eager["round_medians_ms"] == [40.0, 60.0, 50.0]
    assert graphed["median_ms"] == 4.0 and graphed["speedup"] == pytest.approx(12.5)
    assert graphed["speedup_range"] == pytest.approx([8.0, 15.0])  # the failed third round has no ratio
    assert record["suite_command"] == "python benchmarks/suite.py two_variants --steps 40 --rounds 3"
    assert record["host_cpu"] == host_cpu()  # host-bound rows move with it
    assert "| full_iteration | 4.00 |  | 12.50x (8.00-15.00) |" in "\n".join(benchmark_table.table(record | {
        "driver": "580", "date": "2026-11-24", "versions": {**record["versions"], "torch": "2.11"}}))


def test_a_record_names_the_hosts_processor_as_the_kernel_gives_it(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert host_cpu(cpuinfo) == f"AMD EPYC 9654 96-Core Processor, {len(os.sched_getaffinity(0))} CPUs"
    cpuinfo.write_text("processor\t: 0\n")
    assert host_cpu(cpuinfo) is None and host_cpu(tmp_path / "missing") is None


def test_a_suite_row_can_say_what_the_hypervisor_gave_others_while_it_ran(tmp_path):
    """The steal column of /proc/stat's first line (the eighth number, in clock ticks): a row's steal_s is its
    difference over the run (host_noise's test reads it from a real one)."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  3687108 0 180410 1235600 7646 0 2015 10696 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    assert stolen_s(stat) == pytest.approx(10696 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("cpu  3687108 0 180410 1235600\n")  # a kernel too old to count steal
    assert stolen_s(stat) is None and stolen_s(tmp_path / "missing") is None


H100_019 = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "megatron_core": "0.19.2",
            "transformer_engine": "2.10.0", "python": "3.12.3"}


def measured_as(order: list, env: dict, stop_at=None):
    """A run_variant that records what ran, measures 50 ms eager and 5 ms graphed, and stops the whole
    block (as the device's limit does) when it reaches ``stop_at``: (round, variant)."""
    def run_variant(workload, overrides, job_dir, steps, timeout_s):
        ran = (int(job_dir.parent.name.removeprefix("round")), job_dir.name)
        if ran == stop_at:
            raise KeyboardInterrupt
        order.append(ran)
        result = {"status": "completed", "step_time_ms": {"median": 50.0 if ran[1] == "eager" else 5.0}, "env": env}
        return suite.Measured(["graphbridge", *suite.variant_arguments(workload, overrides, steps)], result)
    return run_variant


@pytest.mark.harness
def test_a_block_cut_off_keeps_its_rounds_and_resume_runs_only_the_missing_ones(monkeypatch, tmp_path):
    workload = suite.Workload("two variants", ("recipe=llama/tiny",),
                              {"eager": ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",)})
    monkeypatch.setitem(suite.WORKLOADS, "two_variants", workload)
    out, order = tmp_path / "out", []
    arguments = ["--rounds", "3", "--out", str(out), "--scratch", str(tmp_path / "scratch")]
    monkeypatch.setenv("GRAPHBRIDGE_COMMIT", "aaaaaaa")
    monkeypatch.setattr(suite, "run_variant", measured_as(order, H100_019, stop_at=(2, "eager")))
    with pytest.raises(KeyboardInterrupt):
        suite.main(["two_variants", *arguments])
    record_path = out / "two_variants_h100_mcore0.19.2.json"
    cut = json.loads(record_path.read_text())
    assert (cut["rounds"], cut["rounds_done"]) == (3, 1)  # round 2 had measured full_iteration only: not kept
    assert cut["variants"]["full_iteration"]["speedup"] == pytest.approx(10.0)
    assert "`python benchmarks/suite.py two_variants --steps 40 --rounds 3` (1 of 3 rounds so far)" in "\n".join(
        benchmark_table.table(cut))

    order.clear()
    monkeypatch.setenv("GRAPHBRIDGE_COMMIT", "bbbbbbb")
    monkeypatch.setattr(suite, "run_variant", measured_as(order, H100_019))
    monkeypatch.setattr(suite, "cuda_gpus", lambda: (GPU("NVIDIA H100 80GB HBM3", (9, 0)),))
    versions = {"torch": "2.11.0", "megatron-core": "0.19.2", "transformer-engine": "2.10.0"}
    monkeypatch.setattr(suite, "installed_version", versions.get)
    assert suite.main(["--resume", str(record_path), *arguments]) == 0
    assert order == [(2, "full_iteration"), (2, "eager"), (3, "eager"), (3, "full_iteration")]
    done = json.loads(record_path.read_text())
    assert done["rounds_done"] == 3 and done["versions"]["graphbridge"] == "aaaaaaa + bbbbbbb"
    assert [each["commit"] for each in done["round_records"]] == ["aaaaaaa", "bbbbbbb", "bbbbbbb"]
    assert done["variants"]["full_iteration"]["round_medians_ms"] == [5.0, 5.0, 5.0]


@pytest.mark.harness
def test_a_workload_with_a_variant_this_machine_refuses_is_not_measured_at_all(monkeypatch, tmp_path, capsys):
    """As 0.19.2 with Transformer Engine 2.10 refused the distributed-optimizer row's optimizer graph after its eager
    and full_iteration variants had taken eight device minutes: the plan here refuses first, and nothing runs."""
    wide = ("cuda_graph=full_iteration", "train.num_gpus=4096", "train.global_batch_size=4096")  # no node has 4096
    workload = suite.Workload("one variant too wide", ("recipe=llama/tiny",), {"eager": ("cuda_graph=none",),
                                                                                "wide": wide})
    monkeypatch.setitem(suite.WORKLOADS, "too_wide", workload)
    order = []
    monkeypatch.setattr(suite, "run_variant", measured_as(order, H100_019))
    assert suite.main(["too_wide", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "scratch")]) == 1
    said = capsys.readouterr().out
    assert "too_wide: variant wide cannot run on this machine: [" in said and "train.num_gpus" in said
    assert order == [] and not list((tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize("script, status, says", [
    # a rank stuck in a collective: the variant is stopped, with its children, and the block goes on
    ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)  # {token}']); "
     "print('waiting in all-reduce', flush=True); time.sleep(120)", "timeout", "waiting in all-reduce"),
    ("import sys; print('Traceback: boom', flush=True); sys.exit(1)", "missing", "Traceback: boom"),
])
def test_a_variant_that_hangs_or_dies_is_recorded_with_its_last_lines(monkeypatch, tmp_path, script, status, says):
    token = f"suite-variant-{uuid.uuid4().hex}"  # this case's processes, apart from any other test's
    monkeypatch.setattr(suite, "GRAPHBRIDGE", [sys.executable, "-c", script.replace("{token}", token)])
    workload = suite.WORKLOADS["llama_tiny_te"]
    measured = suite.run_variant(workload, workload.variants["eager"], tmp_path / "eager", 40, timeout_s=3)
    row = measured.row()
    assert row["status"] == status and says in "\n".join(row["log_tail"])
    # the process's life: a stopped one's runs to its stop at the timeout (3 s), a dead one's to its exit
    assert (3 <= row["wall_s"] < 60) if status == "timeout" else (0 <= row["wall_s"] < 3)
    assert row["command"].startswith("graphbridge recipe=llama/tiny cuda_graph=none")
    leftover = subprocess.run(["pgrep", "-f", token], capture_output=True, text=True).stdout.split()
    assert not leftover, f"the variant's children outlived it: {leftover}"


def cut_record(tmp_path: Path, **changes) -> Path:
    """llama_tiny_te measured on an H100 with 0.19.2 for one round of three, then ``changes``."""
    workload = suite.WORKLOADS["llama_tiny_te"]
    rows = {variant: {"status": "completed", "median_ms": 10.0, "command": " ".join(
        ["graphbridge", *suite.variant_arguments(workload, overrides, 40)])} for variant, overrides in workload.variants.items()}
    record = {"workload": "llama_tiny_te", "steps": 40, "rounds": 3, "rounds_done": 1, "gpu": H100_019["gpu"],
              "versions": {**H100_019, "graphbridge": "aaaaaaa"},
              "round_records": [{"commit": "aaaaaaa", "env": H100_019, "rows": rows}]} | changes
    path = tmp_path / "llama_tiny_te_h100_mcore0.19.2.json"
    path.write_text(json.dumps(record))
    return path


@pytest.mark.parametrize("changes, arguments, says", [
    ({}, ["--rounds", "3"], "measured elsewhere (gpu NVIDIA H100 80GB HBM3 there, None here"),
    ({}, ["--rounds", "2"], "it runs --steps 40 --rounds 3; give those"),
    ({"rounds_done": 3}, ["--rounds", "3"], "its 3 rounds are all done; nothing to resume"),
    ({"workload": "no_such_workload"}, ["--rounds", "3"], "not a suite record with its rounds"),
])
def test_resume_refuses_a_record_this_machine_cannot_go_on_with_in_one_line(tmp_path, changes, arguments, says):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite.py"), "--resume",
                           str(cut_record(tmp_path, **changes)), *arguments, "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and says in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_resume_refuses_a_record_whose_variants_ran_other_commands(monkeypatch, tmp_path):
    path = cut_record(tmp_path)
    record = json.loads(path.read_text())
    record["round_records"][0]["rows"]["te_layer"]["command"] += " model.num_layers=4"
    path.write_text(json.dumps(record))
    with pytest.raises(suite.CannotResume, match="llama_tiny_te's variants run other commands now"):
        suite.take_over(path, 40, 3)


@pytest.mark.parametrize("section", ["suite", "vs_bridge", "equivalence"])
def test_the_docs_tables_are_up_to_date_with_the_committed_results(section):
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    body = {"suite": benchmark_table.markdown, "vs_bridge": benchmark_table.vs_bridge_markdown,
            "equivalence": benchmark_table.equivalence_markdown}[section]()
    assert with_section(docs, section, body) == docs, (
        f"docs/benchmarks.md's {section} section is out of date: run python scripts/benchmark_table.py")


def test_the_vs_bridge_table_shows_both_sides_and_the_ratio():
    text = benchmark_table.vs_bridge_markdown()
    assert "| llama32_1b_eager | 1274.07 (1256.31-1308.58) | 1261.82 (1242.33-1296.10) | 1.01x | 32.62 / 32.62 |" in text
    assert "ours only: Bridge 0.3.1 steps the optimizer outside the graph" in text


@pytest.mark.harness
@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE installed: variants run")
def test_a_workload_this_machine_cannot_run_says_which_variant_and_writes_nothing(tmp_path):
    """On a machine without a GPU the torch engine trains, and it has no Transformer Engine graphs."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite.py"), "llama_tiny_te",
                           "--out", str(tmp_path / "results"), "--scratch", str(tmp_path / "scratch")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "llama_tiny_te: variant te_layer cannot run on this machine: [engine_impl]" in done.stdout
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").glob("*.json"))


@pytest.mark.harness
def test_a_workload_where_nothing_completes_writes_no_result_and_fails(monkeypatch, tmp_path, capsys):
    def fails(workload, overrides, job_dir, steps, timeout_s):
        return suite.Measured(["graphbridge", *overrides], {"status": "failed", "reason": "boom"})

    monkeypatch.setattr(suite, "run_variant", fails)
    out = tmp_path / "results"
    assert suite.main(["llama_tiny_local", "--out", str(out), "--scratch", str(tmp_path / "scratch")]) == 1
    assert "llama_tiny_local: no variant completed; nothing written" in capsys.readouterr().out
    assert not list(out.glob("*.json"))


def test_the_trace_summary_counts_per_step_what_a_profile_shows(tmp_path):
    def span(name, cat, ts, dur, correlation=None):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "args": {"correlation": correlation}}
    events = [span("step 7", "user_annotation", 0, 1000), span("step 8", "user_annotation", 1000, 1000),
              span("gemm", "kernel", 10, 300), span("gemm", "kernel", 1010, 300), span("copy", "gpu_memcpy", 200, 200),
              span("cudaLaunchKernel", "cuda_runtime", 5, 4), span("cudaLaunchKernel", "cuda_runtime", 1005, 4),
              span("cudaStreamSynchronize", "cuda_runtime", 400, 100),
              # one replay of two kernels with 3 us between them; a kernel of another launch inside its span
              span("cudaGraphLaunch", "cuda_runtime", 900, 5, correlation=42), span("add", "kernel", 910, 20, 42),
              span("mul", "kernel", 933, 7, 42), span("other", "kernel", 931, 1, 7)]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": events}))
    run = subprocess.run([sys.executable, "benchmarks/trace_summary.py", str(tmp_path), "--json", str(tmp_path / "s.json")],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary, = json.loads((tmp_path / "s.json").read_text())
    assert summary["steps"] == 2
    # the copy overlaps a gemm, the other launch's kernel a replay gap
    assert summary["gpu_busy_ms_per_step"] == pytest.approx((390 + 300 + 20 + 1 + 7) / 1e3 / 2)
    assert summary["launches_per_step"] == 1 and summary["graph_replays_per_step"] == 0.5
    assert summary["replay_span_ms_per_step"] == pytest.approx(30 / 1e3 / 2)
    assert summary["replay_idle_ms_per_step"] == pytest.approx(3 / 1e3 / 2)
    assert summary["host_waits_per_step"] == {"cudaStreamSynchronize": 0.5}
    assert list(summary["top_kernels_ms_per_step"]) == ["gemm", "copy", "add", "mul", "other"]
    assert "GPU busy 0.36 ms/step" in run.stdout
    assert "graph replays span 0.01 ms/step, of which 0.00 ms between kernels" in run.stdout


def test_the_gpu_differential_tables_are_up_to_date_with_the_committed_records():
    docs = (ROOT / "docs" / "gpu_differential.md").read_text()
    assert with_section(docs, "differential", differential_table.markdown()) == docs, (
        "docs/gpu_differential.md is out of date: run python scripts/differential_table.py")


def test_the_confirming_rule_simulation_takes_a_faster_contender_far_more_often_than_a_slower_one():
    run = subprocess.run([sys.executable, "benchmarks/confirming_rule.py", "--trials", "400", "--seed", "1"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    taken = [float(line.split("took the contender in ")[1].split("%")[0]) for line in run.stdout.splitlines()
             if "took the contender in" in line]
    faster, level, slower_3_percent, slower_by_the_scatter = taken
    assert faster > 60 and slower_by_the_scatter < 10 and faster > level > slower_by_the_scatter, run.stdout


def test_a_row_keeps_the_runs_first_and_last_loss_and_its_parameter_counts():
    """Workloads whose parameters train apart (LoRA) are compared by what trains and by the loss it reaches."""
    result = {"status": "completed", "loss": [8.49, 8.45, 8.42], "parameters": {"total": 29794816, "trainable": 1998848}}
    row = suite.Measured(["graphbridge", "recipe=llama/tiny_lora"], result).row()
    assert row["loss"] == {"first": 8.49, "last": 8.42} and row["parameters"]["trainable"] == 1998848
    assert suite.Measured(["graphbridge"], {"status": "failed"}).row()["loss"] is None


def test_the_workloads_record_keeps_a_row_a_variant_and_each_workloads_record(monkeypatch, tmp_path):
    """benchmarks/workloads.py (issue 83's record): every workload it names, eager and graphed, a row a variant with
    loss, step time, reserved peak and parameters; a workload this machine refuses is named with its reason."""
    import workloads

    refused = workloads.RECORDED[-1]

    def run_variant(workload, overrides, job_dir, steps, timeout_s):
        graphed = "cuda_graph=none" not in overrides
        result = {"status": "completed", "step_time_ms": {"median": 5.0 if graphed else 50.0},
                  "memory": {"peak_reserved_gb": 3.0}, "loss": [8.3, 4.2], "graph_count": 8 * graphed,
                  "parameters": {"total": 30, "trainable": 2}, "env": H100_019}
        return suite.Measured(["graphbridge", *overrides], result)

    monkeypatch.setattr(suite, "run_variant", run_variant)
    monkeypatch.setattr(suite, "cannot_run_here", lambda workload, steps: "too wide" if workload is suite.WORKLOADS[
        refused] else None)
    assert workloads.main(["--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]) == 1
    record = json.loads((tmp_path / "workloads.json").read_text())
    assert record["refused"] == {refused: "too wide"} and set(record["records"]) == set(workloads.RECORDED[:-1])
    measured = {(row["workload"], row["variant"]): row for row in record["rows"]}
    assert set(measured) == {(name, variant) for name in workloads.RECORDED[:-1]
                             for variant in suite.WORKLOADS[name].variants}
    graphed = measured["llama_tiny_packed", "te_mlp"]
    assert graphed["loss"] == {"first": 8.3, "last": 4.2} and graphed["speedup"] == pytest.approx(10.0)
    assert graphed["peak_reserved_gb"] == 3.0 and graphed["parameters"] == {"total": 30, "trainable": 2}
    # Named workloads are measured into that record; the others keep their rows, and the refused one may run now.
    monkeypatch.setattr(suite, "cannot_run_here", lambda workload, steps: None)
    kept = record["records"]["llama_tiny_lora"]
    assert workloads.main([refused, "--out", str(tmp_path), "--scratch", str(tmp_path / "scratch")]) == 0
    again = json.loads((tmp_path / "workloads.json").read_text())
    assert again["refused"] == {} and list(again["records"]) == list(workloads.RECORDED)
    assert again["records"]["llama_tiny_lora"] == kept
    with pytest.raises(SystemExit):
        workloads.main(["llama_tiny_bogus", "--out", str(tmp_path)])
