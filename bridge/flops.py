"""Model FLOPs of one optimizer step, with Megatron-LM's ``num_floating_point_operations``
conventions, so our TFLOP/s/GPU compares with Megatron-LM and Megatron-Bridge logs:

- a GEMM of (m x n) by (n x k) costs 2mnk; every GEMM runs three times per step (forward,
  backward data gradient, backward weight gradient), so a step is 3x the forward;
- causal attention counts half of the score matrix (QK^T and the product with V);
  sliding windows are not discounted (Megatron-LM does not discount them either);
- Gated DeltaNet layers (linear attention) count their projections, convolution and the
  four head_dim^2 products of the delta rule per value head;
- a gated linear unit (SwiGLU, GPT-OSS's GLU) has three ffn GEMMs, a plain MLP two;
- MoE layers count the top-k routed experts plus the shared expert; the dense/MoE pattern
  comes from ``moe_layer_freq``; MTP layers count as extra layers of the last layer's kind,
  plus their norms, projection and own logits;
- the LM head uses the padded vocabulary (a multiple of make_vocab_size_divisible_by * TP);
- norms, rotary embeddings, softmax and the router GEMM are not counted.

Plain arithmetic on the config (a GraphBridgeConfig or its DictConfig): no torch import.
"""

from bridge.config.model_facts import last_layer_is_moe, moe_layer_count, padded_vocab_size


def model_flops_per_step(cfg) -> float:
    """FLOPs of forward + backward over the global batch of one optimizer step."""
    tokens = cfg.train.global_batch_size * cfg.model.seq_length
    return float(tokens * 3 * _forward_flops_per_token(cfg))


def _forward_flops_per_token(cfg) -> float:
    model = cfg.model
    h = model.hidden_size
    mtp = model.mtp_num_layers or 0
    moe_layers = moe_layer_count(model) + (mtp if last_layer_is_moe(model) else 0)
    dense_layers = model.num_layers + mtp - moe_layers
    layers = model.num_layers + mtp

    glu = 3 if model.gated_linear_unit else 2
    ffn = model.ffn_hidden_size or 4 * h
    moe_ffn = model.moe_ffn_hidden_size or ffn
    shared = model.moe_shared_expert_intermediate_size or 0
    mlp_macs = h * glu * (
        ffn * dense_layers + (moe_ffn * model.moe_router_topk + shared) * moe_layers
    )
    linear_layers = _linear_attention_layers(model, layers)
    attn_macs = (_attention_macs_per_token(model) * (layers - linear_layers)
                 + _gated_delta_net_macs_per_token(model) * linear_layers)
    mtp_macs = mtp * (3 * h + 2 * h * h)  # eh norms and the 2h -> h projection
    logits_macs = h * padded_vocab_size(cfg) * (mtp + 1)
    return 2 * (mlp_macs + attn_macs + mtp_macs + logits_macs)


def _attention_macs_per_token(model) -> float:
    """Multiply-accumulates per token of one self-attention block (projections + core)."""
    h, s, heads = model.hidden_size, model.seq_length, model.num_attention_heads
    if model.multi_latent_attention:
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank is None:
            q_proj = h * heads * qk
        else:  # down projection, up projection, q norm
            q_proj = model.q_lora_rank * (h + heads * qk + 1)
        kv_proj = model.kv_lora_rank * (h + heads * (model.qk_head_dim + model.v_head_dim) + 1)
        rope_k = h * model.qk_pos_emb_head_dim
        out_proj = heads * model.v_head_dim * h
        core = s * heads * qk / 2 + s * heads * model.v_head_dim / 2  # causal half
        return q_proj + kv_proj + rope_k + out_proj + core
    kv_channels = model.kv_channels or h // heads
    q = kv_channels * heads
    kv = kv_channels * (model.num_query_groups or heads)
    gate = q if model.attention_output_gate else 0
    qkv_proj = h * (q + 2 * kv + gate)
    core = q * s / 2 * 2  # causal half, for QK^T and for the product with V
    out_proj = q * h
    return qkv_proj + core + out_proj


def _linear_attention_layers(model, layers: int) -> int:
    """How many of ``layers`` (MTP included) are Gated DeltaNet layers."""
    if model.experimental_attention_variant != "gated_delta_net":
        return 0
    freq = model.linear_attention_freq
    if isinstance(freq, int):  # every freq-th layer keeps full attention
        return layers - layers // freq
    return sum(int(bit) for bit in freq)


def _gated_delta_net_macs_per_token(model) -> float:
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    in_proj = model.hidden_size * (2 * qk + 2 * v + 2 * model.linear_num_value_heads)
    conv = model.linear_conv_kernel_dim * (2 * qk + v)
    delta_rule = model.linear_num_value_heads * model.linear_value_head_dim ** 2 * 4
    out_proj = model.hidden_size * v
    return in_proj + conv + delta_rule + out_proj
