"""A small native PyTorch GPT built from the same ``model.*`` fields as megatron-core's GPTModel.

The torch engine trains it: the correctness reference and the performance peer of the
megatron engine, not a replacement for it at scale. Every layer is a pre-norm residual stack
``x -> attention block -> MLP or MoE block``, so the CUDA-graph modules of the config map onto
real submodules (``AttentionBlock``, ``MLPBlock``, ``MoEBlock``, ``Router``).

Simplifications, on purpose:
- MoE runs every expert on every token and mixes the outputs with the sparse top-k gate
  (zero weight for unselected experts). Shapes are static and nothing is read on the host, so
  a whole MoE layer or just its router can be captured in a CUDA graph. The price is compute
  that grows with num_moe_experts / moe_router_topk, fine at tiny sizes. Not modelled: the
  auxiliary load-balancing loss, the expert-bias update, capacity and dropping, and
  multi-token prediction (mtp_num_layers).
- Multi-latent attention (``multi_latent_attention=True``) keeps DeepSeek's low-rank q/kv
  projections and the shared rotary key, without yarn scaling or mscale.
- ``position_embedding_type=yarn`` is plain rotary embedding.

Initialisation depends only on the seed: every matrix is drawn from N(0, init_method_std) by
one CPU generator in parameter order, biases are zero, norms are one.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from bridge.config.model_facts import moe_layer_pattern, padded_vocab_size
from bridge.config.peft import lora_targets
from bridge.config.schema import GraphBridgeConfig, ModelConfig
from bridge.engines.torch.attention import GroupedQueryAttention, MultiLatentAttention, Packing, packing_of
from bridge.engines.torch.lora import add_lora
from bridge.engines.torch.norms import make_norm


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _squared_relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "quick_gelu": _quick_gelu, "squared_relu": _squared_relu}


class Activation(nn.Module):
    """Plain or gated (GLU) activation; the gated form follows megatron-core's MLP."""

    def __init__(self, model: ModelConfig):
        super().__init__()
        self.function = ACTIVATIONS[model.activation_func]
        self.gated = model.gated_linear_unit
        self.clamp = model.activation_func_clamp_value
        self.linear_offset = model.glu_linear_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.gated:
            return self.function(x)
        gate, linear = torch.chunk(x, 2, dim=-1)
        if self.clamp is not None:
            gate = gate.clamp(max=self.clamp)
            linear = linear.clamp(min=-self.clamp, max=self.clamp)
        return self.function(gate) * (linear + self.linear_offset)


class MLP(nn.Module):
    def __init__(self, model: ModelConfig, ffn_hidden_size: int):
        super().__init__()
        fc1_size = ffn_hidden_size * (2 if model.gated_linear_unit else 1)
        self.fc1 = nn.Linear(model.hidden_size, fc1_size, bias=model.add_bias_linear)
        self.activation = Activation(model)
        self.fc2 = nn.Linear(ffn_hidden_size, model.hidden_size, bias=model.add_bias_linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class Router(nn.Module):
    """Top-k gate as in megatron-core's topk_routing_with_score_function: [tokens, experts]
    weights, zero outside each token's top k."""

    def __init__(self, model: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(model.hidden_size, model.num_moe_experts, bias=False)
        self.topk = model.moe_router_topk
        self.score_function = model.moe_router_score_function
        self.pre_softmax = model.moe_router_pre_softmax
        self.scaling_factor = model.moe_router_topk_scaling_factor
        self.num_groups = model.moe_router_num_groups
        self.group_topk = model.moe_router_group_topk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x.reshape(-1, x.shape[-1])).float()
        if self.score_function == "sigmoid":
            scores, chosen = self._topk(torch.sigmoid(logits))
            probs = scores / (scores.sum(-1, keepdim=True) + 1e-20) if self.topk > 1 else scores
        elif self.pre_softmax:
            probs, chosen = self._topk(torch.softmax(logits, dim=-1))
        else:
            top_logits, chosen = self._topk(logits)
            probs = torch.softmax(top_logits, dim=-1)
        if self.scaling_factor:
            probs = probs * self.scaling_factor
        return torch.zeros_like(logits).scatter(1, chosen, probs)

    def _topk(self, scores: torch.Tensor):
        if not self.group_topk:
            return torch.topk(scores, self.topk, dim=-1)
        # Group-limited routing (DeepSeek-V3): only experts of each token's best groups compete.
        grouped = scores.view(scores.shape[0], self.num_groups, -1)
        group_scores = grouped.topk(self.topk // self.group_topk, dim=-1)[0].sum(-1)
        best_groups = torch.topk(group_scores, self.group_topk, dim=-1)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, best_groups, True)
        masked = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).flatten(1)
        return torch.topk(masked, self.topk, dim=-1)


