"""The differential of graphbridge's catalogue against megatron-core itself, on the CPU.

Seeded random configs over the CUDA-graph surface and what it meets (MoE routing and dispatch,
recompute, dropout, offloading, EP overlap, delayed wgrad, fp8, MLA, TP, biases) are judged twice:

- by graphbridge: the whole catalogue for a target that trains on megatron-core here (one GPU
  machine with this process's megatron-core and Transformer Engine, or none);
- by megatron-core: ``build_megatron_configs`` (TransformerConfig's checks), then, when every
  parallel size is 1 and nothing needs a package this machine lacks, the GPTModel itself with the
  local layer spec on the CPU (the layers', MoE layer's and token dispatcher's own assertions).

Each config lands in one class: both accept, both refuse, graphbridge alone refuses (a documented
rule of ours: graphs, engines, measured GPU failures) or megatron-core alone refuses (a bug: a rule
is missing). Run it in its own process (megatron-core keeps global state):

    python -m tests.differential --seed 0 --count 100 [--json]

GRAPHBRIDGE_MEGATRON_CORE_PATH=<site dirs> puts another megatron-core install first on the path
(e.g. megatron-core 0.19.2: /tmp/mc19/site:/tmp/mc19/tsite); the target then speaks that version.
"""

import argparse
import json
import os
import random
import sys
import warnings
from collections import Counter
from typing import Dict, List, Optional, Tuple

if os.environ.get("GRAPHBRIDGE_MEGATRON_CORE_PATH"):
    sys.path[:0] = os.environ["GRAPHBRIDGE_MEGATRON_CORE_PATH"].split(os.pathsep)

BOTH_ACCEPT, BOTH_REFUSE, OURS_ONLY, MEGATRON_ONLY = "both accept", "both refuse", "graphbridge refuses", \
    "megatron-core refuses"
MEGATRON_REFUSALS = (AssertionError, ValueError, KeyError, NotImplementedError, TypeError, RuntimeError, ImportError,
                     AttributeError)
"""What megatron-core raises on a config it will not build (TypeError and AttributeError are its crashes on
inputs it never expected: still a refusal the user would meet at model build)."""


def random_config(rng: random.Random) -> Dict[str, object]:
    """Dotted keys of one random config (judged on top of a small llama-like default)."""
    changes: Dict[str, object] = {"model.num_layers": 2, "model.hidden_size": 64, "model.num_attention_heads": 4,
                                  "model.vocab_size": 256, "dataset.seq_length": 32, "train.train_iters": 20,
                                  "model.seq_length": 32}
    impl = rng.choice(["none", "local", "transformer_engine", "full_iteration"])
    changes["model.cuda_graph_impl"] = impl
    changes["model.cuda_graph_modules"] = rng.sample(["attn", "mlp", "moe", "moe_router", "moe_preprocess"],
                                                     rng.choice([0, 0, 1, 1, 2, 3]))
    if rng.random() < 0.6:
        changes.update(moe(rng))
    changes.update(recompute(rng))
    changes.update(parallel_and_precision(rng, "model.num_moe_experts" in changes))
    if rng.random() < 0.1:
        changes["model.cpu_offloading"] = True
        changes["model.cpu_offloading_num_layers"] = 1
    if rng.random() < 0.15:
        changes.update({"model.multi_latent_attention": True, "model.q_lora_rank": rng.choice([None, 32]),
                        "model.kv_lora_rank": 32, "model.qk_head_dim": 16, "model.qk_pos_emb_head_dim": 8,
                        "model.v_head_dim": 16})
    for key in ("model.attention_dropout", "model.hidden_dropout"):
        if rng.random() < 0.2:
            changes[key] = 0.1
    for key in ("model.cross_entropy_loss_fusion", "model.bias_dropout_fusion", "model.masked_softmax_fusion",
                "model.persist_layer_norm"):
        if rng.random() < 0.2:
            changes[key] = True
    if rng.random() < 0.2:
        changes["model.cross_entropy_fusion_impl"] = "te"
    if rng.random() < 0.1:  # GPT-OSS's biases: megatron-core refuses them in shared experts at model build
        changes["model.add_bias_linear"] = True
    return changes


def moe(rng: random.Random) -> Dict[str, object]:
    changes = {"model.num_moe_experts": 4, "model.moe_ffn_hidden_size": 32, "model.moe_router_topk": rng.choice([1, 2]),
               "model.moe_layer_freq": rng.choice([1, 1, [0, 1]]),
               "model.moe_token_dispatcher_type": rng.choice(["allgather", "alltoall", "flex"]),
               "model.moe_grouped_gemm": rng.random() < 0.3}
    if changes["model.moe_token_dispatcher_type"] == "flex":
        changes["model.moe_flex_dispatcher_backend"] = rng.choice(["deepep", "hybridep"])
    if rng.random() < 0.4:
        changes["model.moe_expert_capacity_factor"] = 1.0
        changes["model.moe_pad_expert_input_to_capacity"] = rng.random() < 0.6
    elif rng.random() < 0.1:
        changes["model.moe_pad_expert_input_to_capacity"] = True
    if rng.random() < 0.2:
        changes["model.moe_router_padding_for_fp8"] = True
    if rng.random() < 0.3:
        changes["model.moe_shared_expert_intermediate_size"] = 32
        changes["model.moe_shared_expert_overlap"] = rng.random() < 0.5
    if rng.random() < 0.1:
        changes["model.moe_input_jitter_eps"] = 0.01
    if rng.random() < 0.1:
        changes["model.moe_permute_fusion"] = True
    return changes


