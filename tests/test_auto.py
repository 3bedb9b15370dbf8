"""cuda_graph=auto as the command line shows it on this CPU: the plan lists its candidates (every choice that
trains the same, the optimizer inside the full-iteration graph included), the cost of measuring them and the cache
key; the run trains eagerly and says why; what auto cannot decide for, and a bad cache file, are one line each; and
the benchmark suite's auto row says what auto chose (the probe and its decision: test_auto_probe.py)."""

import json
import os
import sys
from pathlib import Path

import pytest

import bridge
from bridge.auto.cache import cache_path
from bridge.auto.candidates import compose_candidate, plan_auto
from bridge.machine import Machine
from bridge.planning import build_plan
from bridge.prepare import prepare
from tests.sampling import every

ROOT = Path(__file__).resolve().parent.parent
AUTO = ("recipe=llama/tiny", "cuda_graph=auto")
OPTIMIZER_IN_GRAPH = "full_iteration+optimizer_in_graph"
DENSE_CANDIDATES = ["none", "full_iteration", "local_layer", "te_attn", "te_attn_mlp", "te_layer", "te_mlp",
                    OPTIMIZER_IN_GRAPH]
DENSE_REFUSED = {"te_attn_moe_router": "moe_modules_need_moe_model", "te_mamba": "mamba_layers",
                 "te_moe": "moe_modules_need_moe_model", "te_moe_router": "moe_modules_need_moe_model"}


def environment(cache_home) -> dict:
    return {**os.environ, "XDG_CACHE_HOME": str(cache_home)}


# --- on this CPU machine, through the command line ------------------------------------------------------


README_LINE = "graphbridge recipe=llama/tiny cuda_graph=auto train.train_iters=5"
"""The README's auto run ("cuda_graph=auto" in its graph choices), which tests/test_readme.py leaves to this module."""


def test_auto_on_a_cpu_trains_eagerly_and_records_why(cli, tmp_path, cache_home):
    assert f"\n    {README_LINE}\n" in (ROOT / "README.md").read_text()
    result = cli(*README_LINE.split()[1:], "hydra.run.dir=run", cwd=tmp_path, env=environment(cache_home))
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if "cuda_graph=auto:" in line]  # its log, not the commands
    assert len(said) == 1 and "no CUDA device here, so graphs cannot pay off" in said[0], said
    assert "auto (chose none) -> none" in result.stdout  # the run's summary names auto and its choice
    record = json.loads((tmp_path / "run" / "result.json").read_text())
    assert record["status"] == "completed" and record["impl"] == record["effective_impl"] == "none"
    auto = record["auto"]
    assert auto["chosen"] == "none" and auto["source"] == "no_cuda_device"
    # graph choices are not judged for a machine that never runs them: eager alone, as trained
    assert [(c["choice"], c["status"], c["median_ms"]) for c in auto["candidates"]] == [("none", "not_probed", None)]
    assert not (tmp_path / "run" / "auto").exists() and not cache_home.exists()  # no probe, nothing cached


PLANNED = {
    "default": (),
    "local spec": ("model.transformer_impl=local",),
    "distributed on 0.19.2": ("ddp.use_distributed_optimizer=true", "plan.megatron_core=0.19.2"),
    "distributed on 0.16.1": ("ddp.use_distributed_optimizer=true", "plan.megatron_core=0.16.1"),
    "optimizer kept out": ("optimizer.optimizer_in_graph=false",),
    "again": ("train.train_iters=500",),
    "tp2": ("model.tensor_model_parallel_size=2", "train.num_gpus=2"),
    "dp2": ("train.num_gpus=2", "train.global_batch_size=4"),
}
"""The workloads whose JSON plan on an H100 node the tests below read: llama/tiny's auto with these overrides."""
TEXT_PLAN = ("mode=plan", *AUTO, "gpu=h100")
CPU_PLAN = ("mode=plan", *AUTO)


def json_plan(overrides) -> tuple:
    return ("mode=plan", "plan.format=json", *AUTO, "gpu=h100", *overrides)


@pytest.fixture(scope="session")
def plan_cache(shared_tmp) -> Path:
    """The decision cache the plans below read, which none of them writes: one path for every pytest-xdist worker."""
    return shared_tmp / "auto_plans_cache" / "graphbridge" / "cuda_graph_auto.json"


