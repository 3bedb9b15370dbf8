"""The allocator options a graphed job's training process gets where the user set none (bridge/allocator.py)."""

import os

import pytest

from bridge import run
from bridge.allocator import ALLOC_CONF, NCCL_GRAPH_REGISTER, graph_allocator_settings

NEW_TORCH, OLD_TORCH = "2.11.0+cu130", "2.8.0"


def settings(small_config, *overrides, environ=None, torch_version=NEW_TORCH):
    return graph_allocator_settings(small_config("llama/tiny", *overrides), environ or {}, torch_version)


def test_a_full_iteration_graph_gets_capture_reuse_and_expandable_segments(small_config):
    assert settings(small_config, "cuda_graph=full_iteration") == {
        ALLOC_CONF: "graph_capture_record_stream_reuse:True,expandable_segments:True", NCCL_GRAPH_REGISTER: "0"}


@pytest.mark.parametrize("choice", ["te_attn", "local_layer"])
def test_per_layer_graphs_get_capture_reuse_alone(small_config, choice):
    assert settings(small_config, f"cuda_graph={choice}") == {ALLOC_CONF: "graph_capture_record_stream_reuse:True"}


def test_an_eager_job_gets_nothing(small_config):
    assert settings(small_config, "cuda_graph=none") == {}


def test_what_the_user_wrote_stays_and_only_options_it_does_not_name_are_added(small_config):
    assert settings(small_config, "cuda_graph=full_iteration",
                    "+env_vars.PYTORCH_CUDA_ALLOC_CONF='expandable_segments:False,max_split_size_mb:512'") == {
        ALLOC_CONF: "expandable_segments:False,max_split_size_mb:512,graph_capture_record_stream_reuse:True"}
    assert settings(small_config, "cuda_graph=full_iteration",
                    "+env_vars.PYTORCH_CUDA_ALLOC_CONF=graph_capture_record_stream_reuse:False",
                    "+env_vars.NCCL_GRAPH_REGISTER=0") == {
        ALLOC_CONF: "graph_capture_record_stream_reuse:False,expandable_segments:True", NCCL_GRAPH_REGISTER: "0"}


def test_the_starting_environment_counts_as_the_users_unless_the_config_sets_the_variable(small_config):
    shell = {ALLOC_CONF: "expandable_segments:False", NCCL_GRAPH_REGISTER: "1"}
    assert settings(small_config, "cuda_graph=full_iteration", environ=shell) == {
        ALLOC_CONF: "expandable_segments:False,graph_capture_record_stream_reuse:True"}
    # NCCL_GRAPH_REGISTER=1 set by the user: expandable segments would need it off, so they are not added.
    assert settings(small_config, "cuda_graph=full_iteration", environ={NCCL_GRAPH_REGISTER: "1"}) == {
        ALLOC_CONF: "graph_capture_record_stream_reuse:True"}


def test_a_pytorch_that_does_not_know_the_option_is_not_given_it(small_config):
    assert settings(small_config, "cuda_graph=te_attn", torch_version=OLD_TORCH) == {}
    assert settings(small_config, "cuda_graph=full_iteration", torch_version=OLD_TORCH) == {
        ALLOC_CONF: "expandable_segments:True", NCCL_GRAPH_REGISTER: "0"}


def test_the_training_process_sets_them_before_it_builds_the_engine(small_config, write_job, scripted_engine,
                                                                     tmp_path, monkeypatch):
    seen = {}

    def build(cfg, target):
        seen.update({name: os.environ.get(name) for name in (ALLOC_CONF, NCCL_GRAPH_REGISTER)})
        return scripted_engine([1.0] * 5)

    monkeypatch.setattr("bridge.trainer.build_engine", build)
    monkeypatch.setattr("bridge.run.refusals", lambda cfg, target: [])  # graphs need a GPU; the engine is scripted
    monkeypatch.setattr("bridge.run.torch.__version__", NEW_TORCH)
    for name in (ALLOC_CONF, NCCL_GRAPH_REGISTER):
        monkeypatch.delenv(name, raising=False)  # and restored after the test, whatever run.main sets
    job_dir = write_job(tmp_path, small_config("llama/tiny", "cuda_graph=te_attn"))
    assert run.main([str(job_dir)]) == run.COMPLETED
    assert seen == {ALLOC_CONF: "graph_capture_record_stream_reuse:True", NCCL_GRAPH_REGISTER: None}


def test_plan_shows_the_environment_the_job_gets(cli, tmp_path):
    shown = cli("mode=plan", "recipe=llama/tiny", "cuda_graph=full_iteration", cwd=tmp_path)
    env_line = next(line for line in shown.stdout.splitlines() if line.strip().startswith("env:"))
    assert "graph_capture_record_stream_reuse:True,expandable_segments:True" in env_line
    assert "'NCCL_GRAPH_REGISTER': '0'" in env_line
