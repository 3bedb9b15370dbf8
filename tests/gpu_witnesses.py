"""The GPU witness of each rule that refuses on GPU grounds: the run of a GPU differential record
(benchmarks/results/) that failed as the rule says. tests/test_rules.py checks each against its record."""

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from bridge.machine import GPU, Machine
from tests.rule_cases import H100

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def read_record(record: str) -> dict:
    """A committed GPU record by its path under benchmarks/results/. A record that a newer one replaced is kept
    gzipped (`<name>_<commit>.json.gz`): a GPU call carries the tree, and the old records were 29 of its 49 MB."""
    path = RESULTS / record
    return json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())


@dataclass(frozen=True)
class GpuWitness:
    """The GPU run that justified a rule refusing on GPU grounds: a record of the GPU differential under
    benchmarks/results/ (its command, GPU and versions in its summary), the run's index in it, and a fragment
    of the error the run ended with."""

    record: str
    run: int
    error: str


FIRST_DIFFERENTIAL = "h100/mcore-0.16.1/gpu_differential_610e521.json.gz"
ON_0161 = "h100/mcore-0.16.1/gpu_differential.json"
ON_0192 = "h100/mcore-0.19.2/gpu_differential.json"
LAZY_NCCL_0161 = "h100/mcore-0.16.1/gpu_differential_91c0f81.json.gz"
TWO_GPUS_0161 = "h100/mcore-0.16.1/gpu_differential_e15f81f.json.gz"
"""(Two one-GPU differentials side by side on a two-GPU machine; each run had one GPU.)"""
TWO_GPU_RUNS_0161 = "h200/mcore-0.16.1/gpu_differential_2gpu_b15bb2a.json.gz"
WITNESSES_2GPU_0161 = "h200/mcore-0.16.1/gpu_witnesses_2gpu_cfa782d.json"
WITNESSES_2GPU_0192 = "h200/mcore-0.19.2/gpu_witnesses_2gpu_cfa782d.json"
TWO_GPU_RUNS_0192 = "h200/mcore-0.19.2/gpu_differential_2gpu_4ebf167.json.gz"
H200_0161 = "h200/mcore-0.16.1/gpu_differential_24488cb.json.gz"
"""Runs of two GPUs each (num_gpus 2 in their summaries), on two H200s."""
H200_F0650F3_0161 = "h200/mcore-0.16.1/gpu_differential_f0650f3.json.gz"
"""The one-GPU differential at f0650f3 (seed 11), before the rule it witnesses."""
TWO_GPU_RUNS_6C7A53D_0161 = "h200/mcore-0.16.1/gpu_differential_2gpu.json"
"""The two-GPU differential at 6c7a53d (seed 33), before the rule it witnesses; gpu_differential_2gpu_6c7a53d.json.gz
once the next two-GPU record takes the plain name."""
H200_0DCDB17_0161 = "h200/mcore-0.16.1/gpu_differential_0dcdb17.json.gz"
"""The one-GPU differential at 0dcdb17 (seed 15), whose witness cases found the rule it witnesses."""
SCHEMA_DRAW_0192 = "h200/mcore-0.19.2/gpu_differential_schema_9901178.json"
"""The first one-GPU differential with the schema-wide draw (issue 79), at 9901178 on an H200."""
SCHEMA_DRAW_E6AA918_0161 = "h100/mcore-0.16.1/gpu_differential_schema_e6aa918.json"
"""The second one-GPU differential with the schema-wide draw (seed 80), at e6aa918 on an H100."""
SCHEMA_DRAW_B0CCB80_0161 = "h100/mcore-0.16.1/gpu_differential_schema_b0ccb80.json"
SCHEMA_DRAW_B0CCB80_0192 = "h100/mcore-0.19.2/gpu_differential_schema_b0ccb80.json"
"""The third one-GPU differential with the schema-wide draw (seed 81), at b0ccb80 on an H100."""
PACKED_0161 = "h100/mcore-0.16.1/gpu_witnesses.json"
PACKED_0192 = "h100/mcore-0.19.2/gpu_witnesses.json"
"""The packed-sequence witness cases at eae46ab on an H100 (benchmarks/differential_witnesses.py, packed_*)."""
GPU_WITNESSES = {
    "mla_query_groups": GpuWitness(SCHEMA_DRAW_0192, 1700, "Keys and values must have num_gqa_group = 2 heads"),
    "quantized_gemm_widths": GpuWitness(SCHEMA_DRAW_0192, 7, "Leading dimension requirement on A for FP8 GEMM"),
    "te_graphs_bf16_params": GpuWitness(SCHEMA_DRAW_0192, 645, "Data types for parameters must match"),
    "single_token_attention": GpuWitness(SCHEMA_DRAW_0192, 555, "s_q = s_kv = 1 is not supported"),
    "yarn_betas": GpuWitness(SCHEMA_DRAW_E6AA918_0161, 1415, "float division by zero when instantiating MLASelf"),
    "router_topk_experts": GpuWitness(SCHEMA_DRAW_B0CCB80_0192, 843, "selected index k out of range"),
    "cpu_offloading_sequential_experts": GpuWitness(SCHEMA_DRAW_B0CCB80_0161, 184, "cannot pickle 'Stream' object"),
    "allgather_dispatch_capture": GpuWitness(ON_0161, 706, "Cannot copy between CPU and CUDA tensors during CUDA graph"),
    "dropless_permute_capture": GpuWitness(ON_0161, 709, "cudaErrorStreamCaptureUnsupported"),
    "recompute_in_layer_graphs": GpuWitness(ON_0161, 702, "Checkpointing is not compatible with .grad()"),
    "recompute_quantized_in_layer_graphs": GpuWitness(ON_0192, 704, "Checkpointing is not compatible with .grad()"),
    "te_rng_tracker": GpuWitness(ON_0192, 711, "Unsupported RNG states tracker"),
    "mla_recompute_in_layer_graphs": GpuWitness(ON_0192, 229, "cudaErrorIllegalAddress"),
    "router_fp64_graphs": GpuWitness(ON_0192, 201, "Could not infer dtype of _WeakRefTensor"),
    "router_fusion_fp64": GpuWitness(LAZY_NCCL_0161, 344, "does not support float64 router type"),
    "router_padding_saved_map": GpuWitness(TWO_GPUS_0161, 348, "modified by an inplace operation"),
    "moe_norm_recompute_in_layer_graphs": GpuWitness(TWO_GPUS_0161, 1055, "cudaErrorIllegalAddress"),
    "grouped_gemm_package": GpuWitness(TWO_GPUS_0161, 1258, "Grouped GEMM is not available"),
    "retained_backward_compiled_fusion": GpuWitness(ON_0192, 97, "non-empty donated buffers"),
    "quantized_precision_gpu": GpuWitness(FIRST_DIFFERENTIAL, 600, "compute capability 10.0 or higher required for MXFP8"),
    "shared_expert_bias": GpuWitness(FIRST_DIFFERENTIAL, 615, "bias is not supported in the shared experts"),
    "mla_needs_te_spec": GpuWitness(FIRST_DIFFERENTIAL, 354, "unexpected keyword argument 'k_channels'"),
    "compiled_kernels": GpuWitness(FIRST_DIFFERENTIAL, 35, "fused_weight_gradient_mlp_cuda module is not found"),
    "moe_tensor_parallel_needs_sequence_parallel": GpuWitness(WITNESSES_2GPU_0161, 0, "MoE and tensor parallelism"),
    "torch_norm": GpuWitness(WITNESSES_2GPU_0192, 2, "sequence parallel not supported by torch LayerNorm"),
    "expert_bias_tensor_parallel": GpuWitness(WITNESSES_2GPU_0161, 3, "Bias in Moe is only supported when ETP==1"),
    "overlap_param_gather": GpuWitness(WITNESSES_2GPU_0192, 5, "'NoneType' object is not iterable"),
    "local_graphs_pipeline_microbatches": GpuWitness(WITNESSES_2GPU_0192, 11, "CudaGraphManager"),
    "context_parallel_attention_variants": GpuWitness(WITNESSES_2GPU_0161, 13,
                                                      "does not support sliding window attention"),
    "context_parallel_local_attention": GpuWitness(TWO_GPU_RUNS_0161, 367, "only supported by TEDotProductAttention"),
    "virtual_pipeline_microbatches": GpuWitness(TWO_GPU_RUNS_0161, 102, "contiguous micro-batches"),
    "quantized_experts_fp64_probs": GpuWitness(TWO_GPU_RUNS_0192, 944, "GetTransformerEngineDType: Invalid type"),
    "fused_quick_geglu_capture": GpuWitness(H200_0161, 63, "Cannot copy between CPU and CUDA tensors"),
    "quantized_norm_recompute_local_spec": GpuWitness(H200_0161, 295, "set_save_original_input"),
    "local_spec_norm_recompute_in_te_graphs": GpuWitness(H200_F0650F3_0161, 1068, "cudaErrorIllegalAddress"),
    "local_spec_attention_dropout_in_te_graphs": GpuWitness(TWO_GPU_RUNS_6C7A53D_0161, 594,
                                                            "CUDA generator not in capture mode"),
    "local_spec_forced_balance_in_te_graphs": GpuWitness(H200_0DCDB17_0161, 1733, "CUDA generator not in capture mode"),
    "packed_sequence_layer_spec": GpuWitness(PACKED_0161, 1, "Packed sequence is not supported by DotProductAttention"),
    "packed_sequence_scope": GpuWitness(PACKED_0192, 4, "CUDA graph accepts only Tensor inputs"),
    "static_shapes": GpuWitness(PACKED_0192, 8, "The size of tensor a (256) must match the size of tensor b (224)"),
}


def record_machine(summary: dict) -> Machine:
    """The machine a GPU differential record ran on, as the catalogue judges it: its GPUs (one H100 for the records
    before the GPU's name was kept), as many as each run had, with the record's megatron-core and Transformer
    Engine."""
    gpu = GPU(summary["gpu"], H100.capability) if summary.get("gpu") else H100
    return Machine(gpus=(gpu,) * summary.get("num_gpus", 1),
                   packages={"torch": "2.11.0", "megatron-core": summary["megatron_core"],
                             "transformer-engine": summary["transformer_engine"]})