@pytest.fixture(scope="session")
def plans(cli_batch, plan_cache) -> dict:
    """TEXT_PLAN, CPU_PLAN and each JSON plan of PLANNED -> its `graphbridge` result, all planned by one process a
    session (conftest.py's cli_batch, which also checks that they write nothing): each auto plan composes a dozen
    candidates, and a process of its own per plan added ~2 s to each."""
    commands = [TEXT_PLAN, CPU_PLAN, *(json_plan(overrides) for overrides in PLANNED.values())]
    return cli_batch("auto_plans", commands, env=environment(plan_cache.parents[1]))


def planned_auto(plans, name: str) -> dict:
    """The auto section of the JSON plan of PLANNED[name]."""
    result = plans[json_plan(PLANNED[name])]
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["auto"]


def test_the_plan_lists_the_candidates_and_how_they_are_measured(plans, plan_cache):
    result = plans[TEXT_PLAN]
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for choice in DENSE_CANDIDATES:
        assert f"\n    {choice} " in text, choice
    for choice, rule in DENSE_REFUSED.items():
        assert f"{choice} ({rule})" in text
    order = ", ".join(["none", *DENSE_CANDIDATES[1:], "none"])
    assert (f"probe:     round 1: 9 runs ({order}), the first of 34 steps, 30 timed (warmup and capture excluded), "
            "the others of 14 steps, 10 timed, where screening pays; the faster half") in text
    assert "goes on to round 2: eager, those, eager, 34 steps each, whose medians decide" in text
    assert "starting a run costs more than the steps screening saves, every run of round 1 is of 34 steps" in text
    assert ("Where eager is then kept for the noise and the probe cannot rule out that the fastest graph choice "
            "gains more than 3%, a confirming round times it (or the broadest choice within its reach) and eager "
            "again in pairs, alternating, 34 steps each, until all their runs settle it (from the pair 2 on, at most "
            "6 pairs)") in text
    assert (f"\n    {OPTIMIZER_IN_GRAPH}  cuda_graph=full_iteration optimizer.optimizer_in_graph=true: forward and "
            "backward of the whole iteration") in text and "(optimizer step inside the graph)" in text
    assert f"cache:     {plan_cache} (0 decision(s)): none for this workload" in text
    # a plan writes nothing, and probes nothing: cli_batch checked that the plans left their directory empty

    planned = planned_auto(plans, "default")
    assert [c["choice"] for c in planned["candidates"] if c["accepted"]] == DENSE_CANDIDATES
    assert planned["probe"]["runs"] == ["none", *DENSE_CANDIDATES[1:], "none"]
    assert planned["probe"]["confirming"] == {"first_runs": 4, "most_runs": 12, "timed_steps": 30,
                                                  "gain_over": 0.03}


def test_on_the_local_spec_auto_weighs_transformer_engines_graphs_too(plans):
    # They replay the causal mask their attention was captured with (transformer_engine.causal_replays), so they
    # train as eager there: gpu_witnesses_6e4647f.json, both releases.
    local = planned_auto(plans, "local spec")
    assert [c["choice"] for c in local["candidates"] if c["accepted"]] == DENSE_CANDIDATES


def test_the_optimizer_in_the_graph_is_a_candidate_unless_the_user_chose_where_it_runs(plans):
    by_choice = {c["choice"]: c for c in planned_auto(plans, "default")["candidates"]}
    assert by_choice[OPTIMIZER_IN_GRAPH]["overrides"] == ["cuda_graph=full_iteration",
                                                          "optimizer.optimizer_in_graph=true"]
    assert by_choice[OPTIMIZER_IN_GRAPH]["graphed"].endswith("(optimizer step inside the graph)")
    on_019 = {c["choice"]: c for c in planned_auto(plans, "distributed on 0.19.2")["candidates"]}
    assert on_019[OPTIMIZER_IN_GRAPH]["accepted"]
    assert "megatron-core's optimizer graph" in on_019[OPTIMIZER_IN_GRAPH]["graphed"]
    on_016 = {c["choice"]: c for c in planned_auto(plans, "distributed on 0.16.1")["candidates"]}
    assert on_016[OPTIMIZER_IN_GRAPH]["refused_by"] == ["optimizer_graph_distributed"]
    kept_out = planned_auto(plans, "optimizer kept out")  # the user's value holds
    assert OPTIMIZER_IN_GRAPH not in [c["choice"] for c in kept_out["candidates"]]


def test_the_cache_key_holds_the_layout_and_the_optimizer_switch(plans):
    keys = {name: planned_auto(plans, name)["cache"]["key"]
            for name in ("default", "again", "tp2", "dp2", "optimizer kept out")}
    assert keys["again"] == keys["default"]  # the run's length is not the workload
    assert len({keys[name] for name in ("default", "tp2", "dp2", "optimizer kept out")}) == 4, keys


