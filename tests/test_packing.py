"""Packed sequences (dataset.packed_sequence): the mock data packs whole samples into each row as Megatron-Bridge's
packed SFT data does, the megatron engine hands them to the model as megatron-core's packed-sequence parameters, and
the torch engine's native model keeps each sample to itself, and the plan refuses what cannot train packed, each
with its fix. The megatron engine's packed training needs Transformer Engine (tests/gpu/megatron_cases.py's packed
cases)."""

import json
import math

import pytest
import torch

import bridge
from bridge.data import PAD_MULTIPLE, MockData

PACKED = ("recipe=llama/tiny", "dataset.packed_sequence=true", "train.micro_batch_size=1", "engine=megatron")


def rows(*overrides, steps=3):
    data = MockData(bridge.load([*PACKED, *overrides]))
    return [row for step in range(steps) for row in data.microbatches(step)]


def samples_of(row):
    """The row's samples as (tokens, labels, positions, loss mask) slices, the padding's last if any."""
    bounds = row["cu_seqlens"].tolist()
    return [tuple(row[key][0, start:end] for key in ("tokens", "labels", "position_ids", "loss_mask"))
            for start, end in zip(bounds, bounds[1:])]


def test_a_packed_row_holds_whole_samples_each_from_position_zero_and_a_masked_tail():
    for row in rows():
        assert row["tokens"].shape == (1, 256) and row["cu_seqlens"].dtype == torch.int32
        assert row["cu_seqlens"][0] == 0 and row["cu_seqlens"][-1] == 256
        *packed, last = samples_of(row)
        padded = not bool(last[3].all())
        if not padded:
            packed.append(last)
        assert len(packed) >= 2, "a row packs several samples"
        for tokens, labels, positions, mask in packed:
            assert torch.equal(positions, torch.arange(len(tokens))) and bool(mask.all())
            assert torch.equal(tokens[1:], labels[:-1]), "labels are the sample's next tokens, not the next sample's"
        if padded:
            assert not last[3].any() and not last[2].any() and not last[0].any()
        assert int(row["max_seqlen"]) == int((row["cu_seqlens"][1:] - row["cu_seqlens"][:-1]).max())


def test_packing_follows_the_seed_alone():
    first, again, other = rows(), rows(), rows("rng.seed=7")
    assert all(torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["cu_seqlens"], b["cu_seqlens"])
               for a, b in zip(first, again))
    assert any(not torch.equal(a["cu_seqlens"], b["cu_seqlens"]) for a, b in zip(first, other))


def test_an_unpadded_row_ends_after_its_last_sample_rounded_up_to_16_tokens():
    for padded, cut in zip(rows(), rows("dataset.pad_to_max_length=false")):
        filled = int(padded["loss_mask"].sum())
        width = cut["tokens"].shape[1]
        assert width == min(256, -(-filled // PAD_MULTIPLE) * PAD_MULTIPLE) and cut["cu_seqlens"][-1] == width
        assert torch.equal(cut["tokens"][0, :filled], padded["tokens"][0, :filled])


def test_the_megatron_engine_gives_the_model_megatron_cores_packed_parameters(monkeypatch):
    from megatron.core.packed_seq_params import PackedSeqParams

    from bridge.engines.megatron import engine

    monkeypatch.setattr(torch.Tensor, "cuda", lambda tensor, *args, **kwargs: tensor)  # the CPU stands in
    seen = {}

    def model(tokens, position_ids, attention_mask, **kwargs):
        seen.update(kwargs, tokens=tokens, position_ids=position_ids)
        return torch.zeros(tokens.shape)

    [row, *_] = rows(steps=1)
    engine.forward_step(iter([row]), model)
    packed = seen["packed_seq_params"]
    assert isinstance(packed, PackedSeqParams) and packed.qkv_format == "thd"
    assert torch.equal(packed.cu_seqlens_q, row["cu_seqlens"]) and packed.cu_seqlens_kv is packed.cu_seqlens_q
    assert packed.max_seqlen_q == packed.max_seqlen_kv == int(row["max_seqlen"])
    assert torch.equal(seen["position_ids"], row["position_ids"])
    unpacked = next(iter(MockData(bridge.load(["recipe=llama/tiny"])).microbatches(0)))
    engine.forward_step(iter([unpacked]), model)
    assert seen["packed_seq_params"] is None


REFUSED = [
    (("train.micro_batch_size=2",), "packed_sequence_micro_batch",
     "set train.micro_batch_size=1 train.global_batch_size=1 dataset.seq_length=512"),
    (("model.transformer_impl=local",), "packed_sequence_layer_spec", "set model.transformer_impl=transformer_engine"),
]


@pytest.fixture(scope="session")
def refused_plans(cli_batch) -> dict:
    """The plan of each refused packing above, planned by one process a session (conftest.py's cli_batch)."""
    return cli_batch("packing_refusals", [("mode=plan", *PACKED, *overrides) for overrides, _, _ in REFUSED])


@pytest.mark.parametrize("overrides,rule,fix", REFUSED)
def test_the_plan_refuses_what_cannot_train_packed_with_its_fix(refused_plans, overrides, rule, fix):
    run = refused_plans[("mode=plan", *PACKED, *overrides)]
    assert run.returncode == 2 and f"[{rule}]" in run.stderr and fix in run.stderr, run.stderr


def test_bridges_packed_presets_plan_packed_as_they_are():
    cfg = bridge.load(["recipe=llama/llama3_70b_lora", "gpu=h100", "precision=bf16"])
    assert cfg.dataset.packed_sequence and cfg.train.micro_batch_size == 1
    assert not [v for v in bridge.validate(cfg) if v.rule.startswith("packed_sequence")]


@pytest.mark.parametrize("recipe", ["llama/tiny", "gpt_oss/tiny", "deepseek/tiny"])  # GQA; sinks and windows; MLA
def test_the_native_model_trains_a_packed_row_as_its_samples_one_by_one(recipe):
    from bridge.engines.torch.native_model import build_native_model

    cfg = bridge.load([f"recipe={recipe}", "engine=torch", "dataset.packed_sequence=true", "train.micro_batch_size=1",
                       "model.num_layers=2", "model.hidden_dropout=0.0", "model.attention_dropout=0.0"])
    model = build_native_model(cfg).eval()
    row = MockData(cfg).microbatches(0)[0]
    inputs = [row[key] for key in ("tokens", "labels", "loss_mask")]
    packed = model(*inputs, row["position_ids"])
    weighted, tokens = 0.0, 0
    for sample_tokens, labels, _, mask in samples_of(row):
        if mask.all():
            alone = model(sample_tokens[None], labels[None], torch.ones(1, len(sample_tokens)))
            weighted, tokens = weighted + alone * len(sample_tokens), tokens + len(sample_tokens)
    assert packed.item() == pytest.approx((weighted / tokens).item(), rel=1e-6)
    assert model(*inputs).item() != pytest.approx(packed.item(), rel=1e-5), "unpacked, samples would see each other"


def test_a_packed_tiny_sft_trains_on_the_cpu(cli, tmp_path):
    # Two narrow layers: the rows are packed and unpadded as llama/tiny's, in a third of the time.
    run = cli(*PACKED[:3], "engine=torch", "dataset.pad_to_max_length=false", "train.train_iters=3",
              "model.num_layers=2", "model.hidden_size=128", "hydra.run.dir=run", cwd=tmp_path)
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert run.returncode == 0 and result["status"] == "completed", run.stderr[-2000:]
    assert all(math.isfinite(loss) for loss in result["loss"])
