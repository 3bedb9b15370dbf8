"""graphbridge-workload: Bridge's performance-script flags as Hydra overrides (the console script as a user types
it: test_workload_console.py)."""

import json
from pathlib import Path

import pytest

import bridge
from perf.bridge_flags import FLAGS, VALID_CUDA_GRAPH_SCOPES
from perf.workload import build_parser, flags_to_overrides


# One row per mapped flag (and per distinct meaning of its values): argv -> the overrides it adds.
FLAG_CASES = [
    (["--domain", "LLM"], []),
    (["-m", "llama", "-mr", "tiny"], ["recipe=llama/tiny"]),
    (["--model_family_name", "Llama", "--model_recipe_name", "TINY"], ["recipe=llama/tiny"]),
    (["--task", "sft"], ["workload.task=sft"]),
    (["-m", "llama", "-mr", "llama3_8b", "--task", "pretrain"], ["recipe=llama/llama3_8b", "workload.task=pretrain"]),
    (["-m", "llama", "-mr", "llama3_8b", "--task", "lora"], ["recipe=llama/llama3_8b_lora", "workload.task=lora"]),
    (["-g", "b200"], ["gpu=b200"]),
    (["--gpu", "h100"], ["gpu=h100"]),
    (["-g", "h200"], ["gpu=h200"]),  # graphbridge's: the H100 presets against 141 GB (Bridge v0.3.1 has no H200)
    (["-c", "fp8_cs"], ["precision=fp8_cs"]),
    (["--compute_dtype", "bf16"], ["precision=bf16"]),
    (["-d"], ["mode=plan"]),
    (["--dryrun"], ["mode=plan"]),
    (["-ng", "8"], ["train.num_gpus=8"]),
    (["--num_gpus", "4"], ["train.num_gpus=4"]),
    (["--hidden_size", "256"], ["model.hidden_size=256"]),
    (["--num_layers", "4"], ["model.num_layers=4"]),
    (["--first_k_dense_replace", "2"], ["model.moe_layer_freq='${graphbridge.dense_first:2,${model.num_layers}}'"]),
    (["--pipeline_model_parallel_layout", "Et|tL"], ["model.pipeline_model_parallel_layout=Et|tL"]),
    (["-tp", "2"], ["model.tensor_model_parallel_size=2", "model.sequence_parallel=true"]),
    (["--tensor_model_parallel_size", "1"], ["model.tensor_model_parallel_size=1", "model.sequence_parallel=false"]),
    (["-pp", "4"], ["model.pipeline_model_parallel_size=4"]),
    (["--pipeline_model_parallel_size", "2"], ["model.pipeline_model_parallel_size=2"]),
    (["-cp", "2"], ["model.context_parallel_size=2"]),
    (["--context_parallel_size", "2"], ["model.context_parallel_size=2"]),
    (["-vp", "4"], ["model.virtual_pipeline_model_parallel_size=4"]),
    (["--virtual_pipeline_model_parallel_size", "None"], ["model.virtual_pipeline_model_parallel_size=null"]),
    (["-ep", "8"], ["model.expert_model_parallel_size=8"]),
    (["--expert_model_parallel_size", "2"], ["model.expert_model_parallel_size=2"]),
    (["-et", "1"], ["model.expert_tensor_parallel_size=1"]),
    (["--expert_tensor_parallel_size", "None"], ["model.expert_tensor_parallel_size=null"]),
    (["-mb", "2"], ["train.micro_batch_size=2"]),
    (["--micro_batch_size", "1"], ["train.micro_batch_size=1"]),
    (["-gb", "256"], ["train.global_batch_size=256"]),
    (["--global_batch_size", "8"], ["train.global_batch_size=8"]),
    (["-sl", "8192"], ["dataset.seq_length=8192"]),
    (["--seq_length", "64"], ["dataset.seq_length=64"]),
    (["-ms", "100"], ["train.train_iters=100"]),
    (["--max_steps", "5"], ["train.train_iters=5"]),
    (["--lr", "1e-4"], ["optimizer.lr=0.0001"]),
    (["--min_lr", "1e-5"], ["optimizer.min_lr=1e-05"]),
    (["--warmup_iters", "0"], ["optimizer.lr_warmup_iters=0"]),
    (["--data", "mock"], ["dataset.mock=true"]),
    (["--packed_sequence"], ["dataset.packed_sequence=true"]),
    (["--vocab_size", "32000"], ["model.vocab_size=32000"]),
    (["-a", "acct", "-p", "batch"],
     ["hydra.launcher.account=acct", "hydra.launcher.partition=batch", "hydra/launcher=submitit_slurm",
      "hydra.mode=MULTIRUN"]),
    (["--account", "a", "--partition", "p", "-d"],
     ["hydra.launcher.account=a", "hydra.launcher.partition=p", "hydra/launcher=submitit_slurm", "mode=plan"]),
    (["-t", "01:30:00"], ["hydra.launcher.timeout_min=90", "hydra/launcher=submitit_slurm", "hydra.mode=MULTIRUN"]),
    (["--time_limit", "1-00:00:30"],
     ["hydra.launcher.timeout_min=1441", "hydra/launcher=submitit_slurm", "hydra.mode=MULTIRUN"]),
    (["--gres", "gpu:8"], ["hydra.launcher.gres=gpu:8", "hydra/launcher=submitit_slurm", "hydra.mode=MULTIRUN"]),
    (["-ng", "16", "-gn", "8"], ["train.num_gpus=16", "train.num_nodes=2"]),
    (["--num_gpus", "4", "--gpus_per_node", "8"], ["train.num_gpus=4", "train.num_nodes=1"]),
    (["--additional_slurm_params", "nodelist=n1,n2;exclusive"],
     ["hydra/launcher=submitit_slurm", "hydra.mode=MULTIRUN",
      "++hydra.launcher.additional_parameters.nodelist='n1,n2'",
      "++hydra.launcher.additional_parameters.exclusive=true"]),
    (["-cb", "module", "load", "cuda", "--custom_bash_cmds", "echo", "hi"],
     ["hydra/launcher=submitit_slurm", "hydra.mode=MULTIRUN", "hydra.launcher.setup=['module load cuda','echo hi']"]),
    (["-ce", "NCCL_DEBUG=INFO,GREETING=it's ${HOME}"],
     ["++env_vars.NCCL_DEBUG=INFO", "++env_vars.GREETING='it\\'s \\${HOME}'"]),
    (["--custom_env_vars", "A=1"], ["++env_vars.A='1'"]),
    (["-pyp", "true"], ["perf.profile=true"]),
    (["--pytorch_profiler", "false"], ["perf.profile=false"]),
    (["-en"], ["perf.nsys=true"]),
    (["--enable_nsys", "--profiling_start_step", "5", "--profiling_stop_step", "8"],
     ["perf.nsys=true", "perf.profile_start_step=5", "perf.profile_steps=3"]),
    # One end of the window given: Bridge's default for the other (10 and 11).
    (["--profiling_start_step", "7"], ["perf.profile_start_step=7", "perf.profile_steps=4"]),
    (["--profiling_stop_step", "12"], ["perf.profile_start_step=10", "perf.profile_steps=2"]),
    (["--nsys_trace", "cuda,nvtx,osrt"], ["perf.nsys_trace=['cuda','nvtx','osrt']"]),
    (["--nsys_extra_args=--cuda-graph-trace=node", "--profiling_gpu_metrics"],
     ["perf.nsys_extra_args=['--cuda-graph-trace=node','--gpu-metrics-devices=all','--sample=none',"
      "'--cuda-event-trace=false']"]),
    (["--cuda_graph_impl", "none"], ["model.cuda_graph_impl=none"]),
    (["--cuda_graph_impl", "local"], ["model.cuda_graph_impl=local"]),
    # No scope: the recipe's modules stay (Bridge v0.3.1 crashes here).
    (["--cuda_graph_impl", "transformer_engine"], ["model.cuda_graph_impl=transformer_engine"]),
    (["--cuda_graph_scope", "attn,mlp"], ["model.cuda_graph_modules=['attn','mlp']"]),
    (["--cuda_graph_scope", "full_iteration"], ["model.cuda_graph_impl=full_iteration", "model.cuda_graph_modules=[]"]),
    (["--cuda_graph_impl", "local", "--cuda_graph_scope", "full_iteration"],
     ["model.cuda_graph_impl=full_iteration", "model.cuda_graph_modules=[]"]),
    (["--cuda_graph_impl", "transformer_engine", "--cuda_graph_scope", "moe_router,moe_preprocess"],
     ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=['moe_router','moe_preprocess']"]),
    (["--recompute_modules", "core_attn,mlp"],
     ["model.recompute_granularity=selective", "model.recompute_modules=['core_attn','mlp']"]),
    (["-rl", "2"], ["model.recompute_granularity=full", "model.recompute_method=block", "model.recompute_num_layers=2"]),
    (["--recompute_num_layers", "1"],
     ["model.recompute_granularity=full", "model.recompute_method=block", "model.recompute_num_layers=1"]),
    (["-ol", "2"], ["model.cpu_offloading=true", "model.cpu_offloading_num_layers=2"]),
    # 0 means no offloading (Bridge v0.3.1 turns offloading on for 0).
    (["--activation_offload_layers", "0"], ["model.cpu_offloading=false", "model.cpu_offloading_num_layers=0"]),
    (["--use_tokendrop", "true"], ["model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true",
                                   "model.moe_router_force_load_balancing=false"]),
    (["--use_tokendrop", "False"], ["model.moe_expert_capacity_factor=null",
                                    "model.moe_pad_expert_input_to_capacity=false",
                                    "model.moe_router_force_load_balancing=true"]),
    (["--moe_a2a_overlap", "yes"], ["model.overlap_moe_expert_parallel_comm=true", "model.delay_wgrad_compute=true",
                                    "model.moe_shared_expert_overlap=false"]),
    (["--moe_a2a_overlap", "0"], ["model.overlap_moe_expert_parallel_comm=false", "model.delay_wgrad_compute=false"]),
    (["-l", "/runs/it's"], ["hydra.run.dir='/runs/it\\'s/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}'",
                            "hydra.sweep.dir='/runs/it\\'s/multirun/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}'"]),
    (["--log_dir", "runs/"], ["hydra.run.dir=runs/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}",
                               "hydra.sweep.dir=runs/multirun/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"]),
    (["--multirun", "cuda_graph=none,full_iteration"], ["cuda_graph=none,full_iteration", "hydra.mode=MULTIRUN"]),
    (["model.num_layers=4", "+env_vars.X=1"], ["model.num_layers=4", "+env_vars.X=1"]),
    (["--use_megatron_fsdp", "true"], ["ddp.use_megatron_fsdp=true", "ddp.data_parallel_sharding_strategy=optim_grads_params",
                                       "ddp.use_distributed_optimizer=true", "ddp.average_in_collective=false",
                                       "model.gradient_accumulation_fusion=false"]),
    (["--use_megatron_fsdp", "false"], ["ddp.use_megatron_fsdp=false"]),
    ([], []),
]

# Refused flags: a sample value each. Every refused flag of Bridge's parser is here.
REFUSED_CASES = {flag.label: [flag.names[-1]] + ([] if flag.parse.get("action") == "store_true" else
                                                   [{"int": "3", "float": "0.5"}.get(getattr(flag.parse.get("type"), "__name__", ""), "x")])
                 for flag in FLAGS if flag.refusal}
REFUSED_CASES.update({"--optimizer_type": ["--optimizer_type", "muon"], "--tokenizer_type": ["--tokenizer_type", "HuggingFaceTokenizer"],
                      "-cv/--config_variant": ["-cv", "v2"], "--profiling_ranks": ["--profiling_ranks", "0,1"],
                      "--detach": ["--detach", "true"], "-mh/--record_memory_history": ["-mh", "true"],
                      "-vb/--enable_vboost": ["-vb", "true"],
                      "--nccl_ub": ["--nccl_ub", "true"],
                      "-cm/--custom_mounts": ["-cm", "/a:/b"],
                      "-cs/--custom_srun_args": ["--custom_srun_args=--mpi=pmix"]})
# Refused flags accept graphbridge's own behaviour, so a pasted Bridge command line keeps working.
KEPT = [["-cv", "v1"], ["--optimizer_type", "adam"], ["--tokenizer_type", "NullTokenizer"], ["--detach", "false"],
        ["-mh", "false"], ["-vb", "False"], ["--nccl_ub", "0"]]


@pytest.mark.parametrize("argv,expected", FLAG_CASES, ids=[" ".join(argv) or "nothing" for argv, _ in FLAG_CASES])
def test_each_flag_maps_to_its_overrides(argv, expected):
    assert flags_to_overrides(argv) == expected


def test_the_tables_cover_every_flag_of_the_parser():
    options = {option for action in build_parser()._actions for option in action.option_strings}
    covered = {arg.split("=")[0] for argv, _ in FLAG_CASES for arg in argv if arg.startswith("-")}
    refused = {name for flag in FLAGS if flag.refusal for name in flag.names}
    assert options - covered - refused == {"-h", "--help"}
    assert set(REFUSED_CASES) == {flag.label for flag in FLAGS if flag.refusal}


# Recorded from Bridge's own parser by scripts/bridge_flags_fixture.py.
BRIDGE_FLAGS = json.loads((Path(__file__).parent / "fixtures" / "megatron_bridge_v0.3.1_flags.json").read_text())
OWN_CHOICES = {"--domain": {"vlm"}, "--gpu": {"h200"}}
"""Choices graphbridge differs in on purpose: no vision-language recipes (a refused value); h200 is its own."""


def test_every_flag_of_bridges_parser_by_its_real_names_kind_and_choices():
    ours = {flag.names: flag for flag in FLAGS}
    assert set(ours) == {tuple(bridge["names"]) for bridge in BRIDGE_FLAGS["flags"]}
    checked_in_a_type_function = {"--cuda_graph_impl": BRIDGE_FLAGS["cuda_graph_impls"]}
    for bridge in BRIDGE_FLAGS["flags"]:
        flag = ours[tuple(bridge["names"])]
        assert flag.parse.get("action", "store") == bridge["action"], flag.label
        assert flag.parse.get("nargs") == (None if bridge["action"] == "store_true" else bridge["nargs"]), flag.label
        choices = bridge["choices"] or checked_in_a_type_function.get(bridge["names"][-1]) or ()
        differ = set(flag.parse.get("choices") or ()) ^ set(choices)
        assert differ == OWN_CHOICES.get(bridge["names"][-1], set()), flag.label
    assert VALID_CUDA_GRAPH_SCOPES == BRIDGE_FLAGS["cuda_graph_scopes"]


@pytest.mark.parametrize("label", sorted(REFUSED_CASES))
def test_a_refused_flag_stops_naming_the_flag_and_what_to_use(label, capsys):
    flag = next(flag for flag in FLAGS if flag.label == label)
    with pytest.raises(SystemExit) as exit_info:
        flags_to_overrides(REFUSED_CASES[label])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"no graphbridge equivalent: {label}" in err and flag.refusal in err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", KEPT, ids=" ".join)
def test_a_refused_flag_accepts_graphbridges_own_behaviour(argv):
    assert flags_to_overrides(argv) == []


@pytest.mark.parametrize("typed", ["--num_gpu", "--cuda_graph", "--dry", "--model_family"])
def test_no_abbreviation_is_accepted(typed, capsys):
    with pytest.raises(SystemExit):
        flags_to_overrides([typed, "1"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_flags_come_after_the_trailing_overrides_wherever_they_are_typed():
    typed_last = flags_to_overrides(["model.tensor_model_parallel_size=4", "-tp", "2"])
    typed_first = flags_to_overrides(["-tp", "2", "model.tensor_model_parallel_size=4"])
    assert typed_last == typed_first == [
        "model.tensor_model_parallel_size=4", "model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
    ]


# Composed through the real config: a flag wins over a trailing override of the same key, and
# the cuda-graph flags reach the override helper's coupled settings.
@pytest.mark.parametrize(
    "argv,expected",
    [
        (["-tp", "2", "model.tensor_model_parallel_size=4"], {"model.tensor_model_parallel_size": 2}),
        (["-m", "llama", "-mr", "llama3_8b", "--task", "sft", "-g", "h100", "-c", "bf16", "recipe=llama/tiny"],
         {"workload.task": "sft", "workload.gpu": "h100", "workload.precision": "bf16"}),
        (["-ms", "7", "train.train_iters=3"], {"train.train_iters": 7}),
        (["-vp", "None", "model.virtual_pipeline_model_parallel_size=2"],
         {"model.virtual_pipeline_model_parallel_size": None}),
        (["-ol", "0", "model.cpu_offloading=true", "model.cpu_offloading_num_layers=2"],
         {"model.cpu_offloading": False, "model.cpu_offloading_num_layers": 0}),
        (["--cuda_graph_impl", "transformer_engine", "cuda_graph=te_attn_mlp"],
         {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ["attn", "mlp"],
          "rng.te_rng_tracker": True}),
        (["--cuda_graph_impl", "transformer_engine"],
         {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": [],
          "model.use_te_rng_tracker": True}),
        (["--cuda_graph_scope", "attn", "cuda_graph=te_attn_mlp"],
         {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": ["attn"]}),
        (["--cuda_graph_scope", "full_iteration", "cuda_graph=te_attn"],
         {"model.cuda_graph_impl": "full_iteration", "model.cuda_graph_modules": [],
          "rerun_state_machine.check_for_nan_in_loss": False, "ddp.check_for_nan_in_grad": False}),
        (["--cuda_graph_impl", "none", "cuda_graph=te_attn"],
         {"model.cuda_graph_impl": "none", "rng.te_rng_tracker": False, "model.use_te_rng_tracker": False}),
        (["-m", "deepseek", "-mr", "tiny", "--num_layers", "3"], {"model.moe_layer_freq": [0, 1, 1]}),
        (["-m", "deepseek", "-mr", "tiny", "--first_k_dense_replace", "2"], {"model.moe_layer_freq": [0, 0, 1, 1]}),
        (["-ce", "GREETING=it's ${HOME},EMPTY=", "+env_vars.GREETING=x"],
         {"env_vars": {"GREETING": "it's ${HOME}", "EMPTY": ""}}),
        (["-pyp", "true", "--profiling_start_step", "3", "--profiling_stop_step", "5", "--profiling_gpu_metrics"],
         {"perf.profile": True, "perf.profile_start_step": 3, "perf.profile_steps": 2,
          "perf.nsys_extra_args": ["--gpu-metrics-devices=all", "--sample=none", "--cuda-graph-trace=node",
                                   "--cuda-event-trace=false"]}),
        (["--use_tokendrop", "false", "model.moe_expert_capacity_factor=2.0"],
         {"model.moe_expert_capacity_factor": None, "model.moe_router_force_load_balancing": True}),
    ],
)
def test_flags_win_in_the_composed_config(argv, expected):
    config = bridge.load(flags_to_overrides(argv))
    for dotted, value in expected.items():
        actual = config
        for part in dotted.split("."):
            actual = getattr(actual, part)
        assert getattr(actual, "value", actual) == value, dotted


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--cuda_graph_scope", "attn,full"],
         "--cuda_graph_scope: unknown scope full; choose from full_iteration, attn, mlp, moe, moe_router, "
         "moe_preprocess, mamba"),
        (["--cuda_graph_impl", "full_iteration"],
         "argument --cuda_graph_impl: invalid choice: 'full_iteration' (choose from 'none', 'local', 'transformer_engine')"),
        (["--cuda_graph_impl", "transformer_engine", "--cuda_graph_scope", "full_iteration"],
         "--cuda_graph_impl/--cuda_graph_scope: full_iteration cannot use cuda_graph_impl=transformer_engine"),
        (["--cuda_graph_scope", "full_iteration,attn"], "full_iteration cannot be combined with other scopes"),
        (["-m", "llama"], "-m/--model_family_name and -mr/--model_recipe_name go together"),
        (["-m", "llama", "-mr", "llama9_1b"], "no recipe llama/llama9_1b; recipes of llama: llama/llama31_405b, "),
        (["-m", "llama", "-mr", "tiny", "--task", "sft"], "-m llama -mr tiny --task sft: no recipe llama/tiny_sft;"),
        (["-m", "nofamily", "-mr", "x"], "no recipe nofamily/x; recipes: deepseek/deepseek_v3, "),
        (["-rl", "2", "--recompute_modules", "core_attn"], "-rl/--recompute_num_layers (full recompute) and"),
        (["--profiling_start_step", "5", "--profiling_stop_step", "5"],
         "--profiling_start_step 5 --profiling_stop_step 5: the window is steps start..stop-1, so the stop step "
         "must be greater; e.g. --profiling_stop_step 6"),
        (["--profiling_start_step", "12"], "--profiling_stop_step 11: the window is steps start..stop-1"),
        (["-rl", "0"], "argument -rl/--recompute_num_layers: must be >= 1, got 0"),
        (["-ol", "-1"], "argument -ol/--activation_offload_layers: must be >= 0, got -1"),
        (["-tp", "two"], "argument -tp/--tensor_model_parallel_size: expected a whole number, got 'two'"),
        (["-vp", "0"], "argument -vp/--virtual_pipeline_model_parallel_size: must be >= 1, got 0"),
        (["--use_tokendrop", "maybe"], "argument --use_tokendrop: expected true or false, got 'maybe'"),
        (["-g", "a100"], "argument -g/--gpu: invalid choice: 'a100'"),
        (["--data", "squad"], "--data squad: graphbridge trains on mock data only; use --data mock"),
        (["--data", "web"], "argument --data: invalid choice: 'web'"),
        (["-gn", "8"], "-gn/--gpus_per_node 8 needs -ng/--num_gpus"),
        (["-ng", "12", "-gn", "8"], "-ng 12 is not a multiple of -gn 8"),
        (["-t", "soon"], "argument -t/--time_limit: expected a Slurm time such as 00:30:00, got 'soon'"),
        (["-ce", "NOVALUE"], "argument -ce/--custom_env_vars: expected KEY=VALUE pairs"),
        (["--save_dir", "/ckpt", "-hf", "tok"], "no graphbridge equivalent: --save_dir /ckpt: graphbridge measures "
         "training speed and writes no checkpoints; drop the flag; -hf/--hf_token <hidden>: "),
        (["--no_such_flag", "1"], "unrecognized arguments: --no_such_flag"),
        (["num_layers"], "unrecognized argument 'num_layers': trailing overrides are key=value, e.g. model.num_layers=4"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_and_the_fix(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        flags_to_overrides(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
