"""Bad input on the command line: one line naming the file and line, or the override and the nearest
name or the fix."""

import os
import shutil
from pathlib import Path

import pytest

from bridge.config.load import compose_config
from bridge.config.paths import config_dir
from perf.preflight import check
from tests.config_damage import FORMER_GAPS, replaced

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["model.num_layer=3"], "did you mean model.num_layers?"),
        (["trian.train_iters=3"], "did you mean train.train_iters?"),
        (["cuda_graph=te_atn"], "did you mean te_attn"),
        (["-m", "cuda_graph=none,te_atn"], "cuda_graph=te_atn: no such option"),
        (["recipe=llama/tinyy"], "did you mean llama/tiny"),
        (["ddp.check_for_nan_in_grads=false"], "did you mean ddp.check_for_nan_in_grad?"),
    ],
)
def test_unknown_names_get_the_nearest_valid_one(argv, expected):
    assert expected in check(argv)


@pytest.mark.parametrize(
    "argv",
    [["cuda_graph=te_attn", "model.num_layers=2"], ["+env_vars.NCCL_GRAPH_REGISTER=0"], ["hydra.run.dir=x"],
     ["--cfg", "job"], ["recipe=llama/tiny"], ["model.cuda_graph_modules=[attn]"], ["cuda_graph=glob(te_*)"],
     ["-m", "hydra/launcher=basic"], ["model.num_layers='4'"], ["model.num_layers=${train.train_iters}"],
     ["-m", "model.num_layers=range(1,3)"], ["perf.tensorboard=null"], ["model.layernorm_epsilon=1"]],
)
def test_valid_command_lines_pass(argv):
    assert check(argv) is None


def test_broken_recipe_yaml_names_file_and_line(cli, tmp_path):
    broken = tmp_path / "recipe" / "llama" / "broken.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("# @package _global_\nmodel:\n  num_layers: [1,\n  hidden_size: 3\n")
    result = cli("--config-dir", str(tmp_path), "recipe=llama/broken", "mode=plan", cwd=tmp_path)
    assert result.returncode == 2
    assert f"{broken}: line 3, column 15" in result.stderr
    assert "Traceback" not in result.stderr


# --- config files: duplicate keys, headers, defaults lists, the primary config --------------


def check_extra_file(tmp_path, text, *argv):
    """Preflight's verdict on graphbridge's conf/ with one more config dir whose recipe ``extra`` (the
    recipe the command line selects) holds ``text``."""
    (tmp_path / "recipe").mkdir(exist_ok=True)
    (tmp_path / "recipe" / "extra.yaml").write_text(text)
    return check(["--config-dir", str(tmp_path), "recipe=extra", *argv])


def test_the_shipped_config_tree_passes():
    assert check([]) is None


def test_duplicate_key_names_its_line_and_the_first(tmp_path):
    problem = check_extra_file(tmp_path, "model:\n  num_layers: 2\ntrain:\n  train_iters: 3\nmodel:\n  hidden_size: 4\n")
    assert problem == (f"{tmp_path / 'recipe' / 'extra.yaml'}: line 5, column 1: duplicate key 'model', first at line 1 "
                       "(merge the two or delete one)")


def test_same_key_in_different_mappings_passes(tmp_path):
    assert check_extra_file(tmp_path, "model:\n  num_layers: 2\ntrain:\n  num_layers: 2\n") is None


@pytest.mark.parametrize("header", ["# @", "# @package", "# @package _global_ # eh", "# @package\t_global_",
                                    "# @package model..optimizer", "# @package $"])
def test_malformed_package_header_names_the_line(tmp_path, header):
    problem = check_extra_file(tmp_path, f"\n{header}\nmodel: {{}}\n")
    assert problem.startswith(f"{tmp_path / 'recipe' / 'extra.yaml'}: line 2: malformed header '{header.strip()}'")
    assert "write '# @package <package>'" in problem


@pytest.mark.parametrize("header", ["# @package _global_", "# @package _group_", "# @package model.optimizer",
                                    "#@package _global_", "# a comment first\n# @"])
def test_well_formed_package_header_passes(tmp_path, header):
    assert check_extra_file(tmp_path, f"{header}\nmodel: {{}}\n") is None


@pytest.mark.parametrize("text,line", [("- model\n", "a list"), ("3\n", "a single value")])
def test_config_file_that_is_not_a_mapping_is_named(tmp_path, text, line):
    assert check_extra_file(tmp_path, text) == (f"{tmp_path / 'recipe' / 'extra.yaml'}: line 1: a config file is a mapping "
                                                f"of keys, not {line} (write 'key: value')")


