"""Megatron-Bridge 0.3.1's side of a benchmarks/vs_bridge.py row, in its own torchrun process: what the worker
changes in Bridge before ``pretrain`` (the dataset helpers' build, the PEFT hook's base-checkpoint load), the mock
batches both sides train on, and the clock around Bridge's steps. Everything here imports Bridge."""

import importlib
import json
from dataclasses import dataclass
from pathlib import Path


def skip_dataset_helper_build() -> None:
    """Bridge's initialisation runs ``make`` in megatron-core's datasets folder (compile_helpers), which the
    megatron-core wheel does not ship a Makefile for: it ships the helpers already built, and then the
    build has nothing to do. Where they import, Bridge skips the build; where they do not, it runs as ever."""
    try:
        importlib.import_module("megatron.core.datasets.helpers_cpp")
    except ImportError:
        return
    from megatron.bridge.training import initialize

    initialize.compile_helpers = lambda: None


def without_base_checkpoint() -> None:
    """Bridge's PEFT pre-wrap hook loads the base weights from ``checkpoint.pretrained_checkpoint`` and then
    applies the adapters. A LoRA row's base is megatron-core's initialisation from the seed on both sides (the
    losses stay comparable, and no checkpoint has to be written first), so the hook here applies Bridge's own
    transformation (adapters, frozen base, the parameters to save) without that load."""
    from megatron.bridge.training import setup

    setup._create_peft_pre_wrap_hook = lambda cfg, state: lambda model: setup._apply_peft_transformation(
        cfg.peft, model)


def same_batches(cfg, packed: bool = False):
    """A DatasetProvider of graphbridge's mock samples (bridge.data.MockData), in Bridge's batch keys; packed
    rows carry Bridge's packed-sequence keys (cu_seqlens, its argmin, max_seqlen) as its SFT collate writes them."""
    from types import SimpleNamespace

    import torch
    from megatron.bridge.training.config import DatasetProvider

    from bridge.data import MockData

    seq, mock = cfg.model.seq_length, MockData(SimpleNamespace(
        rng=cfg.rng, model=SimpleNamespace(vocab_size=cfg.model.vocab_size),
        dataset=SimpleNamespace(seq_length=cfg.model.seq_length, packed_sequence=packed,
                                pad_to_max_length=True), train=cfg.train))

    class Samples(torch.utils.data.Dataset):
        def __init__(self, count):
            self.count = count

        def __len__(self):
            return self.count

        def __getitem__(self, index):
            if packed:  # sample ``index`` is row ``index`` of the run: graphbridge's micro-batch of one row
                row = mock.microbatches(index // mock.global_batch_size)[index % mock.global_batch_size]
                cu_seqlens = row["cu_seqlens"]
                return {**{key: row[key][0] for key in ("tokens", "labels", "loss_mask", "position_ids")},
                        "cu_seqlens": cu_seqlens, "cu_seqlens_argmin": torch.tensor(len(cu_seqlens)),
                        "max_seqlen": row["max_seqlen"]}
            tokens = mock.sample(index)
            return {"tokens": tokens[:-1], "labels": tokens[1:], "loss_mask": torch.ones(seq),
                    "position_ids": torch.arange(seq)}

    @dataclass(kw_only=True)
    class GraphbridgeMockData(DatasetProvider):
        seq_length: int
        skip_getting_attention_mask_from_dataset: bool = True

        def build_datasets(self, context):
            return Samples(context.train_samples), None, None

    return GraphbridgeMockData(seq_length=seq, dataloader_type="single", num_workers=2)


def step_clock(path: Path):
    """Bridge's training callbacks around each train_step: times, losses and peak memory, as graphbridge's
    trainer records them (perf_counter between device synchronisations)."""
    import time

    import torch
    from megatron.bridge.training.callbacks import Callback

    class StepClock(Callback):
        def __init__(self):
            self.times, self.losses, self.started = [], [], 0.0

        def on_train_step_start(self, context):
            torch.cuda.synchronize()
            self.started = time.perf_counter()

        def on_train_step_end(self, context):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.started)
            losses = context.loss_dict or {}
            self.losses.append(float(losses.get("lm loss", next(iter(losses.values()), float("nan")))))

        def on_train_end(self, context):
            weights = [weight for chunk in context.model for weight in chunk.parameters()]
            path.write_text(json.dumps({
                "status": "completed", "step_times_s": self.times, "loss": self.losses,
                "parameters": {"total": sum(weight.numel() for weight in weights),
                               "trainable": sum(weight.numel() for weight in weights if weight.requires_grad)},
                "peak_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
                "peak_reserved_gb": torch.cuda.max_memory_reserved() / 2**30}) + "\n")

    return StepClock()
