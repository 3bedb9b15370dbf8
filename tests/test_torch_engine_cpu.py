"""The torch engine and its native model on the CPU: every tiny recipe trains, the same seed
gives the same weights and data for every impl, graph requests fall back to eager with one
warning line, settings the engine cannot run are named, and the optimizer schedule is right.
"""

import logging
import math
from pathlib import Path

import pytest
import torch

import bridge
from bridge.config import engines
from bridge.data import MockData
from bridge.engines.torch.engine import TorchEngine, learning_rate
from bridge.engines.torch.native_model import ACTIVATIONS, Router, build_native_model
from bridge.engines.torch.norms import NORMS
from bridge.machine import Machine
from bridge.validation import resolve_target

LAPTOP = Machine(gpus=(), packages={"torch": "2.13.0", "megatron-core": "0.16.1", "transformer-engine": None})
TINY_RECIPES = ("llama/tiny", "qwen/tiny", "deepseek/tiny", "gpt_oss/tiny")


def train(engine: TorchEngine, steps: int):
    return [float(engine.train_step(step)) for step in range(steps)]


@pytest.mark.parametrize("recipe", TINY_RECIPES)
def test_every_tiny_recipe_trains_eagerly_on_cpu(small_config, recipe):
    engine = TorchEngine(small_config(recipe))
    losses = train(engine, 3)
    assert all(math.isfinite(loss) for loss in losses)
    # An untrained LM is close to uniform over the padded vocabulary.
    assert abs(losses[0] - math.log(engine.model.embedding.num_embeddings)) < 0.5
    assert (engine.name, engine.device.type, engine.effective_impl) == ("torch", "cpu", "none")
    assert engine.capture_steps() == set() and engine.graph_count() == 0
    engine.close()
    engine.close()
    assert engine.model is None


def test_loss_decreases_over_50_steps_on_llama_tiny(small_config):
    cfg = small_config("llama/tiny", "model.ffn_hidden_size=384", "train.train_iters=50")
    losses = train(TorchEngine(cfg), 50)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses


@pytest.mark.parametrize("cuda_graph", ["full_iteration", "local_layer"])
def test_same_seed_gives_same_initial_weights_for_every_impl(small_config, cuda_graph):
    eager = build_native_model(small_config()).state_dict()
    graphed = build_native_model(small_config("llama/tiny", f"cuda_graph={cuda_graph}")).state_dict()
    assert eager.keys() == graphed.keys()
    assert all(torch.equal(eager[name], graphed[name]) for name in eager)
    other_seed = build_native_model(small_config("llama/tiny", "rng.seed=7")).state_dict()
    assert not torch.equal(eager["embedding.weight"], other_seed["embedding.weight"])


def test_initialisation_uses_init_method_std_and_zero_biases(small_config):
    model = build_native_model(small_config("gpt_oss/tiny", "model.init_method_std=0.05"))
    assert model.embedding.weight.std().item() == pytest.approx(0.05, rel=0.05)
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    assert biases and all(torch.count_nonzero(bias) == 0 for bias in biases)


def test_same_seed_gives_same_data_whatever_the_impl_or_micro_batch(small_config):
    one_microbatch = MockData(small_config("llama/tiny", "train.global_batch_size=4", "train.micro_batch_size=4"))
    two_microbatches = MockData(small_config("llama/tiny", "cuda_graph=full_iteration",
                                             "train.global_batch_size=4", "train.micro_batch_size=2"))
    whole = one_microbatch.microbatches(3)
    split = two_microbatches.microbatches(3)
    assert len(whole) == 1 and len(split) == 2
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert torch.equal(whole[0][key], torch.cat([mb[key] for mb in split]))
    assert not torch.equal(whole[0]["tokens"], one_microbatch.microbatches(4)[0]["tokens"])


def test_mock_batches_have_static_shapes_and_shifted_labels(small_config):
    cfg = small_config("llama/tiny", "train.global_batch_size=4", "train.micro_batch_size=2")
    microbatches = MockData(cfg).microbatches(0)
    assert len(microbatches) == 2
    for mb in microbatches:
        assert mb["tokens"].shape == mb["labels"].shape == (2, cfg.dataset.seq_length)
        assert mb["tokens"].dtype == torch.int64 and mb["attention_mask"] is None
        assert 0 <= mb["tokens"].min() and mb["tokens"].max() < cfg.model.vocab_size
        assert torch.equal(mb["labels"][:, :-1], mb["tokens"][:, 1:])


def test_data_parallel_ranks_split_the_global_batch(small_config):
    cfg = small_config("llama/tiny", "train.global_batch_size=4", "train.micro_batch_size=1")
    whole = torch.cat([mb["tokens"] for mb in MockData(cfg).microbatches(2)])
    ranks = [torch.cat([mb["tokens"] for mb in MockData(cfg, rank, 2).microbatches(2)]) for rank in (0, 1)]
    assert torch.equal(whole, torch.cat(ranks))


