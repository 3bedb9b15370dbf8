"""bridge.flops against FLOPs counted by hand, step by step (Megatron-LM's conventions:
2 FLOPs per multiply-accumulate, 3x forward per step, causal attention counts half)."""

import pytest

import bridge
from bridge.flops import model_flops_per_step


@pytest.fixture(scope="module")
def llama_tiny():
    return bridge.load(["recipe=llama/tiny"])


@pytest.fixture(scope="module")
def deepseek_tiny():
    return bridge.load(["recipe=deepseek/tiny"])


def test_llama_tiny_dense_gqa_swiglu(llama_tiny):
    # 8 layers, hidden 512, ffn 1408, 8 heads of 64 dims, 4 KV groups, vocab 4096, seq 256,
    # global batch 2.
    q_width = 8 * 64                               # 512
    kv_width = 4 * 64                              # 256
    qkv_proj = 512 * (q_width + 2 * kv_width)      # 524288
    scores_and_values = q_width * 256              # 131072: QK^T and AV, each over half of 256
    out_proj = q_width * 512                       # 262144
    attention = qkv_proj + scores_and_values + out_proj   # 917504
    swiglu_mlp = 3 * 512 * 1408                    # 2162688: gate, up and down GEMMs
    layers = 8 * (attention + swiglu_mlp)          # 24641536
    logits = 512 * 4096                            # 2097152: 4096 is already a multiple of 128
    macs_per_token = layers + logits               # 26738688
    forward_per_token = 2 * macs_per_token         # 53477376
    tokens = 2 * 256                               # 512
    expected = 3 * forward_per_token * tokens      # 82141249536
    assert expected == 82_141_249_536
    assert model_flops_per_step(llama_tiny) == expected


def test_deepseek_tiny_mla_moe_shared_expert_mtp(deepseek_tiny):
    # 4 layers [dense, MoE, MoE, MoE] + 1 MTP layer (MoE, like the last layer); hidden 256;
    # MLA with 8 heads, q rank 64, kv rank 32, qk 32 + rope 16 dims, v 32 dims; dense ffn 512;
    # 8 experts top-2 of width 128 plus a shared expert of 128; vocab 4096; seq 256; batch 2.
    q_proj = 64 * (256 + 8 * (32 + 16) + 1)        # 41024: down, up and the q norm
    kv_proj = 32 * (256 + 8 * (32 + 32) + 1)       # 24608: down, up to k and v, the kv norm
    rope_key = 256 * 16                            # 4096: the decoupled RoPE key
    out_proj = 8 * 32 * 256                        # 65536
    core = 256 * 8 * 48 / 2 + 256 * 8 * 32 / 2     # 81920: causal half of QK^T and AV
    attention = q_proj + kv_proj + rope_key + out_proj + core   # 217184
    attention_all = 5 * attention                  # 1085920: 4 layers + the MTP layer
    dense_mlp = 3 * 256 * 512                      # 393216: layer 0
    moe_mlp = 3 * 256 * (2 * 128 + 128)            # 294912: top-2 routed + shared expert
    mlps = 1 * dense_mlp + 4 * moe_mlp             # 1572864: 3 MoE layers + the MTP layer
    mtp_extra = 3 * 256 + 2 * 256 * 256            # 131840: its norms and 2h -> h projection
    logits = 2 * 256 * 4096                        # 2097152: main head + the MTP head
    macs_per_token = attention_all + mlps + mtp_extra + logits  # 4887776
    expected = 3 * 2 * macs_per_token * (2 * 256)  # 15015247872
    assert expected == 15_015_247_872
    assert model_flops_per_step(deepseek_tiny) == expected


def test_linear_in_global_batch_and_padded_vocabulary():
    base = bridge.load(["recipe=llama/tiny"])
    doubled = bridge.load(["recipe=llama/tiny", "train.global_batch_size=4"])
    assert model_flops_per_step(doubled) == 2 * model_flops_per_step(base)
    # vocab 4000 pads to 4096 (multiple of 128), so the logits cost the same.
    padded = bridge.load(["recipe=llama/tiny", "model.vocab_size=4000"])
    assert model_flops_per_step(padded) == model_flops_per_step(base)


def test_composed_dictconfig_gives_the_same_count(llama_tiny):
    from omegaconf import OmegaConf

    assert model_flops_per_step(OmegaConf.structured(llama_tiny)) == model_flops_per_step(llama_tiny)


def test_qwen3_next_counts_gated_deltanet_layers_and_the_output_gate():
    cfg = bridge.load(["recipe=qwen/qwen3_next_80b_a3b", "gpu=gb200"])
    # 48 layers: 36 Gated DeltaNet, 12 gated full attention (every 4th).
    h, s = 2048, 8192
    qk, v, v_heads = 128 * 16, 128 * 32, 32
    gdn = h * (2 * qk + 2 * v + 2 * v_heads) + 4 * (2 * qk + v) + v_heads * 128 ** 2 * 4 + h * v
    q, kv = 16 * 256, 2 * 256
    full = h * (q + 2 * kv + q) + q * s + q * h     # the output gate is one more q-wide GEMM
    moe = 3 * h * (10 * 512 + 512)                  # top-10 routed experts + shared expert
    logits = h * 151936                             # 151936 = 1187 * 128, no padding
    macs = 36 * gdn + 12 * full + 48 * moe + logits
    assert model_flops_per_step(cfg) == 3 * 2 * macs * 1024 * s
