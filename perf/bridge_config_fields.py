"""Megatron-Bridge 0.3.1's ConfigContainer next to graphbridge's keys: which field carries which key,
and the vocabularies Bridge's YAML spells as ``_target_`` objects (callables, dtypes, enums).

graphbridge names its keys after Bridge's (bridge/config/schema.py), so most fields map by their
own name: SAME_NAME lists those keys, section by section. RENAMED lists the fields whose key is
spelled otherwise. The fields listed in HANDLED need more than a copy and are read by
perf.bridge_config_import (and written by perf.bridge_config_export): the CUDA-graph fields, the
values graphbridge derives, the precision that ``mixed_precision`` lays over the model and DDP
at setup, the overlap switches of ``comm_overlap``, and the fields spelled as objects. Every
other field of a file is ignored and named. Pure data: nothing here imports Bridge,
megatron-core or torch.
"""

from typing import Dict, Tuple

CONTAINER = "megatron.bridge.training.config.ConfigContainer"
SECTIONS = ("rng", "rerun_state_machine", "train", "model", "optimizer", "optimizer_config_override_provider",
            "ddp", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "ft", "straggler",
            "nvrx_straggler", "profiling", "peft", "comm_overlap", "mixed_precision", "tensor_inspect",
            "inprocess_restart")
"""The fields of ConfigContainer in Bridge 0.3.1 (a partial overrides file uses some of them)."""

