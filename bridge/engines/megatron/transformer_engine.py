"""Transformer Engine per-layer graphs: megatron-core's TECudaGraphHelper.

Capture follows Megatron-Bridge's train.py (v0.3.1): before the step whose index minus the
first step equals ``cuda_graph_warmup_steps``, the helper runs TE's make_graphed_callables over
every graphable layer (static inputs from seq_length x micro_batch_size), then zeroes the grad
buffers and optimizer grads it dirtied. When the distributed optimizer overlaps the param
all-gather with the forward, DDP's forward pre-hooks are switched off around the capture
(hooks are not captured) and re-registered as manual hooks that the graphed layers call.

A pipeline rank can hold no layer of the scope while the others do (deepseek/tiny under te_mlp at PP2: its one
dense layer sits on the first stage). It builds no graph and meets the others' capture (compat.capture_layer_graphs);
only a pipeline with no such layer on any rank is refused.

A YaRN model's graphed attention gets its rotary embedding as a captured input (``rotary_inputs``):
megatron-core's helper hands it only to ``rope`` models. A local-spec layer's graphed attention gets a causal mask at
every replay (``causal_replays``): megatron-core hands it an all-false one.
"""

from functools import lru_cache, partial
from typing import Callable, List, Optional, Set

import torch
from megatron.core import parallel_state
from megatron.core.transformer.cuda_graphs import TECudaGraphHelper
from megatron.core.transformer.dot_product_attention import DotProductAttention

from bridge.diagnosis import graph_region
from bridge.engines.megatron.compat import capture_layer_graphs, graph_module_names
from bridge.engines.megatron.lifecycle import FirstStep


class TransformerEngineGraphs:
    region = "the Transformer Engine per-layer graphs (megatron-core TECudaGraphHelper)"

    def __init__(self, model_chunks: List[torch.nn.Module], transformer_config, seq_length: int,
                 micro_batch_size: int, optimizer, toggle_forward_pre_hook: bool):
        self.model_chunks = model_chunks
        self.helper = TECudaGraphHelper(model=model_chunks, config=transformer_config, seq_length=seq_length,
                                        micro_batch_size=micro_batch_size, optimizers=[optimizer])
        if not layers_in_pipeline(len(self.helper.flattened_callables)):
            raise ValueError("model.cuda_graph_impl=transformer_engine found no layer matching "
                             f"model.cuda_graph_modules={graph_module_names(transformer_config)} on any pipeline "
                             "rank; "
                             "pick modules the model has (attn, mlp for dense layers, moe_router for MoE)")
        self.rotary_layers = rotary_inputs(model_chunks, self.helper.flattened_callables)
        self.causal_layers = causal_replays(self.helper.flattened_callables)
        self.warmup_steps = transformer_config.cuda_graph_warmup_steps
        self.toggle_forward_pre_hook = toggle_forward_pre_hook
        self.first_step = FirstStep()

    def wrap(self, forward_backward_func: Callable) -> Callable:
        return forward_backward_func

    def before_step(self, step: int) -> None:
        self.first_step.see(step)
        if self.helper.graphs_created() or step - self.first_step.index != self.warmup_steps:
            return
        if self.toggle_forward_pre_hook:
            for chunk in self.model_chunks:
                chunk.disable_forward_pre_hook(param_sync=False)
        with graph_region(self.region, "capture"):
            capture_layer_graphs(self.helper)
        if self.toggle_forward_pre_hook:
            for chunk in self.model_chunks:
                chunk.enable_forward_pre_hook()
            self.helper.cuda_graph_set_manual_hooks()

    def phase(self, step: int) -> Optional[str]:
        # Captured in before_step, so the forward-backward of the capture step already replays.
        return "replay" if self.helper.graphs_created() else None

    def capture_steps(self) -> Set[int]:
        return self.first_step.offset(self.warmup_steps)

    def graph_count(self) -> int:
        return sum(len(layer.cuda_graphs) for layer in self.helper.flattened_callables)

    def delete(self) -> None:
        if self.helper.graphs_created():
            self.helper.delete_cuda_graphs()
        for layer in self.rotary_layers:
            del layer.get_layer_static_inputs  # the class's again
        for layer in self.causal_layers:
            del layer._get_te_cuda_graph_replay_args
        causal_mask.cache_clear()
        self.rotary_layers = self.causal_layers = []


def layers_in_pipeline(count: int) -> int:
    """The graphable layers of every pipeline rank together, given this rank's ``count``."""
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        return count
    total = torch.tensor([count], device=torch.cuda.current_device())
    torch.distributed.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return int(total.item())


