"""The draw both differentials share (tests/layout_draw.py on the CPU, benchmarks/differential_draw.py on the GPU): a
few fields of GraphBridgeConfig changed, each drawn by its type in the schema, so a field is drawn the day it is added.

- bools both ways; enums and the string fields with a closed set (the catalogue's CHOICES, STRING_CHOICES) by choice;
- Optional fields as null one time in four;
- ints and floats from the values that matter for the field: 1, 2, 4, the current value's neighbours, double and half,
  kept inside the range the catalogue gives the field (out-of-range values are tests/test_absurd_values.py's);
- the list and free-form fields by their own generators (STRUCTURED).

Every field of the sections that reach the model, DDP, the optimizer, the training loop, the data and the RNG is drawn,
but the few NOT_DRAWN names with a reason. ``coverage`` counts, per field, how many draws varied it and how many of
those the plan accepted: a record's ``fields_varied`` is the number varied at least MIN_VARIED times and accepted once.
"""

import dataclasses
import random
import typing
from enum import Enum
from typing import Any, Callable, Dict, Iterable, List, Tuple

from bridge.config.model_schema import CUDA_GRAPH_MODULES
from bridge.config.schema import GraphBridgeConfig
from bridge.validation.recompute_rules import RECOMPUTE_MODULES
from bridge.validation.value_rules import CHOICES, POSITIVE, RANGES, out_of_range

DRAWN_SECTIONS = ("model", "rng", "rerun_state_machine", "ddp", "train", "optimizer", "dataset")
"""What a job trains. The other sections say how it is run or reported (mode, plan, perf, workload, engine, device,
env_vars, torch_compile): the differentials judge the megatron engine on a given machine, so those stay as set."""
NOT_DRAWN = {
    "train.num_gpus": "the world size: the CPU layout's rank count, or the GPUs the GPU differential trains on",
    "train.num_nodes": "derived from the GPUs per node: a launcher's matter that no rank's build sees",
    "train.train_iters": "the harness sets how many steps a run takes",
}
STRING_CHOICES = {
    "model.recompute_granularity": ("selective", "full"),
    "model.recompute_method": ("uniform", "block"),
    "model.moe_flex_dispatcher_backend": ("deepep", "hybridep"),
    "optimizer.lr_decay_style": ("constant", "linear", "cosine"),
}
"""The string fields the catalogue's CHOICES leaves out: megatron-core's own spellings of their values."""
MIN_VARIED = 5
CHANGES_WEIGHTS = (40, 25, 14, 9, 7, 5)
"""How often a draw changes 1, 2, ... 6 fields: mostly few, so that most draws stay near a recipe that trains."""


def _fields(cls, prefix: str = "") -> Iterable[Tuple[str, Any]]:
    hints = typing.get_type_hints(cls)
    for item in dataclasses.fields(cls):
        kind = hints[item.name]
        if dataclasses.is_dataclass(kind):
            yield from _fields(kind, f"{prefix}{item.name}.")
        else:
            yield prefix + item.name, kind


SCHEMA_FIELDS: Dict[str, Any] = dict(_fields(GraphBridgeConfig))
DRAWN = tuple(key for key in SCHEMA_FIELDS if key.split(".")[0] in DRAWN_SECTIONS and key not in NOT_DRAWN)


def _inner(kind) -> Tuple[Any, bool]:
    """The type under Optional, and whether the field may be null."""
    arguments = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union and type(None) in arguments:
        return next(argument for argument in arguments if argument is not type(None)), True
    return kind, False


def _subset(rng: random.Random, names, low: int, high: int) -> List[str]:
    return rng.sample(list(names), rng.randint(low, high))


def _layout(rng: random.Random, current: Callable[[str], Any]):
    """A pipeline layout of the model's layers over PP x VP stages, E first and L last, the layers split at random."""
    virtual = current("model.virtual_pipeline_model_parallel_size") or 1
    stages = current("model.pipeline_model_parallel_size") * virtual
    layers = current("model.num_layers")
    if layers > 64 or stages > 16:
        return None
    cuts = sorted(rng.randint(0, layers) for _ in range(stages - 1))
    counts = [high - low for low, high in zip([0, *cuts], [*cuts, layers])]
    mtp = "m" * (current("model.mtp_num_layers") or 0)
    text = "|".join("t" * count for count in counts)
    return f"E{text}{mtp}L"


