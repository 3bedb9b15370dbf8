"""Bad input never ends in a traceback. Random override sets and random damage to one YAML file
of a copy of the config tree go through the real plan path in-process (perf.preflight.check,
Hydra composition, prepare, build_plan), and every outcome is one of: a valid plan, a list of
violations, a preflight message, or a composition error from Hydra or OmegaConf with a message.
Any other exception fails the test with hypothesis's smallest example; the damage that once got
past preflight (FORMER_GAPS) has a test of its one-line message.

By default 310 cases (60 override sets, 200 syntax-breaking damages, 50 damages of any kind); under
-m slow another 1600 (300, 1000 and 300), drawn by tests of their own. A preflight verdict costs about
20 ms, a composition about 0.2 s, so the default keeps the file near half a minute on two cores
(tests/test_cli_fuzz.py fuzzes the command line further). Run with --hypothesis-show-statistics to see
how the outcomes split.

The examples are a function of the seed alone: by default hypothesis derives it from each test's
source; GRAPHBRIDGE_FUZZ_SEED=N draws another reproducible set (a failure names its seed).
"""

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest
from hydra.errors import HydraException
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from bridge.config.load import compose_config
from bridge.prepare import prepare
from bridge.config.paths import config_dir
from bridge.config.schema import GraphBridgeConfig
from bridge.planning import build_plan
from perf.preflight import check
from tests.config_damage import FORMER_GAPS, replaced

COMPOSITION_ERRORS = (HydraException, OmegaConfBaseException)
# Deterministic: the same examples on every run (derandomize, no example database), so a failure
# is reproducible from the test alone; a new seed is a code change.
FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
FUZZ_SEED = os.environ.get("GRAPHBRIDGE_FUZZ_SEED")


def seeded(test):
    """``test`` drawing from GRAPHBRIDGE_FUZZ_SEED when it is set (hypothesis's @seed wins over derandomize)."""
    return seed(int(FUZZ_SEED))(test) if FUZZ_SEED else test


def plan_outcome(overrides: Sequence[str], config_root: Optional[Path] = None) -> str:
    """What graphbridge mode=plan would end with; raises on anything outside the allowed set."""
    problem = check(list(overrides), config_root=config_root)
    if problem is not None:
        assert isinstance(problem, str) and problem.strip()
        return "preflight message"
    try:
        prepared = prepare(compose_config(overrides, config_root=config_root))
    except COMPOSITION_ERRORS as error:
        # Hydra prints the cause's message when its own is empty, as for a bad interpolation.
        assert str(error).strip() or str(error.__cause__ or "").strip(), f"{type(error).__name__} without a message"
        return f"composition error ({type(error).__name__})"
    plan = build_plan(prepared)
    report = json.loads(plan.to_json())
    if plan.valid:
        return "valid plan"
    assert report["violations"] and all(v["rule"] and v["keys"] and v["message"] for v in report["violations"])
    return "violations"


@pytest.mark.parametrize("case", sorted(FORMER_GAPS))
def test_former_gap_is_one_line_from_preflight(config_tree, case):
    overrides, relative_path, text, expected = FORMER_GAPS[case]
    with replaced(config_tree.root, relative_path, text):
        assert plan_outcome(overrides, config_root=config_tree.root) == "preflight message"
        message = check(list(overrides), config_root=config_tree.root)
    assert expected.format(file=config_tree.root / (relative_path or "")) in message
    assert "\n" not in message and "Traceback" not in message


def test_composition_without_the_schema_is_a_composition_error(config_tree):
    # Past preflight (the in-process API does not run it), prepare still names the fix.
    with replaced(config_tree.root, "config.yaml", ""):
        with pytest.raises(HydraException, match="must name base_config first"):
            prepare(compose_config([], config_root=config_tree.root))


# --- random override sets ------------------------------------------------------------------


def leaf_keys(node=GraphBridgeConfig, prefix: str = "") -> List[str]:
    keys = []
    for field in dataclasses.fields(node):
        if dataclasses.is_dataclass(field.type):
            keys += leaf_keys(field.type, f"{prefix}{field.name}.")
        else:
            keys.append(prefix + field.name)
    return keys


LEAF_KEYS = leaf_keys()
GROUPS = {
    "recipe": ["llama/tiny", "qwen/tiny", "deepseek/tiny", "gpt_oss/tiny", "llama/llama3_8b", "qwen/qwen3_30b_a3b",
               "llama/tinyy", "mistral/tiny", "llama"],
    "gpu": ["h100", "b200", "gb200", "a100", "null"],
    "precision": ["bf16", "fp8_cs", "fp8_mx", "nvfp4", "fp16"],
    "cuda_graph": ["none", "full_iteration", "local_layer", "te_attn", "te_attn_mlp", "te_moe", "te_atn", "full"],
    "sweep": ["dense_scopes", "moe_scopes", "nope"],
}
VALUES = ["0", "1", "-1", "3", "65536", "1.5", "-0.5", "1e400", "nan", "true", "false", "null", "abc", "''", "'a b'",
          "[]", "[attn]", "[attn,mlp]", "[1,2]", "{}", "{a: 1}", "[", "{", "]", "'", "???", "${oops}",
          "${model.hidden_size}", "glob(*)", "1,2", "range(1,3)", "choice(a,b)"]


