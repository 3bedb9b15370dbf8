"""What a plain `pytest` keeps covering while the broad parametrizations run a sample by default and the rest under
`-m slow` (tests/sampling.py): every rule of the catalogue has a reject and an accept case that run and a fix that is
followed, every shipped recipe is planned and every cuda_graph choice with some recipe, every workload preset is
planned on its own GPU, every sweep preset's jobs are planned, and each sample keeps every kind of case it stands for.

The rules, recipes, presets and sweeps are enumerated as the code enumerates them (bridge.validation.RULES,
bridge.recipes, conf/); what runs is read from pytest itself, as the node ids of the default selection
(conftest.py's default_selection), never by importing a test module: a case moved under slow, a test marked slow or
renamed, fails here. That the two halves of a split are the whole list is tested on tests/sampling.py below."""

import megatron_fixture
import pytest

from bridge.config.paths import config_dir
from bridge.config.releases import SUPPORTED
from bridge.recipes import presets, recipe_names
from bridge.validation import RULES
from tests.number_fields import EVERY_INT, FIELDS, INT_KEYS
from tests.preset_reference import ROWS, row_kind
from tests.rule_cases import RULE_CASES
from tests.sampling import DEFAULT_MARKS, SLOW, every, one_per, split


def ids(selection, test: str) -> list:
    """The ids of the cases of ``test`` (``tests/test_x.py::test_y``) in the selection, in brackets in a node id."""
    return [node[len(test) + 1:-1] for node in selection if node.startswith(f"{test}[")]


def runs(selection, test: str) -> bool:
    return test in selection or bool(ids(selection, test))


def preset_key(case_id: str) -> tuple:
    """A preset's (recipe, gpu, precision) from its case id ``recipe-gpu-precision``."""
    return tuple(case_id.rsplit("-", 2))


def test_the_default_marks_are_pyprojects(pytestconfig):
    addopts = pytestconfig.getini("addopts")
    assert addopts[addopts.index("-m") + 1] == DEFAULT_MARKS


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_has_a_reject_and_an_accept_case_in_the_default_run(default_selection, rule):
    if RULES[rule].before_resolution:  # judged on a composed config: tests of its own in test_rules.py
        for verdict in ("rejects", "accepts"):
            prefix = f"tests/test_rules.py::test_{rule}_{verdict}"
            assert any(node.startswith(prefix) for node in default_selection), f"no default {verdict} test of {rule}"
        return
    reject, accept = RULE_CASES[rule]
    assert reject is not None and accept is not None
    for test in ("test_rule_rejects", "test_rule_accepts"):
        assert rule in ids(default_selection, f"tests/test_rules.py::{test}"), f"{test}[{rule}] is not run by default"


def test_every_rule_has_a_default_fix_that_is_followed(default_selection):
    cases = ids(default_selection, "tests/test_fix_follows.py::test_the_fix_a_message_names_works_when_followed")
    assert {case.split("#")[0] for case in cases} >= set(RULE_CASES)
    assert runs(default_selection, "tests/test_fix_follows.py::test_few_messages_offer_only_prose")


def test_every_recipe_is_planned_by_default_and_every_graph_choice_with_some_recipe(default_selection):
    pairs = [case.rsplit("-", 1) for case in
             ids(default_selection, "tests/test_plan_equals_run.py::test_the_run_refuses_what_the_plan_reports")]
    shipped = sorted(path.relative_to(config_dir() / "recipe").with_suffix("").as_posix()
                     for path in (config_dir() / "recipe").glob("*/*.yaml"))
    assert shipped == recipe_names()  # the recipe group as Hydra lists its files: nothing the walk misses
    assert {recipe for recipe, _ in pairs} == set(recipe_names()) and recipe_names()
    assert {choice for _, choice in pairs} == {path.stem for path in (config_dir() / "cuda_graph").glob("*.yaml")}


