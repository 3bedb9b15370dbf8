"""Absurd values get one line (issue 79): every int and float field of the schema, at each of VALUES (at one of
EXTREMES by default, the rest under -m slow), on `recipe=qwen/tiny gpu=h100`, is planned within LIMIT seconds, and
where the plan refuses it names each violation on one line (exit 2), never a traceback or a hang.

The matrix runs in this process through the steps `graphbridge mode=plan` takes (perf/main.py's app): the
composed config judged, prepared, planned, its violations reported and its plan rendered; a handful of the cases
run through the real command as well. A timer interrupts a case that runs past LIMIT, so a hang fails the test
instead of stalling the suite."""

import contextlib
import functools
import io
import signal
import typing

import pytest
from omegaconf import OmegaConf

from bridge.config.load import compose_config
from bridge.config.model_facts import (has_dense_layers, has_moe_layers, last_layer_is_moe, moe_layer_count,
                                       moe_layer_pattern)
from bridge.config.model_schema import ModelConfig
from bridge.planning import build_plan
from bridge.prepare import prepare
from bridge.validation import judge_composed
from perf.main import INVALID, rendered, report_violations
from tests.number_fields import EVERY_INT, FIELDS, INT_KEYS
from tests.sampling import split

VALUES = (-1, 0, 2**31 - 1, 2**31, 2**63, 10**20, 2_000_000_000)
BASE = ("recipe=qwen/tiny", "gpu=h100", "mode=plan")
LIMIT = 2.0
"""Seconds a plan may take, whatever the value (the command's own start comes on top)."""
INT32 = range(-2**31, 2**31)
SINGLE = [{key: value} for key, kind in FIELDS.items() for value in VALUES if kind is float or value in INT32]
# Integers beyond int32 stop at the int32_values gate before any other rule reads them: one case per value sets
# every int field at once, and the gate must name each on its own line.
BEYOND_INT32 = [dict.fromkeys(INT_KEYS, value) for value in VALUES if value not in INT32]


class TookTooLong(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    def expire(signum, frame):
        raise TookTooLong(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def plan_status(composed) -> typing.Tuple[int, str]:
    """The exit status and stderr of `graphbridge mode=plan` for a composed config, as perf/main.py's app
    decides them."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        unresolvable = judge_composed(composed)
        if unresolvable:  # app prints the first on one line
            return INVALID, unresolvable[0].message
        plan = build_plan(prepare(composed))
        report_violations(plan)
        rendered(plan)
    return (0 if plan.valid else INVALID), stderr.getvalue()


@pytest.fixture(scope="module")
def composed():
    return compose_config(BASE)


@pytest.fixture(scope="module")
def as_composed(composed):
    """The composed value of a dotted key, interpolations unresolved: a case sets its keys on the shared
    composed config and puts these back (prepare plans a copy, so nothing else of it changes)."""
    raw = OmegaConf.to_container(composed, resolve=False)
    return lambda key: functools.reduce(lambda node, part: node[part], key.split("."), raw)


def case_id(changes: dict) -> str:
    if len(changes) > 1:
        return f"{EVERY_INT}={next(iter(changes.values()))}"
    [(key, value)] = changes.items()
    return f"{key}={value}"


def test_every_number_field_of_the_schema_is_tried():
    assert {"model.num_layers", "model.tensor_model_parallel_size", "model.expert_model_parallel_size",
            "optimizer.lr", "model.num_moe_experts"} <= set(FIELDS)
    assert {key for case in SINGLE + BEYOND_INT32 for key in case} == set(FIELDS)


EXTREMES = {int: (-1, 0, 2**31 - 1), float: (-1, 0, 10**20)}
"""Below, at and far above the smallest sensible value: each field takes one of them by default, in turn (every
extreme with a third of the fields); the other values under -m slow. The cases that set every int field at once run
by default."""
DEFAULT_EXTREME = {key: EXTREMES[kind][index % 3] for index, (key, kind) in enumerate(FIELDS.items())}


def by_default(_, changes: dict) -> bool:
    [(key, value)] = changes.items() if len(changes) == 1 else [(None, None)]
    return key is None or value == DEFAULT_EXTREME[key]


@pytest.mark.parametrize("changes", split(SINGLE + BEYOND_INT32, by_default, ids=case_id))
def test_a_plan_answers_at_once_and_refuses_in_one_line_per_violation(composed, as_composed, changes):
    try:
        for key, value in changes.items():
            OmegaConf.update(composed, key, value, merge=False)
        with time_limit(LIMIT):
            code, stderr = plan_status(composed)
    finally:
        for key in changes:
            OmegaConf.update(composed, key, as_composed(key), merge=False)
    if code == 0:
        return
    lines = stderr.splitlines()
    assert code == INVALID and lines, stderr
    if len(lines) > 1:  # the block of every violation, one line each
        assert lines[0] == "invalid configuration:" and all(line.startswith("  [") for line in lines[1:]), stderr
    if len(changes) > 1:
        assert sorted(line.split("] ")[1].split(":")[0] for line in lines[1:]) == sorted(changes), stderr
        assert all(line.startswith("  [int32_values] ") for line in lines[1:]), stderr


ABSURD_COMMANDS = [
    ("recipe=qwen/tiny", "gpu=h100", "model.num_layers=2000000000"),
    ("recipe=qwen/tiny", "gpu=h100", "model.num_layers=9223372036854775808"),
    ("recipe=qwen/tiny", "gpu=h100", "model.tensor_model_parallel_size=2147483647"),
    ("recipe=qwen/tiny", "gpu=h100", "model.tensor_model_parallel_size=2147483648"),
    ("recipe=qwen/tiny", "gpu=h100", "model.expert_model_parallel_size=2147483648"),
    ("model.num_layers=99999999999999999999",),
    ("recipe=deepseek/tiny", "model.num_layers=2000000000"),  # its moe_layer_freq is written out per layer
]


@pytest.fixture(scope="session")
def refused(cli_batch) -> dict:
    """Each command above planned by one `graphbridge` process a session (cli_batch), a minute for all of them."""
    return cli_batch("absurd_values", [("mode=plan", *overrides) for overrides in ABSURD_COMMANDS], timeout=60)


@pytest.mark.parametrize("overrides", ABSURD_COMMANDS)
def test_the_command_refuses_absurd_values_in_one_line_each(refused, overrides):
    result = refused[("mode=plan", *overrides)]
    shown = f"{overrides}: exit {result.returncode}\n{result.stderr}"
    assert result.returncode == INVALID and "Traceback" not in result.stdout + result.stderr, shown
    lines = result.stderr.splitlines()
    # One line naming the problem, or the block of every violation, one line each.
    assert lines[0].startswith("graphbridge: ") and len(lines) == 1 or lines[0] == "invalid configuration:" and all(
        line.startswith("  [") for line in lines[1:]), shown


@pytest.mark.parametrize("experts", [None, 1, 8])
@pytest.mark.parametrize("freq", [1, 2, 3, 7, [0, 1, 1, 0, 1], [1, 0], 0, True])
@pytest.mark.parametrize("layers", [0, 1, 5, 6])
def test_the_layer_counts_agree_with_the_written_out_pattern(experts, freq, layers):
    """The rules and the memory estimate count MoE layers without writing out num_layers entries."""
    model = ModelConfig(num_layers=layers, num_moe_experts=experts, moe_layer_freq=freq)
    pattern = moe_layer_pattern(model)
    assert moe_layer_count(model) == sum(pattern)
    assert last_layer_is_moe(model) == bool(pattern and pattern[-1])
    assert has_dense_layers(model) == (0 in pattern) and has_moe_layers(model) == (1 in pattern)
