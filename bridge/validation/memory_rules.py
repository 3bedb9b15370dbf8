"""Rules on memory: a job the plan's estimate (bridge.memory) puts beyond its GPU even if the
estimate were ESTIMATE_ERROR too high cannot fit, and is refused with the changes that would make it
fit. Beyond the GPU but within that error it is only likely out of memory: the plan's verdict line
says so, and the job may run.

memory_capacity judges the GPU the config names (workload.gpu, a preset GPU: its fault, wherever it
is planned); memory_capacity_here judges this machine's GPU for a config that names none (another,
larger GPU could run it). Both judge the job as Megatron-Bridge runs it (Megatron-FSDP, LoRA, fp8
weights); engine_memory judges the same GPU for graphbridge's engine, which trains from bf16 weights
(with Transformer Engine's quantized copies), where that is what does not fit.
"""

from dataclasses import replace
from typing import List, Optional, Tuple

from bridge.machine import PRESET_GPUS
from bridge.memory import ESTIMATE_ERROR, GIB, estimate_memory
from bridge.validation.registry import rule, violation
from bridge.validation.value_rules import positive_sizes, value_ranges

REJECTS = (f"a job estimated beyond its GPU's memory even if the estimate (bridge/memory/) were "
           f"{ESTIMATE_ERROR:.0%} high")
FIX = ("the changes the message names that fit it (the distributed optimizer, recompute, a smaller micro-batch), "
       "else more GPUs: higher TP or PP")
KEYS = ["train.micro_batch_size", "model.recompute_granularity", "ddp.use_distributed_optimizer"]
MEMORY_RULES = ("memory_capacity", "memory_capacity_here", "engine_memory")


@rule("memory_capacity", rejects=REJECTS + " (the preset GPU `gpu=` names)", fix=FIX)
def memory_capacity(cfg, target):
    if cfg.workload.gpu not in PRESET_GPUS:
        return None
    return beyond_capacity("memory_capacity", cfg, target, None, None)


@rule("memory_capacity_here", environment=True, rejects=REJECTS + " (this machine's GPU, without `gpu=`)",
      fix=FIX + "; or a GPU with more memory")
def memory_capacity_here(cfg, target):
    gpus = target.machine.gpus
    if cfg.workload.gpu in PRESET_GPUS or not gpus or not gpus[0].memory_bytes:
        return None  # memory_capacity judges a named GPU; without a known GPU there is no capacity
    return beyond_capacity("memory_capacity_here", cfg, target, gpus[0].memory_bytes / GIB, gpus[0].name)


@rule("engine_memory", engine="megatron",
      rejects="a preset that fits its GPU as Megatron-Bridge runs it (fp8 primary weights) "
              f"but not as graphbridge's engine, which does none of them, trains it (even {ESTIMATE_ERROR:.0%} lower)",
      fix="more GPUs (higher TP or PP with train.num_gpus), or train the preset with Megatron-Bridge itself")
def engine_memory(cfg, target):
    if cfg.workload.gpu not in PRESET_GPUS or positive_sizes(cfg, target) or value_ranges(cfg, target):
        return None
    estimate = estimate_memory(cfg)
    if estimate.engine_verdict != "cannot fit" or estimate.verdict == "cannot fit":
        return None  # it fits the engine, or memory_capacity refuses it as Bridge runs it already
    return violation("engine_memory", ["workload.task", "workload.precision", "workload.gpu"],
                     f"graphbridge's engine trains it without {' and '.join(estimate.as_bridge_runs_it)} (as "
                     f"Megatron-Bridge runs it) and would need "
                     f"~{estimate.engine_gib:.0f} GiB per GPU, beyond the {estimate.capacity_gib:.0f} GiB of the "
                     f"{estimate.gpu} even {ESTIMATE_ERROR:.0%} lower (Megatron-Bridge runs it in "
                     f"~{estimate.total_gib:.0f}); spread it over more GPUs (higher model.tensor_model_parallel_size "
                     "or model.pipeline_model_parallel_size with train.num_gpus), or train it with Megatron-Bridge")


def beyond_capacity(name: str, cfg, target, gpu_gib: Optional[float], gpu_name: Optional[str]):
    """The violation when the estimate on that GPU cannot fit, else None."""
    if positive_sizes(cfg, target) or value_ranges(cfg, target):
        return None  # those rules report the sizes the estimate would divide by
    estimate = estimate_memory(cfg, gpu_gib, gpu_name)
    if estimate.verdict != "cannot fit":
        return None
    fixes = [f"{change} (~{total:.0f} GiB)" for change, total in fitting_changes(cfg, gpu_gib, gpu_name)]
    advice = (f"set {' or '.join(fixes)}" if fixes else
              "no single change of micro-batch, recompute or optimizer sharding fits it: spread it over more GPUs, "
              "raise model.tensor_model_parallel_size or model.pipeline_model_parallel_size with train.num_gpus")
    return violation(name, KEYS + (["workload.gpu"] if cfg.workload.gpu else []),
                     f"the memory estimate is ~{estimate.total_gib:.0f} GiB per GPU, beyond the "
                     f"{estimate.capacity_gib:.0f} GiB of the {estimate.gpu} even {ESTIMATE_ERROR:.0%} lower "
                     f"(plan: memory); {advice}")


def fitting_changes(cfg, gpu_gib: Optional[float], gpu_name: Optional[str]) -> List[Tuple[str, float]]:
    """Each one-step change that brings the estimate inside the GPU, with its estimate."""
    model = cfg.model
    candidates = []
    if cfg.train.micro_batch_size > 1:
        candidates.append(("train.micro_batch_size=1", replace(cfg, train=replace(cfg.train, micro_batch_size=1))))
    if not cfg.ddp.use_distributed_optimizer and not cfg.ddp.use_megatron_fsdp:
        candidates.append(("ddp.use_distributed_optimizer=true",
                           replace(cfg, ddp=replace(cfg.ddp, use_distributed_optimizer=True))))
    if model.recompute_granularity != "full":
        full = replace(model, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        candidates.append(("model.recompute_granularity=full model.recompute_method=uniform "
                           "model.recompute_num_layers=1", replace(cfg, model=full)))
    found = []
    for change, changed in candidates:
        estimate = estimate_memory(changed, gpu_gib, gpu_name)
        if estimate.verdict in ("fits", "tight"):
            found.append((change, estimate.total_gib))
    return found