def test_gradient_accumulation_matches_one_big_microbatch(small_config):
    big = TorchEngine(small_config("llama/tiny", "train.global_batch_size=4", "train.micro_batch_size=4"))
    accumulated = TorchEngine(small_config("llama/tiny", "train.global_batch_size=4", "train.micro_batch_size=2"))
    assert train(big, 3) == pytest.approx(train(accumulated, 3), abs=1e-5)


@pytest.mark.parametrize("override", ["cuda_graph=full_iteration", "cuda_graph=local_layer",
                                      "torch_compile=reduce-overhead", "cuda_graph=none"])
def test_on_cpu_the_engine_trains_eagerly_and_leaves_the_saying_to_the_plan(small_config, override, caplog):
    with caplog.at_level(logging.WARNING):
        engine = TorchEngine(small_config("llama/tiny", override))
        train(engine, 2)
    assert not caplog.records
    assert engine.effective_impl == "none" and engine.graph_count() == 0


@pytest.mark.parametrize("override, named", [("cuda_graph=full_iteration", "cuda_graph_impl=full_iteration"),
                                             ("torch_compile=reduce-overhead", "torch_compile=reduce-overhead")])
def test_a_cpu_plan_says_once_what_the_cpu_does_not_apply(cli, tmp_path, override, named):
    plan = cli("mode=plan", "engine=torch", "device=cpu", override, cwd=tmp_path)
    notes = [line for line in plan.stdout.splitlines() if "not applied" in line]
    assert len(notes) == 1 and named in notes[0] and "trains eagerly" in notes[0], plan.stdout


README_LINE = "graphbridge recipe=llama/tiny cuda_graph=full_iteration train.train_iters=5"
"""The README's graph choice trained on a CPU (its "Use" section), which tests/test_readme.py leaves to this module."""


def test_a_cpu_run_of_a_graph_choice_says_once_that_graphs_are_not_captured(cli, tmp_path):
    assert f"\n    {README_LINE} " in (Path(__file__).resolve().parent.parent / "README.md").read_text()
    run = cli(*README_LINE.split()[1:], "hydra.run.dir=run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    said = [line for line in (run.stdout + run.stderr).splitlines()
            if "not applied" in line or "not captured" in line or "runs eagerly" in line]
    assert len(said) == 1 and "cuda_graph_impl=full_iteration not applied" in said[0], said
    assert "full_iteration -> none" in run.stdout  # the table shows the outcome, and says no more


def test_settings_the_torch_engine_cannot_run_are_all_named_by_the_catalogue(small_config):
    cfg = small_config("llama/tiny", "train.num_gpus=2", "model.tensor_model_parallel_size=2",
                       "optimizer.optimizer=sgd", "optimizer.lr_decay_style=WSD")
    violations = [v for v in bridge.validate(cfg, LAPTOP) if v.rule.startswith("torch_engine")]
    named = {key for violation in violations for key in violation.keys}
    for key in ("train.num_gpus", "model.tensor_model_parallel_size", "optimizer.optimizer",
                "optimizer.lr_decay_style"):
        assert key in named
    assert all(violation.in_config for violation in violations)  # engine=torch was asked for: invalid anywhere


def test_native_model_builds_exactly_the_choices_the_catalogue_allows():
    assert set(ACTIVATIONS) == set(engines.TORCH_ACTIVATIONS)
    assert set(NORMS) == set(engines.TORCH_NORMALIZATIONS)


def test_device_and_engine_resolution_without_cuda(small_config):
    target = resolve_target(small_config("llama/tiny", "engine=auto"), LAPTOP)
    assert (target.engine, target.device, target.engine_is_auto) == ("torch", "cpu", True)
    cuda = [v for v in bridge.validate(small_config("llama/tiny", "device=cuda"), LAPTOP) if v.rule == "cuda_device"]
    assert len(cuda) == 1 and not cuda[0].in_config and "needs a CUDA device" in cuda[0].message
    refused = {v.rule for v in bridge.validate(small_config("llama/tiny", "engine=megatron", "device=cpu"), LAPTOP)}
    assert "engine_device" in refused


def test_learning_rate_warms_up_then_decays_to_min_lr(small_config):
    optimizer = small_config("llama/tiny", "optimizer.lr=1e-3", "optimizer.min_lr=1e-4",
                             "optimizer.lr_warmup_iters=10").optimizer
    rates = [learning_rate(optimizer, 100, step) for step in range(100)]
    assert rates[0] == pytest.approx(1e-4) and rates[9] == pytest.approx(1e-3)
    assert all(later <= earlier for earlier, later in zip(rates[9:], rates[10:]))
    assert rates[-1] == pytest.approx(1e-4, rel=1e-2)


@pytest.mark.parametrize("router", [(), ("model.moe_router_score_function=sigmoid", "model.moe_router_num_groups=4",
                                         "model.moe_router_group_topk=2")])
def test_router_gives_topk_weights_per_token(small_config, router):
    cfg = small_config("qwen/tiny", *router)
    gates = Router(cfg.model)(torch.randn(2, 16, cfg.model.hidden_size))
    assert gates.shape == (32, cfg.model.num_moe_experts)
    assert torch.all((gates > 0).sum(-1) == cfg.model.moe_router_topk)
    assert torch.allclose(gates.sum(-1), torch.ones(32))
