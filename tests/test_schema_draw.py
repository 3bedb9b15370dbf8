"""The differentials' draw comes from the schema (benchmarks/schema_draw.py): every field of the sections that reach
the training is drawn or left out with a reason, each drawn value is one the schema takes, and coverage counts what
the draws varied."""

import random

import pytest
from omegaconf import OmegaConf

import bridge
from benchmarks.schema_draw import DRAWN, DRAWN_SECTIONS, NOT_DRAWN, SCHEMA_FIELDS, coverage, mutations, value_for
from bridge.config.schema import GraphBridgeConfig


def test_every_field_of_the_drawn_sections_is_drawn_or_says_why_not():
    sections = {key for key in SCHEMA_FIELDS if key.split(".")[0] in DRAWN_SECTIONS}
    assert set(DRAWN) | set(NOT_DRAWN) == sections
    assert set(NOT_DRAWN) <= set(SCHEMA_FIELDS) and all(NOT_DRAWN.values())
    assert len(DRAWN) >= 150  # the 120 varied fields need this many drawn


@pytest.mark.parametrize("recipe", ["llama/tiny", "deepseek/tiny"])
def test_each_drawn_value_is_one_the_schema_takes_and_differs(recipe):
    node = bridge.compose([f"recipe={recipe}"])
    rng = random.Random(0)
    current = OmegaConf.select
    typed = OmegaConf.structured(GraphBridgeConfig)
    for key in DRAWN:
        values = [value_for(rng, key, lambda name: current(node, name)) for _ in range(5)]
        # a subset or a layout may come out as the current one; every other kind of field draws another value
        assert any(value != current(node, key) for value in values) or current(node, key) is None, key
        for value in values:
            OmegaConf.update(typed, key, value, merge=False)  # the schema's type check: raises on a wrong type


def test_a_draw_changes_one_to_six_fields():
    node = bridge.compose(["recipe=qwen/tiny"])
    rng = random.Random(1)
    sizes = [len(mutations(rng, lambda name: OmegaConf.select(node, name))) for _ in range(300)]
    assert min(sizes) >= 0 and max(sizes) <= 6 and sum(size >= 1 for size in sizes) > 0.9 * len(sizes)
    assert len(set(sizes)) >= 5


def test_coverage_counts_fields_varied_five_times_and_accepted_once():
    key, other = DRAWN[0], DRAWN[1]
    draws = [([key], False)] * 4 + [([key, other], True)] + [([other], False)] * 3
    counted = coverage(draws)
    assert counted["per_field"][key] == {"varied": 5, "accepted": 1}
    assert counted["per_field"][other] == {"varied": 4, "accepted": 1}
    assert counted["fields_varied"] == 1