def typo(key: str, draw) -> str:
    position = draw(st.integers(0, len(key) - 1))
    kind = draw(st.sampled_from(["drop", "double", "swap", "case"]))
    if kind == "drop":
        return key[:position] + key[position + 1:]
    if kind == "double":
        return key[:position] + key[position] + key[position:]
    if kind == "swap" and position + 1 < len(key):
        return key[:position] + key[position + 1] + key[position] + key[position + 2:]
    return key[:position] + key[position].upper() + key[position + 1:]


@st.composite
def bad_override(draw) -> str:
    kind = draw(st.sampled_from(["value", "value", "value", "typo", "group", "add", "delete", "raw"]))
    if kind == "group":
        group = draw(st.sampled_from(sorted(GROUPS)))
        return f"{group}={draw(st.sampled_from(GROUPS[group]))}"
    key = draw(st.sampled_from(LEAF_KEYS))
    value = draw(st.sampled_from(VALUES))
    if kind == "typo":
        return f"{typo(key, draw)}={value}"
    if kind == "add":
        return f"{draw(st.sampled_from(['+', '++']))}{key}={value}"
    if kind == "delete":
        return f"~{key}"
    if kind == "raw":
        return draw(st.sampled_from([key, f"{key}=", "=1", f"{key}==1", f"{key} =1", "model..num_layers=2", "@x=1"]))
    return f"{key}={value}"


@seeded
@settings(FUZZ, max_examples=60)
@given(st.lists(bad_override(), max_size=4))
def test_random_overrides_end_in_an_allowed_outcome(overrides):
    event(plan_outcome(overrides))


@pytest.mark.slow
@seeded
@settings(FUZZ, max_examples=300)
@given(st.lists(bad_override(), max_size=4))
def test_random_overrides_end_in_an_allowed_outcome_many(overrides):
    event(plan_outcome(overrides))


# --- random damage to one YAML file ---------------------------------------------------------

# Compositions that between them load every kind of file: recipes with and without presets,
# each family's arch, gpu and precision files, cuda_graph and sweep options.
SCENARIOS = (
    (),
    ("recipe=llama/llama3_8b", "gpu=h100"),
    ("recipe=qwen/qwen3_30b_a3b", "gpu=b200", "precision=fp8_mx"),
    ("recipe=deepseek/tiny", "cuda_graph=te_attn"),
    ("recipe=gpt_oss/tiny", "cuda_graph=full_iteration"),
    ("recipe=qwen/tiny", "sweep=moe_scopes"),
    ("recipe=deepseek/deepseek_v3", "gpu=gb200"),
    ("recipe=llama/llama3_8b_sft", "gpu=gb200"),
    ("recipe=gpt_oss/gpt_oss_120b", "gpu=b300"),
    ("recipe=llama/llama3_8b_lora", "cuda_graph=local_layer"),
)
BAD_VALUES = ["abc", "[1, 2]", "{x: 1}", "null", "-3", "0", "1.5", "true", "'???'", "???", "${nope}",
              "${model.hidden_size}", "1e400", ".nan", "[]", "{}", "/arch/nope", "_self_"]
SYNTAX_BREAKING = ("tab", "bracket")


@dataclasses.dataclass
class ConfigTree:
    root: Path
    """The copy's conf/; its recipe entry is a symlink to ../recipes, as in the checkout."""
    loaded: Dict[tuple, List[Path]]
    """For each scenario, the YAML files its composition reads."""


# A copy a worker (its tests damage it, one file at a time, and put the file back); which files each scenario
# reads, as paths within the tree, asked of the command line once a session (conftest.py's across_workers).
@pytest.fixture(scope="session")
def config_tree(cli, tmp_path_factory, across_workers) -> ConfigTree:
    base = tmp_path_factory.mktemp("tree")
    conf = config_dir()
    shutil.copytree(conf, base / "conf", symlinks=True)
    shutil.copytree((conf / "recipe").resolve(), base / "recipes")
    root = base / "conf"
    assert (root / "recipe").is_symlink() and (root / "recipe" / "llama" / "tiny.yaml").is_file()
    loaded = across_workers("fuzz_files_loaded", lambda: {
        scenario: [path.relative_to(root) for path in files] for scenario, files in files_loaded(cli, root).items()})
    return ConfigTree(root, {scenario: [root / path for path in paths] for scenario, paths in loaded.items()})


