"""Bad input through the real `graphbridge` command: seeded random sets of bad overrides (typos, wrong
types, impossible and overflowing values, nested lists, unknown options, broken interpolations and
syntax, conflicting graph settings, damage to Hydra's own tree, bytes that are not UTF-8, keys too
long for a file name, misplaced flags), each mixed with valid ones, as a plan or a run, must end in
exit status 2 with one line (or one block of violations) that names the problem, never in a Python
traceback or a hang, and leave nothing behind. 20 cases by default; 1040 more under `-m slow`.

Each case is a function of its seed alone; GRAPHBRIDGE_FUZZ_SEED=N moves the seeds to N, N+1, ...
(e.g. GRAPHBRIDGE_FUZZ_SEED=5000 pytest -m slow tests/test_cli_fuzz.py tries 1040 other cases).
"""

import dataclasses
import os
import random

import pytest

from bridge.config.schema import GraphBridgeConfig

VALID = ["recipe=llama/tiny", "recipe=qwen/tiny", "cuda_graph=te_attn", "cuda_graph=none", "train.train_iters=20",
         "model.num_layers=4", "precision=bf16", "engine=torch", "dataset.seq_length=128"]
CONFLICTS = [
    ["cuda_graph=full_iteration", "ddp.check_for_nan_in_grad=true"],
    ["cuda_graph=te_attn", "rng.te_rng_tracker=false"],
    ["cuda_graph=te_attn", "model.cpu_offloading=true"],
    ["recipe=llama/tiny", "cuda_graph=te_moe_router"],
    ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[full_iteration]"],
    ["model.enable_cuda_graph=true", "model.external_cuda_graph=true"],
    ["optimizer.lr_warmup_iters=80", "train.train_iters=40"],
    ["train.num_gpus=3", "model.tensor_model_parallel_size=2"],
]


def schema_leaves(node=GraphBridgeConfig, prefix=""):
    for item in dataclasses.fields(node):
        if dataclasses.is_dataclass(item.type):
            yield from schema_leaves(item.type, f"{prefix}{item.name}.")
        else:
            yield prefix + item.name, item.type


ALL_KEYS = {key for key, _ in schema_leaves()}
INT_KEYS = [key for key, kind in schema_leaves() if kind is int and not key.startswith(("env_vars", "plan"))]
POSITIVE_KEYS = ["model.num_layers", "model.hidden_size", "train.micro_batch_size", "train.train_iters",
                 "dataset.seq_length", "model.num_attention_heads", "model.kv_channels", "model.moe_router_topk",
                 "model.ffn_hidden_size", "model.num_moe_experts", "model.seq_length", "model.window_attn_skip_freq"]
NON_NEGATIVE_KEYS = ["perf.warmup_steps", "perf.nan_check_interval", "model.cuda_graph_warmup_steps",
                     "perf.profile_start_step", "rng.seed", "optimizer.lr_warmup_iters"]
LIST_KEYS = ["model.cuda_graph_modules", "model.recompute_modules", "model.moe_layer_freq"]
HYDRA_DAMAGE = ["hydra.run.dir=${oops}", "hydra.job.name=${oops}", "hydra.verbose=${oops}",
                "+hydra.callbacks.x._target_=os.system", "hydra.callbacks.summary._target_=builtins.print",
                "hydra.callbacks.run_directory.wait=maybe", "+hydra.job_logging.handlers.x={class:logging.Handler}",
                "hydra.launcher._target_=os.getcwd", "hydra.callbacks=[1]", "hydra.run.dir=null"]
VIOLATION_BLOCKS = ("invalid configuration:", "cannot run on this machine:")
SEED = int(os.environ.get("GRAPHBRIDGE_FUZZ_SEED", "0"))


def typo(rng: random.Random, key: str) -> str:
    """``key`` with one letter replaced, never another real key."""
    position = rng.randrange(len(key))
    typed = key[:position] + rng.choice("xqz") + key[position + 1:] if key[position] != "." else key + "x"
    return typed if typed not in ALL_KEYS else typed + "x"


