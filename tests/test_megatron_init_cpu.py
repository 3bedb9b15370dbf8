"""What the megatron engine does to the model it builds so that a graphed run and its eager twin start from the
same weights and compute the same layer, checked on the CPU with stand-ins for the GPU-only modules:
Transformer Engine's attention sinks are zeroed (TE before 2.14 leaves them uninitialised), and a YaRN model's
TE-graphed layers are captured with its rotary embedding (megatron-core's helper gives it to rope models only),
and a local-spec layer's graphed attention replays with the causal mask it was captured with.
A pipeline rank without a layer of the TE scope meets the others' capture instead of refusing to build."""

from types import SimpleNamespace

import pytest
import torch

from bridge.engines.megatron import compat
from bridge.engines.megatron import transformer_engine as te_graphs
from bridge.engines.megatron.model_build import zero_attention_sinks
from bridge.engines.megatron.transformer_engine import DotProductAttention, causal_replays, rotary_inputs, unwrapped


class TEAttention(torch.nn.Module):
    """Stands in for TE's DotProductAttention with softmax_type=learnable: sinks made with torch.empty."""

    def __init__(self):
        super().__init__()
        self.softmax_offset = torch.nn.Parameter(torch.full((4,), float("nan")))


TEAttention.__module__ = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"


class MegatronTEAttention(TEAttention):
    """megatron-core's TEDotProductAttention: a subclass of TE's, defined in megatron-core."""


class LocalAttention(torch.nn.Module):
    """megatron-core's own DotProductAttention: its sinks come from init_method."""

    def __init__(self):
        super().__init__()
        self.softmax_offset = torch.nn.Parameter(torch.full((4,), 0.5))


def test_transformer_engine_sinks_are_zeroed_and_nothing_else_changes():
    model = torch.nn.ModuleDict({"te": MegatronTEAttention(), "local": LocalAttention(),
                                 "linear": torch.nn.Linear(3, 3)})
    weight = model["linear"].weight.detach().clone()
    rng = torch.get_rng_state()
    assert zero_attention_sinks(model) == 1
    assert torch.equal(model["te"].softmax_offset, torch.zeros(4))
    assert torch.equal(model["local"].softmax_offset, torch.full((4,), 0.5))
    assert torch.equal(model["linear"].weight, weight)
    assert torch.equal(torch.get_rng_state(), rng), "zeroing the sinks drew from a generator"
    assert isinstance(model["te"].softmax_offset, torch.nn.Parameter)


def test_a_model_without_learnable_sinks_is_left_alone():
    class VanillaTEAttention(torch.nn.Module):
        softmax_offset = None

    VanillaTEAttention.__module__ = TEAttention.__module__
    assert zero_attention_sinks(torch.nn.Sequential(VanillaTEAttention(), torch.nn.Linear(2, 2))) == 0


SEQ, BATCH, HIDDEN, DIM = 8, 2, 4, 6


class Rotary:
    """YarnRotaryEmbedding's interface: the length from the decoder input, forward returns (emb, mscale)."""

    def __init__(self, returns_tuple=True):
        self.calls = []
        self.returns_tuple = returns_tuple

    def get_rotary_seq_len(self, inference_context, transformer, transformer_input, config, packed_seq_params):
        assert inference_context is None and packed_seq_params is None
        return transformer_input.size(0) * (config.tensor_model_parallel_size if config.sequence_parallel else 1)

    def __call__(self, seq_len):
        self.calls.append(seq_len)
        emb = torch.arange(seq_len, dtype=torch.float32)[:, None, None, None].expand(seq_len, 1, 1, DIM)
        return (emb, 1.0) if self.returns_tuple else emb


def local_attention() -> torch.nn.Module:
    """megatron-core's own DotProductAttention (the local spec), unbuilt: its __init__ needs parallel state."""
    attention = DotProductAttention.__new__(DotProductAttention)
    torch.nn.Module.__init__(attention)
    return attention


class Layer(torch.nn.Module):
    def __init__(self, attention_graphed=True, attention=None):
        super().__init__()
        self.attention_graphed = attention_graphed
        self.self_attention = torch.nn.Module()
        self.self_attention.core_attention = attention or MegatronTEAttention()

    def get_layer_static_inputs(self, seq_length, micro_batch_size):
        inputs = {"hidden_states": torch.ones(seq_length, micro_batch_size, HIDDEN)}
        if self.attention_graphed:  # causal, as TransformerLayer captures it
            causal = ~torch.tril(torch.ones(seq_length, seq_length)).bool()
            inputs["attention_mask"] = causal.reshape(1, 1, seq_length, seq_length).tile(micro_batch_size, 1, 1, 1)
        return inputs

    def _get_te_cuda_graph_replay_args(self, hidden_states, **kwargs):
        """TransformerLayer's: the kwargs of the layer's call, with an all-false mask where the step passed none;
        with its attention outside the graph, the layer ran the attention itself and passes no kwargs."""
        kwargs = dict(kwargs, is_first_microbatch=True) if self.attention_graphed else {"is_first_microbatch": True}
        if self.attention_graphed and kwargs.get("attention_mask") is None:
            seq_length, micro_batch_size = hidden_states.shape[:2]
            kwargs["attention_mask"] = torch.zeros(micro_batch_size, 1, seq_length, seq_length, dtype=torch.bool)
        return (hidden_states,), kwargs