SAME_NAME: Dict[str, Tuple[str, ...]] = {
    "model": (
        # architecture
        "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
        "make_vocab_size_divisible_by", "share_embeddings_and_output_weights", "normalization",
        "layernorm_epsilon", "gated_linear_unit", "activation_func_clamp_value", "glu_linear_offset",
        "add_bias_linear", "add_qkv_bias", "qk_layernorm", "attention_dropout", "hidden_dropout", "init_method_std",
        "rotary_base", "rotary_percent", "rope_scaling", "rope_scaling_factor", "window_size",
        "window_attn_skip_freq", "softmax_type", "attention_output_gate", "layernorm_zero_centered_gamma",
        "experimental_attention_variant", "linear_attention_freq", "linear_conv_kernel_dim", "linear_key_head_dim",
        "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
        # multi-latent attention and YaRN
        "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
        "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
        "mscale_all_dim",
        # mixture of experts
        "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_shared_expert_intermediate_size",
        "moe_shared_expert_overlap", "moe_shared_expert_gate", "moe_router_score_function", "moe_router_pre_softmax",
        "moe_router_enable_expert_bias", "moe_router_num_groups", "moe_router_group_topk",
        "moe_router_topk_scaling_factor", "moe_router_dtype", "moe_router_load_balancing_type", "moe_aux_loss_coeff",
        "moe_router_force_load_balancing", "moe_router_fusion", "moe_router_padding_for_fp8",
        "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_expert_capacity_factor",
        "moe_pad_expert_input_to_capacity", "moe_input_jitter_eps", "moe_grouped_gemm", "moe_permute_fusion",
        "moe_use_legacy_grouped_gemm", "mtp_num_layers", "mtp_loss_scaling_factor",
        # parallelism
        "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
        "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
        "account_for_embedding_in_pipeline_split", "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage", "account_for_loss_in_pipeline_split",
        # recompute and offloading
        "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules", "cpu_offloading",
        "cpu_offloading_num_layers",
        # kernels
        "transformer_impl", "apply_rope_fusion", "bias_activation_fusion", "gradient_accumulation_fusion",
        "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "bias_dropout_fusion", "masked_softmax_fusion",
        "persist_layer_norm", "disable_parameter_transpose_cache",
        # CUDA graphs, besides the impl and its scope (HANDLED)
        "cuda_graph_warmup_steps", "cuda_graph_use_single_mempool", "cuda_graph_retain_backward_graph",
    ),
    "rng": ("seed", "inference_rng_tracker"),
    "ddp": ("average_in_collective", "use_megatron_fsdp", "data_parallel_sharding_strategy", "fsdp_double_buffer"),
    "train": ("micro_batch_size", "global_batch_size", "train_iters", "exit_signal_handler"),
    "optimizer": ("optimizer", "lr", "min_lr", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad"),
}

RENAMED = {
    "dataset.sequence_length": "dataset.seq_length",
    "scheduler.lr_warmup_iters": "optimizer.lr_warmup_iters",
    "scheduler.lr_decay_style": "optimizer.lr_decay_style",
}

CUDA_GRAPH = ("model.cuda_graph_impl", "model.cuda_graph_scope", "model.enable_cuda_graph",
              "model.external_cuda_graph")
"""megatron-core 0.16.1's CUDA-graph spelling, read together: graphbridge keeps the canonical impl + modules
(bridge.config.migration decides what the older spelling means)."""

DERIVED = {
    "rng.te_rng_tracker": "graphed", "model.use_te_rng_tracker": "graphed",
    "rerun_state_machine.check_for_nan_in_loss": "host_checks", "ddp.check_for_nan_in_grad": "host_checks",
    "model.batch_p2p_sync": "host_checks",
}
"""Keys graphbridge derives from the graph impl (bridge.config.resolvers, by the resolver's name). A
file's value that equals the derivation for the file's own impl is left to it, so a graph choice typed
after the file still derives them; a value that differs is the file's explicit choice."""

PRECISION = {"model.bf16": "bf16", "model.fp16": "fp16", "model.fp8": "fp8", "model.fp8_recipe": "fp8_recipe",
             "model.fp4": "fp4", "ddp.grad_reduce_in_fp32": "grad_reduce_in_fp32"}
"""Key -> the MixedPrecisionConfig field Bridge copies onto it at setup (mixed_precision wins)."""

MIXED_PRECISION_RECIPES = {
    # name: (dtype, fp8, fp8_recipe, fp4); grad_reduce_in_fp32 is on exactly for the bf16 ones.
    "bf16_mixed": ("bf16", None, "tensorwise", None),
    "fp16_mixed": ("fp16", None, "tensorwise", None),
    "bf16_with_fp8_delayed_scaling_mixed": ("bf16", "hybrid", "delayed", None),
    "fp16_with_fp8_delayed_scaling_mixed": ("fp16", "hybrid", "delayed", None),
    "bf16_with_mxfp8_mixed": ("bf16", "e4m3", "mxfp8", None),
    "fp16_with_mxfp8_mixed": ("fp16", "e4m3", "mxfp8", None),
    "bf16_with_fp8_current_scaling_mixed": ("bf16", "hybrid", "tensorwise", None),
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": ("bf16", "hybrid", "tensorwise", None),
    "nanov2_bf16_with_fp8_current_scaling_mixed": ("bf16", "hybrid", "blockwise", None),
    "fp16_with_fp8_current_scaling_mixed": ("fp16", "hybrid", "tensorwise", None),
    "bf16_with_fp8_subchannel_scaling_mixed": ("bf16", "hybrid", "blockwise", None),
    "fp16_with_fp8_subchannel_scaling_mixed": ("fp16", "hybrid", "blockwise", None),
    "bf16_with_nvfp4_mixed": ("bf16", None, "tensorwise", "e2m1"),
}
"""Bridge 0.3.1's named mixed-precision recipes (training/mixed_precision.py; hyphens accepted too)."""

COMM_OVERLAP = {
    "model.tp_comm_overlap": ("tp_comm_overlap", False),
    "model.overlap_moe_expert_parallel_comm": ("overlap_moe_expert_parallel_comm", False),
    "model.delay_wgrad_compute": ("delay_wgrad_compute", False),
    "ddp.overlap_grad_reduce": ("overlap_grad_reduce", None),
    "ddp.overlap_param_gather": ("overlap_param_gather", None),
    "optimizer.overlap_param_gather_with_optimizer_step": ("overlap_param_gather_with_optimizer_step", None),
}
"""Key -> (the CommOverlapConfig field Bridge copies onto it at setup, what Bridge sets when that field is
null). The model's switches are turned off unless comm_overlap turns them on; the DDP and optimizer ones
Bridge derives from the data-parallel size, unknown in a file, so a null keeps the section's value."""

HANDLED = (CUDA_GRAPH + tuple(DERIVED) + tuple(PRECISION) + tuple(COMM_OVERLAP) + (
    "model.activation_func", "model.seq_length", "model.vocab_size", "model.pipeline_model_parallel_layout",
    "model.moe_layer_freq", "model.position_embedding_type", "model.rope_type", "optimizer.weight_decay",
    "ddp.use_distributed_optimizer",
    "optimizer.use_distributed_optimizer", "tokenizer.tokenizer_type", "tokenizer.vocab_size",
    "comm_overlap.data_parallel_size", "dataset.seq_length", "dataset.packed_sequence_specs", "dataset.dataset_kwargs",
    "peft",
))
"""Fields read by code in perf.bridge_config_import, not copied. A field holding a mapping counts as read
when graphbridge reads an entry of it (dataset.packed_sequence_specs: its packed_sequence_size)."""

ALIKE_BUT_NOT_MAPPED = {
    "dataset.mock": "megatron-core derives it from the blend (no blend: mock data); graphbridge always trains on mock "
                    "data",
}
"""Fields named like a graphbridge key that do not carry it (ignored, and named as such)."""

YARN = {"yarn_rotary_scaling_factor": "rotary_scaling_factor",
        "yarn_original_max_position_embeddings": "original_max_position_embeddings",
        "yarn_beta_fast": "beta_fast", "yarn_beta_slow": "beta_slow", "yarn_mscale": "mscale",
        "yarn_mscale_all_dim": "mscale_all_dim",
        "yarn_correction_range_round_to_int": "yarn_correction_range_round_to_int"}
"""GPTOSSProvider's YaRN fields (model.yarn_*) -> graphbridge's model keys; MLA configs use the plain names."""

ACTIVATIONS = {
    "torch.nn.functional.silu": "silu",
    "torch.nn.functional.gelu": "gelu",
    "megatron.core.fusions.fused_bias_geglu.quick_gelu": "quick_gelu",
    "megatron.core.activations.quick_gelu": "quick_gelu",
    "megatron.core.activations.squared_relu": "squared_relu",
}
"""model.activation_func as Bridge writes it (a callable's ``_target_``) -> graphbridge's name."""
ACTIVATION_TARGETS = {"silu": "torch.nn.functional.silu", "gelu": "torch.nn.functional.gelu",
                      "quick_gelu": "megatron.core.fusions.fused_bias_geglu.quick_gelu",
                      "squared_relu": "megatron.core.activations.squared_relu"}

ENUMS = {
    "megatron.core.transformer.enums.CudaGraphScope": {1: "full_iteration", 2: "attn", 3: "mlp", 4: "moe",
                                                        5: "moe_router", 6: "moe_preprocess", 7: "mamba"},
}
"""Enums in fields graphbridge reads, by ``_target_`` -> value -> name (megatron-core 0.16.1)."""

DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.half": "fp16", "torch.float32": "fp32"}

LAYOUT_SYMBOLS = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
"""pipeline_model_parallel_layout: Bridge's list of stages (layer names) -> megatron-core's string symbols."""

PROVIDERS = {"gpt": "megatron.bridge.models.gpt_provider.GPTModelProvider",
             "mla": "megatron.bridge.models.mla_provider.MLAModelProvider",
             "yarn": "megatron.bridge.models.gpt_oss.gpt_oss_provider.GPTOSSProvider"}
"""The model provider an export names: MLA models, YaRN without MLA (the provider that declares the
yarn_* fields in 0.3.1), everything else."""



def same_name_keys() -> Tuple[str, ...]:
    return tuple(f"{section}.{name}" for section, names in SAME_NAME.items() for name in names)

LORA = "megatron.bridge.peft.lora.LoRA"
"""The one PEFT class graphbridge's engines run (peft=lora); Bridge's DoRA and canonical LoRA they do not."""
LORA_FIELDS = ("target_modules", "dim", "alpha", "dropout", "dropout_position")
"""LoRA's fields that graphbridge's peft section has, by the same name (Bridge's ``peft`` is a LoRA object, or null:
the fixtures of ConfigContainer, which have no LoRA, cannot list them)."""

PLANNED_FOR = "# graphbridge: "
"""The comment line of an exported file that holds what graphbridge planned the run for and a
ConfigContainer has no field for (the gpu= preset, the GPU count), as overrides bridge_config= reads
back; Bridge's YAML loader skips comments."""
