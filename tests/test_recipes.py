"""The recipe tree: discovery by walking recipes/ (Hydra's glob cannot see nested options),
architectures against the reference (megatron-cuda-graphs.md §3.5), the tiny recipes (shape,
structure, every cuda_graph choice), recipes without presets, and the two CLI plans the
issue names."""

import dataclasses
import json
import re

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import bridge
from bridge.config.paths import config_dir, recipes_dir
from bridge.config.store import register
from bridge.prepare import prepare
from bridge.recipes import presets, recipe_names
from bridge.translate import build_megatron_configs
from bridge.config.model_facts import moe_layer_pattern


RECIPES = {
    "llama/tiny", "llama/tiny_lora", "llama/llama32_1b", "llama/llama3_8b", "llama/llama3_8b_sft", "llama/llama3_8b_lora",
    "llama/llama3_70b", "llama/llama3_70b_sft", "llama/llama3_70b_lora", "llama/llama31_405b",
    "deepseek/tiny", "deepseek/deepseek_v3",
    "qwen/tiny", "qwen/qwen3_30b_a3b", "qwen/qwen3_235b_a22b", "qwen/qwen3_next_80b_a3b",
    "gpt_oss/tiny", "gpt_oss/gpt_oss_20b", "gpt_oss/gpt_oss_120b",
}
WITHOUT_PRESETS = {"llama/llama32_1b", "llama/llama3_8b_lora", "gpt_oss/gpt_oss_20b"}
TINY = {name for name in RECIPES if name.split("/")[1].startswith("tiny")}
"""The CPU-sized recipes (no presets): llama/tiny_lora is llama/tiny with LoRA."""
MAIN_JOB = "llama/tiny"
"""What `graphbridge` trains without a recipe= (conf/config.yaml)."""

# Reference §3.5, one entry per model; keys are model.* fields (seq_length: dataset).
LLAMA = dict(normalization="RMSNorm", gated_linear_unit=True, activation_func="silu", add_bias_linear=False,
             rotary_base=500000.0, vocab_size=128256, seq_length=8192, hidden_dropout=0.0, attention_dropout=0.0,
             make_vocab_size_divisible_by=128, num_moe_experts=None)
QWEN3 = dict(normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True, activation_func="silu",
             add_bias_linear=False, qk_layernorm=True, kv_channels=128, vocab_size=151936, rotary_base=1e6,
             num_moe_experts=128, moe_router_topk=8, moe_layer_freq=1, moe_shared_expert_intermediate_size=None,
             moe_router_score_function="softmax", moe_router_pre_softmax=False,
             moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3, seq_length=4096)
GPT_OSS = dict(hidden_size=2880, ffn_hidden_size=2880, moe_ffn_hidden_size=2880, num_attention_heads=64,
               num_query_groups=8, kv_channels=64, vocab_size=201088, add_bias_linear=True, window_size=[128, 0],
               window_attn_skip_freq=2, softmax_type="learnable", activation_func="quick_gelu",
               activation_func_clamp_value=7.0, glu_linear_offset=1.0, gated_linear_unit=True,
               position_embedding_type="yarn", rotary_base=150000.0, rotary_scaling_factor=32.0,
               original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
               yarn_correction_range_round_to_int=False, moe_router_topk=4, moe_grouped_gemm=True,
               moe_layer_freq=1, moe_router_load_balancing_type="none", moe_router_pre_softmax=False,
               normalization="RMSNorm", seq_length=4096)
