"""Mock training data with static shapes, shared by the torch and megatron engines.

Each sample is an arithmetic progression of token ids modulo ALPHABET (or the vocabulary
when it is smaller), with a random start and a random stride in [1, MAX_STRIDE]. Uniform
random tokens over the whole vocabulary would leave nothing to learn in a few dozen steps;
this gives a loss that falls from the start (token frequencies first, then bigrams, then the
stride from the context), so a loss curve is a meaningful check that a graph impl trains
like eager. Shapes and compute are those of the full vocabulary either way.

Sample ``i`` of the run (``i = step * global_batch_size + position in the global batch``) is
drawn from its own generator seeded by a hash of ``(rng.seed, i)`` (PyTorch's CPU generator keeps 32 bits of a
seed, so ``rng.seed * 2**32 + i`` gave every seed the same data): the same seed gives the same batches
whatever the engine, graph impl, micro-batch size or data-parallel layout.

Usage: ``MockData(cfg, rank, size).microbatches(step)`` is the list of this data-parallel
rank's microbatches for one optimizer step, each a dict of CPU tensors of shape
``[micro_batch_size, seq_length]``:
    tokens (int64), labels (int64, tokens shifted by one), loss_mask (float32, ones),
    position_ids (int64), attention_mask (None: causal, as megatron-core's schedules expect).
``iter(mock_data.microbatches(step))`` is what megatron-core's forward-backward function takes.

With ``dataset.packed_sequence`` each row is packed as Megatron-Bridge's packed SFT data is: whole samples of
PACKED_LENGTHS tokens one after another (each with its own positions from 0), the rest of the row padding
(token 0, loss mask 0) that cu_seqlens closes as a sequence of its own. The micro-batch is one row (Bridge
refuses packing with micro_batch_size > 1), ``seq_length`` tokens long with ``dataset.pad_to_max_length``,
else cut after its last sample, rounded up to PAD_MULTIPLE, as Bridge pads. A packed microbatch adds
    cu_seqlens (int32, [sequences + 1], the padding's own boundary last) and
    max_seqlen (int32 scalar, the longest of those sequences, padding included: the kernels' bound).
"""

import hashlib
from typing import Dict, List, Optional

import torch

from bridge.config.schema import GraphBridgeConfig

ALPHABET = 256
MAX_STRIDE = 8
PACKED_LENGTHS = (1 / 16, 1 / 2)
"""A packed sample's share of seq_length, drawn uniformly: several samples a row, and a padded tail."""
PAD_MULTIPLE = 16
"""Bridge pads an unpadded packed row to a multiple of 16 tokens (FP8 GEMMs need it)."""
Microbatch = Dict[str, Optional[torch.Tensor]]


class MockData:
    def __init__(self, cfg: GraphBridgeConfig, data_parallel_rank: int = 0, data_parallel_size: int = 1):
        self.seed = cfg.rng.seed
        self.alphabet = min(ALPHABET, cfg.model.vocab_size)
        self.seq_length = cfg.dataset.seq_length
        self.packed = cfg.dataset.packed_sequence
        self.padded_rows = cfg.dataset.pad_to_max_length
        self.micro_batch_size = cfg.train.micro_batch_size
        self.global_batch_size = cfg.train.global_batch_size
        per_step = self.micro_batch_size * data_parallel_size
        if self.global_batch_size % per_step:
            raise ValueError(
                f"train.global_batch_size={self.global_batch_size} is not a multiple of "
                f"train.micro_batch_size * data-parallel size = {per_step}; change train.global_batch_size"
            )
        self.num_microbatches = self.global_batch_size // per_step
        self.first_sample_of_rank = data_parallel_rank * self.num_microbatches * self.micro_batch_size

    def sample(self, index: int, length: Optional[int] = None) -> torch.Tensor:
        """Sample ``index`` of the run: ``length + 1`` token ids (``seq_length + 1`` by default)."""
        generator = self._generator("sample", index)
        start = torch.randint(self.alphabet, (), generator=generator)
        stride = torch.randint(1, MAX_STRIDE + 1, (), generator=generator)
        return (start + stride * torch.arange((length or self.seq_length) + 1)) % self.alphabet

    def _generator(self, stream: str, index: int) -> torch.Generator:
        """A generator of its own for each (rng.seed, stream, index), its seed hashed into the 32 bits that
        PyTorch's CPU generator (mt19937) keeps."""
        digest = hashlib.blake2b(f"{self.seed}:{stream}:{index}".encode(), digest_size=4).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest, "little"))

    def microbatches(self, step: int) -> List[Microbatch]:
        first = step * self.global_batch_size + self.first_sample_of_rank
        return [self._microbatch(first + m * self.micro_batch_size) for m in range(self.num_microbatches)]

    def _microbatch(self, first_sample: int) -> Microbatch:
        if self.packed:
            return self._packed_row(first_sample)
        samples = torch.stack([self.sample(first_sample + i) for i in range(self.micro_batch_size)])
        return {
            "tokens": samples[:, :-1].contiguous(),
            "labels": samples[:, 1:].contiguous(),
            "loss_mask": torch.ones(self.micro_batch_size, self.seq_length),
            "position_ids": torch.arange(self.seq_length).expand(self.micro_batch_size, -1).contiguous(),
            "attention_mask": None,
        }

    def packed_lengths(self, row: int) -> List[int]:
        """The lengths of the samples packed into row ``row`` of the run: drawn from its own generator until the
        next would not fit (the first always fits: a sample is at most half the row)."""
        generator = self._generator("lengths", row)
        shortest, longest = (max(1, int(self.seq_length * share)) for share in PACKED_LENGTHS)
        lengths: List[int] = []
        while True:
            length = int(torch.randint(shortest, longest + 1, (), generator=generator))
            if sum(lengths) + length > self.seq_length:
                return lengths
            lengths.append(length)

    def _packed_row(self, row: int) -> Microbatch:
        lengths = self.packed_lengths(row)
        # A packed sample's index leaves room for a row's samples (at most seq_length of them).
        samples = [self.sample(row * self.seq_length + i, length) for i, length in enumerate(lengths)]
        filled = sum(lengths)
        width = self.seq_length if self.padded_rows else min(self.seq_length, -(-filled // PAD_MULTIPLE) * PAD_MULTIPLE)
        padding = width - filled
        boundaries = torch.tensor([0, *lengths, *([padding] if padding else [])]).cumsum(0).to(torch.int32)
        return {
            "tokens": torch.cat([s[:-1] for s in samples] + [torch.zeros(padding, dtype=torch.long)]).unsqueeze(0),
            "labels": torch.cat([s[1:] for s in samples] + [torch.zeros(padding, dtype=torch.long)]).unsqueeze(0),
            "loss_mask": torch.cat([torch.ones(filled), torch.zeros(padding)]).unsqueeze(0),
            "position_ids": torch.cat([torch.arange(n) for n in lengths] + [torch.zeros(padding, dtype=torch.long)]
                                      ).unsqueeze(0),
            "attention_mask": None,
            "cu_seqlens": boundaries,
            "max_seqlen": (boundaries[1:] - boundaries[:-1]).max(),
        }
