"""The main job: `graphbridge`, whose recipe (llama/tiny) measures its graph choice (cuda_graph=auto). On this CPU
it trains eagerly and its last lines say so, why, what to run next and where its result is; a graph choice or graph
fields on the command line still win over that default; and the closing lines of a GPU run that auto graphed show
the speedup its probe measured (a synthetic result: no GPU here)."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bridge.run_report import REAL_MODEL_PLAN, print_summary

@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU says; on a GPU auto probes")
def test_the_first_run_on_a_cpu_says_why_it_trained_eagerly_what_next_and_where_its_result_is(cpu_run, cli, tmp_path):
    run = cpu_run["result"]  # conftest.py's CPU_RUN: no graph choice, the recipe's own
    lines = run.stdout.splitlines()
    assert "graphed:   nothing, the run trained eagerly" in lines
    [why] = [line for line in lines if line.startswith("why eager:")]
    assert "graphs need a CUDA device" in why and "`graphbridge recipe=llama/tiny cuda_graph=auto`" in why
    # The path whole, alone on the last line, whatever the terminal's width: copied, it opens the result.
    path = Path(lines[-1])
    assert path.is_absolute() and path.name == "result.json" and path.parent.parent.parent.name == "outputs"
    assert json.loads(path.read_text())["auto"]["source"] == "no_cuda_device"
    [next_line] = [line for line in lines if line.startswith("next:")]
    command = shlex.split(next_line.split("`")[1])
    assert command[0] == "graphbridge"
    env = {**os.environ, "XDG_CACHE_HOME": str(cpu_run["cache"])}
    planned = cli(*command[1:], cwd=tmp_path, env=env)  # the next command runs here too
    assert planned.returncode == 0 and "graphbridge plan: VALID" in planned.stdout, planned.stderr[-3000:]


CHOSEN_ON_THE_COMMAND_LINE = [
    ((), True, "none"),  # the recipe's auto: eager until a probe on a GPU picks
    (("cuda_graph=none",), False, "none"),
    (("cuda_graph=full_iteration",), False, "full_iteration"),
    (("model.cuda_graph_impl=none",), False, "none"),  # graph fields win over the recipe's auto, none among them
    (("model.cuda_graph_impl=local",), False, "local"),
    (("model.enable_cuda_graph=true",), False, "local"),  # an older spelling too
]


@pytest.fixture(scope="session")
def planned(cli_batch) -> dict:
    """The plan of each command line above, all of them by one `graphbridge` process a session (cli_batch)."""
    return cli_batch("main_job_choices", [("mode=plan", "plan.format=json", *overrides)
                                          for overrides, _, _ in CHOSEN_ON_THE_COMMAND_LINE])


@pytest.mark.parametrize("overrides, measured, impl", CHOSEN_ON_THE_COMMAND_LINE)
def test_a_graph_choice_or_graph_fields_on_the_command_line_win_over_the_recipes_auto(planned, overrides, measured,
                                                                                       impl):
    result = planned[("mode=plan", "plan.format=json", *overrides)]
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["valid"] and (plan["auto"] is not None) == measured and plan["graphs"]["impl"] == impl


def test_the_recipes_auto_leaves_a_job_of_several_nodes_eager_and_says_so(cli, tmp_path):
    result = cli("mode=plan", "plan.format=json", "gpu=h100", "train.num_gpus=16", "train.global_batch_size=32",
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["valid"] and plan["auto"] is None and plan["graphs"]["impl"] == "none"
    assert any("probes on one node" in note and "train.num_nodes=2" in note for note in plan["notes"])


def probed(chosen: str, reason: str, eager_ms: float, medians: dict) -> dict:
    """The auto record a probe leaves: eager's two runs and one run of each graph choice."""
    runs = [("none", eager_ms), *medians.items(), ("none", eager_ms + 0.5)]
    return {"chosen": chosen, "reason": reason, "eager_ms": eager_ms, "noise_ms": 0.4, "source": "probe",
            "candidates": [{"choice": choice, "status": "completed", "median_ms": median} for choice, median in runs]}


def gpu_result(impl: str, modules: list, auto, graph_count: int = 0, capture_step=None) -> dict:
    """A completed result.json of llama/tiny on an H100 (only the keys the summary reads)."""
    return {"status": "completed", "engine": "megatron", "device": "cuda", "env": {"gpu": "NVIDIA H100 80GB HBM3"},
            "impl": "none" if auto else impl, "effective_impl": impl, "modules": modules, "auto": auto,
            "step_time_ms": {"median": 10.2, "p10": 10.0, "p90": 10.5, "count": 40}, "tokens_per_s": 50000.0,
            "tflops_per_gpu": 40.0, "memory": {"peak_allocated_gb": 2.0, "peak_reserved_gb": 2.5},
            "capture_step": capture_step, "capture_time_s": 1.5 if capture_step is not None else None,
            "graph_count": graph_count, "loss": [8.3, 7.9],
            "job": {"choices": {"recipe": "llama/tiny", "cuda_graph@_global_": "auto"}, "overrides": []}}