STRUCTURED: Dict[str, Callable[[random.Random, Callable[[str], Any]], Any]] = {
    "model.cuda_graph_modules": lambda rng, current: _subset(rng, CUDA_GRAPH_MODULES, 0, 2),
    "model.recompute_modules": lambda rng, current: _subset(rng, RECOMPUTE_MODULES, 1, 2),
    "model.moe_layer_freq": lambda rng, current: (
        rng.choice([1, 2]) if rng.random() < 0.5
        else [rng.randint(0, 1) for _ in range(min(current("model.num_layers"), 64))]),
    "model.linear_attention_freq": lambda rng, current: rng.choice([2, 4]),
    "model.window_size": lambda rng, current: [rng.choice([16, 64, 128]), 0],
    "model.pipeline_model_parallel_layout": _layout,
    "model.cuda_graph_scope": lambda rng, current: rng.choice(["full_iteration", "attn", ["attn", "mlp"], "full"]),
}
"""Fields whose type says too little (Any, lists): each with the generator of its values."""


def _numbers(key: str, kind, value) -> List:
    if kind is int:
        candidates = [1, 2, 4, 8] if value is None else [0, 1, 2, 4, value - 1, value + 1, value * 2, value // 2]
    else:
        candidates = [0.01, 0.1, 1.0] if value is None else [0.0, 0.1, 1.0, value * 2, value / 2]
    low = 1 if key in POSITIVE else 0
    return [number for number in candidates
            if number != value and number >= low and not (key in RANGES and out_of_range(key, number))]


def value_for(rng: random.Random, key: str, current: Callable[[str], Any]):
    """A value of ``key`` other than its current one, by the field's type (None where the type has no other)."""
    value = current(key)
    kind, nullable = _inner(SCHEMA_FIELDS[key])
    if nullable and value is not None and rng.random() < 0.25:
        return None
    if key in STRUCTURED:
        return STRUCTURED[key](rng, current)
    if kind is bool:
        return not value
    if isinstance(kind, type) and issubclass(kind, Enum):
        return rng.choice([member.value for member in kind if member.value != getattr(value, "value", value)])
    if kind is str:
        names = [name for name in CHOICES.get(key) or STRING_CHOICES[key] if name != value]
        return rng.choice(names) if names else None
    if kind in (int, float):
        numbers = _numbers(key, kind, value)
        return rng.choice(numbers) if numbers else None
    raise TypeError(f"{key}: no way to draw a {kind}; give it a generator in STRUCTURED or list it in NOT_DRAWN")


def mutations(rng: random.Random, current: Callable[[str], Any]) -> Dict[str, Any]:
    """1 to 6 drawn fields changed, each from its value in ``current`` (the config as drawn so far)."""
    changes: Dict[str, Any] = {}
    count = rng.choices(range(1, len(CHANGES_WEIGHTS) + 1), CHANGES_WEIGHTS)[0]
    for key in rng.sample(DRAWN, count):
        value = value_for(rng, key, lambda name: changes[name] if name in changes else current(name))
        if value != current(key):
            changes[key] = value
    return changes


def coverage(draws: Iterable[Tuple[Iterable[str], bool]]) -> Dict[str, Any]:
    """Per field, the draws that varied it and how many of those the plan accepted; ``draws`` gives each draw's
    varied keys and whether it was accepted."""
    varied: Dict[str, List[int]] = {key: [0, 0] for key in DRAWN}
    for keys, accepted in draws:
        for key in set(keys) & set(varied):
            varied[key][0] += 1
            varied[key][1] += bool(accepted)
    return {"fields_drawn": len(DRAWN),
            "fields_varied": sum(times >= MIN_VARIED and accepted > 0 for times, accepted in varied.values()),
            "per_field": {key: {"varied": times, "accepted": accepted} for key, (times, accepted) in varied.items()}}
