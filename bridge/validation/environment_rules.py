"""This machine: whether it has the GPUs a job needs and the packages (and versions) its engine
and graphs need. A violation here means "cannot run on this machine"; the plan still judges the
configuration, so planning for a cluster from a laptop works."""

from bridge.config.schema import Device, EngineChoice
from bridge.machine import version_tuple
from bridge.validation.graph_facts import FULL_ITERATION, IMPL, TE, impl_of
from bridge.validation.registry import rule, violation

SUPPORTED_MEGATRON_CORE = ("0.16.1",)


@rule("engine_device",
      rejects="`engine=megatron` with `device=cpu` (megatron-core trains on CUDA devices)",
      fix="`engine=torch` or `engine=auto` for the CPU")
def engine_device(cfg, target):
    if EngineChoice(cfg.engine) == EngineChoice.megatron and Device(cfg.device) == Device.cpu:
        return violation("engine_device", ["engine", "device"],
                         "engine=megatron needs a CUDA device, but device=cpu; use engine=torch (or engine=auto) "
                         "to train on the CPU")
    return None


@rule("cuda_device", environment=True,
      rejects="a job that needs CUDA (`device=cuda`, `engine=megatron`) on a machine without a CUDA GPU",
      fix="run it on a GPU machine, or `device=auto` / `engine=auto` to train on the CPU")
def cuda_device(cfg, target):
    wants_cuda = Device(cfg.device) == Device.cuda or EngineChoice(cfg.engine) == EngineChoice.megatron
    if wants_cuda and target.machine.gpu_count == 0 and Device(cfg.device) != Device.cpu:
        key = "device" if Device(cfg.device) == Device.cuda else "engine"
        return violation("cuda_device", [key],
                         f"{key}={getattr(cfg, key).value} needs a CUDA device and this machine has none visible "
                         "(CUDA_VISIBLE_DEVICES and the driver decide); run it on a GPU machine, or use "
                         "device=auto engine=auto to train on the CPU")
    return None


@rule("gpus_per_node", environment=True,
      rejects="more GPUs per node (`train.num_gpus` / `train.num_nodes`) than this machine has",
      fix="run it where the GPUs are (e.g. `hydra/launcher=submitit_slurm`), or lower `train.num_gpus`")
def gpus_per_node(cfg, target):
    needed = cfg.train.num_gpus // max(1, cfg.train.num_nodes)
    present = target.machine.gpu_count
    if (needed > 1 or target.device == "cuda") and needed > present:
        return violation(
            "gpus_per_node", ["train.num_gpus", "train.num_nodes"],
            f"each node runs {needed} GPU(s) (train.num_gpus={cfg.train.num_gpus} over train.num_nodes="
            f"{cfg.train.num_nodes}) and this machine has {present or 'none'}; run it on nodes with {needed} GPUs "
            "(under Slurm: -m hydra/launcher=submitit_slurm), or lower train.num_gpus with the parallel sizes",
        )
    return None


@rule("process_count", environment=True,
      rejects="a training process started with another process count than `train.num_gpus`",
      fix="start it through `graphbridge`, or `torchrun --nproc-per-node <train.num_gpus>`")
def process_count(cfg, target):
    if target.processes is not None and target.processes != cfg.train.num_gpus:
        return violation("process_count", ["train.num_gpus"],
                         f"train.num_gpus={cfg.train.num_gpus} but {target.processes} process(es) were started; start "
                         f"the job through graphbridge, or torchrun --nproc-per-node {cfg.train.num_gpus}, or set "
                         f"train.num_gpus={target.processes}")
    return None


@rule("megatron_core_installed", environment=True,
      rejects="the megatron engine where megatron-core is not installed",
      fix="`pip install megatron-core==0.16.1`, or `engine=torch`")
def megatron_core_installed(cfg, target):
    if target.engine == "megatron" and not target.machine.has("megatron-core"):
        return violation("megatron_core_installed", ["engine"],
                         f"engine=megatron needs megatron-core, which is not installed here; pip install "
                         f"megatron-core=={SUPPORTED_MEGATRON_CORE[-1]}, or engine=torch")
    return None


@rule("megatron_core_version",
      rejects="planning for, or training on, a megatron-core version graphbridge does not support",
      fix="a supported version (README, Versions)")
def megatron_core_version(cfg, target):
    installed = target.machine.version("megatron-core")
    planned = cfg.plan.megatron_core
    if planned is not None and planned not in SUPPORTED_MEGATRON_CORE:
        return violation("megatron_core_version", ["plan.megatron_core"],
                         f"plan.megatron_core={planned} is not supported; use one of {list(SUPPORTED_MEGATRON_CORE)}")
    if target.engine == "megatron" and installed not in (None, "unknown", *SUPPORTED_MEGATRON_CORE):
        return violation("megatron_core_version", ["engine"],
                         f"megatron-core {installed} is installed here and graphbridge supports "
                         f"{', '.join(SUPPORTED_MEGATRON_CORE)}; pip install megatron-core=="
                         f"{SUPPORTED_MEGATRON_CORE[-1]}")
    return None


def transformer_engine_needs(cfg):
    """(what needs Transformer Engine, the config keys, the lowest TE version it needs)."""
    model, impl = cfg.model, impl_of(cfg)
    needs = []
    if impl == TE:
        needs.append(("Transformer Engine graphs", [IMPL], (2, 9)))
    if model.fp8 or model.fp4:
        needs.append(("fp8/fp4 training", ["model.fp8" if model.fp8 else "model.fp4"], (2, 9)))
    if model.experimental_attention_variant is not None:
        needs.append((f"{model.experimental_attention_variant} layers", ["model.experimental_attention_variant"],
                      (2, 9)))
    if model.delay_wgrad_compute and impl == TE:
        graphs_attention = not cfg.model.cuda_graph_modules or "attn" in cfg.model.cuda_graph_modules
        needs.append(("delay_wgrad_compute with partial CUDA graphs", ["model.delay_wgrad_compute", IMPL],
                      (2, 12) if graphs_attention else (2, 10)))
    if model.moe_permute_fusion:
        needs.append(("the fused MoE token permutation", ["model.moe_permute_fusion"], (2, 1)))
    if model.cpu_offloading:
        needs.append(("activation offloading to the CPU", ["model.cpu_offloading"], (2, 9)))
    if impl == FULL_ITERATION and model.cross_entropy_fusion_impl == "te":
        needs.append(("TE cross-entropy fusion in a full-iteration graph", ["model.cross_entropy_fusion_impl", IMPL],
                      (2, 7)))
    return needs


@rule("transformer_engine", environment=True,
      rejects="TE graphs, fp8/fp4 or TE-only layers where Transformer Engine is missing or too old",
      fix="install `graphbridge[te]` (Transformer Engine 2.9 to 2.11 with megatron-core 0.16.1)")
def transformer_engine(cfg, target):
    if target.engine != "megatron":
        return None
    installed = target.machine.version("transformer-engine")
    found = []
    for what, keys, lowest in transformer_engine_needs(cfg):
        if installed is None:
            found.append(violation("transformer_engine", keys,
                                   f"{what} need Transformer Engine, which is not installed here; "
                                   "pip install 'graphbridge[te]'"))
        elif version_tuple(installed) and version_tuple(installed) < lowest:
            found.append(violation("transformer_engine", keys,
                                   f"{what} need Transformer Engine >= {'.'.join(map(str, lowest))} and {installed} "
                                   "is installed here; pip install 'graphbridge[te]'"))
    return found
