"""One reject and one accept configuration per rule of the catalogue, built without Hydra.

A case is a dict of dotted keys set on a fresh GraphBridgeConfig (a key set here is a value the
user set: derived values follow only the keys left alone), judged on a machine: by default one
H100 with megatron-core 0.16.1 and Transformer Engine 2.10, so that the verdicts do not depend on
the machine the tests run on; a case for a rule of megatron-core 0.19 runs on ONE_H100_019, where
0.19.2 is installed. Cases marked ``megatron=True`` exercise a rule that megatron-core's
TransformerConfig also checks: there both verdicts must agree, live on the installed release
(tests/test_megatron_agreement.py) and, on 0.19.2, against the verdicts recorded from the real
package (tests/test_versions.py, tests/fixtures/).

The machines, the configuration fragments, Case, build and fired are tests/rule_case_kit.py's.
"""

from tests.rule_case_kit import (
    ALLTOALL, DP2, DROP_AND_PAD, EIGHT_H100, EP_OVERLAP, FULL_ITERATION, FULL_RECOMPUTE, FUSED_QUICK_GEGLU,
    GATED_DELTA_NET, H100_80GB, LAPTOP, LLAMA_8B, MLA, MOE, NO_MEGATRON, NO_TE, ONE_B200, ONE_H100_019, PP2, SELECTIVE,
    TE_WITHOUT_EXTENSION, TP2_SP, WITH_APEX, WITH_APEX_KERNELS, WITH_GROUPED_GEMM, WITH_NSYS, Case, local, te,
)
# Re-exported: tests and scripts/megatron_fixture.py import these from here.
from tests.rule_case_kit import H100, ONE_H100, PACKAGES, PACKAGES_019, build, fired  # noqa: F401

FSDP = {"ddp.use_megatron_fsdp": True, "ddp.use_distributed_optimizer": True}
FP8_PRIMARY_EIGHT = {"workload.precision": "fp8_cs", "model.fp8": "e4m3", "model.fp8_recipe": "tensorwise",
                     "ddp.use_distributed_optimizer": True, "model.num_layers": 68, "train.num_gpus": 8,
                     "train.global_batch_size": 8}
LORA = {"peft.scheme": "lora"}
PACKED = {"dataset.packed_sequence": True}

