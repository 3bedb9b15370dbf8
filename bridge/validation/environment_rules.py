"""This machine: whether it has the GPUs a job needs and the packages (and versions) its engine
and graphs need. A violation here means "cannot run on this machine"; the plan still judges the
configuration, so planning for a cluster from a laptop works."""

from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from bridge.config.releases import RELEASES, SUPPORTED, in_range, release, version_tuple
from bridge.config.schema import Device, EngineChoice
from bridge.config.model_facts import is_moe_model
from bridge.machine import PACKAGES
from bridge.validation.graph_facts import IMPL, MODULES, TE, impl_of, te_graphs_attention
from bridge.validation.local_spec_rules import builds_local_spec
from bridge.validation.registry import rule, violation


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


@rule("megatron_core_version",
      rejects="planning for a megatron-core release graphbridge does not support (`plan.megatron_core`)",
      fix="a supported release (README, Versions): " + " or ".join(f"`plan.megatron_core={v}`" for v in SUPPORTED))
def megatron_core_version(cfg, target):
    planned = cfg.plan.megatron_core
    if planned is not None and release(planned) is None:
        return violation("megatron_core_version", ["plan.megatron_core"],
                         f"plan.megatron_core={planned} is not a release graphbridge supports "
                         f"({', '.join(SUPPORTED)}); set plan.megatron_core={SUPPORTED[-1]}, or leave it unset for "
                         "the installed one")
    return None


@rule("megatron_core_installed", environment=True,
      rejects="the megatron engine where megatron-core is missing, is a release graphbridge does not support, "
              "or is another release than `plan.megatron_core`",
      fix=" or ".join(f"`pip install 'graphbridge[{row.extra}]'`" for row in RELEASES.values()) + ", or `engine=torch`")
def megatron_core_installed(cfg, target):
    if target.engine != "megatron":
        return None
    wanted = release(target.megatron_core)
    install = f"pip install 'graphbridge[{wanted.extra}]'" if wanted else "install a supported release"
    installed = target.machine.version("megatron-core")
    if installed is None:
        return violation("megatron_core_installed", ["engine"],
                         f"engine=megatron needs megatron-core, which is not installed here; {install} "
                         f"(megatron-core {target.megatron_core}), or engine=torch")
    if installed == "unknown":  # a source checkout: its release cannot be read, so it is not judged
        return None
    if release(installed) is None:
        return violation("megatron_core_installed", ["engine"],
                         f"megatron-core {installed} is installed here and graphbridge supports "
                         f"{', '.join(SUPPORTED)}; {install}")
    if installed != target.megatron_core:
        return violation("megatron_core_installed", ["plan.megatron_core", "engine"],
                         f"the plan is for megatron-core {target.megatron_core} (plan.megatron_core) and "
                         f"{installed} is installed here; run it where {target.megatron_core} is installed, "
                         f"{install}, or drop plan.megatron_core to train with {installed}")
    return None


@dataclass(frozen=True)
class TransformerEngineNeed:
    """Something a config can ask for that needs Transformer Engine, from release ``lowest`` on: where
    megatron-core 0.16.1 and 0.19.2 gate it (is_te_min_version), or graphbridge's tested floor (2.9)
    where they gate nothing. On top, each megatron-core release accepts only the TE releases its
    row in bridge.config.releases names."""

    what: str
    keys: Tuple[str, ...]
    lowest: str
    asked: Callable[[object], bool]
    megatron_core: Optional[str] = None
    """The megatron-core releases that need it (a range, bridge.config.releases.in_range); None: all."""


