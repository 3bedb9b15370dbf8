"""What the benchmark suite measures: each workload's shared overrides and its variants (benchmarks/suite.py runs
them). A workload is one model shape on one layout; its variants differ in the graph choice alone, so that
their ratios to the eager variant are what the graphs buy."""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

EAGER = "eager"
RECIPE_DEFAULT = "recipe_default"
"""The variant without a cuda_graph override: what the recipe's preset for the GPU graphs (for Qwen3-30B-A3B
on an H100, Transformer Engine graphs of moe_router and moe_preprocess)."""
FULL_ITERATION_WITH_OPTIMIZER = ("cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true")
AUTO = "auto"
"""The variant that measures the graph choices itself (cuda_graph=auto): its row says what it chose, the probe's
wall time (none when the decision came from the cache) and how its step time compares with the best other
variant of the same run."""
DISTRIBUTED_OPTIMIZER_PROXY = "qwen3_moe_distributed_optimizer"


@dataclass(frozen=True)
class Workload:
    description: str
    base: Tuple[str, ...]
    variants: Dict[str, Tuple[str, ...]]
    gpus: int = 1
    megatron_core: Optional[str] = None
    """The megatron-core releases it measures (a range, bridge.config.releases.in_range); None: all."""


ONE_GPU = ("train.num_gpus=1", "workload.preset_num_gpus=1", "model.tensor_model_parallel_size=1",
           "model.pipeline_model_parallel_size=1", "model.virtual_pipeline_model_parallel_size=null",
           "model.context_parallel_size=1", "model.sequence_parallel=false", "model.pipeline_model_parallel_layout=null")
"""A preset's layout brought to one GPU (its widths and sequence stay)."""


def moe_proxy(recipe: str, gpu: str, *extra: str, experts: Optional[int] = None) -> Tuple[str, ...]:
    """A MoE recipe's layer shapes on one GPU: two layers, one expert-parallel rank, the alltoall dispatcher
    (flex needs TP x EP > 1), four micro-batches per step, no distributed optimizer unless ``extra`` turns it
    back on (one rank has nothing to shard it over, and before megatron-core 0.19 the in-graph optimizer step
    needs it off)."""
    shrink = ("model.num_layers=2", "train.num_gpus=1", "workload.preset_num_gpus=1", "ddp.use_distributed_optimizer=false",
              "model.expert_model_parallel_size=1", "model.tensor_model_parallel_size=1",
              "model.pipeline_model_parallel_size=1", "model.virtual_pipeline_model_parallel_size=null",
              "model.context_parallel_size=1", "model.sequence_parallel=false",
              "model.pipeline_model_parallel_layout=null", "model.moe_token_dispatcher_type=alltoall",
              "model.moe_flex_dispatcher_backend=null", "train.micro_batch_size=1", "train.global_batch_size=4")
    experts_override = (f"model.num_moe_experts={experts}",) if experts else ()
    return (f"recipe={recipe}", f"gpu={gpu}", "precision=bf16", *shrink, *experts_override, *extra)


DROP_AND_PAD = ("model.moe_expert_capacity_factor=1.0", "model.moe_pad_expert_input_to_capacity=true",
                "model.moe_router_force_load_balancing=false")