def test_every_workload_preset_is_planned_on_its_own_gpu_by_default(default_selection):
    shipped = {(recipe, gpu, precision) for recipe in recipe_names() for gpu, precision in presets(recipe)}
    on_disk = {(str(path.parent.relative_to(config_dir() / "preset").as_posix()), *path.stem.split("_", 1))
               for path in (config_dir() / "preset").glob("*/*/*.yaml")}
    assert shipped == on_disk and shipped
    planned = set(map(preset_key, ids(default_selection, "tests/test_presets.py::"
                                                         "test_every_preset_plans_valid_on_its_own_gpu")))
    # An h200 preset is its h100 twin (test_presets.py asserts it; the h200 ones compose through the CLI elsewhere).
    assert {key for key in shipped if key[1] != "h200"} <= planned
    assert runs(default_selection, "tests/test_presets.py::test_every_h100_preset_has_an_h200_twin_that_is_exactly_it")
    for test in ("test_effective_values_match_the_reference", "test_bridge_perf_defaults_apply"):
        assert set(map(preset_key, ids(default_selection, f"tests/test_presets.py::{test}"))) == set(ROWS), test


def test_every_sweep_preset_is_planned_by_default(default_selection):
    cases = ids(default_selection,
                "tests/test_sweeps.py::test_every_job_of_a_sweep_preset_is_valid_on_the_recipes_it_is_for")
    assert {case.split("-")[0] for case in cases} == {path.stem for path in (config_dir() / "sweep").glob("*.yaml")}


def test_the_preset_graph_choices_sample_holds_every_kind_of_row(default_selection):
    sample = map(preset_key, ids(default_selection, "tests/test_preset_graph_choices.py::"
                                                    "test_every_cuda_graph_choice_gets_the_expected_verdict"))
    assert {row_kind(key) for key in sample} == {row_kind(key) for key in ROWS}


def test_the_release_verdict_sample_holds_every_shared_rule_for_every_release(default_selection):
    sample = {tuple(case.split("-", 1)) for case in ids(
        default_selection, "tests/test_versions.py::test_a_valid_plan_builds_and_shared_rules_agree")}
    shared = {(version, case_id) for version in SUPPORTED for case_id, case in megatron_fixture.case_ids()
              if case.megatron}
    assert shared and shared <= sample
    assert {version for version, _ in sample} == set(SUPPORTED)


def test_the_absurd_value_sample_tries_every_number_field(default_selection):
    cases = ids(default_selection,
                "tests/test_absurd_values.py::test_a_plan_answers_at_once_and_refuses_in_one_line_per_violation")
    tried = {key for case in cases for key in (INT_KEYS if case.startswith(f"{EVERY_INT}=") else
                                               [case.split("=", 1)[0]])}
    assert tried == set(FIELDS)


# --- tests/sampling.py: a sample and its slow half are the whole list ----------------------------------------------

def halves(params) -> tuple:
    """The values of the params a plain `pytest` runs, and of the slow ones."""
    assert all(param.marks in ((), (SLOW,)) for param in params)
    return [param.values for param in params if not param.marks], [param.values for param in params if param.marks]


def test_a_split_keeps_every_value_in_order_and_marks_the_rest_slow():
    params = split(range(7), lambda index, value: value % 3 == 0, ids=str)
    assert [param.values for param in params] == [(value,) for value in range(7)]
    assert [param.id for param in params] == [str(value) for value in range(7)]
    assert halves(params) == ([(0,), (3,), (6,)], [(1,), (2,), (4,), (5,)])
    several = split([("a", 1), ("b", 2)], lambda index, _: index == 0, several=True)
    assert halves(several) == ([("a", 1)], [("b", 2)])


def test_every_takes_the_first_and_each_step_on():
    assert halves(every(list("abcdefg"), 3)) == ([("a",), ("d",), ("g",)], [("b",), ("c",), ("e",), ("f",)])


def test_one_per_takes_the_first_of_each_signature():
    params = one_per([10, 11, 20, 12, 21, 30], signature=lambda value: value // 10)
    assert halves(params) == ([(10,), (20,), (30,)], [(11,), (12,), (21,)])
