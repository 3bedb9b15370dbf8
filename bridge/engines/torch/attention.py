"""The native model's attention: grouped-query and multi-latent attention with rotary embeddings, causal softmax
attention with optional sliding window and sinks, and packed rows (bridge.data), where each sample attends only
within itself and its positions start from 0."""

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn

from bridge.config.engines import TORCH_ROTARY_TYPES
from bridge.config.schema import ModelConfig
from bridge.engines.torch.norms import make_norm


class Packing(NamedTuple):
    """What a packed row (bridge.data) asks of attention: each token's position within its sample, and which
    keys each query may see (its own sample's, up to itself)."""

    positions: torch.Tensor
    """[batch, seq] int64."""
    allowed: torch.Tensor
    """[batch, 1, seq, seq] bool."""


def packing_of(position_ids: torch.Tensor) -> Packing:
    """A packed row's samples start where the positions return to 0 (a padding token is a sample of its own)."""
    sample = (position_ids == 0).cumsum(-1)
    seq = position_ids.shape[-1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=position_ids.device).tril()
    return Packing(position_ids, ((sample[:, :, None] == sample[:, None, :]) & causal).unsqueeze(1))


class Rotary(nn.Module):
    """Rotates the first ``dim`` channels of each head (megatron-core's non-interleaved layout)."""

    def __init__(self, dim: int, seq_length: int, base: float):
        super().__init__()
        self.dim = dim
        inverse_frequency = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angles = torch.outer(torch.arange(seq_length, dtype=torch.float64), inverse_frequency)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor, positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x``: [batch, heads, seq, dim]; ``positions`` [batch, seq] (packed rows), else 0 to seq - 1."""
        rotated, passed = x[..., : self.dim], x[..., self.dim :]
        first, second = rotated.chunk(2, dim=-1)
        half_turn = torch.cat([-second, first], dim=-1)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        if positions is None:
            cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
        else:
            cos, sin = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
        return torch.cat([rotated * cos + half_turn * sin, passed], dim=-1)


class CoreAttention(nn.Module):
    """Causal softmax attention with optional sliding window and attention sinks.

    Plain attention goes through F.scaled_dot_product_attention; sinks (off-by-one or learnable
    softmax) need the extra logit column, so they use the explicit formula.
    """

    def __init__(self, model: ModelConfig, num_heads: int, layer_number: int):
        super().__init__()
        seq = model.seq_length
        positions = torch.arange(seq)
        distance = positions[:, None] - positions[None, :]
        allowed = distance >= 0
        if _is_window_layer(model, layer_number) and model.window_size[0] >= 0:
            allowed &= distance <= model.window_size[0]
        needs_mask = not bool(allowed.equal(distance >= 0)) or model.softmax_type != "vanilla"
        self.register_buffer("allowed", allowed if needs_mask else None, persistent=False)
        if model.softmax_type == "learnable":
            self.sink_logits = nn.Parameter(torch.zeros(num_heads))
        else:
            off_by_one = torch.zeros(num_heads) if model.softmax_type == "off-by-one" else None
            self.register_buffer("sink_logits", off_by_one, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                packing: Optional[Packing] = None) -> torch.Tensor:
        grouped = k.shape[1] != q.shape[1]
        seq = q.shape[2]  # a row may be shorter than seq_length: an unpadded packed one, a sample alone
        allowed = None if self.allowed is None else self.allowed[:seq, :seq]
        if packing is not None:
            allowed = packing.allowed if allowed is None else packing.allowed & allowed
        if self.sink_logits is None:
            if allowed is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=grouped)
        if grouped:
            repeats = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        scores = (q @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        sinks = self.sink_logits.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
        return weights.to(v.dtype) @ v


def _is_window_layer(model: ModelConfig, layer_number: int) -> bool:
    """megatron-core's is_layer_window_attention (layer_number counts from 1)."""
    if not model.window_size:
        return False
    return model.window_attn_skip_freq is None or layer_number % model.window_attn_skip_freq != 0