TE_ATTN_MLP = probed("te_attn_mlp", "faster", 14.0, {"full_iteration": 11.0, "te_attn_mlp": 10.0})
KEPT_EAGER = probed("none", "the fastest graph choice, te_attn, is within the probe's noise of 0.40 ms (13.80 ms a "
                            "step against eager's 14.00 ms): training eagerly", 14.0, {"te_attn": 13.8})


@pytest.mark.parametrize("result, expected", [
    (gpu_result("transformer_engine", ["attn", "mlp"], TE_ATTN_MLP, 16, 3),
     ["graphed:   attn, mlp of each layer (cuda_graph=auto chose te_attn_mlp; 16 graph(s) captured at step 3)",
      "speedup:   1.40x eager's speed: te_attn_mlp took 10.00 ms a step in the probe, eager 14.00 ms",
      f"next:      `{REAL_MODEL_PLAN}` shows what auto would measure for Llama 3 8B on an H100 node"]),
    (gpu_result("none", [], KEPT_EAGER),
     ["graphed:   nothing, the run trained eagerly",
      f"why eager: cuda_graph=auto: {KEPT_EAGER['reason']}",
      f"next:      `{REAL_MODEL_PLAN}` shows what auto would measure for Llama 3 8B on an H100 node"]),
    (gpu_result("full_iteration", [], None, 1, 3),  # a choice named on the command line: nothing measured eager
     ["graphed:   forward and backward of the whole iteration (model.cuda_graph_impl=full_iteration; 1 graph(s) "
      "captured at step 3)",
      "next:      `graphbridge recipe=llama/tiny cuda_graph=auto` times each graph choice against eager and trains "
      "with the fastest"]),
    # the torch engine's torch.compile: its effective impl is no entry of the graph vocabulary
    ({**gpu_result("torch_compile:reduce-overhead", [], None, 1), "engine": "torch"},
     ["graphed:   the compiled model's steps, in torch.compile's CUDA graphs (torch_compile=reduce-overhead)",
      "next:      `graphbridge recipe=llama/tiny cuda_graph=auto` times each graph choice against eager and trains "
      "with the fastest"]),
    ({**gpu_result("torch_compile:default", [], None), "engine": "torch"},
     ["graphed:   nothing; torch.compile compiled the model without CUDA graphs (torch_compile=default)",
      "next:      `graphbridge recipe=llama/tiny cuda_graph=auto` times each graph choice against eager and trains "
      "with the fastest"]),
])
def test_a_gpu_runs_closing_lines_say_what_was_graphed_what_it_bought_and_what_next(capsys, tmp_path, result,
                                                                                    expected):
    print_summary(result, tmp_path / "result.json")
    lines = capsys.readouterr().out.splitlines()
    assert lines[-len(expected) - 1:] == [*expected, str(tmp_path / "result.json")]


def test_after_a_confirming_round_the_speedup_is_of_the_mean_runs_the_decision_weighed(capsys, tmp_path):
    auto = probed("te_layer", "timed again", 12.0, {"te_layer": 10.0})
    auto["candidates"] += [{"choice": "te_layer", "status": "completed", "median_ms": 8.0},
                           {"choice": "te_layer", "status": "stopped_early", "median_ms": 1.0}]
    print_summary(gpu_result("transformer_engine", [], auto, 8, 3), tmp_path / "result.json")
    assert "speedup:   1.33x eager's speed: te_layer took 9.00 ms a step in the probe, eager 12.00 ms" in (
        capsys.readouterr().out.splitlines())


KILLED_RUN = '''
import multiprocessing, sys, time
from pathlib import Path


def run(drawn):
    from bridge.trainer import progress_bar
    progress_bar(total=3).update(1)
    Path(drawn).touch()
    time.sleep(120)


if __name__ == "__main__":
    drawn = Path(sys.argv[1])
    process = multiprocessing.get_context("forkserver").Process(target=run, args=(str(drawn),))
    process.start()
    while not drawn.exists() and process.is_alive():
        time.sleep(0.1)
    process.kill()  # as cuda_graph=auto's probe kills a run once its result is written
    process.join()
'''


def test_a_killed_run_leaves_its_parent_no_semaphore_to_warn_about(tmp_path):
    """The probe kills each run after its result: the run's progress bar holds no named semaphore, whose leak the
    parent's resource tracker would report after the result path (bridge.trainer.progress_bar)."""
    script = tmp_path / "killed_run.py"
    script.write_text(KILLED_RUN)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "drawn")], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and (tmp_path / "drawn").exists(), done.stderr[-2000:]
    assert "leaked semaphore" not in done.stderr