ARCHITECTURES = {
    "llama/llama32_1b": dict(LLAMA, num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
                             num_query_groups=8, kv_channels=64, share_embeddings_and_output_weights=True,
                             rope_scaling=True, rope_scaling_factor=32.0, layernorm_epsilon=1e-5),
    "llama/llama3_8b": dict(LLAMA, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                            num_query_groups=8, kv_channels=128, share_embeddings_and_output_weights=False,
                            rope_scaling=False, init_method_std=0.01, layernorm_epsilon=1e-5),
    "llama/llama3_70b": dict(LLAMA, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                             num_query_groups=8, kv_channels=128, init_method_std=0.008944),
    "llama/llama31_405b": dict(LLAMA, num_layers=126, hidden_size=16384, ffn_hidden_size=53248,
                               num_attention_heads=128, num_query_groups=8, kv_channels=128, rope_scaling=True,
                               rope_scaling_factor=8.0, init_method_std=0.02),
    "deepseek/deepseek_v3": dict(
        num_layers=61, hidden_size=7168, ffn_hidden_size=18432, multi_latent_attention=True, num_attention_heads=128,
        q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128,
        qk_layernorm=True, num_moe_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048, moe_layer_freq=[0] * 3 + [1] * 58,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_num_groups=8,
        moe_router_group_topk=4, moe_router_topk_scaling_factor=2.5, moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-4, moe_router_dtype="fp32", moe_router_pre_softmax=True, vocab_size=129280,
        make_vocab_size_divisible_by=1280, position_embedding_type="yarn", rotary_base=10000.0,
        rotary_scaling_factor=40.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
        mscale=1.0, mscale_all_dim=1.0, normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True,
        add_bias_linear=False, mtp_num_layers=1, mtp_loss_scaling_factor=0.1, init_method_std=0.006,
        seq_length=4096),
    "qwen/qwen3_30b_a3b": dict(QWEN3, num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
                               num_query_groups=4, moe_ffn_hidden_size=768),
    "qwen/qwen3_235b_a22b": dict(QWEN3, num_layers=94, hidden_size=4096, ffn_hidden_size=12288,
                                 num_attention_heads=64, num_query_groups=4, moe_ffn_hidden_size=1536),
    "qwen/qwen3_next_80b_a3b": dict(
        num_layers=48, hidden_size=2048, ffn_hidden_size=5120, num_attention_heads=16, num_query_groups=2,
        kv_channels=256, attention_output_gate=True, layernorm_zero_centered_gamma=True,
        experimental_attention_variant="gated_delta_net", linear_attention_freq=4, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        num_moe_experts=512, moe_router_topk=10, moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=512,
        moe_shared_expert_gate=True, moe_layer_freq=1, moe_router_load_balancing_type="global_aux_loss",
        moe_router_dtype="fp32", rotary_base=1e7, rotary_percent=0.25, vocab_size=151936, normalization="RMSNorm",
        layernorm_epsilon=1e-6, gated_linear_unit=True, add_bias_linear=False, mtp_num_layers=None,
        seq_length=8192),
    "gpt_oss/gpt_oss_120b": dict(GPT_OSS, num_layers=36, num_moe_experts=128),
    "gpt_oss/gpt_oss_20b": dict(GPT_OSS, num_layers=24, num_moe_experts=32),
}
ARCHITECTURES.update({
    "llama/llama3_8b_sft": dict(ARCHITECTURES["llama/llama3_8b"], seq_length=16384),  # its first preset: GB200
    "llama/llama3_8b_lora": dict(ARCHITECTURES["llama/llama3_8b"], seq_length=4096),
    "llama/llama3_70b_sft": dict(ARCHITECTURES["llama/llama3_70b"], seq_length=4096),
    "llama/llama3_70b_lora": dict(ARCHITECTURES["llama/llama3_70b"], seq_length=4096),
})


def first_preset(recipe):
    """Overrides that compose ``recipe``: its first preset, or none when it has none."""
    found = presets(recipe)
    return [f"recipe={recipe}"] + ([f"gpu={found[0][0]}", f"precision={found[0][1]}"] if found else [])


def compose_recipes() -> dict:
    register()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return {recipe: compose(config_name="config", overrides=first_preset(recipe)) for recipe in sorted(RECIPES)}


@pytest.fixture(scope="session")
def composed(across_workers):
    """Each recipe composed once through Hydra (with its first preset when it has presets): by one worker a session,
    read back by the others (conftest.py's across_workers)."""
    return across_workers("composed_recipes", compose_recipes)


def test_walking_recipes_finds_every_recipe():
    assert set(recipe_names()) == RECIPES


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_a_recipe_pulls_in_its_presets_exactly_when_it_has_some(recipe):
    text = (recipes_dir() / f"{recipe}.yaml").read_text()
    has_presets = bool(presets(recipe))
    assert has_presets == (recipe not in WITHOUT_PRESETS | TINY)
    assert (f"- /preset/{recipe}: ${{gpu}}_${{precision}}" in text) == has_presets
    # every recipe composes its default graph in a slot the command line still overrides: eager, but for the
    # main job (the default recipe), which measures the graph choices where it runs (cuda_graph=auto); a recipe
    # built on another (- /recipe/<name>@_global_) takes that one's
    base = re.search(r"^  - /recipe/(\S+)@_global_$", text, re.MULTILINE)
    source = base.group(1) if base else recipe
    slot = f"- /cuda_graph@_global_: {'auto' if source == MAIN_JOB else 'none'}"
    assert slot in (recipes_dir() / f"{source}.yaml").read_text()
    assert text.startswith("# @package _global_\n# " + recipe + ":")