def _rotary(model: ModelConfig, head_dim: int) -> Optional[Rotary]:
    if model.position_embedding_type not in TORCH_ROTARY_TYPES:
        return None
    return Rotary(int(head_dim * model.rotary_percent), model.seq_length, model.rotary_base)


class GroupedQueryAttention(nn.Module):
    def __init__(self, model: ModelConfig, layer_number: int):
        super().__init__()
        self.num_heads = model.num_attention_heads
        self.num_groups = model.num_query_groups or self.num_heads
        self.head_dim = model.kv_channels or model.hidden_size // self.num_heads
        qkv_size = (self.num_heads + 2 * self.num_groups) * self.head_dim
        self.qkv = nn.Linear(model.hidden_size, qkv_size, bias=model.add_bias_linear or model.add_qkv_bias)
        self.proj = nn.Linear(self.num_heads * self.head_dim, model.hidden_size, bias=model.add_bias_linear)
        self.q_norm = make_norm(model, self.head_dim) if model.qk_layernorm else nn.Identity()
        self.k_norm = make_norm(model, self.head_dim) if model.qk_layernorm else nn.Identity()
        self.rotary = _rotary(model, self.head_dim)
        self.core = CoreAttention(model, self.num_heads, layer_number)

    def forward(self, x: torch.Tensor, packing: Optional[Packing] = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        sizes = [self.num_heads * self.head_dim, self.num_groups * self.head_dim, self.num_groups * self.head_dim]
        q, k, v = (part.view(batch, seq, -1, self.head_dim).transpose(1, 2) for part in self.qkv(x).split(sizes, -1))
        q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            positions = None if packing is None else packing.positions
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        return self.proj(self.core(q, k, v, packing).transpose(1, 2).reshape(batch, seq, -1))


class MultiLatentAttention(nn.Module):
    """Simplified MLA: low-rank q (optional) and kv projections, one rotary key shared by heads."""

    def __init__(self, model: ModelConfig, layer_number: int):
        super().__init__()
        hidden, heads = model.hidden_size, model.num_attention_heads
        self.num_heads, self.kv_lora_rank = heads, model.kv_lora_rank
        self.qk_dim, self.rope_dim, self.v_dim = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
        q_size = heads * (self.qk_dim + self.rope_dim)
        if model.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, q_size, bias=False)
        else:
            self.q_proj = nn.Sequential(nn.Linear(hidden, model.q_lora_rank, bias=False),
                                        make_norm(model, model.q_lora_rank),
                                        nn.Linear(model.q_lora_rank, q_size, bias=False))
        self.kv_down = nn.Linear(hidden, self.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = make_norm(model, self.kv_lora_rank)
        self.kv_up = nn.Linear(self.kv_lora_rank, heads * (self.qk_dim + self.v_dim), bias=False)
        self.proj = nn.Linear(heads * self.v_dim, hidden, bias=model.add_bias_linear)
        self.rotary = Rotary(self.rope_dim, model.seq_length, model.rotary_base)
        self.core = CoreAttention(model, heads, layer_number)

    def forward(self, x: torch.Tensor, packing: Optional[Packing] = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        positions = None if packing is None else packing.positions
        q = self.q_proj(x).view(batch, seq, self.num_heads, -1).transpose(1, 2)
        q_content, q_position = q.split([self.qk_dim, self.rope_dim], dim=-1)
        compressed, k_position = self.kv_down(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv = self.kv_up(self.kv_norm(compressed)).view(batch, seq, self.num_heads, -1).transpose(1, 2)
        k_content, v = kv.split([self.qk_dim, self.v_dim], dim=-1)
        k_position = self.rotary(k_position.unsqueeze(1), positions).expand(-1, self.num_heads, -1, -1)
        q = torch.cat([q_content, self.rotary(q_position, positions)], dim=-1)
        k = torch.cat([k_content, k_position], dim=-1)
        return self.proj(self.core(q, k, v, packing).transpose(1, 2).reshape(batch, seq, -1))
