"""Bad input on the command line: one line naming the file and line, or the nearest name."""

import pytest

from perf.preflight import check
from tests.test_cli import graphbridge


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
     ["--cfg", "job"], ["recipe=llama/tiny"], ["model.cuda_graph_modules=[attn]"], ["cuda_graph=glob(te_*)"]],
)
def test_valid_command_lines_pass(argv):
    assert check(argv) is None


def test_broken_recipe_yaml_names_file_and_line(tmp_path):
    broken = tmp_path / "recipe" / "llama" / "broken.yaml"
    broken.parent.mkdir(parents=True)
    broken.write_text("# @package _global_\nmodel:\n  num_layers: [1,\n  hidden_size: 3\n")
    result = graphbridge("--config-dir", str(tmp_path), "recipe=llama/broken", "mode=plan", cwd=tmp_path)
    assert result.returncode == 1
    assert f"{broken}: line 3, column 15" in result.stderr
    assert "Traceback" not in result.stderr