class Model(torch.nn.Module):
    def __init__(self, position_embedding_type="yarn", mla=False, layers=2, returns_tuple=True):
        super().__init__()
        self.position_embedding_type = position_embedding_type
        self.config = SimpleNamespace(multi_latent_attention=mla, sequence_parallel=False,
                                      tensor_model_parallel_size=1)
        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList(Layer() for _ in range(layers))
        self.rotary_pos_emb = Rotary(returns_tuple)


def wrapped(model):
    """DDP(Float16Module(GPTModel)): each keeps the next as .module."""
    inner = torch.nn.Module()
    inner.module = model
    outer = torch.nn.Module()
    outer.module = inner
    return outer


def test_a_yarn_model_captures_its_rotary_embedding():
    model = Model()
    layers = list(model.decoder.layers)
    assert rotary_inputs([wrapped(model)], layers) == layers
    inputs = layers[0].get_layer_static_inputs(SEQ, BATCH)
    assert set(inputs) == {"hidden_states", "attention_mask", "rotary_pos_emb"}
    assert torch.equal(inputs["rotary_pos_emb"], model.rotary_pos_emb(SEQ)[0])
    assert model.rotary_pos_emb.calls[0] == SEQ


def test_the_rotary_length_follows_sequence_parallelism():
    model = Model()
    model.config.sequence_parallel, model.config.tensor_model_parallel_size = True, 2
    rotary_inputs([model], list(model.decoder.layers))
    # The helper hands a sequence-parallel layer SEQ / TP rows; the embedding covers the whole sequence.
    inputs = model.decoder.layers[0].get_layer_static_inputs(SEQ // 2, BATCH)
    assert inputs["rotary_pos_emb"].shape[0] == SEQ


def test_an_embedding_returned_alone_is_taken_as_is():
    model = Model(returns_tuple=False)
    rotary_inputs([model], list(model.decoder.layers))
    assert model.decoder.layers[1].get_layer_static_inputs(SEQ, BATCH)["rotary_pos_emb"].shape == (SEQ, 1, 1, DIM)


def test_layers_whose_attention_is_not_graphed_get_no_embedding():
    model = Model()
    model.decoder.layers[0].attention_graphed = False
    rotary_inputs([model], list(model.decoder.layers))
    assert set(model.decoder.layers[0].get_layer_static_inputs(SEQ, BATCH)) == {"hidden_states"}
    assert model.rotary_pos_emb.calls == []


def test_rope_mla_and_ungraphed_layers_are_left_to_megatron_core():
    rope, mla, yarn = Model("rope"), Model(mla=True), Model()
    graphed = list(rope.decoder.layers) + list(mla.decoder.layers) + [yarn.decoder.layers[0]]
    assert rotary_inputs([rope, mla, yarn], graphed) == [yarn.decoder.layers[0]]
    for layer in list(rope.decoder.layers) + list(mla.decoder.layers) + [yarn.decoder.layers[1]]:
        assert "get_layer_static_inputs" not in vars(layer)
    assert "rotary_pos_emb" not in rope.decoder.layers[0].get_layer_static_inputs(SEQ, BATCH)


def test_a_local_spec_layer_replays_with_the_causal_mask_it_was_captured_with():
    layer, te_layer = Layer(attention=local_attention()), Layer()
    assert causal_replays([layer, te_layer]) == [layer]
    hidden = torch.ones(SEQ, BATCH, HIDDEN)
    _, replayed = layer._get_te_cuda_graph_replay_args(hidden, attention_mask=None)
    assert torch.equal(replayed["attention_mask"], layer.get_layer_static_inputs(SEQ, BATCH)["attention_mask"])
    _, again = layer._get_te_cuda_graph_replay_args(hidden, attention_mask=None)
    assert again["attention_mask"].data_ptr() == replayed["attention_mask"].data_ptr(), "one mask for every replay"
    given = torch.rand(BATCH, 1, SEQ, SEQ) > 0.5
    assert layer._get_te_cuda_graph_replay_args(hidden, attention_mask=given)[1]["attention_mask"] is given
    _, te_replayed = te_layer._get_te_cuda_graph_replay_args(hidden, attention_mask=None)
    assert not te_replayed["attention_mask"].any(), "Transformer Engine's causal attention reads no mask"


def test_a_local_spec_layer_whose_attention_runs_outside_the_graph_is_given_no_mask():
    layer = Layer(attention_graphed=False, attention=local_attention())
    causal_replays([layer])
    _, replayed = layer._get_te_cuda_graph_replay_args(torch.ones(SEQ, BATCH, HIDDEN), attention_mask=None)
    assert "attention_mask" not in replayed


def helper_of(layers, calls):
    """Stands in for megatron-core's TECudaGraphHelper that finds ``layers`` on this rank; notes its captures."""

    class Helper:
        def __init__(self, model, config, seq_length, micro_batch_size, optimizers):
            self.flattened_callables = layers

        def graphs_created(self):
            return False

        def create_cudagraphs(self):
            calls.append("create_cudagraphs")

    return Helper


def pipeline(monkeypatch, ranks: int, layers_elsewhere: int = 0, calls=None) -> None:
    """This rank in a pipeline of ``ranks``, whose other ranks hold ``layers_elsewhere`` graphable layers: the
    pipeline group's all-reduce adds them; barriers are noted in ``calls``."""
    monkeypatch.setattr(te_graphs, "parallel_state", SimpleNamespace(
        get_pipeline_model_parallel_world_size=lambda: ranks, get_pipeline_model_parallel_group=lambda: "pipeline"))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, group: tensor.add_(layers_elsewhere))
    monkeypatch.setattr(torch.distributed, "barrier", lambda: calls.append("barrier"))