def rotary_inputs(model_chunks: List[torch.nn.Module], graphed_layers) -> List[torch.nn.Module]:
    """Give the graphed layers of YaRN models (outside MLA) their rotary embedding as a static input; returns the
    layers changed.

    megatron-core's TECudaGraphHelper adds ``rotary_pos_emb`` to a layer's sample inputs only when the model's
    position_embedding_type is ``rope`` (transformer/cuda_graphs.py, get_rotary_pos_emb: line 1863 in 0.16.1,
    2306 in 0.19.2). A YaRN model's attention is captured with no rotary embedding, and at replay TE's graphed
    callable reads only the keyword arguments it was captured with (TE 2.10 pytorch/graph.py:740-753), so the
    ``rotary_pos_emb`` the layer is given is dropped without a word: the graphed attention trains without
    positions while eager's rotates (gpt_oss/tiny te_attn_moe_router: 1.4e-2 from eager after 30 steps on an
    H100). Each such layer's ``get_layer_static_inputs`` adds the embedding the model computes for that length
    (as GPTModel does before the decoder), so it is captured as an input and every replay copies in the one the
    layer is given. MLA computes its rotary embedding inside the attention, which the graph holds."""
    graphed = {id(layer) for layer in graphed_layers}
    changed = []
    for chunk in model_chunks:
        model = unwrapped(chunk)
        if getattr(model, "position_embedding_type", None) != "yarn" or model.config.multi_latent_attention:
            continue
        for layer in model.modules():
            if id(layer) in graphed:
                layer.get_layer_static_inputs = partial(with_rotary_embedding, layer.get_layer_static_inputs, model)
                changed.append(layer)
    return changed


def with_rotary_embedding(static_inputs: Callable, model, seq_length: int, micro_batch_size: int) -> dict:
    inputs = static_inputs(seq_length, micro_batch_size)
    # The layer adds an attention mask exactly when its attention is in its graph.
    if "attention_mask" in inputs and "rotary_pos_emb" not in inputs:
        rotary_seq_len = model.rotary_pos_emb.get_rotary_seq_len(
            None, model.decoder, inputs["hidden_states"], model.config, None)
        embedding = model.rotary_pos_emb(rotary_seq_len)
        inputs["rotary_pos_emb"] = embedding[0] if isinstance(embedding, tuple) else embedding  # YaRN: (emb, mscale)
    return inputs


def causal_replays(graphed_layers) -> List[torch.nn.Module]:
    """Replay the graphed attention of local-spec layers with the causal mask it was captured with; returns the
    layers changed.

    A layer's static inputs hold a causal attention mask when its attention is in the graph
    (TransformerLayer.get_layer_static_inputs), but where the step passes no mask, as causal models do, each replay
    copies in an all-false one (TransformerLayer._get_te_cuda_graph_replay_args: 0.16.1 and 0.19.2). Transformer
    Engine's attention, of mask type causal, reads no mask; megatron-core's own DotProductAttention (the local spec)
    builds its causal mask only when given none, so it applies the all-false one and attends to later tokens:
    llama/tiny te_layer on the local spec left its eager twin from the capture step on (0.79 % by step 6 at
    0d3b80c, gpu_witnesses_0d3b80c.json), while te_mlp, whose attention stays outside the graph, matched it."""
    changed = []
    for layer in graphed_layers:
        attention = getattr(getattr(layer, "self_attention", None), "core_attention", None)
        if isinstance(attention, DotProductAttention):
            layer._get_te_cuda_graph_replay_args = partial(replay_args_with_causal_mask,
                                                           layer._get_te_cuda_graph_replay_args)
            changed.append(layer)
    return changed


def replay_args_with_causal_mask(replay_args: Callable, *args, **kwargs):
    graph_args, graph_kwargs = replay_args(*args, **kwargs)
    filled = graph_kwargs.get("attention_mask")
    if kwargs.get("attention_mask") is None and filled is not None:
        batch, heads, queries, keys = filled.shape
        graph_kwargs["attention_mask"] = causal_mask(queries, keys, filled.device).expand(batch, heads, queries, keys)
    return graph_args, graph_kwargs


@lru_cache(maxsize=4)
def causal_mask(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """True where a query may not look: the later keys, as the captured static input has it. Made once, since every
    replay of every layer reads it (queries x keys bytes: 64 MiB at a sequence of 8192)."""
    return ~torch.ones(queries, keys, dtype=torch.bool, device=device).tril()


def unwrapped(chunk: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside megatron DDP and Float16Module."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk
