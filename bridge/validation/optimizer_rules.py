"""What megatron-core's optimizer builders take: both planned valid and failed at build (the schema-wide draw found
them, tests/differential.py), since no config class checks them."""

from bridge.validation.registry import rule, violation

PARAM_GATHER_WITH_STEP = "optimizer.overlap_param_gather_with_optimizer_step"


@rule("distributed_optimizer_adam", engine="megatron",
      rejects="the distributed optimizer (`ddp.use_distributed_optimizer=true`) with `optimizer.optimizer=sgd`",
      fix="`optimizer.optimizer=adam`, or `ddp.use_distributed_optimizer=false`")
def distributed_optimizer_adam(cfg, target):
    # DistributedOptimizer asserts "Only Adam and HybridDeviceOptimizer currently supported" (0.16.1 and 0.19.2).
    if cfg.optimizer.optimizer != "sgd" or not cfg.ddp.use_distributed_optimizer:
        return None
    return violation(
        "distributed_optimizer_adam", ["optimizer.optimizer", "ddp.use_distributed_optimizer"],
        "megatron-core's distributed optimizer shards Adam only (optimizer.optimizer=sgd); set "
        "optimizer.optimizer=adam, or ddp.use_distributed_optimizer=false",
    )


@rule("param_gather_with_optimizer_step", engine="megatron",
      rejects=f"`{PARAM_GATHER_WITH_STEP}=true` without the distributed optimizer, its overlapped parameter gather and "
              "virtual pipeline stages",
      fix=f"`{PARAM_GATHER_WITH_STEP}=false`")
def param_gather_with_optimizer_step(cfg, target):
    # Overlapping the first chunk's parameter gather with the optimizer step lives in the distributed optimizer and
    # its interleaved schedule (Megatron-LM's arguments require all three): llama/tiny with it alone planned valid
    # and failed at build ("'Float16OptimizerWithFloat16Params' object has no attribute 'model_chunks'").
    if not cfg.optimizer.overlap_param_gather_with_optimizer_step:
        return None
    missing = [key for key, present in (("ddp.use_distributed_optimizer=true", cfg.ddp.use_distributed_optimizer),
                                        ("ddp.overlap_param_gather=true", cfg.ddp.overlap_param_gather),
                                        ("model.virtual_pipeline_model_parallel_size=2",
                                         cfg.model.virtual_pipeline_model_parallel_size)) if not present]
    if not missing:
        return None
    return violation(
        "param_gather_with_optimizer_step", [PARAM_GATHER_WITH_STEP] + [key.split("=")[0] for key in missing],
        f"{PARAM_GATHER_WITH_STEP} needs the distributed optimizer with an overlapped parameter gather on virtual "
        f"pipeline stages, and this configuration lacks {' '.join(missing)}; set {PARAM_GATHER_WITH_STEP}=false",
    )