# rule name -> (reject, accept)
RULE_CASES = {
    "auto_graph_fields": (Case(te("attn"), graphs_measured=True), Case(te("attn"))),  # fields alone are no auto
    "auto_one_node": (Case({"train.num_gpus": 16, "train.num_nodes": 2, "train.global_batch_size": 16},
                           graphs_measured=True),
                      Case({"train.num_gpus": 8, "train.global_batch_size": 16}, graphs_measured=True)),
    "module_names": (Case(te("attn", "bogus"), megatron=True), Case(te("attn"), megatron=True)),
    "full_iteration_modules": (Case({**FULL_ITERATION, "model.cuda_graph_modules": ["attn"]}),
                               Case(FULL_ITERATION)),
    "te_rng_tracker": (Case({**te("attn"), "rng.te_rng_tracker": False}),
                       Case({**te("attn"), "rng.te_rng_tracker": False, "model.use_te_rng_tracker": True})),
    "full_iteration_nan_checks": (Case({**FULL_ITERATION, "ddp.check_for_nan_in_grad": True}),
                                  Case({**FULL_ITERATION, "rerun_state_machine.check_for_nan_in_loss": True})),
    "local_scoped_modules": (Case(local("attn")), Case(local())),
    "cpu_offloading": (Case({**te("attn"), "model.cpu_offloading": True}, megatron=True),
                       Case({"model.cpu_offloading": True}, megatron=True)),
    "moe_with_moe_router": (Case({**MOE, **DROP_AND_PAD, **te("moe", "moe_router")}, megatron=True),
                            Case({**MOE, **te("moe_router")}, megatron=True)),
    "moe_preprocess_needs_router": (Case({**MOE, **te("moe_preprocess")}, megatron=True),
                                    Case({**MOE, **local("moe_preprocess")}, megatron=True)),
    "moe_modules_need_moe_model": (Case(te("moe_router", "moe_preprocess"), megatron=True),
                                   Case({**MOE, **te("moe_router", "moe_preprocess")}, megatron=True)),
    "mlp_needs_dense_layers": (Case({**MOE, **te("mlp")}, megatron=True),
                               Case({**MOE, "model.moe_layer_freq": [0, 1], **te("mlp")}, megatron=True)),
    "moe_needs_drop_and_pad": (Case({**MOE, **te("moe")}, megatron=True),
                               Case({**MOE, **DROP_AND_PAD, **te("moe")}, megatron=True)),
    "moe_preprocess_host_sync": (
        Case({**MOE, "model.moe_expert_capacity_factor": 1.0, "model.moe_token_dispatcher_type": "alltoall",
              **te("moe_router", "moe_preprocess")}, megatron=True),
        Case({**MOE, "model.moe_expert_capacity_factor": 1.0, "model.moe_token_dispatcher_type": "allgather",
              **te("moe_router", "moe_preprocess")}, megatron=True)),
    "full_recompute": (Case({**FULL_RECOMPUTE, **te("attn")}, megatron=True),
                       Case({**FULL_RECOMPUTE, **FULL_ITERATION}, megatron=True)),
    "moe_recompute_with_router": (
        Case({**MOE, "model.recompute_granularity": "selective", "model.recompute_modules": ["moe"],
              **te("moe_router", "moe_preprocess")}, megatron=True),
        Case({**MOE, "model.recompute_granularity": "selective", "model.recompute_modules": ["layernorm"],
              **te("moe_router", "moe_preprocess")}, megatron=True)),
    "recompute_attention_dropout": (
        Case({"model.recompute_granularity": "selective", "model.attention_dropout": 0.1, **te()}, megatron=True),
        Case({"model.recompute_granularity": "selective", "model.attention_dropout": 0.1, **te("mlp")},
             megatron=True)),
    "recompute_hidden_dropout": (
        Case({"model.recompute_granularity": "selective", "model.hidden_dropout": 0.1,
              "model.recompute_modules": ["mlp"], **te("attn", "mlp")}, megatron=True),
        Case({"model.recompute_granularity": "selective", "model.hidden_dropout": 0.1,
              "model.recompute_modules": ["mlp"], **te("attn")}, megatron=True)),
    "recompute_moe_jitter": (
        Case({**MOE, "model.recompute_granularity": "selective", "model.moe_input_jitter_eps": 0.01,
              "model.recompute_modules": ["moe"], **te()}, megatron=True),
        Case({**MOE, "model.recompute_granularity": "selective", "model.moe_input_jitter_eps": 0.01,
              "model.recompute_modules": ["moe"], **te("attn")}, megatron=True)),
    "ep_overlap": (Case({**EP_OVERLAP, **local("moe_router")}, megatron=True),
                   Case({**EP_OVERLAP, **te("attn", "moe_router", "moe_preprocess")}, megatron=True)),
    "delay_wgrad": (Case({**MOE, "model.delay_wgrad_compute": True}, megatron=True),
                    Case({**EP_OVERLAP, "model.delay_wgrad_compute": True}, megatron=True)),
    "delay_wgrad_legacy_gemm": (
        Case({**EP_OVERLAP, "model.delay_wgrad_compute": True, "model.moe_use_legacy_grouped_gemm": True},
             megatron=True),
        Case({**EP_OVERLAP, "model.delay_wgrad_compute": True}, megatron=True)),
    "dropless_moe_capture": (Case({**MOE, **FULL_ITERATION}),
                             Case({**MOE, **DROP_AND_PAD, "model.moe_token_dispatcher_type": "alltoall",
                                   **FULL_ITERATION})),
    "mamba_layers": (Case(te("mamba")), Case(te("attn"))),
    "warmup_steps": (Case({**te("attn"), "model.cuda_graph_warmup_steps": 0}),
                     Case({**te("attn"), "model.cuda_graph_warmup_steps": 1})),
    "static_shapes": (Case({**te("attn"), "model.seq_length": 128}), Case({**te("attn"), "model.seq_length": 256})),
    "packed_sequence_scope": (Case({**te("attn"), "dataset.packed_sequence": True}),
                              Case({**te("mlp"), "dataset.packed_sequence": True})),
    "engine_impl": (Case({**te("attn"), "engine": "torch"}), Case({**FULL_ITERATION, "engine": "torch"})),
    "full_iteration_param_gather": (
        Case({**FULL_ITERATION, "optimizer.overlap_param_gather_with_optimizer_step": True}),
        Case({"optimizer.overlap_param_gather_with_optimizer_step": True})),
    "optimizer_in_graph": (Case({**te("attn"), "optimizer.optimizer_in_graph": True}),
                           Case({**FULL_ITERATION, "optimizer.optimizer_in_graph": True})),
    "nccl_graph_register": (
        Case({**local(), "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "workload.gpu": "h100"}),
        Case({**local(), "env_vars.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "workload.gpu": "b200"})),
    "moe_padding_needs_capacity": (Case({**MOE, "model.moe_pad_expert_input_to_capacity": True}, megatron=True),
                                   Case({**MOE, **DROP_AND_PAD}, megatron=True)),
    "expert_parallel_needs_experts": (Case({"model.expert_model_parallel_size": 2, "train.num_gpus": 2}, megatron=True),
                                      Case({**MOE, "model.expert_model_parallel_size": 2, "train.num_gpus": 2},
                                           megatron=True)),
    "recompute_settings": (Case({"model.recompute_granularity": "full"}, megatron=True),
                           Case({**FULL_RECOMPUTE}, megatron=True)),
    "ep_overlap_prerequisites": (Case({**MOE, "model.overlap_moe_expert_parallel_comm": True}, megatron=True),
                                 Case({**EP_OVERLAP}, megatron=True)),
    "cpu_offloading_conflicts": (Case({"model.cpu_offloading": True, "model.recompute_granularity": "selective"},
                                      megatron=True),
                                 Case({"model.cpu_offloading": True}, megatron=True)),
    "config_types": (Case({"model.window_size": "${model.hidden_size}"}), Case({"model.window_size": [128, 0]})),
    "positive_sizes": (Case({"train.train_iters": 0}), Case({"train.train_iters": 1})),
    "value_ranges": (Case({"model.kv_channels": 0}), Case({"model.kv_channels": 64})),
    "int32_values": (Case({"train.train_iters": 2**31}), Case({"train.train_iters": 2**31 - 1})),
    # Two layers over two stages that place three: TransformerConfig asserts at model build, on both releases.
    "pipeline_layout": (Case({**PP2, "model.pipeline_model_parallel_layout": "Et*2|tL"}, megatron=True),
                        Case({**PP2, "model.pipeline_model_parallel_layout": "Et|tL"}, megatron=True)),
    "config_choices": (Case({"model.cross_entropy_fusion_impl": "fused"}), Case({"model.cross_entropy_fusion_impl": "te"})),
    # megatron-core floors hidden/heads silently here and fails later, at model build.
    "attention_heads": (Case({"model.hidden_size": 100, "model.num_attention_heads": 3}),
                        Case({"model.hidden_size": 96, "model.num_attention_heads": 3})),
    "tensor_parallel_heads": (Case({"train.num_gpus": 4, "model.tensor_model_parallel_size": 4, "model.hidden_size": 96,
                                    "model.num_attention_heads": 6}, megatron=True),
                              Case({"train.num_gpus": 4, "model.tensor_model_parallel_size": 4, "model.hidden_size": 96,
                                    "model.num_attention_heads": 8}, megatron=True)),
    "gated_delta_net_context_parallel": (
        Case({**GATED_DELTA_NET, "train.num_gpus": 2, "model.context_parallel_size": 2}, megatron=True),
        Case({**GATED_DELTA_NET, "train.num_gpus": 2, "model.tensor_model_parallel_size": 2}, megatron=True)),
    # Both fail at model build (the parallel linears' and the MoE layer's own asserts), past TransformerConfig.
    "tensor_parallel_widths": (Case({**TP2_SP, "model.ffn_hidden_size": 1001}),
                               Case({**TP2_SP, "model.ffn_hidden_size": 1002})),
    "expert_parallel_experts": (Case({**MOE, "model.num_moe_experts": 6, "model.expert_model_parallel_size": 4,
                                      "train.num_gpus": 4}),
                                Case({**MOE, "model.num_moe_experts": 8, "model.expert_model_parallel_size": 4,
                                      "train.num_gpus": 4})),
    "moe_layer_freq": (Case({**MOE, "model.num_layers": 3, "model.moe_layer_freq": [0, 1]}),
                       Case({**MOE, "model.num_layers": 3, "model.moe_layer_freq": [0, 1, 1]})),
    "gpu_count": (Case({"train.num_gpus": 3, "model.tensor_model_parallel_size": 2}),
                  Case({"train.num_gpus": 4, "model.tensor_model_parallel_size": 2})),
    "node_count": (Case({"train.num_gpus": 12, "train.num_nodes": 8}),
                   Case({"train.num_gpus": 16, "train.num_nodes": 2, "train.global_batch_size": 16})),
    "node_size": (Case({"workload.gpu": "h100", "workload.gpus_per_node": 8, "train.num_gpus": 16,
                        "train.num_nodes": 1, "train.global_batch_size": 16}),
                  Case({"workload.gpu": "h100", "workload.gpus_per_node": 8, "train.num_gpus": 16,
                        "train.num_nodes": 2, "train.global_batch_size": 16})),
    "global_batch": (Case({"train.num_gpus": 2, "train.global_batch_size": 3}),
                     Case({"train.num_gpus": 2, "train.global_batch_size": 4})),
    # megatron-core's scheduler asserts warmup < decay steps with no message, at engine build.
    "lr_schedule": (Case({"train.train_iters": 8, "optimizer.lr_warmup_iters": 10}),
                    Case({"train.train_iters": 8, "optimizer.lr_warmup_iters": 2})),
    "virtual_pipeline": (Case({"model.virtual_pipeline_model_parallel_size": 2}),
                         Case({"model.virtual_pipeline_model_parallel_size": 2, "train.num_gpus": 2,
                               "model.pipeline_model_parallel_size": 2})),
    "sequence_parallel": (Case({"model.sequence_parallel": True}, megatron=True),
                          Case({"model.sequence_parallel": True, "model.tensor_model_parallel_size": 2,
                                "train.num_gpus": 2}, megatron=True)),
    "precision": (Case({"model.fp16": True}), Case({"model.fp16": True, "model.bf16": False})),
    "torch_compile": (Case({"torch_compile": "max"}), Case({"torch_compile": "reduce-overhead"})),
    "full_iteration_p2p_sync": (
        Case({**FULL_ITERATION, **PP2, "model.batch_p2p_sync": True}),
        Case({**FULL_ITERATION, **PP2})),  # the helper turns the sync off
    "profile_window": (Case({**FULL_ITERATION, "perf.profile": True, "train.train_iters": 8}),
                       Case({**FULL_ITERATION, "perf.profile": True, "train.train_iters": 10})),
    "nsys_with_profile": (Case({"perf.nsys": True, "perf.profile": True, "train.train_iters": 20}, machine=WITH_NSYS),
                          Case({"perf.nsys": True, "train.train_iters": 20}, machine=WITH_NSYS)),
    "torch_norm": (Case({**TP2_SP, "model.transformer_impl": "local"}, machine=EIGHT_H100),
                   Case({**TP2_SP, "model.transformer_impl": "local", "model.normalization": "LayerNorm"},
                        machine=WITH_APEX)),
    "context_parallel_local_attention": (
        Case({"model.context_parallel_size": 2, "train.num_gpus": 2, "model.transformer_impl": "local"},
             machine=EIGHT_H100),
        Case({"model.context_parallel_size": 2, "train.num_gpus": 2}, machine=EIGHT_H100)),
    "block_scaled_gather_shapes": (
        Case({**MLA, **TP2_SP, "model.fp8": "e4m3", "model.fp8_recipe": "blockwise"}, machine=EIGHT_H100),
        Case({**MLA, **TP2_SP, "model.fp8": "e4m3", "model.fp8_recipe": "blockwise", "model.kv_lora_rank": 128},
             machine=EIGHT_H100)),
    "quantized_norm_recompute_local_spec": (
        Case({"model.fp8": "e4m3", "model.transformer_impl": "local", **SELECTIVE,
              "model.recompute_modules": ["layernorm"]}),
        Case({"model.fp8": "e4m3", **SELECTIVE, "model.recompute_modules": ["layernorm"]})),
    # The accept case is the same graph on the TE spec, which fuses the input norm into linear_qkv.
    "local_spec_norm_recompute_in_te_graphs": (
        Case({"model.transformer_impl": "local", **te("attn"), **SELECTIVE, "model.recompute_modules": ["layernorm"]}),
        Case({**te("attn"), **SELECTIVE, "model.recompute_modules": ["layernorm"]})),
    # The accept case is the same graph with the TE tracker, which registers its generators with the graph.
    "local_spec_attention_dropout_in_te_graphs": (
        Case({"model.transformer_impl": "local", **te("attn"), "model.attention_dropout": 0.1,
              "rng.te_rng_tracker": False}),
        Case({"model.transformer_impl": "local", **te("attn"), "model.attention_dropout": 0.1})),
    # The accept case is the same graph with the TE tracker.
    "local_spec_forced_balance_in_te_graphs": (
        Case({**MOE, **ALLTOALL, **DROP_AND_PAD, "model.transformer_impl": "local", **te("moe_router"),
              "model.moe_router_force_load_balancing": True, "rng.te_rng_tracker": False}),
        Case({**MOE, **ALLTOALL, **DROP_AND_PAD, "model.transformer_impl": "local", **te("moe_router"),
              "model.moe_router_force_load_balancing": True})),
    "moe_router_without_transformer_engine": (Case(MOE, machine=NO_TE), Case(MOE)),
    "expert_bias_tensor_parallel": (Case({**MOE, **TP2_SP, "model.add_bias_linear": True}, megatron=True),
                                    Case({**MOE, **TP2_SP, "model.add_bias_linear": True,
                                          "model.expert_tensor_parallel_size": 1}, megatron=True)),
    "moe_tensor_parallel_needs_sequence_parallel": (
        Case({**MOE, "model.tensor_model_parallel_size": 2, "train.num_gpus": 2}, machine=EIGHT_H100),
        Case({**MOE, **TP2_SP}, machine=EIGHT_H100)),
    "virtual_pipeline_microbatches": (
        Case({**PP2, "model.virtual_pipeline_model_parallel_size": 2, "train.global_batch_size": 1}),
        Case({**PP2, "model.virtual_pipeline_model_parallel_size": 2, "train.global_batch_size": 4})),
    "local_graphs_pipeline_microbatches": (
        Case({**local(), **PP2, "train.micro_batch_size": 1, "train.global_batch_size": 4}, machine=ONE_H100_019),
        Case({**local(), **PP2, "train.micro_batch_size": 1, "train.global_batch_size": 1}, machine=ONE_H100_019)),
    "context_parallel_attention_variants": (
        Case({"model.context_parallel_size": 2, "train.num_gpus": 2, "model.softmax_type": "learnable"}),
        Case({"model.context_parallel_size": 2, "train.num_gpus": 2})),
    "overlap_param_gather": (Case({**DP2, "ddp.overlap_param_gather": True}, machine=ONE_H100_019),
                             Case({**DP2, "ddp.overlap_param_gather": True, "ddp.use_distributed_optimizer": True},
                                  machine=ONE_H100_019)),
    "nsys_available": (Case({"perf.nsys": True, "train.train_iters": 20}),
                       Case({"perf.nsys": True, "train.train_iters": 20}, machine=WITH_NSYS)),
    # An 8B model on one GPU: its weights, gradients and Adam state alone are beyond 80 GB.
    "memory_capacity": (Case({**LLAMA_8B, "workload.gpu": "h100"}), Case({**LLAMA_8B, "workload.gpu": "b300"})),
    # The same 8B model on 8 GPUs with Megatron-FSDP: Bridge's shards fit an H100, graphbridge's DDP keeps it whole.
    # Bridge's fp8 primary weights fit 68 of Llama 3 8B's layers a B200 (~172 GiB, within the estimate's error);
    # the engine's bf16 weights with their fp8 copies cannot (~203 GiB). A B300 holds both.
    "engine_memory": (Case({**LLAMA_8B, **FP8_PRIMARY_EIGHT, "workload.gpu": "b200"}),
                      Case({**LLAMA_8B, **FP8_PRIMARY_EIGHT, "workload.gpu": "b300"})),
    # LoRA: multi-latent attention has no linear_qkv; an adapter's rank splits over TP at column-parallel layers.
    "lora_targets": (Case({**MLA, **LORA, "peft.target_modules": ["linear_qkv", "linear_proj"]}),
                     Case({**MLA, **LORA, "peft.target_modules": ["linear_proj"]})),
    "lora_rank_tensor_parallel": (Case({**TP2_SP, **LORA, "peft.dim": 5}), Case({**TP2_SP, **LORA, "peft.dim": 6})),
    "packed_sequence_micro_batch": (Case({**PACKED, "train.micro_batch_size": 2, "train.global_batch_size": 4}),
                                    Case({**PACKED, "train.global_batch_size": 4})),
    "packed_sequence_layer_spec": (Case({**PACKED, "model.transformer_impl": "local"}), Case(PACKED)),
    "packed_sequence_context_parallel": (Case({**PACKED, "model.context_parallel_size": 2, "train.num_gpus": 2}),
                                         Case({**PACKED, **DP2})),
    "packed_sequence_unpadded_pipeline": (Case({**PACKED, **PP2, "dataset.pad_to_max_length": False}),
                                          Case({**PACKED, **PP2})),
    "megatron_fsdp_graphs": (Case({**FSDP, **te("mlp")}), Case({**FSDP, **te("mlp"), "ddp.use_megatron_fsdp": False})),
    "megatron_fsdp_distributed_optimizer": (Case({**FSDP, "ddp.use_distributed_optimizer": False}), Case(FSDP)),
    "megatron_fsdp_pipeline": (Case({**FSDP, **PP2, "model.num_layers": 2}), Case({**FSDP, **DP2})),
    "memory_capacity_here": (Case(LLAMA_8B, machine=H100_80GB), Case({**LLAMA_8B, "model.num_layers": 16},
                                                                      machine=H100_80GB)),
}

TORCH = {"engine": "torch"}
RULE_CASES.update({
    # Legacy spellings that migration leaves for the catalogue.
    "legacy_flags": (Case({"model.enable_cuda_graph": True, "model.external_cuda_graph": True}),
                     Case({"model.enable_cuda_graph": True})),
    "legacy_scope": (Case({**te(), "model.cuda_graph_scope": "attn", "model.cuda_graph_modules": ["mlp"]}),
                     Case({**te(), "model.cuda_graph_scope": "attn,mlp"})),
    # What each engine implements.
    "torch_engine_parallelism": (Case({**TORCH, "train.num_gpus": 2, "model.tensor_model_parallel_size": 2}),
                                 Case({**TORCH})),
    "torch_engine_precision": (Case({**TORCH, "model.fp8": "e4m3"}), Case({**TORCH, "model.bf16": True})),
    "torch_engine_sequence": (Case({**TORCH, "model.seq_length": 128, "dataset.seq_length": 256}),
                              Case({**TORCH, "model.seq_length": 128, "dataset.seq_length": 128})),
    "torch_engine_features": (Case({**TORCH, "model.attention_output_gate": True}),
                              Case({**TORCH, "model.normalization": "LayerNorm"})),
    "torch_engine_modules": (Case({**TORCH, **local("moe_preprocess"), **MOE}), Case({**TORCH, **local("attn")})),
    "torch_compile_graphs": (Case({**TORCH, **FULL_ITERATION, "torch_compile": "default"}),
                             Case({**TORCH, "torch_compile": "default"})),
    "torch_compile_megatron": (Case({"torch_compile": "default"}), Case({**TORCH, "torch_compile": "default"})),
    "torch_engine_fsdp": (Case({**TORCH, **FSDP}), Case(FSDP)),
    "optimizer_in_graph_megatron": (
        Case({**FULL_ITERATION, "optimizer.optimizer_in_graph": True, "optimizer.optimizer": "sgd"}),
        Case({**FULL_ITERATION, "optimizer.optimizer_in_graph": True})),
    "optimizer_graph_distributed": (
        Case({**FULL_ITERATION, "optimizer.optimizer_in_graph": True, "ddp.use_distributed_optimizer": True}),
        Case({**FULL_ITERATION, "optimizer.optimizer_in_graph": True, "ddp.use_distributed_optimizer": True},
             machine=ONE_H100_019)),
    "expert_bias": (Case({**MOE, "model.add_bias_linear": True, "model.moe_grouped_gemm": True,
                          "model.bias_dropout_fusion": True}),
                    Case({**MOE, "model.add_bias_linear": True, "model.moe_grouped_gemm": True})),
    "yarn_rounding_mla": (
        Case({"model.multi_latent_attention": True, "model.yarn_correction_range_round_to_int": False}),
        Case({"model.position_embedding_type": "yarn", "model.yarn_correction_range_round_to_int": False})),
    "attention_variant_needs_te_spec": (
        Case({"model.experimental_attention_variant": "gated_delta_net", "model.transformer_impl": "local"}),
        Case({"model.experimental_attention_variant": "gated_delta_net", "model.linear_attention_freq": 2})),
    "gated_delta_net_layout": (
        Case({"model.experimental_attention_variant": "gated_delta_net"}, megatron=True),
        Case({**GATED_DELTA_NET}, megatron=True)),
    # This machine.
    "engine_device": (Case({"engine": "megatron", "device": "cpu"}), Case({"engine": "torch", "device": "cpu"})),
    "cuda_device": (Case({"device": "cuda"}, machine=LAPTOP), Case({"device": "auto"}, machine=LAPTOP)),
    "gpus_per_node": (Case({"train.num_gpus": 8, "train.global_batch_size": 8}),
                      Case({"train.num_gpus": 8, "train.global_batch_size": 8}, machine=EIGHT_H100)),
    "process_count": (Case({"train.num_gpus": 2, "train.global_batch_size": 2}, machine=EIGHT_H100, processes=1),
                      Case({"train.num_gpus": 2, "train.global_batch_size": 2}, machine=EIGHT_H100, processes=2)),
    "megatron_core_installed": (Case({"engine": "megatron"}, machine=NO_MEGATRON),
                                Case({"engine": "auto"}, machine=NO_MEGATRON)),
    "megatron_core_version": (Case({"plan.megatron_core": "0.15.0"}), Case({"plan.megatron_core": "0.19.2"})),
    "transformer_engine": (Case(te("attn"), machine=NO_TE), Case(local(), machine=NO_TE)),
    # megatron-core's MoE routing and dispatch checks outside the graph block.
    "flex_dispatcher": (Case({**MOE, "model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "deepep"}),
                        Case({**MOE, "model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "deepep",
                              "model.expert_model_parallel_size": 2, "train.num_gpus": 2})),
    "shared_expert_overlap": (Case({**MOE, "model.moe_shared_expert_intermediate_size": 64,
                                    "model.moe_shared_expert_overlap": True}, megatron=True),
                              Case({**MOE, "model.moe_shared_expert_intermediate_size": 64,
                                    "model.moe_shared_expert_overlap": True,
                                    "model.moe_token_dispatcher_type": "alltoall"}, megatron=True)),
    "router_padding_for_quantization": (
        Case({**MOE, "model.moe_router_padding_for_fp8": True, "model.moe_token_dispatcher_type": "alltoall"},
             megatron=True),
        Case({**MOE, "model.moe_token_dispatcher_type": "alltoall"}, megatron=True)),
    # The fp8 padding of the routing map is in place, and the router's backward keeps the map (0.16.1 and 0.19.2:
    # "modified by an inplace operation", eager steps included); dropless with the unfused router keeps none.
    "router_padding_saved_map": (
        Case({**MOE, **ALLTOALL, **DROP_AND_PAD, "model.fp8": "e4m3", "model.moe_router_padding_for_fp8": True}),
        Case({**MOE, **ALLTOALL, "model.fp8": "e4m3", "model.moe_router_padding_for_fp8": True})),
    "pipeline_split": (Case({"model.num_layers": 8, **PP2, "model.num_layers_in_first_pipeline_stage": 3,
                             "model.num_layers_in_last_pipeline_stage": 4}),
                       Case({"model.num_layers": 8, **PP2, "model.num_layers_in_first_pipeline_stage": 3,
                             "model.num_layers_in_last_pipeline_stage": 5})),
    "delay_wgrad_graphed_attention": (
        Case({**EP_OVERLAP, "model.delay_wgrad_compute": True, **te("attn", "moe_router", "moe_preprocess")}),
        Case({**EP_OVERLAP, "model.delay_wgrad_compute": True, "model.gradient_accumulation_fusion": True,
              **te("attn", "moe_router", "moe_preprocess")})),
    "shared_expert_bias": (Case({**MOE, "model.moe_shared_expert_intermediate_size": 64, "model.add_bias_linear": True,
                                 "model.moe_grouped_gemm": True}),
                           Case({**MOE, "model.moe_shared_expert_intermediate_size": 64})),
    "quantized_precision_gpu": (Case({"model.fp8": "e4m3", "model.fp8_recipe": "mxfp8"}),
                                Case({"model.fp8": "e4m3", "model.fp8_recipe": "mxfp8"}, machine=ONE_B200)),
    "transformer_engine_extension": (Case({"engine": "megatron"}, machine=TE_WITHOUT_EXTENSION),
                                     Case({"engine": "megatron"}, machine=NO_TE)),
    "mla_needs_te_spec": (Case({**MLA, "model.transformer_impl": "local"}), Case(MLA)),
    "local_graphs_layerless_stage": (
        Case({**PP2, **local(), "model.pipeline_model_parallel_layout": "E|ttL", "train.global_batch_size": 2}),
        Case({**PP2, **local(), "model.pipeline_model_parallel_layout": "Et|tL", "train.global_batch_size": 2})),
    "router_group_limited": (Case({**MOE, "model.moe_router_group_topk": 2}, megatron=True),
                             Case({**MOE, "model.moe_router_group_topk": 2, "model.moe_router_num_groups": 4},
                                  megatron=True)),
    "distributed_optimizer_adam": (Case({**DP2, "optimizer.optimizer": "sgd", "ddp.use_distributed_optimizer": True}),
                                   Case({**DP2, "optimizer.optimizer": "sgd"})),
    "param_gather_with_optimizer_step": (
        Case({"optimizer.overlap_param_gather_with_optimizer_step": True}),
        Case({"optimizer.overlap_param_gather_with_optimizer_step": True, "ddp.use_distributed_optimizer": True,
              "ddp.overlap_param_gather": True, "ddp.overlap_grad_reduce": True, **PP2,
              "model.virtual_pipeline_model_parallel_size": 2, "model.num_layers": 4, "train.global_batch_size": 2})),
    "rotary_dim_even": (Case({"model.kv_channels": 9}), Case({"model.kv_channels": 10})),
    "cpu_offloading_layers": (Case({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 2}, megatron=True),
                              Case({"model.cpu_offloading": True, "model.cpu_offloading_num_layers": 1},
                                   megatron=True)),
    "moe_ffn_without_experts": (Case({"model.moe_ffn_hidden_size": 128}, megatron=True),
                                Case({**MOE, "model.moe_ffn_hidden_size": 128}, megatron=True)),
    "sinkhorn_aux_loss": (Case({**MOE, "model.moe_router_load_balancing_type": "sinkhorn",
                                "model.moe_aux_loss_coeff": 0.001}),
                          Case({**MOE, "model.moe_router_load_balancing_type": "sinkhorn"})),
    "quantized_gemm_widths": (Case({**MOE, "model.fp8": "hybrid", "model.moe_ffn_hidden_size": 100}),
                              Case({**MOE, "model.fp8": "hybrid", "model.moe_ffn_hidden_size": 112})),
    "yarn_betas": (Case({"model.position_embedding_type": "yarn", "model.beta_slow": 0.0}),
                   Case({"model.position_embedding_type": "rope", "model.beta_slow": 0.0})),
    "router_topk_experts": (Case({**MOE, "model.num_moe_experts": 1, "model.moe_router_topk": 2}),
                            Case({**MOE, "model.num_moe_experts": 2, "model.moe_router_topk": 2})),
    "cpu_offloading_sequential_experts": (
        Case({**MOE, "model.cpu_offloading": True, "model.moe_ffn_hidden_size": 128}),
        Case({**MOE, "model.cpu_offloading": True, "model.moe_ffn_hidden_size": 128, "model.moe_grouped_gemm": True})),
    "te_graphs_bf16_params": (Case({**te("attn"), "model.bf16": False}), Case(te("attn"))),
    "single_token_attention": (Case({"dataset.seq_length": 1}), Case({"dataset.seq_length": 2})),
    "mla_query_groups": (Case({**MLA, "model.num_query_groups": 2}),
                         Case({**MLA, "model.num_query_groups": 4, "model.num_attention_heads": 4})),
    "expert_bias_score_function": (
        Case({**MOE, "model.moe_router_enable_expert_bias": True}, megatron=True),
        Case({**MOE, "model.moe_router_enable_expert_bias": True, "model.moe_router_score_function": "sigmoid"},
             megatron=True)),
    # 0.16.1's local spec builds grouped experts as the legacy GroupedMLP, which asserts grouped_gemm imports
    # (qwen/tiny on an H100, at model build).
    "grouped_gemm_package": (Case({**MOE, "model.transformer_impl": "local", "model.moe_grouped_gemm": True}),
                             Case({**MOE, "model.transformer_impl": "local", "model.moe_grouped_gemm": True},
                                  machine=WITH_GROUPED_GEMM)),
    "compiled_kernels": (Case({"model.gradient_accumulation_fusion": True}),
                         Case({"model.gradient_accumulation_fusion": True}, machine=WITH_APEX_KERNELS)),
    "bias_activation_fusion": (
        Case({"model.bias_activation_fusion": True, "model.activation_func": "squared_relu"}, megatron=True),
        Case({"model.bias_activation_fusion": True, "model.activation_func": "gelu"}, megatron=True)),
    "allgather_dispatch_capture": (Case({**MOE, **DROP_AND_PAD, **te("moe")}),
                                   Case({**MOE, **DROP_AND_PAD, **te("moe"), "model.moe_token_dispatcher_type": "alltoall"})),
    "fused_quick_geglu_capture": (Case({**MOE, **DROP_AND_PAD, **ALLTOALL, **FUSED_QUICK_GEGLU, **te("moe")}),
                                  Case({**MOE, **DROP_AND_PAD, **ALLTOALL, **FUSED_QUICK_GEGLU, **te("moe_router")})),
    "dropless_permute_capture": (Case({**MOE, **te("moe_router", "moe_preprocess"), **ALLTOALL}),
                                 Case({**MOE, **te("moe_router", "moe_preprocess")})),
    "recompute_in_layer_graphs": (Case({**te("attn"), **SELECTIVE, "model.recompute_modules": ["core_attn"]}),
                                  Case({**te("attn"), **SELECTIVE, "model.recompute_modules": ["mlp", "layernorm"]})),
    "recompute_quantized_in_layer_graphs": (
        Case({**te("attn", "mlp"), **SELECTIVE, "model.recompute_modules": ["mlp"], "model.fp8": "hybrid"},
             machine=ONE_H100_019),
        Case({**te("attn", "mlp"), **SELECTIVE, "model.recompute_modules": ["mlp"]}, machine=ONE_H100_019)),
    "mla_recompute_in_layer_graphs": (Case({**MLA, **te("attn"), **SELECTIVE, "model.recompute_modules": ["layernorm"]}),
                                      Case({**MLA, **te("mlp"), **SELECTIVE, "model.recompute_modules": ["layernorm"]})),
    # The MoE layer's pre-MLP norm, freed inside the router+preprocess graph and recomputed by a backward hook
    # (illegal address at the first replay under fp8 on an H100, and in bf16 at two H200s, 0.16.1 and 0.19.2);
    # megatron-core itself keeps it eager, without recompute, under the allgather dispatcher.
    "moe_norm_recompute_in_layer_graphs": (
        Case({**MOE, **ALLTOALL, "model.moe_permute_fusion": True, **te("attn", "moe_router", "moe_preprocess"),
              **SELECTIVE, "model.recompute_modules": ["layernorm"]}),
        Case({**MOE, **te("attn", "moe_router", "moe_preprocess"), **SELECTIVE,
              "model.recompute_modules": ["layernorm"]})),
    "router_fp64_graphs": (Case({**MOE, **te("moe_router", "moe_preprocess"), "model.moe_router_dtype": "fp64"}),
                           Case({**MOE, **te("moe_router", "moe_preprocess"), "model.moe_router_dtype": "fp32"})),
    "retained_backward_compiled_fusion": (
        Case({**te("mlp"), "model.cuda_graph_retain_backward_graph": True, "model.bias_dropout_fusion": True,
              "model.hidden_dropout": 0.1}),
        Case({**te("mlp"), "model.cuda_graph_retain_backward_graph": True, "model.bias_dropout_fusion": True})),
    "quantized_experts_fp64_probs": (
        Case({**MOE, **ALLTOALL, "model.fp8": "e4m3", "model.moe_grouped_gemm": True, "model.moe_router_dtype": "fp64"}),
        Case({**MOE, **ALLTOALL, "model.fp8": "e4m3", "model.moe_grouped_gemm": True, "model.moe_router_dtype": "fp32"})),
    "router_fusion_fp64": (Case({**MOE, "model.moe_router_fusion": True, "model.moe_router_dtype": "fp64"}),
                           Case({**MOE, "model.moe_router_fusion": True, "model.moe_router_dtype": "fp32"})),
    "router_topk_one": (Case({**MOE, "model.moe_router_topk": 1}, megatron=True),
                        Case({**MOE, "model.moe_router_topk": 1, "model.moe_router_pre_softmax": True}, megatron=True)),
})

# What megatron-core 0.19 changed: rules that hold from 0.19 on, and the fields a release lacks.
V19 = ONE_H100_019
RULE_CASES.update({
    "version_fields": (Case({**local(), "model.inference_cuda_graph_scope": "layer"}),
                       Case({**local(), "model.inference_cuda_graph_scope": "layer"}, machine=V19)),
    "inference_scope": (Case({**te("attn"), "model.inference_cuda_graph_scope": "layer"}, megatron=True, machine=V19),
                        Case({**local(), "model.inference_cuda_graph_scope": "layer"}, megatron=True, machine=V19)),
    "inference_block_training": (Case({**local(), "model.inference_cuda_graph_scope": "block"}, machine=V19),
                                 Case({**local(), "model.inference_cuda_graph_scope": "layer"}, machine=V19)),
    "ep_overlap_te_graphs": (Case({**EP_OVERLAP, **DROP_AND_PAD, **te("moe")}, megatron=True, machine=V19),
                             Case({**EP_OVERLAP, **DROP_AND_PAD, **FULL_ITERATION}, megatron=True, machine=V19)),
    "ep_overlap_local_graphs": (Case({**EP_OVERLAP, **local("moe_router")}, machine=V19),
                                Case({**EP_OVERLAP, **te("attn", "moe_router", "moe_preprocess")}, machine=V19)),
    "ep_overlap_moe_recompute": (Case({**EP_OVERLAP, "model.recompute_modules": ["moe"]}, megatron=True, machine=V19),
                                 Case({**EP_OVERLAP, "model.recompute_modules": ["core_attn"]}, megatron=True,
                                      machine=V19)),
    "cpu_offloading_layer_graphs": (Case({**te("attn"), "model.cpu_offloading": True}, megatron=True, machine=V19),
                                    Case({**FULL_ITERATION, "model.cpu_offloading": True}, megatron=True,
                                         machine=V19)),
})