def files_loaded(cli, root: Path) -> Dict[tuple, List[Path]]:
    """For each scenario, the YAML files of the copy that its composition reads, from Hydra's defaults list as
    `graphbridge --info defaults` prints it (the copy is graphbridge's own tree); every scenario asked of one
    process (cli.many)."""
    found = {}
    for scenario, done in zip(SCENARIOS, cli.many([("--info", "defaults", *scenario) for scenario in SCENARIOS],
                                                  cwd=root.parent)):
        assert done.returncode == 0, done.stderr
        paths = re.findall(r"^\| (\S+) +\|", done.stdout, re.M)
        files = [root / f"{path}.yaml" for path in paths]
        found[scenario] = [path for path in files if path.is_file()]  # leaves out Hydra's own and the schema
    return found


KEY_OR_ITEM = re.compile(r"^\s*(- |[^\s#][^#]*?:(\s|$))")
BLOCK_SCALAR_START = re.compile(r"^\s*(- |[^\s#][^#]*?:\s+)?[|>][-+0-9]*\s*(#.*)?$")


def block_scalar_text(lines: Sequence[str]) -> set:
    """The indices of the lines inside block scalars (``key: |``): text there is the value itself,
    so a tab or a bracket in it is valid YAML (the --help template has such lines)."""
    inside, parent_indent = set(), None
    for index, line in enumerate(lines):
        indent = len(line) - len(line.lstrip(" "))
        if parent_indent is not None and (not line.strip() or indent > parent_indent):
            inside.add(index)
            continue
        parent_indent = indent if BLOCK_SCALAR_START.match(line.rstrip("\n")) else None
    return inside


def damage(text: str, kind: str, draw) -> str:
    lines = text.splitlines(keepends=True)
    literal = block_scalar_text(lines) if kind in SYNTAX_BREAKING else set()
    content = [i for i, line in enumerate(lines)
               if line.strip() and not line.lstrip().startswith("#") and i not in literal]
    if kind == "truncate" or not content:
        return text[:draw(st.integers(0, max(0, len(text) - 1)))]
    index = draw(st.sampled_from(content))
    line = lines[index].rstrip("\n")
    indent = len(line) - len(line.lstrip(" "))
    key_or_item = KEY_OR_ITEM.match(line)
    # What comes before a value: "  key: ", "  - ", or the indentation of a bare line.
    prefix = key_or_item.group(0).rstrip() + " " if key_or_item else " " * indent
    if kind == "tab":
        column = draw(st.sampled_from([0, indent]))
        lines[index] = line[:column] + "\t" + line[column:] + "\n"
    elif kind == "bracket":  # an unclosed flow collection as the value
        lines[index] = prefix + draw(st.sampled_from(["[", "{", "[1, 2", "{a: 1"])) + "\n"
    elif kind == "indent":
        shift = draw(st.sampled_from([-4, -2, -1, 1, 2, 4]))
        lines[index] = " " * max(0, indent + shift) + line.lstrip(" ") + "\n"
    elif kind == "value":
        lines[index] = prefix + draw(st.sampled_from(BAD_VALUES)) + "\n"
    return "".join(lines)


def damaged_case(config_tree: ConfigTree, kinds: Sequence[str], data) -> str:
    """Damage one file a random scenario reads and run the plan path on the damaged tree."""
    scenario = data.draw(st.sampled_from(SCENARIOS), label="scenario")
    path = data.draw(st.sampled_from(config_tree.loaded[scenario]), label="file")
    kind = data.draw(st.sampled_from(kinds), label="damage")
    damaged = damage(path.read_text(), kind, data.draw)
    data.draw(st.just(damaged), label="damaged text")
    with replaced(config_tree.root, str(path.relative_to(config_tree.root)), damaged):
        return plan_outcome(scenario, config_root=config_tree.root)


def syntax_damage_is_named_by_preflight(config_tree, data):
    outcome = damaged_case(config_tree, SYNTAX_BREAKING, data)
    event(outcome)
    assert outcome == "preflight message"


ANY_DAMAGE = ("truncate", "indent", "value", "tab", "bracket")


@seeded
@settings(FUZZ, max_examples=200)
@given(data=st.data())
def test_syntax_damage_is_named_by_preflight(config_tree, data):
    syntax_damage_is_named_by_preflight(config_tree, data)


@pytest.mark.slow
@seeded
@settings(FUZZ, max_examples=1000)
@given(data=st.data())
def test_syntax_damage_is_named_by_preflight_many(config_tree, data):
    syntax_damage_is_named_by_preflight(config_tree, data)


@seeded
@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_any_damage_to_a_yaml_file_ends_in_an_allowed_outcome(config_tree, data):
    event(damaged_case(config_tree, ANY_DAMAGE, data))


@pytest.mark.slow
@seeded
@settings(FUZZ, max_examples=300)
@given(data=st.data())
def test_any_damage_to_a_yaml_file_ends_in_an_allowed_outcome_many(config_tree, data):
    event(damaged_case(config_tree, ANY_DAMAGE, data))
