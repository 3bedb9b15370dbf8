"""Megatron-FSDP (``ddp.use_megatron_fsdp``): what megatron-core's FullyShardedDataParallel trains in the megatron
engine. Each rule's witness is a run on an H100 (benchmarks/results/h100/megatron_fsdp_probe_83411eb.log): llama/tiny,
qwen/tiny, llama/tiny_lora, packed rows and CPU offloading trained eagerly with it on both releases, their losses
those of DDP with the distributed optimizer."""

from bridge.validation.graph_facts import IMPL, is_graphed
from bridge.validation.registry import rule, violation

FSDP = "ddp.use_megatron_fsdp"


@rule("megatron_fsdp_graphs", engine="megatron",
      rejects="Megatron-FSDP with CUDA graphs (`model.cuda_graph_impl` other than none)",
      fix="`cuda_graph=none`, or `ddp.use_megatron_fsdp=false` (graphs with the distributed optimizer)")
def megatron_fsdp_graphs(cfg, target):
    # Every graph mechanism failed with Megatron-FSDP on both releases (the probe's fsdp_*, m16_* and m19_* runs):
    # Transformer Engine's per-layer graphs at capture ("Modules must not have hooks registered": FSDP's gather and
    # reduce hooks), ZeRO-2 (optim_grads) too, local graphs at capture (a KeyError on FSDP's DTensor parameters),
    # the full-iteration graph at capture (cudaErrorStreamCaptureIsolation: FSDP's streams). Megatron-Bridge's main
    # branch refuses graphs with its Megatron-FSDP as well. The probe ran 0.19.2 without Megatron-FSDP's graph mode,
    # which translation now passes as Megatron-LM does (fsdp_graph_arguments): its fsdp_* witnesses decide again.
    if not (cfg.ddp.use_megatron_fsdp and is_graphed(cfg)):
        return None
    return violation(
        "megatron_fsdp_graphs", [FSDP, IMPL],
        "Megatron-FSDP gathers and reduces every layer through hooks and streams of its own, which no CUDA graph "
        "mechanism captures; set cuda_graph=none, or ddp.use_megatron_fsdp=false to graph with the distributed "
        "optimizer (ddp.use_distributed_optimizer=true) instead",
    )


@rule("megatron_fsdp_distributed_optimizer", engine="megatron",
      rejects="Megatron-FSDP without the distributed optimizer (`ddp.use_distributed_optimizer=false`)",
      fix="`ddp.use_distributed_optimizer=true`")
def megatron_fsdp_distributed_optimizer(cfg, target):
    # megatron-core's other optimizers read param.main_grad, which FSDP's DTensor parameters lack: llama/tiny failed
    # in its first step ("'DTensor' object has no attribute 'main_grad'", the probe's m19_nodistopt); Bridge's FSDP
    # presets all run the distributed optimizer, which shards on FSDP's buffers.
    if not cfg.ddp.use_megatron_fsdp or cfg.ddp.use_distributed_optimizer:
        return None
    return violation(
        "megatron_fsdp_distributed_optimizer", [FSDP, "ddp.use_distributed_optimizer"],
        "Megatron-FSDP steps its sharded parameters through megatron-core's distributed optimizer only; set "
        "ddp.use_distributed_optimizer=true",
    )


@rule("megatron_fsdp_pipeline", engine="megatron",
      rejects="Megatron-FSDP with pipeline parallelism (`model.pipeline_model_parallel_size` above 1)",
      fix="`model.pipeline_model_parallel_size=1` (FSDP shards over the data-parallel ranks instead)")
def megatron_fsdp_pipeline(cfg, target):
    # megatron-core's adapter lays its device mesh over the whole world as data x (expert) x tensor parallel ranks,
    # with no pipeline dimension (_get_dp_tp_mesh, 0.16.1 and 0.19.2): at PP2 the build fails ("EinopsError: Error
    # while processing rearrange-reduction pattern", a schema-wide CPU differential draw of the B300 70B preset).
    pp = cfg.model.pipeline_model_parallel_size
    if not cfg.ddp.use_megatron_fsdp or pp <= 1:
        return None
    return violation(
        "megatron_fsdp_pipeline", [FSDP, "model.pipeline_model_parallel_size"],
        f"Megatron-FSDP lays its device mesh over data, expert and tensor parallelism only, so it cannot build at "
        f"model.pipeline_model_parallel_size={pp}; set model.pipeline_model_parallel_size=1 and shard over the data-"
        "parallel ranks, or ddp.use_megatron_fsdp=false",
    )


@rule("torch_engine_fsdp", engine="torch",
      rejects="Megatron-FSDP on the torch engine (one GPU, no data parallelism to shard over)",
      fix="`ddp.use_megatron_fsdp=false`, or `engine=megatron`")
def torch_engine_fsdp(cfg, target):
    if not cfg.ddp.use_megatron_fsdp:
        return None
    return violation(
        "torch_engine_fsdp", [FSDP],
        "the torch engine trains on one GPU without megatron-core, so it has no Megatron-FSDP; set "
        "ddp.use_megatron_fsdp=false, or train with engine=megatron",
    )
