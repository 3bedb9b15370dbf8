"""Packed sequences (``dataset.packed_sequence``): what the megatron engine's packed microbatches need. Each row of
graphbridge's mock data packs several samples (bridge.data), and the model gets megatron-core's packed-sequence
parameters (thd format) as Megatron-Bridge's packed SFT gives them. What a graph may hold under packing is in
cuda_graph_rules.py (static_shapes, packed_sequence_scope); the torch engine's refusal in engine_rules.py."""

from bridge.validation.registry import rule, violation

PACKED = "dataset.packed_sequence"


@rule("packed_sequence_micro_batch",
      rejects="packed sequences with `train.micro_batch_size` above 1 (a packed row is the micro-batch)",
      fix="`train.micro_batch_size=1`, the global batch and the sequence as the message says")
def packed_sequence_micro_batch(cfg, target):
    # megatron-core's thd attention squeezes the batch dimension away (attention.py, "query.squeeze(1)" under
    # qkv_format == 'thd', 0.16.1 and 0.19.2), and Megatron-Bridge 0.3.1 refuses the same (ConfigContainer.validate:
    # "Micro batch size should be 1 when training with packed sequence"), naming the same equivalent. graphbridge's
    # packed data gives one row a micro-batch whatever the size, so the witness (packed_micro_batch_2, h100
    # gpu_witnesses.json at eae46ab, both releases) trained, on half the tokens its config names.
    train, seq = cfg.train, cfg.dataset.seq_length
    if not cfg.dataset.packed_sequence or train.micro_batch_size <= 1:
        return None
    return violation(
        "packed_sequence_micro_batch", [PACKED, "train.micro_batch_size"],
        f"a packed row is one micro-batch, so train.micro_batch_size={train.micro_batch_size} cannot be packed; the "
        f"same tokens a step: set train.micro_batch_size=1 train.global_batch_size="
        f"{train.global_batch_size // train.micro_batch_size} dataset.seq_length={seq * train.micro_batch_size}",
    )


@rule("packed_sequence_layer_spec", engine="megatron",
      rejects="packed sequences on megatron-core's local layer spec (`model.transformer_impl=local`)",
      fix="`model.transformer_impl=transformer_engine`")
def packed_sequence_layer_spec(cfg, target):
    # The local spec's DotProductAttention.forward asserts packed_seq_params is None ("Packed sequence is not
    # supported by DotProductAttention. Please use TEDotProductAttention instead."), 0.16.1 and 0.19.2: witness
    # packed_local_spec (tests/gpu_witnesses.py).
    if not cfg.dataset.packed_sequence or cfg.model.transformer_impl != "local":
        return None
    return violation(
        "packed_sequence_layer_spec", [PACKED, "model.transformer_impl"],
        "megatron-core's local attention (DotProductAttention) has no packed-sequence path; set "
        "model.transformer_impl=transformer_engine, or dataset.packed_sequence=false",
    )


@rule("packed_sequence_context_parallel", engine="megatron",
      rejects="packed sequences with context parallelism (`model.context_parallel_size` above 1)",
      fix="`model.context_parallel_size=1`")
def packed_sequence_context_parallel(cfg, target):
    # The engine splits a row over context-parallel ranks by position (bridge/engines/megatron/compat.py), which
    # cuts packed samples apart; Megatron-Bridge splits each sample with Transformer Engine's
    # thd_get_partitioned_indices, which graphbridge does not do yet.
    cp = cfg.model.context_parallel_size
    if not cfg.dataset.packed_sequence or cp <= 1:
        return None
    return violation(
        "packed_sequence_context_parallel", [PACKED, "model.context_parallel_size"],
        f"graphbridge splits rows over context-parallel ranks by position, which would cut packed samples apart; "
        f"set model.context_parallel_size=1 (and the {cp} ranks as data parallelism), or dataset.packed_sequence=false",
    )


@rule("packed_sequence_unpadded_pipeline", engine="megatron",
      rejects="unpadded packed rows (`dataset.pad_to_max_length=false`) with pipeline parallelism",
      fix="`dataset.pad_to_max_length=true`")
def packed_sequence_unpadded_pipeline(cfg, target):
    # An unpadded packed row is as long as its samples (rounded up to 16 tokens), so its length changes from
    # microbatch to microbatch, and the pipeline schedule sends activations of seq_length tokens between stages.
    if not cfg.dataset.packed_sequence or cfg.dataset.pad_to_max_length or cfg.model.pipeline_model_parallel_size <= 1:
        return None
    return violation(
        "packed_sequence_unpadded_pipeline", [PACKED, "dataset.pad_to_max_length", "model.pipeline_model_parallel_size"],
        "pipeline stages exchange activations of dataset.seq_length tokens, and unpadded packed rows are shorter; "
        "set dataset.pad_to_max_length=true",
    )
