"""graphbridge-workload as a user types it: a dry run prints the plan and the equivalent graphbridge command line
and writes nothing, an invalid config or a bad or misspelled flag exits 2 naming the rule or the flag, a run trains
under the log dir, a Slurm dry run submits nothing, and Bridge's README command lines plan as pasted (each flag's
overrides: test_workload_cli.py)."""

import json
import os
import sys


def test_dryrun_prints_the_plan_through_the_console_script_and_leaves_no_output(workload_cli, tmp_path):
    result = workload_cli("--dryrun", "-ms", "5", "--cuda_graph_scope", "full_iteration", "model.num_layers=3",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "graphbridge plan: VALID" in result.stdout
    assert "forward and backward of the whole iteration" in result.stdout
    assert "layers=3" in result.stdout and "iters=5" in result.stdout
    # The equivalent graphbridge command line, for users moving to plain Hydra overrides.
    assert ("graphbridge model.num_layers=3 train.train_iters=5 model.cuda_graph_impl=full_iteration "
            "'model.cuda_graph_modules=[]' mode=plan") in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_misspelled_flag_is_one_line_with_the_flag_meant(workload_cli, tmp_path):
    result = workload_cli("-m", "llama", "-mr", "tiny", "--num_gpu", "8", "-d", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "unrecognized arguments: --num_gpu; did you mean --num_gpus?" in result.stderr


def test_dryrun_json_plan_keeps_stdout_machine_readable(workload_cli, tmp_path):
    result = workload_cli("--dryrun", "-tp", "2", "-ng", "2", "plan.format=json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["config"]["model"]["tensor_model_parallel_size"] == 2
    assert plan["config"]["model"]["sequence_parallel"] is True


def test_dryrun_of_an_invalid_config_exits_2_with_the_violation(workload_cli, tmp_path):
    result = workload_cli("--dryrun", "--cuda_graph_impl", "transformer_engine", "engine=torch", cwd=tmp_path)
    assert result.returncode == 2
    assert "graphbridge plan: INVALID (1 violation, on stderr)" in result.stdout
    assert "[engine_impl]" in result.stderr and "Traceback" not in result.stderr


def test_dryrun_with_nsys_plans_the_window_and_names_the_missing_nsys(workload_cli, tmp_path):
    # Without nsys on PATH the config is valid but cannot run here: the plan says which rule, as a run would.
    result = workload_cli("--dryrun", "-en", "--profiling_start_step", "4", "--profiling_stop_step", "6",
                          "-ms", "10", cwd=tmp_path, env={**os.environ, "PATH": os.path.dirname(sys.executable)})
    assert result.returncode == 0, result.stderr
    assert "perf.nsys=true perf.profile_start_step=4 perf.profile_steps=2" in result.stderr
    assert "graphbridge plan: VALID" in result.stdout
    assert "cannot run on this machine" in result.stdout and "[nsys_available] perf.nsys" in result.stdout


def test_dryrun_of_a_window_over_the_warmup_exits_2_with_the_fix(workload_cli, tmp_path):
    result = workload_cli("--dryrun", "-pyp", "true", "--profiling_start_step", "0", "-ms", "10", cwd=tmp_path)
    assert result.returncode == 2
    assert "[profile_window]" in result.stderr and "set perf.profile_start_step=" in result.stderr


def test_a_bad_flag_through_the_console_script_is_one_message_not_a_traceback(workload_cli, tmp_path):
    result = workload_cli("--cuda_graph_scope", "layer", cwd=tmp_path)
    assert result.returncode == 2
    assert "--cuda_graph_scope: unknown scope layer; choose from" in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_a_run_trains_through_graphbridge_under_the_log_dir(workload_cli, tmp_path):
    result = workload_cli("-ms", "3", "-sl", "64", "-mb", "1", "-gb", "1", "engine=torch", "model.num_layers=2",
                          "model.hidden_size=128", "-l", str(tmp_path / "logs"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    [result_path] = (tmp_path / "logs").glob("*/*/result.json")
    record = json.loads(result_path.read_text())
    assert record["status"] == "completed"
    assert record["train_iters"] == 3
    assert "train.train_iters=3" in record["job"]["overrides"]


def test_a_slurm_dryrun_plans_here_and_submits_nothing(workload_cli, tmp_path):
    result = workload_cli("-m", "llama", "-mr", "tiny", "-a", "acct", "-p", "batch", "-t", "00:30:00", "-d",
                          cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "graphbridge plan: VALID" in result.stdout
    assert "hydra/launcher=submitit_slurm" in result.stderr and "MULTIRUN" not in result.stderr
    assert list(tmp_path.iterdir()) == []


# Megatron-Bridge v0.3.1's scripts/performance/README.md, its two command lines with the placeholders filled in.
BRIDGE_README_LINE = ("--account acct --partition batch --gpu gb200 --model_family_name llama --model_recipe_name "
                      "llama3_8b -ng 8").split()
BRIDGE_README_SCRIPT = ["--account", "acct", "-i", "nvcr.io/nvidia/nemo:25.11.01", "--partition", "batch", "-m",
                        "deepseek", "-mr", "deepseek_v3", "--log_dir", "results/dsv3_gb300", "--num_gpus", "256",
                        "--gpus_per_node", "4", "-t", "00:15:00", "-g", "gb300", "-c", "fp8_mx", "-hf", "hf_SECRET"]


def test_bridges_readme_command_lines_plan_as_pasted(workload_cli, tmp_path):
    line = workload_cli(*BRIDGE_README_LINE, "-d", cwd=tmp_path)
    assert line.returncode == 0, line.stderr
    assert line.stdout.startswith("graphbridge plan: VALID") and "workload:  task=pretrain gpu=gb200" in line.stdout
    command = line.stderr.splitlines()[0]
    assert command.startswith("graphbridge recipe=llama/llama3_8b gpu=gb200 train.num_gpus=8 ")
    assert "hydra.launcher.account=acct hydra.launcher.partition=batch" in command  # readable, as typed
    refused = workload_cli(*BRIDGE_README_SCRIPT, "-d", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "hf_SECRET" not in refused.stderr
    assert "-i/--container_image nvcr.io/nvidia/nemo:25.11.01: " in refused.stderr
    assert "-hf/--hf_token <hidden>: graphbridge downloads nothing" in refused.stderr
    kept = [arg for index, arg in enumerate(BRIDGE_README_SCRIPT)
            if not {arg, BRIDGE_README_SCRIPT[index - 1]} & {"-i", "-hf"}]
    script = workload_cli(*kept, "-d", cwd=tmp_path)
    assert script.returncode == 0, script.stderr
    assert "workload:  task=pretrain gpu=gb300 precision=fp8_mx num_gpus=256 num_nodes=64" in script.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing, -l included