def recompute(rng: random.Random) -> Dict[str, object]:
    granularity = rng.choice([None, None, "selective", "full"])
    if granularity is None:
        return {}
    if granularity == "full":
        return {"model.recompute_granularity": "full", "model.recompute_method": rng.choice(["uniform", "block"]),
                "model.recompute_num_layers": 1}
    modules = rng.sample(["core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts"],
                         rng.randint(1, 2))
    return {"model.recompute_granularity": "selective", "model.recompute_modules": modules}


def parallel_and_precision(rng: random.Random, is_moe: bool) -> Dict[str, object]:
    changes: Dict[str, object] = {}
    if is_moe and rng.random() < 0.3:
        changes.update({"model.expert_model_parallel_size": 2, "train.num_gpus": 2, "train.global_batch_size": 2})
        if rng.random() < 0.4:
            changes["model.overlap_moe_expert_parallel_comm"] = True
            changes["model.delay_wgrad_compute"] = rng.random() < 0.5
            changes["model.moe_use_legacy_grouped_gemm"] = rng.random() < 0.2
    elif rng.random() < 0.15:
        changes.update({"model.tensor_model_parallel_size": 2, "model.sequence_parallel": True, "train.num_gpus": 2,
                        "train.global_batch_size": 1})
    if rng.random() < 0.1:
        changes["model.fp8"] = "e4m3"
    return changes


def graphbridge_verdict(changes: Dict[str, object]) -> Tuple[Optional[object], List[str]]:
    """(the finished config or None, the rules that refuse it)."""
    from bridge.config.schema import GraphBridgeConfig
    from bridge.machine import GPU, probe
    from bridge.prepare import resolve
    from bridge.validation import resolve_target, validate

    cfg = GraphBridgeConfig()
    for key, value in changes.items():
        section, name = key.split(".")
        setattr(getattr(cfg, section), name, value)
    finished = resolve(cfg)
    here = probe()
    # A machine with GPUs and this process's packages: the engine is megatron, and what needs a package
    # this machine lacks (Transformer Engine) is refused by the machine rules, as megatron-core refuses it.
    machine = type(here)(gpus=(GPU("a GPU", (9, 0)),) * 8, packages=here.packages)
    return finished, sorted({v.rule for v in validate(finished, resolve_target(finished, machine))})


def megatron_verdict(cfg) -> Optional[str]:
    """None when megatron-core builds it, else the exception's type and first line."""
    from bridge.translate import build_megatron_configs

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            configs = build_megatron_configs(cfg)
            if buildable_here(cfg):
                build_model(configs)
    except MEGATRON_REFUSALS as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
    return None


def buildable_here(cfg) -> bool:
    """A model this one CPU process can build: one rank, nothing that needs a package it lacks (grouped
    GEMM, fp8 and fused permutation kernels) or CUDA at construction (MLA, the alltoall dispatcher's and
    the shared expert overlap's CUDA streams, the RNG tracker of local and full-iteration graphs)."""
    model = cfg.model
    one_rank = all(getattr(model, name) == 1 for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                         "context_parallel_size", "expert_model_parallel_size"))
    impl = str(getattr(model.cuda_graph_impl, "value", model.cuda_graph_impl))
    needs_cuda = (model.multi_latent_attention or model.moe_shared_expert_overlap or impl in ("local", "full_iteration")
                  or (model.num_moe_experts and model.moe_token_dispatcher_type == "alltoall"))
    return one_rank and not (model.moe_grouped_gemm or model.fp8 or model.moe_permute_fusion or needs_cuda)


def build_model(configs) -> None:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    config = configs["transformer_config"]
    config.use_cpu_initialization = True
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=config.normalization)
    GPTModel(config=config, transformer_layer_spec=spec, **configs["gpt_model"])


def init_megatron_on_cpu() -> None:
    import torch
    from megatron.core import parallel_state

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()


def classify(ours: List[str], theirs: Optional[str]) -> str:
    if not ours:
        return BOTH_ACCEPT if theirs is None else MEGATRON_ONLY
    return BOTH_REFUSE if theirs is not None else OURS_ONLY


def run(seed: int, count: int) -> List[dict]:
    init_megatron_on_cpu()
    rng = random.Random(seed)
    records = []
    for index in range(count):
        changes = random_config(rng)
        cfg, ours = graphbridge_verdict(changes)
        theirs = megatron_verdict(cfg)
        records.append({"index": index, "class": classify(ours, theirs), "ours": ours, "megatron": theirs,
                        "changes": changes})
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="every record as JSON on stdout")
    args = parser.parse_args()
    records = run(args.seed, args.count)
    if args.json:
        print(json.dumps(records))
        return 0
    counts = Counter(record["class"] for record in records)
    print(", ".join(f"{name}: {counts[name]}" for name in (BOTH_ACCEPT, BOTH_REFUSE, OURS_ONLY, MEGATRON_ONLY)))
    print("graphbridge alone refuses, by rule:", dict(Counter(rule for record in records
                                                             if record["class"] == OURS_ONLY
                                                             for rule in record["ours"])))
    missing = Counter(record["megatron"] for record in records if record["class"] == MEGATRON_ONLY)
    for message, count in missing.most_common():
        example = next(record["changes"] for record in records if record["megatron"] == message)
        print(f"MISSING RULE ({count}x): {message}\n  e.g. {example}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