class Experts(nn.Module):
    """All routed experts on every token, mixed by the gate (static shapes, see module doc)."""

    def __init__(self, model: ModelConfig, ffn_hidden_size: int):
        super().__init__()
        experts, hidden = model.num_moe_experts, model.hidden_size
        fc1_size = ffn_hidden_size * (2 if model.gated_linear_unit else 1)
        self.fc1 = nn.Parameter(torch.empty(experts, hidden, fc1_size))
        self.fc2 = nn.Parameter(torch.empty(experts, ffn_hidden_size, hidden))
        self.fc1_bias = nn.Parameter(torch.zeros(experts, 1, fc1_size)) if model.add_bias_linear else None
        self.fc2_bias = nn.Parameter(torch.zeros(experts, 1, hidden)) if model.add_bias_linear else None
        self.activation = Activation(model)

    def forward(self, x: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(1, -1, x.shape[-1])
        hidden = tokens @ self.fc1
        if self.fc1_bias is not None:
            hidden = hidden + self.fc1_bias
        out = self.activation(hidden) @ self.fc2
        if self.fc2_bias is not None:
            out = out + self.fc2_bias
        return (out * gates.t().unsqueeze(-1).to(out.dtype)).sum(0).view_as(x)


class AttentionBlock(nn.Module):
    """Pre-norm attention plus its residual: the ``attn`` graph module."""

    def __init__(self, model: ModelConfig, layer_number: int):
        super().__init__()
        self.norm = make_norm(model, model.hidden_size)
        attention = MultiLatentAttention if model.multi_latent_attention else GroupedQueryAttention
        self.attention = attention(model, layer_number)
        self.dropout = nn.Dropout(model.hidden_dropout)

    def forward(self, x: torch.Tensor, packing: Optional[Packing] = None) -> torch.Tensor:
        return x + self.dropout(self.attention(self.norm(x), packing))


class MLPBlock(nn.Module):
    """Pre-norm dense MLP plus its residual: the ``mlp`` graph module."""

    def __init__(self, model: ModelConfig):
        super().__init__()
        self.norm = make_norm(model, model.hidden_size)
        self.mlp = MLP(model, model.ffn_hidden_size or 4 * model.hidden_size)
        self.dropout = nn.Dropout(model.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.mlp(self.norm(x)))


class MoEBlock(nn.Module):
    """Pre-norm router, routed experts and optional shared expert plus the residual: ``moe``."""

    def __init__(self, model: ModelConfig):
        super().__init__()
        self.norm = make_norm(model, model.hidden_size)
        self.router = Router(model)
        self.experts = Experts(model, model.moe_ffn_hidden_size or model.ffn_hidden_size or 4 * model.hidden_size)
        shared_size = model.moe_shared_expert_intermediate_size
        self.shared_expert = MLP(model, shared_size) if shared_size else None
        self.dropout = nn.Dropout(model.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm(x)
        out = self.experts(normed, self.router(normed))
        if self.shared_expert is not None:
            out = out + self.shared_expert(normed)
        return x + self.dropout(out)


class TransformerLayer(nn.Module):
    def __init__(self, model: ModelConfig, layer_number: int, is_moe: bool):
        super().__init__()
        self.attention_block = AttentionBlock(model, layer_number)
        self.ffn_block = MoEBlock(model) if is_moe else MLPBlock(model)

    def forward(self, x: torch.Tensor, packing: Optional[Packing] = None) -> torch.Tensor:
        return self.ffn_block(self.attention_block(x) if packing is None else self.attention_block(x, packing))


class NativeGPT(nn.Module):
    """Decoder-only LM whose forward returns the masked mean cross-entropy of one microbatch."""

    def __init__(self, model: ModelConfig, vocab_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, model.hidden_size)
        learned = model.position_embedding_type == "learned_absolute"
        self.position_embedding = nn.Embedding(model.seq_length, model.hidden_size) if learned else None
        self.layers = nn.ModuleList(
            TransformerLayer(model, number, bool(is_moe))
            for number, is_moe in enumerate(moe_layer_pattern(model), start=1)
        )
        self.final_norm = make_norm(model, model.hidden_size)
        tied = model.share_embeddings_and_output_weights
        self.output = None if tied else nn.Linear(model.hidden_size, vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``position_ids`` only for packed rows (bridge.data): each sample attends within itself from position 0.
        Without them no layer gets a packing argument, so the module graphs capture the layers as ever."""
        x = self.embedding(tokens)
        packing = None if position_ids is None else packing_of(position_ids)
        if self.position_embedding is not None:
            x = x + (self.position_embedding.weight[: tokens.shape[1]] if packing is None
                     else self.position_embedding(position_ids))
        for layer in self.layers:
            x = layer(x) if packing is None else layer(x, packing)
        output_weight = self.embedding.weight if self.output is None else self.output.weight
        logits = F.linear(self.final_norm(x), output_weight)
        losses = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none")
        mask = loss_mask.flatten().float()
        return (losses * mask).sum() / mask.sum()


def build_native_model(cfg: GraphBridgeConfig) -> NativeGPT:
    """The model on CPU, initialised from ``rng.seed`` alone (same weights for every impl); under peft=lora the
    adapters are drawn after the base weights, which stay as they are without them."""
    model = NativeGPT(cfg.model, padded_vocab_size(cfg))
    generator = torch.Generator().manual_seed(cfg.rng.seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.zero_()
            elif parameter.dim() >= 2:
                parameter.normal_(0.0, cfg.model.init_method_std, generator=generator)
    targets = lora_targets(cfg.peft)
    if targets:
        add_lora(model, cfg.peft, targets, generator)
    return model