def test_config_files_stay_short_deltas():
    for path in [*recipes_dir().glob("*/*.yaml"), *(config_dir() / "preset").rglob("*.yaml"),
                 *(config_dir() / "arch").glob("*.yaml"), *(config_dir() / "gpu").glob("*.yaml"),
                 *(config_dir() / "precision").glob("*.yaml")]:
        assert len(path.read_text().splitlines()) <= 60, path


@pytest.mark.parametrize("recipe", sorted(ARCHITECTURES))
def test_architecture_matches_the_reference(composed, recipe):
    cfg = prepare(composed[recipe]).config
    for key, expected in ARCHITECTURES[recipe].items():
        actual = cfg.dataset.seq_length if key == "seq_length" else getattr(cfg.model, key)
        assert actual == expected, key
    assert cfg.model.hidden_dropout == cfg.model.attention_dropout == 0.0


@pytest.mark.parametrize("recipe", sorted(WITHOUT_PRESETS))
def test_recipes_without_presets_run_their_own_workload(composed, recipe):
    cfg = prepare(composed[recipe]).config
    assert cfg.workload.gpu is None and cfg.workload.preset_num_gpus == cfg.train.num_gpus
    assert cfg.train.train_iters == 50 and cfg.dataset.mock
    assert [v for v in bridge.validate(cfg) if v.in_config] == []
    on_h100 = bridge.load(first_preset(recipe) + ["gpu=h100"]).train  # gpu= picks no workload, only nodes of 8
    assert on_h100 == dataclasses.replace(cfg.train, num_nodes=-(-cfg.train.num_gpus // 8))


# --- tiny recipes ---------------------------------------------------------------------------

def test_llama_tiny_keeps_its_shape(composed):
    cfg = prepare(composed["llama/tiny"]).config
    model = cfg.model
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_query_groups,
            model.vocab_size, cfg.dataset.seq_length, cfg.train.micro_batch_size) == (8, 512, 8, 4, 4096, 256, 2)


@pytest.mark.parametrize("recipe", sorted(TINY))
def test_tiny_recipes_are_small_single_process_and_engine_neutral(composed, recipe):
    cfg = prepare(composed[recipe]).config
    assert cfg.train.num_gpus == 1 and cfg.workload.preset_num_gpus is None and cfg.workload.gpu is None
    assert cfg.train.train_iters == 50 and cfg.dataset.mock and cfg.dataset.seq_length == 256
    assert cfg.train.micro_batch_size == 2 and cfg.model.vocab_size == 4096
    assert cfg.model.num_layers <= 8 and cfg.model.hidden_size <= 512
    assert not (cfg.model.moe_permute_fusion or cfg.model.moe_router_fusion)
    # Grouped experts only where the experts have biases: one-by-one experts cannot add them (expert_bias).
    assert cfg.model.moe_grouped_gemm == bool(cfg.model.num_moe_experts and cfg.model.add_bias_linear)
    assert cfg.env_vars == {}


def test_tiny_recipes_keep_their_family_structure(composed):
    deepseek = prepare(composed["deepseek/tiny"]).config.model
    assert deepseek.multi_latent_attention and deepseek.q_lora_rank and deepseek.mtp_num_layers == 1
    assert moe_layer_pattern(deepseek)[0] == 0 and sum(moe_layer_pattern(deepseek)) == deepseek.num_layers - 1
    assert deepseek.moe_shared_expert_intermediate_size and deepseek.moe_router_score_function == "sigmoid"
    assert deepseek.moe_router_enable_expert_bias and deepseek.moe_router_num_groups == 4
    assert (deepseek.num_moe_experts, deepseek.moe_router_topk) == (8, 2)

    qwen = prepare(composed["qwen/tiny"]).config.model
    assert qwen.num_query_groups < qwen.num_attention_heads and qwen.qk_layernorm
    assert set(moe_layer_pattern(qwen)) == {1} and (qwen.num_moe_experts, qwen.moe_router_topk) == (8, 2)
    assert qwen.moe_shared_expert_intermediate_size is None

    gpt_oss = prepare(composed["gpt_oss/tiny"]).config.model
    assert gpt_oss.add_bias_linear and gpt_oss.window_size == [128, 0] and gpt_oss.window_attn_skip_freq == 2
    assert gpt_oss.softmax_type == "learnable" and gpt_oss.activation_func == "quick_gelu"
    assert set(moe_layer_pattern(gpt_oss)) == {1} and (gpt_oss.num_moe_experts, gpt_oss.moe_router_topk) == (8, 2)

    llama = prepare(composed["llama/tiny"]).config.model
    assert llama.num_moe_experts is None and llama.num_query_groups < llama.num_attention_heads


CHOICES = sorted(path.stem for path in (config_dir() / "cuda_graph").glob("*.yaml"))
DENSE_REJECTS = {"te_moe": {"moe_modules_need_moe_model"}, "te_moe_router": {"moe_modules_need_moe_model"},
                 "te_attn_moe_router": {"moe_modules_need_moe_model"}, "te_mamba": {"mamba_layers"}}
# The MoE tiny recipes are dropless with the allgather dispatcher: whole-layer and whole-iteration
# graphs would capture the dispatcher's host reads of per-expert counts.
DISPATCH = {"dropless_moe_capture", "allgather_dispatch_capture"}
DROPLESS_REJECTS = {"full_iteration": DISPATCH, "local_layer": DISPATCH, "te_layer": DISPATCH,
                    "te_mamba": {"mamba_layers"}, "te_moe": {"moe_needs_drop_and_pad", *DISPATCH}}
ALL_MOE_REJECTS = {**DROPLESS_REJECTS, "te_mlp": {"mlp_needs_dense_layers"},
                   "te_attn_mlp": {"mlp_needs_dense_layers"}}
REJECTS = {
    "llama/tiny": DENSE_REJECTS,
    "llama/tiny_lora": DENSE_REJECTS,  # LoRA's adapters change no graph verdict
    "deepseek/tiny": DROPLESS_REJECTS,  # first layer dense: mlp ok
    "qwen/tiny": ALL_MOE_REJECTS,
    "gpt_oss/tiny": ALL_MOE_REJECTS,
}


@pytest.mark.parametrize("recipe", sorted(TINY))
def test_tiny_recipes_under_every_cuda_graph_choice(composed, recipe):
    for choice in CHOICES:
        # exactly what cuda_graph=<choice> does: the option merges after the recipe
        with_choice = OmegaConf.merge(composed[recipe], OmegaConf.load(config_dir() / "cuda_graph" / f"{choice}.yaml"))
        finished = prepare(with_choice).config
        found = {v.rule for v in bridge.validate(finished) if v.in_config}
        expected = REJECTS[recipe].get(choice, set())
        assert found == expected, choice
        if not found:
            build_megatron_configs(finished)


# --- the plans the issue names, through the real CLI -----------------------------------------

def _plan_json(cli, cwd, *overrides):
    done = cli("mode=plan", "plan.format=json", *overrides, cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout[done.stdout.index("{"):])


def test_cli_plan_qwen3_30b_on_gb200(cli, tmp_path):
    plan = _plan_json(cli, tmp_path, "recipe=qwen/qwen3_30b_a3b", "gpu=gb200", "precision=bf16")
    assert plan["valid"]
    assert plan["graphs"]["impl"] == "transformer_engine"
    assert plan["graphs"]["modules"] == ["attn", "moe_router", "moe_preprocess"]
    assert plan["config"]["model"]["expert_model_parallel_size"] == 8
    assert plan["config"]["train"]["micro_batch_size"] == 4
    assert plan["config"]["train"]["global_batch_size"] == 512


def test_cli_plan_llama3_8b_on_b200(cli, tmp_path):
    plan = _plan_json(cli, tmp_path, "recipe=llama/llama3_8b", "gpu=b200", "precision=bf16")
    assert plan["valid"]
    assert plan["graphs"]["impl"] == "full_iteration"
    assert plan["megatron"]["transformer_config"]["cuda_graph_scope"] == ["full_iteration"]
    assert plan["config"]["train"]["micro_batch_size"] == 2
