"""The model the megatron engine trains: one GPTModel per virtual pipeline stage, built from megatron-core's
layer specs as Megatron-LM's gpt_builders build it, with Transformer Engine's uninitialised attention sinks
zeroed and, under peft=lora, adapters beside frozen weights (lora.py), in Float16Module and megatron-core's DDP."""

from typing import List, Optional

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
    get_transformer_block_with_experimental_attention_variant_spec,
)
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer.module import Float16Module

from bridge.config.peft import lora_targets
from bridge.config.schema import PeftConfig
from bridge.engines.megatron.lora import add_lora


def build_model_chunks(transformer_config, gpt_model_args, ddp_config, use_transformer_engine: bool,
                       overlap_param_gather_with_optimizer_step: bool, peft: Optional[PeftConfig] = None) -> List:
    """One GPTModel per virtual pipeline stage, each in Float16Module and megatron DDP. LoRA's adapters come after
    the base weights are drawn, so those are the same with and without them."""
    vp_size = transformer_config.virtual_pipeline_model_parallel_size
    targets = lora_targets(peft) if peft is not None else None
    chunks = []
    for vp_stage in range(vp_size) if vp_size else [None]:
        block_spec = decoder_block_spec(transformer_config, use_transformer_engine, vp_stage)
        mtp_spec = None
        if transformer_config.mtp_num_layers:
            mtp_spec = get_gpt_mtp_block_spec(transformer_config, mtp_layer_spec(transformer_config, use_transformer_engine,
                                                                                 block_spec),
                                              use_transformer_engine=use_transformer_engine, vp_stage=vp_stage)
        model = GPTModel(
            config=transformer_config, transformer_layer_spec=block_spec, mtp_block_spec=mtp_spec,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            vp_stage=vp_stage, **gpt_model_args)
        zero_attention_sinks(model)
        if targets:
            add_lora(model, transformer_config, peft, targets)
        model.cuda(torch.cuda.current_device())
        if transformer_config.bf16 or transformer_config.fp16:
            model = Float16Module(transformer_config, model)
        chunks.append(model)
    wrapper = data_parallel_wrapper(ddp_config)
    return [wrapper(config=transformer_config, ddp_config=ddp_config, module=chunk,
                    disable_bucketing=index > 0 or overlap_param_gather_with_optimizer_step)
            for index, chunk in enumerate(chunks)]


def data_parallel_wrapper(ddp_config):
    """megatron-core's DDP, or its Megatron-FSDP adapter (ddp.use_megatron_fsdp), as Megatron-Bridge chooses."""
    if not ddp_config.use_megatron_fsdp:
        return DistributedDataParallel
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

    return FullyShardedDataParallel


def zero_attention_sinks(model: torch.nn.Module) -> int:
    """Zero the learnable attention sinks (``softmax_type=learnable``: ``softmax_offset``) of Transformer Engine's
    attention, as TE 2.14 and later create them; returns how many modules it zeroed.

    TE before 2.14 (2.10: transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py:435)
    makes the parameter with ``torch.empty`` and, unlike its other modules, never runs ``reset_parameters``;
    megatron-core's TEDotProductAttention (0.16.1 and 0.19.2) does not initialise it either. The sinks then hold
    whatever the caching allocator last kept there, which depends on what ran before (megatron-core's first
    CudaGraphManager, built by the first layer under cuda_graph_impl=local and full_iteration on 0.16.1, moves
    the process onto a new stream before that layer's attention exists): on an H100 with TE 2.10, gpt_oss/tiny
    under local_layer and full_iteration started from other weights than its eager twin. Zeros draw
    nothing from any generator, so every other weight stays as it was. megatron-core's own (local-spec)
    DotProductAttention initialises its sinks with init_method and is left alone."""
    zeroed = 0
    for module in model.modules():
        offset = getattr(module, "softmax_offset", None)
        if isinstance(offset, torch.nn.Parameter) and transformer_engine_class(module):
            with torch.no_grad():
                offset.zero_()
            zeroed += 1
    return zeroed


def transformer_engine_class(module: torch.nn.Module) -> bool:
    return any(cls.__module__.split(".")[0] == "transformer_engine" for cls in type(module).__mro__)


def mtp_layer_spec(transformer_config, use_transformer_engine: bool, block_spec):
    """The layer the MTP block repeats: the model's last decoder layer. A stage's own block spec has it only where
    the stage holds decoder layers; a pipeline layout may give the MTP block a stage of its own (DeepSeek-V3's H100
    preset ends on "mL"), whose empty block made megatron-core's MTP spec fail with an IndexError (the CPU build of
    that preset at its 1024 ranks, tests/test_preset_builds.py)."""
    if transformer_config.experimental_attention_variant is not None or block_spec.layer_specs:
        return block_spec
    return get_gpt_decoder_layer_specs(transformer_config, use_transformer_engine=use_transformer_engine,
                                       normalization=transformer_config.normalization)[-1]


def decoder_block_spec(transformer_config, use_transformer_engine: bool, vp_stage):
    """Megatron-LM's gpt_builders choice: linear-attention hybrids have their own block spec (TE only)."""
    if transformer_config.experimental_attention_variant is None:
        return get_gpt_decoder_block_spec(transformer_config, use_transformer_engine=use_transformer_engine,
                                          normalization=transformer_config.normalization, vp_stage=vp_stage)
    return get_transformer_block_with_experimental_attention_variant_spec(transformer_config, vp_stage=vp_stage)