TRANSFORMER_ENGINE_NEEDS = (
    TransformerEngineNeed("Transformer Engine graphs (cuda_graph=te_*)", (IMPL,), "2.9",
                          lambda cfg: impl_of(cfg) == TE),
    TransformerEngineNeed("fp8/fp4 training", ("model.fp8", "model.fp4"), "2.9",
                          lambda cfg: bool(cfg.model.fp8 or cfg.model.fp4)),
    TransformerEngineNeed("linear-attention layers (model.experimental_attention_variant)",
                          ("model.experimental_attention_variant",), "2.9",
                          lambda cfg: cfg.model.experimental_attention_variant is not None),
    TransformerEngineNeed("delay_wgrad_compute with Transformer Engine graphs", ("model.delay_wgrad_compute", IMPL),
                          "2.10", lambda cfg: cfg.model.delay_wgrad_compute and impl_of(cfg) == TE),
    TransformerEngineNeed("delay_wgrad_compute with graphed attention", ("model.delay_wgrad_compute", MODULES),
                          "2.12", lambda cfg: cfg.model.delay_wgrad_compute and te_graphs_attention(cfg)),
    TransformerEngineNeed("multi-latent attention (model.multi_latent_attention)", ("model.multi_latent_attention",),
                          "2.9", lambda cfg: cfg.model.multi_latent_attention),
    TransformerEngineNeed("the fused MoE token permutation", ("model.moe_permute_fusion",), "2.1",
                          lambda cfg: cfg.model.moe_permute_fusion),
    TransformerEngineNeed("activation offloading to the CPU", ("model.cpu_offloading",), "2.9",
                          lambda cfg: cfg.model.cpu_offloading),
    # megatron-core raises at the first loss without TE, and under a full-iteration graph below TE 2.7.
    TransformerEngineNeed("Transformer Engine's fused cross-entropy (cross_entropy_fusion_impl=te)",
                          ("model.cross_entropy_loss_fusion", "model.cross_entropy_fusion_impl"), "2.9",
                          lambda cfg: cfg.model.cross_entropy_loss_fusion and cfg.model.cross_entropy_fusion_impl == "te"),
    TransformerEngineNeed("the fused sqrtsoftplus router (megatron-core 0.19)",
                          ("model.moe_router_fusion", "model.moe_router_score_function"), "2.13",
                          lambda cfg: cfg.model.moe_router_fusion and cfg.model.moe_router_score_function == "sqrtsoftplus"),
    # megatron-core 0.19 clips by a norm left on the device only with TE's multi_tensor_scale_tensor (TE 2.14 on);
    # otherwise get_grad_norm_fp32 reads the norm with .item(), which the optimizer graph's capture cannot hold.
    TransformerEngineNeed("megatron-core's optimizer graph (the in-graph optimizer with the distributed optimizer, "
                          "megatron-core 0.19)", ("optimizer.optimizer_in_graph", "ddp.use_distributed_optimizer"),
                          "2.14", lambda cfg: cfg.optimizer.optimizer_in_graph and cfg.ddp.use_distributed_optimizer,
                          megatron_core=">=0.19"),
)


def transformer_engine_needs(cfg, megatron_core: str) -> List[TransformerEngineNeed]:
    return [need for need in TRANSFORMER_ENGINE_NEEDS
            if need.asked(cfg) and in_range(megatron_core, need.megatron_core)]


@rule("transformer_engine", environment=True,
      rejects="TE graphs, fp8/fp4 or TE-only layers where Transformer Engine is missing or too old, or a Transformer "
              "Engine the target megatron-core release does not accept",
      fix=" or ".join(f"`pip install 'graphbridge[{row.te_extra}]'` (megatron-core {row.version}, TE "
                      f"{row.transformer_engine_range})" for row in RELEASES.values()))
def transformer_engine(cfg, target):
    if target.engine != "megatron" or release(target.megatron_core) is None:
        return None
    row = release(target.megatron_core)
    installed = target.machine.version("transformer-engine")
    install = f"pip install 'graphbridge[{row.te_extra}]' (Transformer Engine {row.transformer_engine_range})"
    needs = transformer_engine_needs(cfg, target.megatron_core)
    if installed is None:
        return [violation("transformer_engine", list(need.keys), f"{need.what} need Transformer Engine, which is "
                          f"not installed here; {install}") for need in needs]
    if installed == "unknown":
        return None
    if (needs or cfg.model.transformer_impl == "transformer_engine") and not row.accepts_transformer_engine(installed):
        other = "" if needs else ", or model.transformer_impl=local"
        return violation("transformer_engine", [IMPL if needs else "model.transformer_impl"],
                         f"megatron-core {row.version} accepts Transformer Engine {row.transformer_engine_range} and "
                         f"{installed} is installed here; {install}{other}")
    return [violation("transformer_engine", list(need.keys),
                      f"{need.what} need Transformer Engine >= {need.lowest} and {installed} is installed here; "
                      f"{install if row.accepts_transformer_engine(need.lowest) else newer_install(cfg, row, need)}")
            for need in needs if version_tuple(installed) < version_tuple(need.lowest)]


def newer_install(cfg, row, need: TransformerEngineNeed) -> str:
    """The install for a need beyond every Transformer Engine ``row``'s release accepts: the first release that
    accepts one new enough (and the plan moved to it where plan.megatron_core pins the old one)."""
    newer = next((other for other in RELEASES.values() if other.accepts_transformer_engine(need.lowest)), None)
    if newer is None:
        return f"megatron-core {row.version} accepts Transformer Engine {row.transformer_engine_range} only"
    plan = f" and set plan.megatron_core={newer.version}" if cfg.plan.megatron_core else ""
    return (f"megatron-core {row.version} accepts Transformer Engine {row.transformer_engine_range} only: pip install "
            f"'graphbridge[{newer.te_extra}]' (megatron-core {newer.version}, Transformer Engine "
            f"{newer.transformer_engine_range}){plan}")


