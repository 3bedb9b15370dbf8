"""The GPU differential's witness cases (``--witnesses``, benchmarks/gpu_differential.py): for each rule that refuses
on GPU grounds, what it refuses and its nearest configuration that should train, and probes of configurations
the catalogue accepts that no record has trained yet. Each trains with every refusing rule unasked
(benchmarks/unchecked_run.py); the GPU's verdict on a pair is its rule's witness (tests/gpu_witnesses.py). A case
trains at its own `train.num_gpus` (1 when unset), in the differential of that many GPUs a configuration."""

SELECTIVE = "model.recompute_granularity=selective"
DROP_AND_PAD = ("model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true")
ALLTOALL = "model.moe_token_dispatcher_type=alltoall"
TWO_GPUS = ("train.num_gpus=2",)
TP2, SP = "model.tensor_model_parallel_size=2", "model.sequence_parallel=true"
CP2 = "model.context_parallel_size=2"
DP2 = ("recipe=llama/tiny", "train.global_batch_size=4")
PACKED = ("recipe=llama/tiny", "dataset.packed_sequence=true")
FSDP_TINY = ("recipe=llama/tiny", "ddp.use_megatron_fsdp=true", "ddp.use_distributed_optimizer=true")
ONE_ROW_A_MICRO_BATCH = ("train.micro_batch_size=1", "train.global_batch_size=2")
WITNESS_CASES = {
    "fp8_mx": ("recipe=llama/tiny", "precision=fp8_mx"),
    "fp8_sc": ("recipe=llama/tiny", "precision=fp8_sc"),
    "recompute_core_attn_te_attn": ("recipe=llama/tiny", "cuda_graph=te_attn", SELECTIVE,
                                    "model.recompute_modules=[core_attn]"),
    "recompute_layernorm_te_attn": ("recipe=llama/tiny", "cuda_graph=te_attn", SELECTIVE,
                                    "model.recompute_modules=[layernorm]"),
    "recompute_mlp_te_attn_mlp_fp8": ("recipe=llama/tiny", "cuda_graph=te_attn_mlp", "precision=fp8_cs", SELECTIVE,
                                      "model.recompute_modules=[mlp]"),
    "recompute_core_attn_full_iteration": ("recipe=llama/tiny", "cuda_graph=full_iteration", SELECTIVE,
                                           "model.recompute_modules=[core_attn,mlp]"),
    "drop_and_pad_allgather_te_moe": ("recipe=qwen/tiny", "cuda_graph=te_moe", *DROP_AND_PAD),
    "drop_and_pad_alltoall_te_moe": ("recipe=qwen/tiny", "cuda_graph=te_moe", *DROP_AND_PAD, ALLTOALL),
    "drop_and_pad_alltoall_full_iteration": ("recipe=gpt_oss/tiny", "cuda_graph=full_iteration", *DROP_AND_PAD,
                                             ALLTOALL),
    "dropless_alltoall_router": ("recipe=qwen/tiny", "cuda_graph=te_attn_moe_router", ALLTOALL),
    "dropless_alltoall_router_fused_permute": ("recipe=qwen/tiny", "cuda_graph=te_attn_moe_router", ALLTOALL,
                                               "model.moe_permute_fusion=true"),
    "local_layer_without_te_tracker": ("recipe=llama/tiny", "cuda_graph=local_layer", "rng.te_rng_tracker=false"),
    "full_iteration_without_te_tracker": ("recipe=llama/tiny", "cuda_graph=full_iteration", "rng.te_rng_tracker=false",
                                          "model.attention_dropout=0.1", "model.hidden_dropout=0.1"),
    # Issue 79's classes: MLA with query groups fails in TE's attention at the first forward (both releases, H100 at
    # 1670511); its control keeps one group a head. MoE-scope graphs on a model whose layers are all dense fail in
    # graphbridge's engine; the control has an MoE layer. Expert bias under softmax is megatron-core's refusal.
    "mla_query_groups_te_attn": ("recipe=deepseek/tiny", "cuda_graph=te_attn", "model.num_query_groups=2"),
    "mla_query_groups_null_te_attn": ("recipe=deepseek/tiny", "cuda_graph=te_attn"),
    "moe_router_graphs_dense_layers_only": ("recipe=deepseek/tiny", "cuda_graph=te_moe_router", "model.num_layers=1"),
    "moe_router_graphs_with_moe_layer": ("recipe=deepseek/tiny", "cuda_graph=te_moe_router", "model.num_layers=2"),
    "expert_bias_softmax": ("recipe=deepseek/tiny", "model.moe_router_score_function=softmax"),
    "expert_bias_sigmoid": ("recipe=deepseek/tiny",),
    # The two classes the 32nd block found (9901178): fp32 parameters under TE per-layer graphs fail at capture (bf16
    # sample inputs), bf16 ones train; a sequence of one token fails in cuDNN's fused attention, two train.
    "te_graphs_fp32_params": ("recipe=qwen/tiny", "cuda_graph=te_attn", "model.bf16=false"),
    "te_graphs_bf16_params": ("recipe=qwen/tiny", "cuda_graph=te_attn"),
    "single_token_sequence": ("recipe=qwen/tiny", "dataset.seq_length=1"),
    "two_token_sequence": ("recipe=qwen/tiny", "dataset.seq_length=2"),
    # The 34th block's (b0ccb80): a router top-k above the expert count fails in the first forward, at the count it
    # trains; CPU offloading's streams break SequentialMLP's copy of the config at build, grouped experts copy none.
    "router_topk_above_experts": ("recipe=llama/tiny", "model.num_moe_experts=1"),
    "router_topk_at_experts": ("recipe=llama/tiny", "model.num_moe_experts=2"),
    "cpu_offloading_sequential_experts": ("recipe=qwen/tiny", "model.cpu_offloading=true"),
    # 9901178's run 1589 left its eager twin on 0.16.1 while both diverged under adam_beta2=0 (tests/test_gpu_records.py,
    # UNDECIDED): with --witness-twins each trains beside its eager twin, the default beta2 as the control.
    **{f"adam_beta2_{name}_local_layer": ("recipe=llama/tiny", "cuda_graph=local_layer", "precision=fp8_sc",
                                          "model.cuda_graph_warmup_steps=2", *beta2)
       for name, beta2 in (("zero", ("optimizer.adam_beta2=0.0",)), ("default", ()))},
    "cpu_offloading_grouped_experts": ("recipe=qwen/tiny", "model.cpu_offloading=true", "model.moe_grouped_gemm=true"),
    "gpt_oss_bias_activation_fusion": ("recipe=gpt_oss/tiny", "model.bias_activation_fusion=true"),
    "router_padding_drop_and_pad": ("recipe=qwen/tiny", "cuda_graph=te_attn", "precision=fp8_sc", ALLTOALL,
                                    *DROP_AND_PAD, "model.moe_router_padding_for_fp8=true"),
    "router_padding_dropless": ("recipe=qwen/tiny", "cuda_graph=te_attn", "precision=fp8_sc", ALLTOALL,
                                "model.moe_router_padding_for_fp8=true"),
    # Recomputing a dropless MoE layer with the padding trained on both releases (24488cb, H200): the rule that
    # refused it is gone; router_padding_saved_map refuses the capacity factor its first witness had.
    "router_padding_dropless_moe_recompute": ("recipe=qwen/tiny", "cuda_graph=te_attn", "precision=fp8_sc", ALLTOALL,
                                              SELECTIVE, "model.recompute_modules=[moe]",
                                              "model.moe_router_padding_for_fp8=true"),
    **{f"moe_norm_recompute_{dispatch}": ("recipe=qwen/tiny", "cuda_graph=te_attn_moe_router", "precision=fp8_sc",
                                          SELECTIVE, "model.recompute_modules=[layernorm]",
                                          f"model.moe_token_dispatcher_type={dispatch}", "model.moe_grouped_gemm=true",
                                          "model.moe_permute_fusion=true", "train.micro_batch_size=1",
                                          "train.global_batch_size=2") for dispatch in ("alltoall", "allgather")},
    # The moe module's graph with its norm recomputed in bf16: failed at replay on both releases (24488cb, c236fc3).
    "moe_norm_recompute_bf16_te_moe": ("recipe=qwen/tiny", "cuda_graph=te_moe", SELECTIVE,
                                       "model.recompute_modules=[layernorm]", ALLTOALL, *DROP_AND_PAD),
    # GPT-OSS's fused quick_geglu in graphed experts (fused_quick_geglu_capture), beside it unfused.
    **{f"quick_geglu_te_moe_fused_{on}": ("recipe=gpt_oss/tiny", "cuda_graph=te_moe", ALLTOALL, *DROP_AND_PAD,
                                          f"model.bias_activation_fusion={on}") for on in ("true", "false")},
    # A norm recomputed under fp8 on the local spec (quantized_norm_recompute_local_spec), beside it in bf16.
    **{f"local_spec_norm_recompute_{precision}": ("recipe=llama/tiny", f"precision={precision}",
                                                  "model.transformer_impl=local", SELECTIVE,
                                                  "model.recompute_modules=[layernorm]")
       for precision in ("fp8_sc", "bf16")},
    # Transformer Engine's graphs on the local spec, which a rule refused until 6e4647f: dense te_layer and te_attn
    # left their eager twins from the capture step on (0.79 % by step 6 at 0d3b80c), since megatron-core replays a
    # layer graph with an all-false mask where the step passed none, and the local spec's attention then attends to
    # later tokens. The engine replays the causal mask now (transformer_engine.causal_replays), and every case
    # equals its twin (gpu_witnesses.json at 6e4647f, both releases); te_mlp keeps the attention outside the graph.
    **{f"te_graphs_local_spec_{graph}": ("recipe=llama/tiny", f"cuda_graph={graph}", "model.transformer_impl=local")
       for graph in ("te_layer", "te_attn", "te_mlp")},
    **{f"te_graphs_local_spec_{graph}": ("recipe=qwen/tiny", f"cuda_graph={graph}", "model.transformer_impl=local",
                                         ALLTOALL, *DROP_AND_PAD) for graph in ("te_moe_router", "te_attn_moe_router")},
    # Attention dropout drawn under megatron-core's RNG tracker in Transformer Engine's graphs of the local spec
    # (local_spec_attention_dropout_in_te_graphs; witness: run 594 of the two-GPU differential at 6c7a53d, both
    # releases): te_attn with each tracker, and local_layer, whose graphs register megatron-core's tracker states.
    # Hidden dropout draws from the default generator outside the fork, which the TE graph registers: the rule leaves
    # it, and te_layer with it alone under megatron-core's tracker says whether that line holds.
    **{f"local_spec_attention_dropout_{graph}_{tracker}_tracker": (
        "recipe=llama/tiny", f"cuda_graph={graph}", "model.transformer_impl=local", "model.attention_dropout=0.1",
        f"rng.te_rng_tracker={on}")
       for graph, tracker, on in (("te_attn", "megatron", "false"), ("te_attn", "te", "true"),
                                  ("local_layer", "megatron", "false"))},
    "local_spec_hidden_dropout_te_layer_megatron_tracker": ("recipe=llama/tiny", "cuda_graph=te_layer",
                                                            "model.transformer_impl=local", "model.hidden_dropout=0.1",
                                                            "rng.te_rng_tracker=false"),
    # The router's forced load balancing draws under megatron-core's expert tracker too, inside the router's TE graph:
    # the same hazard, which failed so on both releases at 0dcdb17 (local_spec_forced_balance_in_te_graphs); the
    # control is the TE tracker, which the rule accepts.
    **{f"forced_balance_local_spec_te_moe_router_{tracker}_tracker": (
        "recipe=qwen/tiny", "cuda_graph=te_moe_router", "model.transformer_impl=local", ALLTOALL, *DROP_AND_PAD,
        "model.moe_router_force_load_balancing=true", f"rng.te_rng_tracker={on}")
       for tracker, on in (("megatron", "false"), ("te", "true"))},
    # A retained backward graph with the compiled bias-dropout-add (retained_backward_compiled_fusion): its witness,
    # te_mlp with hidden dropout, failed on an H100; qwen/tiny's te_attn without dropout trained (7d4567f). te_mlp on
    # both sides of the line the rule draws now.
    **{f"retained_backward_fusion_te_mlp{name}": ("recipe=llama/tiny", "cuda_graph=te_mlp",
                                                  "model.cuda_graph_retain_backward_graph=true",
                                                  "model.bias_dropout_fusion=true", f"model.hidden_dropout={dropout}")
       for name, dropout in (("", "0.0"), ("_hidden_dropout", "0.1"))},
    # bf16 router graphs with the MoE norm recomputed trained at one GPU (24488cb, c236fc3) but not at two
    # (gpu_differential_2gpu_c236fc3 runs 364 and 619): the rule refuses them again. With the overlapped gradient
    # reduce, megatron-core checks at one GPU too that every gradient arrived.
    **{f"moe_norm_recompute_bf16_te_moe_router{name}": ("recipe=qwen/tiny", "cuda_graph=te_moe_router", SELECTIVE,
                                                        "model.recompute_modules=[layernorm]", ALLTOALL,
                                                        "model.moe_permute_fusion=true", *overrides)
       for name, overrides in (("", ()), ("_overlap_grad_reduce", ("ddp.overlap_grad_reduce=true",)))},
    # megatron-core keeps a norm's recompute on inside local per-layer graphs too (can_recompute_pre_mlp_layernorm_
    # for_cudagraph answers yes for cuda_graph_impl=local): the local spec's dense norms, and an MoE layer's pre-MLP
    # norm on the TE spec. Both trained on both releases in every H200 record since 24488cb.
    "local_layer_norm_recompute_local_spec": ("recipe=llama/tiny", "cuda_graph=local_layer",
                                              "model.transformer_impl=local", SELECTIVE,
                                              "model.recompute_modules=[layernorm]"),
    # Transformer Engine's graphs with the norms recomputed (local_spec_norm_recompute_in_te_graphs): on the local
    # spec te_attn and te_mlp failed at the first replay, on the TE spec, which fuses those norms, te_attn trained
    # (local_spec_norm_recompute_f0650f3.log, 0.19.2).
    **{f"norm_recompute_{impl}_spec_{graph}": ("recipe=llama/tiny", f"cuda_graph={graph}",
                                               f"model.transformer_impl={impl}", SELECTIVE,
                                               "model.recompute_modules=[layernorm]")
       for impl in ("local", "transformer_engine") for graph in ("te_attn", "te_mlp")},
    # What else megatron-core 0.19 recomputes inside those graphs on the local spec (0.16.1 refuses it:
    # recompute_in_layer_graphs): one draw of te_attn with core_attn trained (qwen/tiny, 7d4567f), none of te_mlp.
    **{f"local_spec_recompute_{module}_{graph}": ("recipe=llama/tiny", f"cuda_graph={graph}",
                                                  "model.transformer_impl=local", SELECTIVE,
                                                  f"model.recompute_modules=[{module}]")
       for module, graph in (("core_attn", "te_attn"), ("mlp", "te_mlp"))},
    "local_layer_moe_norm_recompute": ("recipe=qwen/tiny", "cuda_graph=local_layer", SELECTIVE,
                                       "model.recompute_modules=[layernorm]", ALLTOALL, *DROP_AND_PAD),
    **{f"local_spec_grouped_gemm_{on}": ("recipe=qwen/tiny", "model.transformer_impl=local",
                                         f"model.moe_grouped_gemm={on}", "train.micro_batch_size=1",
                                         "train.global_batch_size=1") for on in ("true", "false")},
    # fp64 router probabilities into the grouped experts under fp8 (quantized_experts_fp64_probs): with drop-and-pad
    # at capacity 128 (a multiple of 16), gpt_oss/tiny under te_layer trained with the rule bypassed on both releases
    # (8a7890f); at capacity factor 1.1 the capacity is 141, which leaves Fp8Padding rows to pad.
    **{f"fp64_probs_drop_and_pad_capacity_{capacity}": ("recipe=gpt_oss/tiny", "precision=fp8_sc", ALLTOALL,
                                                        f"model.moe_expert_capacity_factor={factor}",
                                                        "model.moe_pad_expert_input_to_capacity=true",
                                                        "model.moe_router_dtype=fp64")
       for capacity, factor in (("128", "1.0"), ("141", "1.1"))},
    # The router's fp8 padding (0.19's experts skip their own padding) rounds every expert's tokens up to 16 on 0.16.1
    # too, where Fp8Padding then finds nothing to pad: 0.16.1 trained it at ec177b3, its losses 0.19.2's.
    "fp64_probs_router_padding": ("recipe=qwen/tiny", "precision=fp8_cs", ALLTOALL, "model.moe_grouped_gemm=true",
                                  "model.moe_router_dtype=fp64", "model.moe_router_padding_for_fp8=true"),
    # One-by-one experts with biases (expert_bias) failed at the first forward pass in bf16 (daa2b42, H100), yet
    # 0.19.2 trained them under fp8_cs with te_layer and drop-and-pad at 4a94902 (run 1749): eagerly, each precision
    # with and without drop-and-pad, to learn whether the rule can narrow to unquantized experts.
    **{f"sequential_expert_bias_{precision}_{routing}": ("recipe=gpt_oss/tiny", f"precision={precision}",
                                                         "model.moe_grouped_gemm=false", *overrides)
       for precision in ("bf16", "fp8_cs")
       for routing, overrides in (("dropless", ()), ("drop_and_pad", (ALLTOALL, *DROP_AND_PAD)))},
    # Two GPUs: the parallel-layout classes a random two-GPU run found after an accepting plan (reference section 9),
    # each beside its control, and DeepSeek-V3's GB200 graphs and recompute (attn, moe_router and moe_preprocess graphs
    # with mla_up_proj recomputed) on the tiny model, experts split as in the preset.
    "moe_tp_without_sp": (*TWO_GPUS, "recipe=deepseek/tiny", TP2),
    "moe_tp_with_sp": (*TWO_GPUS, "recipe=deepseek/tiny", TP2, SP),
    "local_spec_sp": (*TWO_GPUS, "recipe=llama/tiny", "model.transformer_impl=local", TP2, SP),
    "expert_bias_tp2": (*TWO_GPUS, "recipe=gpt_oss/tiny", TP2, SP),
    "expert_bias_tp2_etp1": (*TWO_GPUS, "recipe=gpt_oss/tiny", TP2, SP, "model.expert_tensor_parallel_size=1"),
    "overlap_param_gather_without_distributed_optimizer": (*TWO_GPUS, *DP2, "ddp.overlap_grad_reduce=true",
                                                           "ddp.overlap_param_gather=true"),
    "overlap_param_gather_distributed_optimizer": (*TWO_GPUS, *DP2, "ddp.overlap_grad_reduce=true",
                                                   "ddp.overlap_param_gather=true", "ddp.use_distributed_optimizer=true"),
    **{f"deepseek_v3_gb200_recompute_{graph}": (*TWO_GPUS, "recipe=deepseek/tiny", "model.expert_model_parallel_size=2",
                                                "train.global_batch_size=4", ALLTOALL, *DROP_AND_PAD, SELECTIVE,
                                                "model.recompute_modules=[mla_up_proj]", *overrides)
       for graph, overrides in (("attn_router_preprocess", ("cuda_graph=te_attn_moe_router",
                                                              "model.cuda_graph_modules=[attn,moe_router,moe_preprocess]")),
                                ("attn", ("cuda_graph=te_attn",)))},
    # The two-GPU differential at b15bb2a: local per-layer graphs under PP2 failed capture on 0.19.2 with four
    # micro-batches (runs 99 and 311, a bare AssertionError) and trained with one (run 353); and GPT-OSS at CP2 found
    # no Transformer Engine attention backend (0.16.1 run 101, 0.19.2 run 116): its sinks, or its sliding window?
    **{f"local_layer_pp2_{count}_microbatches": (*TWO_GPUS, "recipe=llama/tiny", "cuda_graph=local_layer",
                                                 "model.pipeline_model_parallel_size=2", "train.micro_batch_size=1",
                                                 f"train.global_batch_size={count}") for count in (1, 2, 4)},
    "gpt_oss_cp2": (*TWO_GPUS, "recipe=gpt_oss/tiny", CP2),
    "gpt_oss_cp2_without_sinks": (*TWO_GPUS, "recipe=gpt_oss/tiny", CP2, "model.softmax_type=vanilla"),
    "gpt_oss_cp2_without_window": (*TWO_GPUS, "recipe=gpt_oss/tiny", CP2, "model.window_size=null"),
    # Answered at 5bba762 on four H100s, a pair a release (gpu_differential_2gpu_5bba762.json.gz): the GB200 DeepSeek
    # presets' shipped shape (router and preprocessing graphed, attention eager with mla_up_proj recomputed) trains,
    # and attention graphs with that recompute at four micro-batches abort (mla_recompute_in_layer_graphs stays).
    # Still open: the b15bb2a run that timed out under load (0.16.1 run 320), alone.
    "deepseek_v3_gb200_shipped": (*TWO_GPUS, "recipe=deepseek/tiny", "model.expert_model_parallel_size=2",
                                  "train.global_batch_size=4", ALLTOALL, *DROP_AND_PAD, SELECTIVE,
                                  "model.recompute_modules=[mla_up_proj]", "cuda_graph=te_moe_router",
                                  "model.cuda_graph_modules=[moe_router,moe_preprocess]"),
    "mla_up_proj_recompute_attn_four_microbatches": (*TWO_GPUS, "recipe=deepseek/tiny",
                                                     "model.expert_model_parallel_size=2", "train.micro_batch_size=1",
                                                     "train.global_batch_size=8", ALLTOALL, *DROP_AND_PAD, SELECTIVE,
                                                     "model.recompute_modules=[mla_up_proj]", "cuda_graph=te_attn"),
    # The MTP block on a pipeline stage of its own, as DeepSeek-V3's H100 preset lays it out ("...|mL"): the engine
    # gives it the model's last decoder layer since the CPU build of that preset failed there.
    "mtp_stage_of_its_own": (*TWO_GPUS, "recipe=deepseek/tiny", "model.pipeline_model_parallel_size=2",
                             "model.pipeline_model_parallel_layout='Et*4|mL'", "train.global_batch_size=4"),
    "timeout_b15bb2a_320": (*TWO_GPUS, "recipe=deepseek/tiny", "cuda_graph=te_mlp", "precision=fp8_cs", ALLTOALL,
                            "model.moe_grouped_gemm=true", "model.moe_router_fusion=true", "train.micro_batch_size=1",
                            "train.global_batch_size=2", "model.cuda_graph_use_single_mempool=true",
                            "model.pipeline_model_parallel_size=2"),
    # 4ebf167's five hangs: a pipeline rank with no layer of the TE scope (deepseek/tiny's one dense layer sits on the
    # first stage) now meets the other rank's capture instead of refusing to build graphs. With and without VPP, and a
    # layout stage of the embedding alone (no layer at all there).
    **{f"te_mlp_pp2_moe_stage{vpp}": (*TWO_GPUS, "recipe=deepseek/tiny", "cuda_graph=te_mlp",
                                      "model.pipeline_model_parallel_size=2", "train.micro_batch_size=1",
                                      "train.global_batch_size=2", *overrides)
       for vpp, overrides in (("", ()), ("_vpp", ("model.virtual_pipeline_model_parallel_size=2",)))},
    # Block-scaled fp8 gathered by sequence parallelism (block_scaled_gather_shapes, witness 0.19.2 run 541 of
    # c236fc3): deepseek/tiny's MLA ranks (64, 32) beside ranks of whole 128-blocks.
    **{f"block_scaled_gather_mla_ranks_{ranks}": (*TWO_GPUS, "recipe=deepseek/tiny", "precision=fp8_sc", TP2, SP,
                                                  *overrides)
       for ranks, overrides in (("64_32", ()), ("128", ("model.q_lora_rank=128", "model.kv_lora_rank=128")))},
    # Transformer Engine's graphs on the local spec at two GPUs: they completed at cfa782d, before the engine replayed
    # the causal mask; at one GPU they equal eager since (6e4647f).
    **{f"te_graphs_local_spec_te_layer_{name}": (*TWO_GPUS, "recipe=llama/tiny", "cuda_graph=te_layer",
                                                 "model.transformer_impl=local", *layout)
       for name, layout in (("tp2", (TP2,)), ("pp2", ("model.pipeline_model_parallel_size=2",
                                                       "train.global_batch_size=4")))},
    # Packed sequences (packing_rules.py, packed_sequence_scope, static_shapes): what each rule refuses beside its
    # control, which the catalogue accepts. megatron-core's thd attention squeezes the batch dimension (micro-batch
    # 2), the local spec's attention asserts no packed parameters; graphs that hold attention, or a whole layer or
    # step, would capture the packed parameters of one micro-batch; unpadded rows change shape from step to step.
    "packed_micro_batch_2": (*PACKED, "cuda_graph=none", "train.micro_batch_size=2", "train.global_batch_size=4"),
    "packed_local_spec": (*PACKED, *ONE_ROW_A_MICRO_BATCH, "cuda_graph=none", "model.transformer_impl=local"),
    **{f"packed_{graph}": (*PACKED, *ONE_ROW_A_MICRO_BATCH, f"cuda_graph={graph}")
       for graph in ("none", "te_mlp", "te_attn", "te_layer", "local_layer", "full_iteration")},
    "packed_unpadded_te_mlp": (*PACKED, *ONE_ROW_A_MICRO_BATCH, "cuda_graph=te_mlp", "dataset.pad_to_max_length=false"),
    "packed_unpadded_eager": (*PACKED, *ONE_ROW_A_MICRO_BATCH, "cuda_graph=none", "dataset.pad_to_max_length=false"),
    "packed_cp2": (*TWO_GPUS, *PACKED, *ONE_ROW_A_MICRO_BATCH, "cuda_graph=none", CP2),
    **{f"packed_{name}_pp2": (*TWO_GPUS, *PACKED, "cuda_graph=none", "model.pipeline_model_parallel_size=2",
                              "train.micro_batch_size=1", "train.global_batch_size=4",
                              f"dataset.pad_to_max_length={padded}")
       for name, padded in (("unpadded", "false"), ("padded", "true"))},
    # Megatron-FSDP (fsdp_rules.py; first runs in h100/megatron_fsdp_probe_83411eb.log): each graph mechanism and
    # the plain optimizer, refused, beside eager; the lighter sharding strategies and the fused weight-gradient
    # accumulation Bridge turns off with FSDP, which the catalogue accepts and no GPU has trained yet.
    **{f"fsdp_{graph}": (*FSDP_TINY, f"cuda_graph={graph}")
       for graph in ("none", "te_mlp", "local_layer", "full_iteration")},
    "fsdp_without_distributed_optimizer": (*FSDP_TINY[:-1], "ddp.use_distributed_optimizer=false", "cuda_graph=none"),
    **{f"fsdp_{strategy}": (*FSDP_TINY, "cuda_graph=none", f"ddp.data_parallel_sharding_strategy={strategy}")
       for strategy in ("no_shard", "optim", "optim_grads")},
    "fsdp_gradient_accumulation_fusion": (*FSDP_TINY, "cuda_graph=none", "model.gradient_accumulation_fusion=true"),
    "te_attn_embedding_stage": (*TWO_GPUS, "recipe=llama/tiny", "cuda_graph=te_attn",
                                "model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout='E|t*8L'",
                                "train.global_batch_size=4"),
}


def gpus_of(overrides) -> int:
    """The GPUs a case trains on: its `train.num_gpus`, 1 when unset."""
    return next((int(item.split("=", 1)[1]) for item in overrides if item.startswith("train.num_gpus=")), 1)