def bad_override(rng: random.Random) -> list:
    kind = rng.choice(["typo", "type", "range", "option", "interpolation", "syntax", "conflict", "overflow",
                       "nested", "hydra", "bytes", "long", "flag"])
    key = rng.choice(INT_KEYS)
    if kind == "typo":
        return [f"{typo(rng, key)}=1"]
    if kind == "type":
        return [f"{key}={rng.choice(['abc', '[1,2]', '{a: 1}', '1.5.5'])}"]
    if kind == "range":
        if rng.random() < 0.3:
            return [f"{rng.choice(NON_NEGATIVE_KEYS)}={rng.choice(['-1', '-100'])}"]
        return [f"{rng.choice(POSITIVE_KEYS)}={rng.choice(['0', '-1', '-7'])}"]
    if kind == "overflow":
        return [f"{key}={rng.choice([2**31, 2**63, 2**64 + 1, -2**63])}"]
    if kind == "nested":
        return [f"{rng.choice(LIST_KEYS)}={rng.choice(['[[attn]]', '[[1],[0]]', '[{a: 1}]', '[[]]'])}"]
    if kind == "hydra":
        return [rng.choice(HYDRA_DAMAGE)]
    if kind == "bytes":
        return [os.fsdecode(rng.choice([b"model.num_layers=\xe9", b"recipe=llama/t\xffny", b"+env_vars.X=\x80"]))]
    if kind == "long":
        return [f"{rng.choice(['+env_vars.', 'model.', ''])}{'k' * rng.randint(256, 4000)}=1"]
    if kind == "flag":
        return rng.choice([["--bogus"], ["-m", "model.num_layers=2"], ["--cfg=nope"], ["-x"]])
    if kind == "option":
        group = rng.choice(["cuda_graph", "recipe", "precision", "gpu", "sweep"])
        return [f"{group}={rng.choice(['nope', 'te_atn', 'llama/tinyy', 'fp7'])}"]
    if kind == "interpolation":
        return [f"{key}=${{{rng.choice(['oops', 'model.nope', 'train'])}}}"]
    if kind == "syntax":
        return [rng.choice([f"{key}=[1,", f"{key}==3", "=1", f"{key}={{", "model..num_layers=2"])]
    return list(rng.choice(CONFLICTS))


def case(seed: int) -> list:
    rng = random.Random(seed)
    overrides = rng.sample(VALID, rng.randint(0, 2))
    for _ in range(rng.randint(1, 2)):
        overrides += bad_override(rng)
    # A run refuses what a plan refuses, before it writes a job or trains.
    return [rng.choice(["mode=plan", "mode=plan", "mode=train engine=torch"]), *overrides]


def check_one_case(cli, tmp_path, seed):
    args = case(seed)
    args = [*args[0].split(), *args[1:]]
    result = cli(*args, cwd=tmp_path, timeout=120)
    shown = f"seed {seed}: {args}: exit {result.returncode}\n{result.stdout[-800:]}{result.stderr[-800:]}"
    assert result.returncode == 2, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    # One line naming the problem, or the block of every violation (of the config, then of this machine).
    lines = result.stderr.splitlines()
    assert lines and (lines[0].startswith("graphbridge: ") and len(lines) == 1 or lines[0] in VIOLATION_BLOCKS and all(
        line in VIOLATION_BLOCKS or line.startswith("  [") for line in lines)), shown
    assert list(tmp_path.iterdir()) == [], shown  # and nothing left behind


@pytest.mark.parametrize("seed", range(SEED, SEED + 20))
def test_bad_overrides_exit_2_with_a_message(cli, tmp_path, seed):
    check_one_case(cli, tmp_path, seed)


@pytest.mark.slow  # 15 minutes on two cores: pyproject's addopts leave it out of a plain pytest
@pytest.mark.parametrize("seed", range(SEED + 20, SEED + 1060))
def test_bad_overrides_exit_2_with_a_message_many(cli, tmp_path, seed):
    check_one_case(cli, tmp_path, seed)