EP2 = ("train.num_gpus=2", "model.expert_model_parallel_size=2", "train.global_batch_size=8")
"""Two expert-parallel ranks, which are data parallel for the rest: four micro-batches a rank, as on one GPU."""
WORKLOADS: Dict[str, Workload] = {
    "llama_tiny_local": Workload(
        "llama/tiny (8 layers, hidden 512, seq 256), megatron-core's local layer spec",
        ("recipe=llama/tiny", "model.transformer_impl=local"),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "local_layer": ("cuda_graph=local_layer",),
         AUTO: ("cuda_graph=auto",)}),
    "llama_tiny_te": Workload(
        "llama/tiny, Transformer Engine layer spec",
        ("recipe=llama/tiny",),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "te_layer": ("cuda_graph=te_layer",),
         "te_attn_mlp": ("cuda_graph=te_attn_mlp",), "te_attn": ("cuda_graph=te_attn",), AUTO: ("cuda_graph=auto",)}),
    "llama32_1b": Workload(
        "llama/llama32_1b as shipped (16 layers, hidden 2048, seq 8192)",
        ("recipe=llama/llama32_1b",),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "te_mlp": ("cuda_graph=te_mlp",), AUTO: ("cuda_graph=auto",)}),  # te_mlp: Bridge's H100 Llama3 scope
    "llama_tiny_lora": Workload(
        "llama/tiny_lora: rank-32 adapters on every attention and MLP linear layer of llama/tiny, the rest frozen",
        ("recipe=llama/tiny_lora",),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "local_layer": ("cuda_graph=local_layer",), "te_attn_mlp": ("cuda_graph=te_attn_mlp",),
         AUTO: ("cuda_graph=auto",)}),
    "llama_tiny_packed": Workload(
        "llama/tiny as Bridge's packed SFT: several samples packed into each 256-token row (padded), one row a "
        "micro-batch, two a step; attention takes megatron-core's packed-sequence parameters",
        ("recipe=llama/tiny", "dataset.packed_sequence=true", "train.micro_batch_size=1", "workload.task=sft"),
        # packed attention stays out of graphs (packed_sequence_scope): te_mlp is the scope Bridge's SFT presets use
        {EAGER: ("cuda_graph=none",), "te_mlp": ("cuda_graph=te_mlp",), AUTO: ("cuda_graph=auto",)}),
    "llama3_70b_lora": Workload(
        "llama/llama3_70b_lora's H100 preset at one GPU: Llama 3 70B's widths, 2 layers, Bridge's rank-16 adapters "
        "on linear_qkv, without the preset's full recompute (two layers fit without it)",
        ("recipe=llama/llama3_70b_lora", "gpu=h100", *ONE_GPU, "model.num_layers=2", "train.micro_batch_size=1",
         "train.global_batch_size=2", "model.recompute_granularity=null", "model.recompute_method=null",
         "model.recompute_num_layers=null"),
        # Bridge's LoRA recipe packs sequences, so graphs may not hold attention (packed_sequence_scope): te_mlp
        {EAGER: ("cuda_graph=none",), "te_mlp": ("cuda_graph=te_mlp",)}),
    "llama_tiny_fsdp": Workload(
        "llama/tiny with Megatron-FSDP (weights, gradients and Adam state sharded; one rank here) beside DDP with the "
        "distributed optimizer; graphs are refused with FSDP (megatron_fsdp_graphs)",
        ("recipe=llama/tiny", "ddp.use_distributed_optimizer=true", "cuda_graph=none"),
        {EAGER: ("ddp.use_megatron_fsdp=true",), "ddp": ("ddp.use_megatron_fsdp=false",)}),
    "llama3_70b_gb200_fsdp": Workload(
        "llama/llama3_70b's GB200 BF16 preset at one GPU: Llama 3 70B's layer widths, 2 layers, a 32k vocabulary (one "
        "GPU holds all of the Adam state: ~51 GiB planned), Megatron-FSDP as Bridge runs it and one layer's "
        "activations offloaded to the host (the preset offloads 20 of 80)",
        ("recipe=llama/llama3_70b", "gpu=gb200", "precision=bf16", *ONE_GPU, "model.num_layers=2",
         "model.vocab_size=32000", "model.cpu_offloading_num_layers=1", "train.micro_batch_size=1",
         "train.global_batch_size=2"),
        {EAGER: ()}),
    "qwen3_moe_dropless": Workload(
        "Qwen3-30B-A3B layer shapes, 2 layers, 1 GPU, dropless alltoall",
        moe_proxy("qwen/qwen3_30b_a3b", "h100"),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), "te_moe_router": ("cuda_graph=te_moe_router",),
         AUTO: ("cuda_graph=auto",)}),
    "qwen3_moe_drop_and_pad": Workload(
        "the same with drop-and-pad routing (capacity factor 1.0)",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "te_attn_moe_router":
         ("cuda_graph=te_attn_moe_router",), AUTO: ("cuda_graph=auto",)}),
    DISTRIBUTED_OPTIMIZER_PROXY: Workload(
        "the drop-and-pad proxy with the distributed optimizer, as every Bridge perf preset trains; in the graph, "
        "megatron-core's own optimizer graph",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD, "ddp.use_distributed_optimizer=true"),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, AUTO: ("cuda_graph=auto",)},
        megatron_core=">=0.19"),  # auto: on 0.19 its candidates hold megatron-core's optimizer graph (issue 39's row)
    "qwen3_moe_ep2": Workload(
        "Qwen3-30B-A3B layer shapes, 2 layers, EP=2 over two GPUs (real all-to-all), dropless",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *EP2),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), "te_moe_router": ("cuda_graph=te_moe_router",),
         AUTO: ("cuda_graph=auto",)}, gpus=2),
    "qwen3_moe_ep2_drop_and_pad": Workload(
        "the EP=2 proxy with drop-and-pad routing (capacity factor 1.0): every graph choice it takes",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD, *EP2),
        {EAGER: ("cuda_graph=none",), RECIPE_DEFAULT: (), "full_iteration": ("cuda_graph=full_iteration",),
         "te_layer": ("cuda_graph=te_layer",), "te_moe": ("cuda_graph=te_moe",), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), "te_moe_router": ("cuda_graph=te_moe_router",),
         "local_layer": ("cuda_graph=local_layer",), AUTO: ("cuda_graph=auto",)}, gpus=2),
    "qwen3_moe_ep2_distributed_optimizer": Workload(
        "the EP=2 drop-and-pad proxy with the distributed optimizer sharded over both GPUs; in the graph, "
        "megatron-core's own optimizer graph",
        moe_proxy("qwen/qwen3_30b_a3b", "h100", *DROP_AND_PAD, "ddp.use_distributed_optimizer=true", *EP2),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER,
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",), AUTO: ("cuda_graph=auto",)},
        gpus=2, megatron_core=">=0.19"),
    "llama_tiny_dp2": Workload(
        "llama/tiny at data parallel 2 (Transformer Engine spec, gradients all-reduced)",
        ("recipe=llama/tiny", "train.num_gpus=2", "train.global_batch_size=4"),
        {EAGER: ("cuda_graph=none",), "full_iteration": ("cuda_graph=full_iteration",),
         "full_iteration+optimizer": FULL_ITERATION_WITH_OPTIMIZER, "te_layer": ("cuda_graph=te_layer",),
         "te_attn_mlp": ("cuda_graph=te_attn_mlp",), "te_attn": ("cuda_graph=te_attn",),
         "local_layer": ("cuda_graph=local_layer",), AUTO: ("cuda_graph=auto",)}, gpus=2),
    "gpt_oss_moe": Workload(
        "GPT-OSS-20B layer shapes (32 experts), 2 layers, 1 GPU",
        moe_proxy("gpt_oss/gpt_oss_20b", "h100"),
        {EAGER: ("cuda_graph=none",), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",)}),
    "deepseek_mla_moe": Workload(
        "DeepSeek-V3 layer shapes (MLA, a dense then a MoE layer, 16 of 256 experts), 1 GPU",
        moe_proxy("deepseek/deepseek_v3", "h100", "model.moe_layer_freq=[0,1]", "model.mtp_num_layers=null",
                  "model.recompute_granularity=null", "model.recompute_modules=null",
                  # the preset's expandable segments need NCCL_GRAPH_REGISTER=0; with 32 experts the weights and
                  # Adam state alone plan 76 GiB, more than an H100 (the run ran out of memory at step 0)
                  "+env_vars.NCCL_GRAPH_REGISTER=0", experts=16),
        {EAGER: ("cuda_graph=none",), "te_attn": ("cuda_graph=te_attn",),
         "te_attn_moe_router": ("cuda_graph=te_attn_moe_router",)}),
}
