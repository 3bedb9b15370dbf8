"""pipeline_rank_layers (bridge.config.model_facts), which the rule te_graphs_every_pipeline_rank reads, places each
pipeline rank's decoder layers as the installed megatron-core does: the count and offset of each virtual stage
(transformer_block.get_num_layers_to_build, transformer_layer.get_transformer_layer_offset), and a layout string
read as PipelineParallelLayerLayout reads it."""

import itertools
from types import SimpleNamespace

import pytest

from bridge.config.model_facts import layout_stages, pipeline_rank_layers

pytest.importorskip("megatron.core")

SPLITS = [SimpleNamespace(num_layers=layers, pipeline_model_parallel_size=ranks,
                          virtual_pipeline_model_parallel_size=chunks, num_layers_in_first_pipeline_stage=first,
                          num_layers_in_last_pipeline_stage=last, account_for_embedding_in_pipeline_split=embedding,
                          account_for_loss_in_pipeline_split=loss, pipeline_model_parallel_layout=None,
                          mtp_num_layers=None)
          for layers, ranks, chunks, first, last, embedding, loss in itertools.product(
              (2, 4, 6, 8, 12), (2, 3, 4), (None, 2, 3), (None, 1, 2, 4), (None, 1, 2, 4), (False, True), (False, True))
          if not ((first or last) and (embedding or loss))]  # megatron-core refuses both, as the pipeline_split rule


def megatron_rank_layers(model):
    """Each rank's decoder layers by megatron-core's own arithmetic, or None where it refuses the split."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    chunks = model.virtual_pipeline_model_parallel_size
    ranks = []
    for rank in range(model.pipeline_model_parallel_size):
        layers = []
        for chunk in range(chunks) if chunks else [None]:
            try:
                count = get_num_layers_to_build(model, vp_stage=chunk, pp_rank=rank)
                first = get_transformer_layer_offset(model, vp_stage=chunk, pp_rank=rank)
            except (AssertionError, ZeroDivisionError):  # the latter: interleaved, first and last set, no middle
                return None
            layers.extend(range(first, first + count))
        ranks.append(tuple(layers))
    placed = sorted(layer for layers in ranks for layer in layers)
    return ranks if placed == list(range(model.num_layers)) else None


def test_every_split_megatron_core_accepts_places_the_layers_as_it_does():
    kinds = set()
    for model in SPLITS:
        expected = megatron_rank_layers(model)
        if expected is None:
            continue
        assert [rank.decoder for rank in pipeline_rank_layers(model)] == expected, vars(model)
        uneven = model.num_layers_in_first_pipeline_stage or model.num_layers_in_last_pipeline_stage
        accounted = model.account_for_embedding_in_pipeline_split or model.account_for_loss_in_pipeline_split
        kinds.add(("uneven" if uneven else "accounted" if accounted else "even",
                   bool(model.virtual_pipeline_model_parallel_size)))
    assert len(kinds) == 6  # each split megatron-core knows, with and without virtual stages, was compared


@pytest.mark.parametrize("layout", ["Et*4|mL", "Ettt|(tt|)*29,m|L", "E|t*3|t*3|tmL", "(t|)*4", "Et|tt|tt|t,mL"])
def test_a_layout_reads_as_megatron_core_reads_it(layout):
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    symbols = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}
    theirs = ["".join(symbols[layer.name] for layer in stage)
              for stage in PipelineParallelLayerLayout.parse_str_to_list(layout)]
    assert layout_stages(layout) == theirs


def test_the_mtp_block_sits_on_the_last_rank_or_where_the_layout_puts_it():
    model = SimpleNamespace(**{**vars(SPLITS[0]), "num_layers": 4, "mtp_num_layers": 1})
    assert [rank.mtp for rank in pipeline_rank_layers(model)] == [0, 1]
    laid_out = SimpleNamespace(**{**vars(model), "pipeline_model_parallel_size": 3,
                                  "pipeline_model_parallel_layout": "Ett|tt|mL"})
    assert [(rank.decoder, rank.mtp) for rank in pipeline_rank_layers(laid_out)] == [((0, 1), 0), ((2, 3), 0),
                                                                                    ((), 1)]