def test_empty_config_file_passes(tmp_path):
    assert check_extra_file(tmp_path, "# nothing yet\n") is None


@pytest.mark.parametrize("defaults", ["defaults:\n", "defaults: /arch/llama3\n", "defaults: {arch: llama3}\n"])
def test_defaults_that_is_not_a_list_is_named(tmp_path, defaults):
    problem = check_extra_file(tmp_path, "# @package _global_\n" + defaults)
    assert problem.startswith(f"{tmp_path / 'recipe' / 'extra.yaml'}: line 2: 'defaults' must be a list of config names")


@pytest.mark.parametrize("entry", ["[1, 2]", "3", "1e3", "null", "{}", "{a: x, b: y}", "gpu: 3", "gpu: [h100, 1]",
                                   "gpu: {a: 1}", "1: h100", "true", "???", "/arch/???@_global_"])
def test_defaults_entry_that_is_not_a_name_is_named(tmp_path, entry):
    problem = check_extra_file(tmp_path, f"defaults:\n  - _self_\n  - {entry}\n")
    assert problem == (f"{tmp_path / 'recipe' / 'extra.yaml'}: line 3: '{entry}' is not a defaults entry; write '- name' "
                       "or '- group: option' (the option a name, a list of names or null)")


def test_defaults_entry_in_a_flow_list_is_quoted_alone(tmp_path):
    problem = check_extra_file(tmp_path, "defaults: [_self_, 3, /arch/llama3]\n")
    assert problem.startswith(f"{tmp_path / 'recipe' / 'extra.yaml'}: line 1: '3' is not a defaults entry")


def test_every_kind_of_defaults_entry_passes(tmp_path):
    defaults = ["/arch/llama3", "/cuda_graph@_global_: none", "gpu: null", "gpu: ???", "precision:", "sweep: [a, b]",
                "optional sweep: null", "override precision: bf16", "/preset/llama/llama3_8b: ${gpu}_${precision}",
                "_self_"]
    assert check_extra_file(tmp_path, "defaults:\n" + "".join(f"  - {d}\n" for d in defaults)) is None
    assert check_extra_file(tmp_path, "defaults: []\n") is None


@pytest.fixture
def conf_copy(tmp_path):
    shutil.copytree(config_dir(), tmp_path / "conf")  # the recipe symlink becomes a copy
    return tmp_path / "conf"


@pytest.mark.parametrize("text", ["", "# emptied\n", "defaults:\n  - recipe: llama/tiny\n  - _self_\n",
                                  "model:\n  num_layers: 2\n"])
def test_primary_config_without_the_schema_is_named(conf_copy, text):
    (conf_copy / "config.yaml").write_text(text)
    problem = check([], config_root=conf_copy)
    assert problem.startswith(f"{conf_copy / 'config.yaml'}: ")
    assert "the primary config no longer loads the schema; put '- base_config' first" in problem


def test_primary_config_naming_the_schema_passes(conf_copy):
    (conf_copy / "config.yaml").write_text("defaults:\n  - base_config\n  - recipe: llama/tiny\n  - _self_\n")
    assert check([], config_root=conf_copy) is None
    (conf_copy / "config.yaml").write_text("")
    assert check(["-cn", "other"], config_root=conf_copy) is None  # another primary: Hydra and prepare judge it


# --- config groups set to null --------------------------------------------------------------


@pytest.mark.parametrize("argv", [["gpu=null"], ["+gpu=null"], ["-m", "gpu=h100,null"], ["recipe=null"]])
def test_group_set_to_null_says_to_delete_it(argv):
    group = argv[-1].lstrip("+").split("=")[0]
    assert check(argv).startswith(f"{group}=null: a config group cannot be set to null; to use no {group} option "
                                  f"write ~{group} (options: ")


@pytest.mark.parametrize("argv", [["~gpu"], ["~gpu=null"], ["~recipe"], ["gpu=h100"], ["-m", "gpu=h100,b200"]])
def test_deleting_a_group_passes(argv):
    assert check(argv) is None


def test_tilde_group_composes_without_the_option():
    # What the null message advises, checked against Hydra: ~group drops even a group with a default.
    assert compose_config(["~gpu"]).workload.gpu is None
    assert compose_config(["~recipe"]).model.hidden_size != compose_config([]).model.hidden_size


# --- the real command line on a damaged copy of graphbridge ---------------------------------


