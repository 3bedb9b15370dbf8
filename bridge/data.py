"""Mock training data with static shapes, shared by the torch and megatron engines.

Each sample is an arithmetic progression of token ids modulo ALPHABET (or the vocabulary
when it is smaller), with a random start and a random stride in [1, MAX_STRIDE]. Uniform
random tokens over the whole vocabulary would leave nothing to learn in a few dozen steps;
this gives a loss that falls from the start (token frequencies first, then bigrams, then the
stride from the context), so a loss curve is a meaningful check that a graph impl trains
like eager. Shapes and compute are those of the full vocabulary either way.

Sample ``i`` of the run (``i = step * global_batch_size + position in the global batch``) is
drawn from its own generator seeded by ``(rng.seed, i)``: the same seed gives the same batches
whatever the engine, graph impl, micro-batch size or data-parallel layout.

Usage: ``MockData(cfg, rank, size).microbatches(step)`` is the list of this data-parallel
rank's microbatches for one optimizer step, each a dict of CPU tensors of shape
``[micro_batch_size, seq_length]``:
    tokens (int64), labels (int64, tokens shifted by one), loss_mask (float32, ones),
    position_ids (int64), attention_mask (None: causal, as megatron-core's schedules expect).
``iter(mock_data.microbatches(step))`` is what megatron-core's forward-backward function takes.
"""

from typing import Dict, List, Optional

import torch

from bridge.config.schema import GraphBridgeConfig

ALPHABET = 256
MAX_STRIDE = 8
Microbatch = Dict[str, Optional[torch.Tensor]]


class MockData:
    def __init__(self, cfg: GraphBridgeConfig, data_parallel_rank: int = 0, data_parallel_size: int = 1):
        self.seed = cfg.rng.seed
        self.alphabet = min(ALPHABET, cfg.model.vocab_size)
        self.seq_length = cfg.dataset.seq_length
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

    def sample(self, index: int) -> torch.Tensor:
        """Sample ``index`` of the run: ``seq_length + 1`` token ids."""
        generator = torch.Generator().manual_seed(self.seed * 2**32 + index)
        start = torch.randint(self.alphabet, (), generator=generator)
        stride = torch.randint(1, MAX_STRIDE + 1, (), generator=generator)
        return (start + stride * torch.arange(self.seq_length + 1)) % self.alphabet

    def microbatches(self, step: int) -> List[Microbatch]:
        first = step * self.global_batch_size + self.first_sample_of_rank
        return [self._microbatch(first + m * self.micro_batch_size) for m in range(self.num_microbatches)]

    def _microbatch(self, first_sample: int) -> Microbatch:
        samples = torch.stack([self.sample(first_sample + i) for i in range(self.micro_batch_size)])
        return {
            "tokens": samples[:, :-1].contiguous(),
            "labels": samples[:, 1:].contiguous(),
            "loss_mask": torch.ones(self.micro_batch_size, self.seq_length),
            "position_ids": torch.arange(self.seq_length).expand(self.micro_batch_size, -1).contiguous(),
            "attention_mask": None,
        }