@rule("grouped_gemm_package", environment=True, megatron_core="<0.19",
      rejects="grouped MoE experts (`model.moe_grouped_gemm=true`) that megatron-core 0.16.1 builds as its legacy "
              "GroupedMLP (the local layer spec, or `model.moe_use_legacy_grouped_gemm=true`) where the grouped_gemm "
              "package is not installed",
      fix="`model.moe_grouped_gemm=false`, Transformer Engine's grouped experts (`model.transformer_impl="
          "transformer_engine`, `model.moe_use_legacy_grouped_gemm=false`), or "
          "`pip install git+https://github.com/fanshiqing/grouped_gemm@v1.1.4`")
def grouped_gemm_package(cfg, target):
    # 0.16.1's LocalSpecProvider.grouped_mlp_modules (models/backends.py) and the TE provider under
    # moe_use_legacy_grouped_gemm return GroupedMLP, whose constructor asserts the package is importable
    # (transformer/moe/experts.py, grouped_gemm_util.assert_grouped_gemm_is_available): qwen/tiny with
    # model.transformer_impl=local and grouped GEMM failed so at model build on an H100. 0.19's local spec builds
    # one-by-one experts (SequentialMLP) whatever the flag, and it has no legacy flag.
    model = cfg.model
    if target.engine != "megatron" or not (is_moe_model(model) and model.moe_grouped_gemm):
        return None
    if target.machine.has("grouped-gemm"):
        return None
    local = builds_local_spec(cfg, target)
    if not (local or model.moe_use_legacy_grouped_gemm):
        return None
    key = "model.transformer_impl" if local else "model.moe_use_legacy_grouped_gemm"
    instead = ("Transformer Engine's grouped experts (model.transformer_impl=transformer_engine)" if local
               else "Transformer Engine's grouped experts (model.moe_use_legacy_grouped_gemm=false)")
    return violation("grouped_gemm_package", ["model.moe_grouped_gemm", key],
                     f"megatron-core {target.megatron_core} builds grouped experts here as its legacy GroupedMLP, which "
                     "needs the grouped_gemm package, not installed here (it asserts at model build); set "
                     f"model.moe_grouped_gemm=false, use {instead}, or pip install "
                     "git+https://github.com/fanshiqing/grouped_gemm@v1.1.4")


@rule("nsys_available", environment=True,
      rejects="`perf.nsys=true` where Nsight Systems' `nsys` is not on PATH, or where the job would train on the CPU",
      fix="install Nsight Systems and put its `nsys` on PATH (on a GPU machine), or `perf.nsys=false` "
          "(`perf.profile=true` traces with torch.profiler)")
def nsys_available(cfg, target):
    if not cfg.perf.nsys:
        return None
    if not target.machine.tools.get("nsys"):
        return violation("nsys_available", ["perf.nsys"],
                         "perf.nsys=true starts the training process under nsys, which is not on PATH here; install "
                         "Nsight Systems and add its bin directory to PATH, or set perf.nsys=false (perf.profile=true "
                         "traces with torch.profiler instead)")
    if target.device != "cuda":
        return violation("nsys_available", ["perf.nsys", "device"],
                         "perf.nsys=true records CUDA between cudaProfilerStart and cudaProfilerStop, but this job "
                         "trains on the CPU; run it on a GPU machine, or set perf.nsys=false (perf.profile=true "
                         "traces the CPU with torch.profiler)")
    return None



# Transformer Engine's support checks (transformer_engine/pytorch/quantization.py, 2.10): per quantized precision
# (the precision group's choice it is written with), the lowest compute capability that runs it and the first
# that no longer does. A model built with one of them asserts at the first forward pass on any other GPU.
PRECISION_CAPABILITY = {
    "fp8_cs": ((8, 9), None),   # fp8 with tensorwise (or delayed) scaling
    "fp8_sc": ((9, 0), None),   # fp8 blockwise scaling
    "fp8_mx": ((10, 0), (12, 0)),
    "nvfp4": ((10, 0), None),
}


def quantized_precision(model):
    """The precision choice this model's fp8/fp4 settings amount to, or None for bf16/fp16."""
    if model.fp4:
        return "nvfp4"
    if not model.fp8:
        return None
    return {"blockwise": "fp8_sc", "mxfp8": "fp8_mx"}.get(model.fp8_recipe, "fp8_cs")


def runs_on(precision: str, capability) -> bool:
    lowest, end = PRECISION_CAPABILITY[precision]
    return capability >= lowest and (end is None or capability < end)


@rule("quantized_precision_gpu", environment=True,
      rejects="fp8/fp4 precisions this machine's GPU cannot run: fp8 below compute capability 8.9, fp8 blockwise "
              "below 9.0, MXFP8 and NVFP4 below 10.0 (Blackwell), MXFP8 from 12.0 on",
      fix="`precision=bf16` or `precision=fp8_cs` on an H100/H200; `precision=fp8_mx` and `precision=nvfp4` on a "
          "B200/GB200/B300/GB300")
