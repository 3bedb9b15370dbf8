"""Bad input through the real `graphbridge` command: seeded random sets of bad overrides (typos, wrong
types, impossible values, unknown options, broken interpolations and syntax, conflicting graph
settings), each mixed with valid ones, must end in exit status 2 with a message that names the
problem, and never in a Python traceback or a hang. 60 cases by default; 1000 under `-m slow`."""

import dataclasses
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
                 "dataset.seq_length", "model.num_attention_heads", "model.kv_channels", "model.moe_router_topk"]


def typo(rng: random.Random, key: str) -> str:
    """``key`` with one letter replaced, never another real key."""
    position = rng.randrange(len(key))
    typed = key[:position] + rng.choice("xqz") + key[position + 1:] if key[position] != "." else key + "x"
    return typed if typed not in ALL_KEYS else typed + "x"


def bad_override(rng: random.Random) -> list:
    kind = rng.choice(["typo", "type", "range", "option", "interpolation", "syntax", "conflict"])
    key = rng.choice(INT_KEYS)
    if kind == "typo":
        return [f"{typo(rng, key)}=1"]
    if kind == "type":
        return [f"{key}={rng.choice(['abc', '[1,2]', '{a: 1}', '1.5.5'])}"]
    if kind == "range":
        return [f"{rng.choice(POSITIVE_KEYS)}={rng.choice(['0', '-1', '-7'])}"]
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
    return ["mode=plan", *overrides]


def check_one_case(cli, tmp_path, seed):
    args = case(seed)
    result = cli(*args, cwd=tmp_path, timeout=120)
    assert result.returncode == 2, f"{args}: exit {result.returncode}\n{result.stdout[-800:]}{result.stderr[-800:]}"
    assert "Traceback" not in result.stderr + result.stdout, args
    assert result.stderr.strip(), args
    assert list(tmp_path.iterdir()) == [], args  # and nothing left behind


@pytest.mark.parametrize("seed", range(60))
def test_bad_overrides_exit_2_with_a_message(cli, tmp_path, seed):
    check_one_case(cli, tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(60, 1060))
def test_bad_overrides_exit_2_with_a_message_many(cli, tmp_path, seed):
    check_one_case(cli, tmp_path, seed)