@pytest.fixture(scope="module")
def installed_copy(tmp_path_factory):
    """bridge/, perf/ and conf/ copied side by side, as a checkout: conf/ is the copy's to damage."""
    site = tmp_path_factory.mktemp("site")
    for package in ("bridge", "perf"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(config_dir(), site / "conf")
    return site


@pytest.mark.parametrize("case", sorted(FORMER_GAPS))
def test_former_gaps_are_one_line_on_the_command_line(cli, installed_copy, tmp_path, case):
    overrides, relative_path, text, expected = FORMER_GAPS[case]
    conf = installed_copy / "conf"
    with replaced(conf, relative_path, text):
        result = cli("mode=plan", *overrides, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(installed_copy)})
    assert result.returncode == 2
    assert result.stderr.startswith("graphbridge: " + expected.format(file=conf / (relative_path or "")))
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""


# --- a user's --config-dir and the command line, one line each (exit 2) ----------------------


def one_line(result, expected: str):
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("graphbridge: ") and expected in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_a_symlink_loop_in_a_config_dir_does_not_hang(cli, tmp_path):
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "loop").symlink_to(tmp_path / "conf")
    # A plan takes a second; walking the loop (as the --help resolver once did on every run) took minutes.
    result = cli("--config-dir", str(tmp_path / "conf"), "mode=plan", cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr


def test_broken_files_the_command_does_not_use_stop_nothing(cli, tmp_path):
    conf = tmp_path / "conf"
    (conf / "recipe" / "mine").mkdir(parents=True)
    (conf / "recipe" / "mine" / "broken.yaml").write_text("model: [1,\n")
    (conf / "recipe" / "mine" / "latin1.yaml").write_bytes("# caf\xe9\nmodel: {}\n".encode("latin-1"))
    (conf / "recipe" / "mine" / "dangling.yaml").symlink_to(tmp_path / "nowhere.yaml")
    result = cli("--config-dir", str(conf), "mode=plan", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    one_line(cli("--config-dir", str(conf), "recipe=mine/latin1", "mode=plan", cwd=tmp_path),
             "latin1.yaml: byte 5: not UTF-8 text")
    one_line(cli("--config-dir", str(conf), "recipe=mine/broken", "mode=plan", cwd=tmp_path),
             "broken.yaml: line 2")


# The command lines below that only print a refusal run one after another in one `graphbridge` process a session
# (conftest.py's cli_batch): REFUSED, at the end of this section, lists them.

BAD_COMMAND_LINES = [
    ("+model.cuda_graph_scop=[attn]", "no key 'cuda_graph_scop' in model; did you mean model.cuda_graph_scope?"),
    ("++train.iters=3", "no key 'iters' in train"),
    ("cuda_graphs=te_attn", "no key 'cuda_graphs' in the top level; did you mean cuda_graph?"),  # a group
    ("+hydra.callbacks.x._target_=os.getcwd", "no callback 'x'; from the command line hydra.callbacks takes "
                                              "graphbridge's own (run_directory, summary)"),
    ("recipe=llama/llama3_8b", "recipe=llama/llama3_8b runs Bridge's per-GPU presets: add gpu= and precision="),
    ("train.train_iters=${oops}", "train.train_iters: Interpolation key 'oops' not found"),
    ("model." + "x" * 10000 + "=1", "no key 'x"),
]


@pytest.mark.parametrize("override, expected", BAD_COMMAND_LINES)
def test_bad_command_lines_are_one_line(refused, override, expected):
    one_line(refused[("mode=plan", override)], expected)


# --- a misspelled key, a value of the wrong type: what to type instead -----------------------


def test_a_misspelled_section_suggests_a_key_that_exists_as_a_whole(refused):
    # 'mode' is nearer to 'modle' than 'model', but a string: mode.num_layers would fail again.
    result = refused[("mode=plan", "modle.num_layers=2")]
    one_line(result, "modle.num_layers: no key 'modle' in the top level; did you mean model.num_layers?")
    assert "mode.num_layers" not in result.stderr


OTHER_MISSPELLINGS = ["modl.num_layers=2", "model.num_layer=2"]
FAR_MISSPELLINGS = ["zzzqq.num_layers=2", "modle.num_layer=2"]


@pytest.mark.parametrize("override", OTHER_MISSPELLINGS)
def test_other_misspellings_still_get_the_key(refused, override):
    one_line(refused[("mode=plan", override)], "did you mean model.num_layers?")


@pytest.mark.parametrize("override", FAR_MISSPELLINGS)
def test_no_key_near_enough_gets_no_suggestion(refused, override):
    result = refused[("mode=plan", override)]
    one_line(result, "(graphbridge --cfg job lists every key)")
    assert "did you mean" not in result.stderr


def example_in(result) -> str:
    """The value of the example that ends a one-line type error."""
    return result.stderr.strip().rsplit("=", 1)[1]


@pytest.mark.parametrize("recipe", ["llama/tiny", "qwen/tiny"])
def test_an_integer_key_given_a_word_says_to_type_an_integer(cli, tmp_path, recipe):
    result = cli("mode=plan", f"recipe={recipe}", "model.num_layers=abc", cwd=tmp_path)
    one_line(result, "graphbridge: model.num_layers takes an integer, e.g. model.num_layers=")
    # The example is the value the command line composes to without the bad override, and it runs.
    assert example_in(result) == str(compose_config([f"recipe={recipe}"]).model.num_layers)
    fixed = cli("--cfg", "job", "mode=plan", f"recipe={recipe}", f"model.num_layers={example_in(result)}", cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr


NOT_INTEGERS = [["model.num_layers=1.5"], ["model.num_layers=[1,2]"], ["model.num_layers=null"],
                ["model.num_layers='two\nlines'"], ["model.num_layers=" + "x" * 10000],
                ["-m", "model.num_layers=2,abc"], ["model.num_layers=1.5", "=1"]]


@pytest.mark.parametrize("args", NOT_INTEGERS,
                         ids=["float", "list", "null", "newline", "long", "sweep", "beside_a_keyless_override"])
def test_an_integer_key_given_anything_else_gets_one_line(refused, args):
    result = refused[(*args, "mode=plan")]  # -m first: Hydra's flags come before the overrides
    one_line(result, "graphbridge: model.num_layers takes an integer, e.g. model.num_layers=")
    int(example_in(result))


TOO_LONG = "model.layernorm_epsilon=" + "9" * 5000


def test_an_integer_too_long_to_read_is_named(refused):
    one_line(refused[("mode=plan", TOO_LONG)], "model.layernorm_epsilon: a number of more than 4300 digits")


def test_a_float_key_given_a_word_says_to_type_a_number(refused):
    result = refused[("mode=plan", "model.layernorm_epsilon=abc")]
    one_line(result, "graphbridge: model.layernorm_epsilon takes a number, e.g. model.layernorm_epsilon=")
    assert float(example_in(result)) == compose_config([]).model.layernorm_epsilon


NOT_BOOLS = [
    ("dataset.mock=maybe", "dataset.mock takes true or false, e.g. dataset.mock=true"),
    ("perf.tensorboard=maybe", "perf.tensorboard takes true or false (or null), e.g. perf.tensorboard=true"),
]


@pytest.mark.parametrize("override, expected", NOT_BOOLS)
def test_a_bool_key_given_a_word_says_true_or_false(refused, override, expected):
    result = refused[("mode=plan", override)]
    one_line(result, expected)
    assert result.stderr == f"graphbridge: {expected}\n"


def test_an_enum_key_given_another_word_lists_its_choices(refused):
    one_line(refused[("mode=plan", "plan.format=yaml")],
             "plan.format takes one of text, json, bridge, e.g. plan.format=text")


def test_hydra_shell_completion_passes_preflight(cli, tmp_path):
    result = cli("-sc", "install=bash", cwd=tmp_path)
    assert result.returncode == 0 and "hydra_bash_completion" in result.stdout, result.stderr


# --- what Hydra or OmegaConf refuse, and Hydra's own tree: one line, exit 2 ---------------------


HYDRA_REFUSES = [
    (["train.train_iters=abc"], "train.train_iters takes an integer, e.g. train.train_iters="),
    (["train.train_iters=[1,"], "no viable alternative at input '[1,' (see https://hydra.cc/"),
    (["env_vars.X=1"], "To append to your config use +env_vars.X=1"),
    (["hydra.run.dir=${oops}"], "hydra.run.dir: Interpolation key 'oops' not found"),
    (["hydra.job.name=${oops}"], "hydra.job.name: Interpolation key 'oops' not found"),
    (["hydra.verbose=${oops}"], "Interpolation key 'oops' not found"),
    (["cuda_graph=none,te_attn", "hydra.sweep.subdir=${oops}", "-m"], "hydra.sweep.subdir: Interpolation key 'oops'"),
    (["hydra.callbacks.run_directory.wait=maybe"], "hydra.callbacks.run_directory.wait=maybe: true (wait for"),
    (["--config-dir=/nonexistent/conf"], "Additional config directory '/nonexistent/conf' not found"),
    (["+env_vars." + "k" * 300 + "=1"], "no config key or group has a name this long (at most 255 bytes)"),
    (["hydra.run.dir=" + "d" * 300 + "/run"], "File name too long; choose another hydra.run.dir"),
    (["-m", "cuda_graph=none"], "-m: Hydra takes its flags before the overrides; write graphbridge -m <overrides>"),
    (["--bogus"], "--bogus: no such flag"),
]


@pytest.mark.parametrize("args, expected", HYDRA_REFUSES, ids=[
    "type", "syntax", "not-in-struct", "run-dir-interpolation", "job-name-interpolation", "verbose-interpolation",
    "sweep-subdir-interpolation", "wait-not-a-bool", "missing-config-dir", "long-key", "long-run-dir",
    "flag-between-overrides", "unknown-flag"])
def test_what_hydra_refuses_is_one_line(refused, args, expected):
    # cli_batch asserts that the directory the commands ran in is left empty: nothing made, nothing left.
    one_line(refused[("mode=plan", *args)], expected)


REFUSED = [*(("mode=plan", override) for override, _ in BAD_COMMAND_LINES), ("mode=plan", "modle.num_layers=2"),
           *(("mode=plan", override) for override in OTHER_MISSPELLINGS + FAR_MISSPELLINGS),
           *((*args, "mode=plan") for args in NOT_INTEGERS), ("mode=plan", TOO_LONG),
           ("mode=plan", "model.layernorm_epsilon=abc"), *(("mode=plan", override) for override, _ in NOT_BOOLS),
           ("mode=plan", "plan.format=yaml"), *(("mode=plan", *args) for args, _ in HYDRA_REFUSES)]


@pytest.fixture(scope="session")
def refused(cli_batch) -> dict:
    """Each command line of REFUSED -> its `graphbridge` result, all run by one process a session (cli_batch)."""
    return cli_batch("preflight_refusals", REFUSED)


def test_bytes_that_are_not_utf8_are_named(cli, tmp_path):
    one_line(cli("mode=plan", os.fsdecode(b"model.num_layers=\xe9"), cwd=tmp_path),
             "model.num_layers=\\xe9: byte 0xe9 is not UTF-8 text")


@pytest.mark.parametrize("mode", ["mode=plan", "mode=train"])
@pytest.mark.parametrize("override, expected", [
    ("+hydra.callbacks.x={_target_:logging.FileHandler,filename:%s}", "no callback 'x'"),
    ("hydra.callbacks.summary={_target_:logging.FileHandler,filename:%s}", "Hydra would import and call "
                                                                          "logging.FileHandler on every run"),
    ("hydra.callbacks.run_directory.x={_target_:logging.FileHandler,filename:%s}", "hydra.callbacks.run_directory "
                                                                                  "is graphbridge's"),
    ("+hydra.job_logging.handlers.x={class:logging.FileHandler,filename:%s}",
     "Hydra would import and call logging.FileHandler (hydra.job_logging.handlers.x.class)"),
    ("hydra.launcher._target_=logging.FileHandler", "(hydra.launcher._target_); choose Hydra's logging and plugins"),
], ids=["new-callback", "callback-target", "nested-target", "logging-class", "launcher-target"])
def test_a_callable_set_in_hydras_tree_is_refused_and_never_called(cli, tmp_path, mode, override, expected):
    # Were the callable called, the file would exist: a FileHandler creates its file.
    called = tmp_path / "called.log"
    one_line(cli(mode, "engine=torch", override.replace("%s", str(called)), cwd=tmp_path), expected)
    assert not called.exists()


def test_graphbridges_own_callbacks_can_be_set(cli, tmp_path):
    result = cli("mode=plan", "hydra.callbacks.run_directory={wait:false}", "~hydra.callbacks.summary",
                 "hydra.callbacks.run_directory._target_=perf.outputs.RunDirectory", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_symlink_loop_is_named_where_help_would_walk_it(cli, tmp_path):
    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "conf" / "recipe" / "loop").symlink_to(tmp_path / "conf")
    one_line(cli("--config-dir", str(tmp_path / "conf"), "--help", cwd=tmp_path, timeout=60),
             f"{tmp_path / 'conf' / 'recipe' / 'loop'}: a symlink to {tmp_path / 'conf'}, which holds it")


def test_a_link_to_nothing_is_no_option(cli, tmp_path):
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    one_line(cli("--config-dir", str(tmp_path), "recipe=gone", "mode=plan", cwd=tmp_path),
             "recipe=gone: no such option")