def quantized_precision_gpu(cfg, target):
    precision = quantized_precision(cfg.model)
    if target.engine != "megatron" or precision is None or not target.machine.gpus:
        return None
    gpu = target.machine.gpus[0]
    if runs_on(precision, gpu.capability):
        return None
    lowest, end = (".".join(map(str, c)) if c else None for c in PRECISION_CAPABILITY[precision])
    needs = f"{lowest} to below {end}" if end else f"{lowest} or newer"
    keys = ["model.fp4"] if precision == "nvfp4" else ["model.fp8", "model.fp8_recipe"]
    # The bf16 choice sets no fp8/fp4 field, so a quantized field typed by hand must go with it.
    here = ", ".join([f"precision=bf16 ({keys[0]}=null)"]
                     + [f"precision={p}" for p in PRECISION_CAPABILITY if runs_on(p, gpu.capability)])
    return violation("quantized_precision_gpu", keys,
                     f"precision={precision} needs a GPU of compute capability {needs}, and this machine's {gpu.name} "
                     f"is {'.'.join(map(str, gpu.capability))} (Transformer Engine asserts at the first forward pass); "
                     f"use {here} here, or run it on a GPU that has it")


@rule("transformer_engine_extension", environment=True,
      rejects="the megatron engine where Transformer Engine's Python package is installed without its PyTorch "
              "extension (megatron-core imports the package and fails)",
      fix="install the extension with the package (`pip install 'graphbridge[te016]'` or `'.[te019]'`), or remove "
          "the package (`pip uninstall transformer-engine`) so that megatron-core builds its local layer spec")
def transformer_engine_extension(cfg, target):
    machine = target.machine
    if target.engine != "megatron" or not machine.has("transformer-engine-python") or machine.has("transformer-engine"):
        return None
    row = release(target.megatron_core)
    extra = f"graphbridge[{row.te_extra}]" if row else "transformer-engine[pytorch]"
    return violation("transformer_engine_extension", ["engine"],
                     f"Transformer Engine {machine.version('transformer-engine-python')} is installed here without its "
                     "PyTorch extension (transformer_engine_torch), and megatron-core fails to import when it finds "
                     f"the package; pip install '{extra}' for the extension, or pip uninstall transformer-engine (the "
                     "local layer spec then trains), or engine=torch")


@dataclass(frozen=True)
class CompiledKernel:
    """A fused kernel megatron-core imports from a compiled extension (apex's, or Megatron-LM's own) when a
    setting asks for it, and fails without at the first forward pass."""

    package: str
    """bridge.machine.PACKAGES key of the extension module."""
    what: str
    keys: Tuple[str, ...]
    asked: Callable[[object, object], bool]


COMPILED_KERNELS = (
    # megatron-core's own linear layers (the output layer on the TE spec too) fuse the weight-gradient
    # accumulation with apex's kernel.
    CompiledKernel("apex-fused-weight-gradient", "model.gradient_accumulation_fusion=true",
                   ("model.gradient_accumulation_fusion",), lambda cfg, target: cfg.model.gradient_accumulation_fusion),
    # The local spec's attention fuses scale, mask and softmax; TE's attention has its own.
    CompiledKernel("fused-softmax", "model.masked_softmax_fusion=true on the local layer spec",
                   ("model.masked_softmax_fusion", "model.transformer_impl"),
                   lambda cfg, target: cfg.model.masked_softmax_fusion and builds_local_spec(cfg, target)),
)


@rule("compiled_kernels", environment=True,
      rejects="fusions whose compiled kernels this machine lacks: `model.gradient_accumulation_fusion=true` without "
              "apex's fused_weight_gradient_mlp_cuda, `model.masked_softmax_fusion=true` on the local spec without "
              "scaled_masked_softmax_cuda",
      fix="turn the fusion off (`model.gradient_accumulation_fusion=false`, `model.masked_softmax_fusion=false` or "
          "`model.transformer_impl=transformer_engine`), or install apex with its CUDA extensions")
def compiled_kernels(cfg, target):
    if target.engine != "megatron":
        return None
    missing = [kernel for kernel in COMPILED_KERNELS if kernel.asked(cfg, target) and not target.machine.has(kernel.package)]
    return [violation("compiled_kernels", list(kernel.keys),
                      f"{kernel.what} needs the compiled kernel module {PACKAGES[kernel.package][1]}, which is not "
                      "installed here (megatron-core fails at the first forward pass without it); set "
                      f"{kernel.keys[0]}=false, or install apex with its CUDA extensions")
            for kernel in missing]