def test_the_plan_on_a_cpu_says_the_run_trains_eagerly(plans):
    result = plans[CPU_PLAN]
    assert result.returncode == 0, result.stderr
    assert "graphed:   nothing (eager): cuda_graph=auto measures graphs on a CUDA device" in result.stdout
    assert "without a probe or graph candidates; gpu=<preset> (e.g. gpu=h100) plans for a GPU node" in result.stdout
    assert "local_layer" not in result.stdout and "refused:" not in result.stdout  # nothing judged for this CPU
    assert "probe:     none (no CUDA device here)" in result.stdout


@pytest.mark.parametrize("words", [(), AUTO, ("recipe=qwen/tiny", "cuda_graph=auto", "model.num_layers=2")],
                         ids=["recipe default", "typed", "moe"])
def test_on_a_cpu_the_eager_candidate_is_the_plans_own_configuration(words):
    """Judged without a composition of its own: it must be the configuration `graphbridge <words> cuda_graph=none`
    composes, which it is while conf/cuda_graph/auto.yaml sets what none.yaml sets."""
    laptop = Machine(gpus=(), packages={"torch": "2.13.0"})
    plan = build_plan(prepare(bridge.compose(list(words))), laptop, graphs_measured=True)
    [eager] = plan_auto(plan, list(words), laptop).candidates
    assert eager.choice == "none" and eager.accepted
    assert eager.plan.config == prepare(compose_candidate(list(words), eager.option)).config


@pytest.mark.parametrize("overrides, rule", [
    (("gpu=h100", "train.num_gpus=16", "train.global_batch_size=32"), "auto_one_node"),
    (("model.cuda_graph_impl=local",), "auto_graph_fields"),
    (("model.external_cuda_graph=true",), "auto_graph_fields"),
])
def test_what_auto_cannot_decide_for_is_refused_in_one_line(cli, tmp_path, cache_home, overrides, rule):
    result = cli("mode=plan", *AUTO, *overrides, cwd=tmp_path, env=environment(cache_home))
    assert result.returncode == 2 and f"[{rule}]" in result.stderr and "Traceback" not in result.stderr
    trained = cli(*AUTO, *overrides, "hydra.run.dir=run", cwd=tmp_path, env=environment(cache_home))
    assert trained.returncode == 2 and f"[{rule}]" in trained.stderr and not (tmp_path / "run").exists()


# Text that is no JSON, and JSON of the wrong shape, by default; two more shapes under -m slow.
@pytest.mark.parametrize("damage", every(["not json {", '{"format": 1, "decisions": []}', "[]",
                                          '{"format": 1, "decisions": {"k": {"chosen": 3}}}'], 2))
def test_a_bad_cache_file_is_one_line_and_never_a_traceback(cli, tmp_path, cache_home, damage):
    cache_path().parent.mkdir(parents=True)
    cache_path().write_text(damage)
    result = cli("mode=plan", *AUTO, "gpu=h100", cwd=tmp_path, env=environment(cache_home))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    told = [line for line in result.stdout.splitlines() if "cannot be read" in line]
    assert len(told) == 1 and str(cache_path()) in told[0] and "delete it" in told[0]


# --- the benchmark suite's auto variant -----------------------------------------------------------------