def test_the_lifecycle_patches_its_graphed_layers_and_delete_restores_them(monkeypatch):
    model = Model()
    model.decoder.layers[1].self_attention.core_attention = local_attention()
    layers = list(model.decoder.layers)
    monkeypatch.setattr(te_graphs, "TECudaGraphHelper", helper_of(layers, []))
    pipeline(monkeypatch, ranks=1)
    config = SimpleNamespace(cuda_graph_warmup_steps=1)
    graphs = te_graphs.TransformerEngineGraphs([wrapped(model)], config, SEQ, BATCH, optimizer=None,
                                               toggle_forward_pre_hook=False)
    assert "rotary_pos_emb" in layers[0].get_layer_static_inputs(SEQ, BATCH)
    assert "_get_te_cuda_graph_replay_args" in vars(layers[1])
    graphs.delete()
    assert all("get_layer_static_inputs" not in vars(layer) for layer in layers)
    assert "_get_te_cuda_graph_replay_args" not in vars(layers[1])
    assert "rotary_pos_emb" not in layers[0].get_layer_static_inputs(SEQ, BATCH)


@pytest.mark.parametrize("since_0_19, meets", [(False, ["barrier", "barrier"]), (True, ["create_cudagraphs"])])
def test_a_pipeline_rank_without_a_layer_of_the_scope_meets_the_others_capture(monkeypatch, since_0_19, meets):
    # deepseek/tiny under te_mlp at PP2: the MoE-only stage has nothing to graph while the first captures. 0.16.1's
    # helper holds a barrier before and after its capture, which this rank meets itself; 0.19's skips capture there.
    calls = []
    monkeypatch.setattr(te_graphs, "TECudaGraphHelper", helper_of([], calls))
    monkeypatch.setattr(compat, "SINCE_0_19", since_0_19)
    pipeline(monkeypatch, ranks=2, layers_elsewhere=1, calls=calls)
    graphs = te_graphs.TransformerEngineGraphs([wrapped(Model(position_embedding_type="rope"))],
                                               SimpleNamespace(cuda_graph_warmup_steps=1), SEQ, BATCH,
                                               optimizer=None, toggle_forward_pre_hook=False)
    for step in range(3):
        graphs.before_step(step)
    assert calls == meets and graphs.graph_count() == 0


def test_no_layer_of_the_scope_on_any_pipeline_rank_is_refused(monkeypatch):
    monkeypatch.setattr(te_graphs, "TECudaGraphHelper", helper_of([], []))
    pipeline(monkeypatch, ranks=2, layers_elsewhere=0)
    config = SimpleNamespace(cuda_graph_warmup_steps=1, cuda_graph_scope=[SimpleNamespace(name="mlp")],
                             cuda_graph_modules=[SimpleNamespace(name="mlp")])
    with pytest.raises(ValueError, match="model.cuda_graph_modules=.'mlp'. on any pipeline rank"):
        te_graphs.TransformerEngineGraphs([wrapped(Model())], config, SEQ, BATCH, optimizer=None,
                                          toggle_forward_pre_hook=False)


def test_unwrapped_reaches_the_model():
    model = Model()
    assert unwrapped(wrapped(model)) is model and unwrapped(model) is model


def test_a_failed_build_is_reported_where_releasing_the_half_built_engine_hangs(monkeypatch):
    """A rank whose peer failed mid-build can wait in destroy_process_group without end: the engine waits for its
    release a bounded time, then raises the build's failure, which bridge.run writes into result.json."""
    import threading
    import time

    import bridge
    from bridge.engines.megatron import engine

    def fail(self):
        raise RuntimeError("the build failed")

    never = threading.Event()
    monkeypatch.setattr(engine, "RELEASE_TIMEOUT_S", 0.2)
    monkeypatch.setattr(engine.MegatronEngine, "_build", fail)
    monkeypatch.setattr(engine.MegatronEngine, "close", lambda self: never.wait(30))  # without the bound: 30 s
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the build failed"):
        engine.MegatronEngine(bridge.load(["recipe=llama/tiny"]))
    assert time.monotonic() - started < 5
    never.set()
