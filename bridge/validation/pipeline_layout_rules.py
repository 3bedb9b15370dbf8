"""The pipeline layout string (`model.pipeline_model_parallel_layout`, e.g. DeepSeek-V3's "Et|(tt|)*30mL"): which
layers each pipeline stage builds. TransformerConfig parses and checks it at model build, on both releases alike
(megatron/core/transformer/pipeline_parallel_layer_layout.py is the same in 0.16.1 and 0.19.2); before this rule a
layout that miscounted the layers or the stages planned VALID and failed there.

The grammar: stages split by `|`; in a stage `E` is the embedding, `t` a transformer layer, `m` an MTP layer, `L`
the loss; `x*n` repeats one character and `(...)*n` a group, stage bars included; commas are cosmetic. Stages run
over PP first: stage i belongs to pipeline rank i mod PP, virtual stage i div PP."""

import re
from typing import List, Optional

from bridge.validation.graph_facts import IMPL, LOCAL, impl_of
from bridge.validation.registry import rule, violation

LAYOUT = "model.pipeline_model_parallel_layout"
LAYER_CHARACTERS = "ELtm"
GROUP_REPEAT = re.compile(r"\(([^)]+)\)\*(\d+)")
CHARACTER_REPEAT = re.compile(r"(.)\*(\d+)")
MAX_REPEAT = 4096
"""The largest repeat a layout may write (megatron-core's recipes repeat at most 61 layers), checked before it is
written out."""


def layout_stages(layout: str) -> List[str]:
    """The layout's stages in order, repetitions written out (groups first, then single characters, as
    megatron-core unrolls them)."""
    text = layout.replace(",", "")
    for pattern in (GROUP_REPEAT, CHARACTER_REPEAT):
        text = pattern.sub(lambda match: match.group(1) * int(match.group(2)), text)
    return text.split("|")


@rule("pipeline_layout",
      rejects="a `model.pipeline_model_parallel_layout` that megatron-core refuses at model build: a character other "
              "than E, t, m, L, a stage count that is not PP x VP, the embedding not first or the loss not last (or "
              "either not exactly once), a count of t other than `model.num_layers` or of m other than "
              "`model.mtp_num_layers`, or an MTP layer before a transformer layer or outside one rank's last virtual "
              "stage",
      fix="a layout with num_layers t's and mtp_num_layers m's over PP x VP stages, E first and L last, or drop it "
          "(null) for the even split")
def pipeline_layout(cfg, target):
    model = cfg.model
    if not model.pipeline_model_parallel_layout or model.pipeline_model_parallel_size < 1:
        return None  # positive_sizes reports a size below 1
    found = layout_problem(model)
    if found is None:
        return None
    problem, keys = found
    return violation("pipeline_layout", [LAYOUT, *keys], f"{LAYOUT}={model.pipeline_model_parallel_layout!r}: "
                                                         f"{problem}; change the layout or drop it (=null)")


def layout_problem(model):
    """What megatron-core would refuse in the model's layout, and the keys beside the layout it concerns."""
    repeats = [int(count) for count in re.findall(r"\*(\d+)", model.pipeline_model_parallel_layout)]
    if max(repeats, default=0) > MAX_REPEAT:
        # Written out, such a layout is gigabytes long (`t*2000000000`), and no model has that many layers.
        return f"a repeat count above {MAX_REPEAT} places more layers than a model has", []
    stages = layout_stages(model.pipeline_model_parallel_layout)
    unknown = sorted({character for stage in stages for character in stage} - set(LAYER_CHARACTERS))
    if unknown:
        return f"{', '.join(map(repr, unknown))} is no layer: use E (embedding), t (layer), m (MTP layer), L (loss)", []
    pp, vp = model.pipeline_model_parallel_size, model.virtual_pipeline_model_parallel_size
    if len(stages) % pp:
        return f"{len(stages)} stages do not divide over PP={pp}", ["model.pipeline_model_parallel_size"]
    detected = len(stages) // pp
    if (vp or 1) != detected:
        return (f"{len(stages)} stages over PP={pp} are {detected} virtual stages each; set "
                f"model.virtual_pipeline_model_parallel_size={detected if detected > 1 else 'null'}",
                ["model.virtual_pipeline_model_parallel_size"])
    return layer_count_problem(model, stages) or mtp_placement_problem(model, stages, pp)


def layer_count_problem(model, stages: List[str]) -> Optional[tuple]:
    layers = "".join(stages)
    if not layers or layers[0] != "E" or layers[-1] != "L" or layers.count("E") != 1 or layers.count("L") != 1:
        return "the embedding E must come once, first, and the loss L once, last", []
    for layer, key, wanted in (("t", "model.num_layers", model.num_layers),
                               ("m", "model.mtp_num_layers", model.mtp_num_layers or 0)):
        if layers.count(layer) != wanted:
            kind = "transformer" if layer == "t" else "MTP"
            return f"it places {layers.count(layer)} {kind} layers, and {key}={getattr(model, key[6:])}", [key]
    if "m" in layers and "t" in layers[layers.index("m"):]:
        return "every transformer layer t must come before the MTP layers m", []
    return None


def mtp_placement_problem(model, stages: List[str], pp: int) -> Optional[tuple]:
    """megatron-core keeps the MTP layers together, in the last virtual stage of one pipeline rank."""
    virtual = len(stages) // pp
    for rank in range(pp):
        own = [stages[chunk * pp + rank] for chunk in range(virtual)]
        if any("m" in stage for stage in own[:-1]):
            return "an MTP layer m must sit in the last virtual stage of its pipeline rank", []
        if "m" in own[-1] and own[-1].count("m") != model.mtp_num_layers:
            return "the MTP layers m must all sit in one stage", []
    return None


@rule("local_graphs_layerless_stage", engine="megatron",
      rejects="local per-layer graphs (`model.cuda_graph_impl=local`) where the pipeline layout leaves a pipeline rank "
              "without a transformer layer",
      fix="a layout that gives every pipeline rank a t, or `cuda_graph=te_layer`")
def local_graphs_layerless_stage(cfg, target):
    # graphbridge's local-graph engine looks for a CudaGraphManager on its own rank's layers and refuses to train
    # without one (bridge/engines/megatron/local.py); Transformer Engine's graphs count the whole pipeline instead.
    model = cfg.model
    if impl_of(cfg) != LOCAL or not model.pipeline_model_parallel_layout or pipeline_layout_problem(model):
        return None
    stages, pp = layout_stages(model.pipeline_model_parallel_layout), model.pipeline_model_parallel_size
    empty = [rank for rank in range(pp) if not any("t" in stage for stage in stages[rank::pp])]
    if not empty:
        return None
    return violation(
        "local_graphs_layerless_stage", [IMPL, LAYOUT],
        f"{LAYOUT}={model.pipeline_model_parallel_layout!r} gives pipeline rank {empty[0]} no transformer layer, and "
        "local graphs need one on every rank; give every rank a t, or use cuda_graph=te_layer",
    )


def pipeline_layout_problem(model) -> bool:
    """Whether the layout itself is refused (pipeline_layout reports it)."""
    return model.pipeline_model_parallel_size < 1 or layout_problem(model) is not None