@pytest.fixture
def suite_with_auto(monkeypatch):
    """benchmarks/suite.py with a workload of eager, te_attn and auto (with_auto), whose variants nothing trains."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import suite

    variants = {"eager": ("cuda_graph=none",), "te_attn": ("cuda_graph=te_attn",), suite.AUTO: ("cuda_graph=auto",)}
    monkeypatch.setitem(suite.WORKLOADS, "with_auto", suite.Workload("with auto", ("recipe=llama/tiny",), variants))
    return suite


def test_the_suites_auto_row_says_what_it_chose_and_how_it_compares_with_the_best(suite_with_auto, monkeypatch,
                                                                                  tmp_path):
    import benchmark_table
    suite = suite_with_auto
    medians = {"eager": 10.0, "te_attn": 8.0, "auto": 8.2}

    def run_variant(workload, overrides, job_dir, steps, timeout_s):
        result = {"status": "completed", "step_time_ms": {"median": medians[job_dir.name]},
                  "env": {"gpu": "NVIDIA H100 80GB HBM3"}}
        if job_dir.name == "auto":
            result["auto"] = {"chosen": "te_attn", "source": "probe", "probe": {"wall_s": 41.6}}
        return suite.Measured(["graphbridge", *overrides], result)

    monkeypatch.setattr(suite, "run_variant", run_variant)
    record = suite.run_workload("with_auto", 40, tmp_path)
    auto = record["variants"]["auto"]
    assert auto["auto_chosen"] == "te_attn" and auto["vs_best"] == pytest.approx(8.2 / 8.0)
    assert auto["auto_probe_s"] == 41.6
    assert record["variants"]["te_attn"]["auto_chosen"] is None and "vs_best" not in record["variants"]["te_attn"]
    table = "\n".join(benchmark_table.table(record | {"driver": "580", "date": "2026-11-25",
                                                      "versions": {**record["versions"], "torch": "2.11"}}))
    assert "| auto (chose te_attn; probe 42 s; 1.02x the best; its choice's variant 1.00x) | 8.20 |" in table
    assert all(suite.AUTO in workload.variants for name, workload in suite.WORKLOADS.items()
               if name in ("llama_tiny_local", "llama_tiny_te", "llama32_1b", "qwen3_moe_dropless",
                           "qwen3_moe_drop_and_pad"))


def test_the_suites_auto_row_over_rounds_keeps_every_probe_and_each_rounds_ratio(suite_with_auto, monkeypatch,
                                                                                 tmp_path):
    import benchmark_table
    suite = suite_with_auto
    # Three rounds: each ratio from one round; the probe ran in the first, the second took the cache (whose record
    # carries the probe that made the decision), and the third, resumed on a fresh machine, probed again: its probe
    # is the row's, and the first's stays beside it.
    medians = {("eager", 1): 10.0, ("te_attn", 1): 8.0, ("auto", 1): 8.4, ("eager", 2): 14.0, ("te_attn", 2): 11.0,
               ("auto", 2): 11.0, ("eager", 3): 10.0, ("te_attn", 3): 8.2, ("auto", 3): 8.1}
    probed = {"chosen": "te_attn", "eager_ms": 10.1, "noise_ms": 0.3, "probe": {"wall_s": 41.6, "imports_s": 12.0},
              "candidates": [{"choice": "te_attn", "status": "completed", "median_ms": 8.0, "spread_ms": 0.4,
                              "wall_s": 3.1, "job": "/scratch/auto/round1/1"},
                             {"choice": "te_layer", "status": "failed", "median_ms": None, "spread_ms": None,
                              "wall_s": 10.6, "reason": "RuntimeError: CUDA error: out of memory",
                              "job": "/scratch/auto/round1/2"}]}

    def run_round(workload, overrides, job_dir, steps, timeout_s):
        ran = (job_dir.name, int(job_dir.parent.name.removeprefix("round")))
        result = {"status": "completed", "step_time_ms": {"median": medians[ran]}, "env": {"gpu": "NVIDIA H100 80GB HBM3"}}
        if ran[0] == "auto":
            result["auto"] = {**probed, "source": "cache" if ran[1] == 2 else "probe"}
            if ran[1] == 3:
                result["auto"]["probe"] = {"wall_s": 30.2, "imports_s": 9.0}
        return suite.Measured(["graphbridge", *overrides], result)

    monkeypatch.setattr(suite, "run_variant", run_round)
    record = suite.run_workload("with_auto", 40, tmp_path, rounds=3)
    auto = record["variants"]["auto"]
    assert auto["vs_best"] == pytest.approx(1.0) and auto["vs_best_range"] == pytest.approx([8.1 / 8.2, 8.4 / 8.0])
    assert auto["chosen_vs_best"] == pytest.approx(1.0) and auto["chosen_vs_best_range"] == pytest.approx([1.0, 1.0])
    assert auto["auto_chosen"] == "te_attn"
    assert auto["auto_probe_s"] == 30.2 and auto["auto_probe"]["imports_s"] == 9.0
    assert auto["auto_probes_s"] == [41.6, 30.2]
    assert auto["auto_probe"]["candidates"] == [  # the width tells close ones apart; the reason, why one failed
        {"choice": "te_attn", "status": "completed", "median_ms": 8.0, "spread_ms": 0.4, "steps": None, "wall_s": 3.1,
         "reason": None},
        {"choice": "te_layer", "status": "failed", "median_ms": None, "spread_ms": None, "steps": None, "wall_s": 10.6,
         "reason": "RuntimeError: CUDA error: out of memory"}]
    assert [each["rows"]["auto"]["auto_probe"] is None for each in record["round_records"]] == [False, True, False]
    # The first H200 round of the Qwen3 proxy (75b3d6e, kept before the suite kept the probe): auto chose eager,
    # the round's fastest variant, and its own eager run landed 34 % slower than the eager variant's.
    superseded = ROOT / "benchmarks/results/superseded/qwen3_moe_dropless_h200_mcore0.19.2_bdbbf68.json"
    cut = json.loads(superseded.read_text())
    first = suite.summarize("qwen3_moe_dropless", 40, 3, cut["round_records"][:1])["variants"]["auto"]
    assert first["auto_probe_s"] == 236.1 and first["auto_chosen"] == "none" and first["chosen_vs_best"] == 1.0
    assert first["vs_best"] == pytest.approx(1.336, abs=1e-3) and first["chosen_vs_best_range"] is None
    # Its second round (b217322) made the eager variant's process the slow one: of two rounds the median is the
    # lower ratio, so the range is what shows the choice's variant at 1.44x the best there.
    both = suite.summarize("qwen3_moe_dropless", 40, 3, cut["round_records"][:2])["variants"]["auto"]
    assert both["chosen_vs_best"] == 1.0 and both["chosen_vs_best_range"] == pytest.approx([1.0, 1.44], abs=5e-3)
    # Three such rounds of llama/tiny (TE spec) carry the one probe's 83.8 s each: it counts once.
    legacy = json.loads((ROOT / "benchmarks/results/llama_tiny_te_h200_mcore0.19.2.json").read_text())
    assert suite.summarize("llama_tiny_te", 40, 3, legacy["round_records"])["variants"]["auto"]["auto_probes_s"] == [83.8]
    assert ("| auto (chose te_attn; probe 30 s (earlier rounds' 42 s); 1.00x the best (0.99-1.05); its choice's "
            "variant 1.00x (1.00-1.00)) |") in "\n".join(
        benchmark_table.table({"workload": "with_auto", "description": "", "gpus": 1, "gpu": "H100", "driver": "580",
                               "date": "2026-11-28", "suite_command": "x", "variants": {"auto": auto},
                               "versions": {"torch": "2.11", "megatron_core": "0.19.2", "transformer_engine": "2.10.0",
                                            "graphbridge": "abc"}}))


def test_the_suites_auto_row_pools_each_configurations_processes_where_one_a_variant_ranks_by_luck(
        suite_with_auto, monkeypatch, tmp_path):
    import benchmark_table
    suite = suite_with_auto
    variants = {"eager": ("cuda_graph=none",), "recipe_default": (), "te_attn": ("cuda_graph=te_attn",),
                suite.AUTO: ("cuda_graph=auto",)}
    monkeypatch.setitem(suite.WORKLOADS, "levels", suite.Workload("levels", ("recipe=llama/tiny",), variants))
    # Round 2's te_attn variant lands in a slow process: that round ranks recipe_default first, the pooled levels
    # do not.
    medians = {("eager", 1): 10.0, ("recipe_default", 1): 9.0, ("te_attn", 1): 8.0, ("auto", 1): 9.0,
               ("eager", 2): 14.0, ("recipe_default", 2): 9.5, ("te_attn", 2): 12.0, ("auto", 2): 8.0}
    runs = [("none", "completed", 11.0), ("te_attn", "completed", 7.0), ("te_layer", "failed", None),
            ("none", "completed", 9.0)]
    probed = {"chosen": "te_attn", "probe": {"wall_s": 41.6},
              "candidates": [{"choice": choice, "status": status, "median_ms": ms} for choice, status, ms in runs]}

    def run_round(workload, overrides, job_dir, steps, timeout_s):
        ran = (job_dir.name, int(job_dir.parent.name.removeprefix("round")))
        result = {"status": "completed", "step_time_ms": {"median": medians[ran]},
                  "env": {"gpu": "NVIDIA H100 80GB HBM3"}}
        if ran[0] == "auto":  # the second round takes the cached decision: no probe runs of its own
            result["auto"] = {**probed, "source": "probe"} if ran[1] == 1 else {"chosen": "te_attn", "source": "cache"}
        return suite.Measured(["graphbridge", *overrides], result)

    monkeypatch.setattr(suite, "run_variant", run_round)
    record = suite.run_workload("levels", 40, tmp_path, rounds=2)
    assert record["variants"]["auto"]["chosen_vs_best_range"] == pytest.approx([1.0, 12.0 / 9.5])
    table = "\n".join(benchmark_table.table(record | {"driver": "580"}))
    # te_attn: its two variants, auto's two runs and the probe's; eager as the probe's none; the failed run is left out
    assert ("Every process of the record by configuration (mean of their medians, ms; how many): te_attn 8.80 (5), "
            "recipe_default 9.25 (2), none 11.00 (4). Auto's choice over the fastest of these: te_attn 1.00x.") in table
