"""What the rule cases are written in and judged by (tests/rule_cases.py, tests/extra_rejects.py): the machines a
case is judged on, the configuration fragments cases combine, the Case itself, and ``build`` and ``fired``, which
set a case's dotted keys on a fresh GraphBridgeConfig and name the rules that reject it on its machine."""

import copy
from dataclasses import dataclass
from typing import Any, Dict, Optional

from omegaconf import OmegaConf

from bridge.config.schema import GraphBridgeConfig
from bridge.machine import GPU, Machine
from bridge.prepare import resolve
from bridge.validation import resolve_target, validate

PACKAGES = {"torch": "2.11.0", "megatron-core": "0.16.1", "transformer-engine": "2.10.0"}
H100 = GPU("NVIDIA H100 80GB HBM3", (9, 0))
ONE_H100 = Machine(gpus=(H100,), packages=PACKAGES)
EIGHT_H100 = Machine(gpus=(H100,) * 8, packages=PACKAGES)
LAPTOP = Machine(gpus=(), packages={"torch": "2.13.0", "megatron-core": "0.16.1", "transformer-engine": None})
NO_TE = Machine(gpus=(H100,), packages={**PACKAGES, "transformer-engine": None})
NO_MEGATRON = Machine(gpus=(H100,), packages={**PACKAGES, "megatron-core": None})
PACKAGES_019 = {"torch": "2.11.0", "megatron-core": "0.19.2", "transformer-engine": "2.20.2"}
ONE_H100_019 = Machine(gpus=(H100,), packages=PACKAGES_019)
ONE_B200 = Machine(gpus=(GPU("NVIDIA B200", (10, 0)),), packages=PACKAGES)
TE_WITHOUT_EXTENSION = Machine(gpus=(H100,), packages={**PACKAGES, "transformer-engine": None,
                                                       "transformer-engine-python": "2.10.0"})
WITH_APEX_KERNELS = Machine(gpus=(H100,), packages={**PACKAGES, "apex-fused-weight-gradient": "unknown",
                                                    "fused-softmax": "unknown"})
WITH_APEX = Machine(gpus=(H100,) * 8, packages={**PACKAGES, "apex": "0.1"})
WITH_GROUPED_GEMM = Machine(gpus=(H100,), packages={**PACKAGES, "grouped-gemm": "1.1.4"})
WITH_NSYS = Machine(gpus=(H100,), packages=PACKAGES, tools={"nsys": "/opt/nvidia/nsight-systems/bin/nsys"})

MOE = {"model.num_moe_experts": 8, "model.moe_router_topk": 2, "model.moe_ffn_hidden_size": 128}
DROP_AND_PAD = {"model.moe_expert_capacity_factor": 1.0, "model.moe_pad_expert_input_to_capacity": True}
EP_OVERLAP = {**MOE, "model.expert_model_parallel_size": 2, "train.num_gpus": 2,
              "model.moe_token_dispatcher_type": "alltoall", "model.overlap_moe_expert_parallel_comm": True}
PP2 = {"model.pipeline_model_parallel_size": 2, "train.num_gpus": 2}
TP2_SP = {"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True, "train.num_gpus": 2}
DP2 = {"train.num_gpus": 2, "train.global_batch_size": 4}
MLA = {"model.multi_latent_attention": True, "model.kv_lora_rank": 32, "model.qk_head_dim": 16,
       "model.qk_pos_emb_head_dim": 8, "model.v_head_dim": 16}
ALLTOALL = {"model.moe_token_dispatcher_type": "alltoall"}
GATED_DELTA_NET = {"model.experimental_attention_variant": "gated_delta_net", "model.linear_attention_freq": 4}
FUSED_QUICK_GEGLU = {"model.activation_func": "quick_gelu", "model.gated_linear_unit": True,
                     "model.bias_activation_fusion": True}
"""GPT-OSS's activation, fused: megatron-core fuses it in MoE experts only."""
SELECTIVE = {"model.recompute_granularity": "selective"}
FULL_RECOMPUTE = {"model.recompute_granularity": "full", "model.recompute_method": "uniform",
                  "model.recompute_num_layers": 1}


def te(*modules: str) -> Dict[str, Any]:
    return {"model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_modules": list(modules)}


def local(*modules: str) -> Dict[str, Any]:
    return {"model.cuda_graph_impl": "local", "model.cuda_graph_modules": list(modules)}


FULL_ITERATION = {"model.cuda_graph_impl": "full_iteration"}
LLAMA_8B = {"model.num_layers": 32, "model.hidden_size": 4096, "model.num_attention_heads": 32,
            "model.ffn_hidden_size": 14336, "dataset.seq_length": 8192}
H100_80GB = Machine(gpus=(GPU("NVIDIA H100 80GB HBM3", (9, 0), 80 * 10**9),), packages=PACKAGES)


@dataclass
class Case:
    changes: Dict[str, Any]
    megatron: bool = False
    machine: Machine = ONE_H100
    processes: Optional[int] = None
    graphs_measured: bool = False
    """Judged as a job of cuda_graph=auto (Target.graphs_measured)."""


SCHEMA = OmegaConf.structured(GraphBridgeConfig)
"""A fresh GraphBridgeConfig as OmegaConf's typed tree, made once a process: converting the dataclass again for
every case took ~35 of build's ~65 ms (the suite builds ~1,400 cases)."""
BUILT: Dict[str, GraphBridgeConfig] = {}
"""repr(case.changes) -> its finished config: test_rules, test_versions, test_fix_follows and megatron_fixture build
the same cases again in one process."""


def build(case: Case) -> GraphBridgeConfig:
    """A fresh GraphBridgeConfig with the case's dotted keys set (OmegaConf checks and converts each value, as it
    would on the dataclass), every interpolation resolved; a copy of its own for each caller, which may change it."""
    key = repr(case.changes)
    if key not in BUILT:
        node = copy.deepcopy(SCHEMA)
        for dotted, value in case.changes.items():
            OmegaConf.update(node, dotted, value, merge=False)
        BUILT[key] = resolve(node)
    return copy.deepcopy(BUILT[key])


def fired(case: Case) -> set:
    """The rules that reject ``case`` on its machine."""
    cfg = build(case)
    target = resolve_target(cfg, case.machine, case.processes, case.graphs_measured)
    return {violation.rule for violation in validate(cfg, target)}
