"""Every GPU differential record replayed against today's catalogue (plan equals run, on the GPU, kept): each run
the plan accepted there is planned again for the machine it ran on (its GPUs, as many as each run had, with the
record's megatron-core and Transformer Engine). A run that completed must still be accepted, or a rule has become
stricter than the GPU; a run that crashed after its plan accepted it, or completed with losses that left its eager
twin's (it trained something else), must now be refused, or have been made to train (TRAINS_NOW), or be shown by a
witness pair to differ by rounding a setting amplifies (AMPLIFIED_ROUNDING), or wait with the run that will decide it
(UNDECIDED).

Slow (about two minutes of plans on one core): `pytest -m slow tests/test_gpu_records.py`."""

from typing import Dict, Tuple

import pytest

import bridge
from perf.preloaded import SHARED_GPU_FAILURES
from tests.gpu_witnesses import RESULTS, read_record, record_machine

# The records repeat their runs' overrides (a run and its eager twin, one block and the next): each composition is
# made once a process (conftest.py).
pytestmark = pytest.mark.usefixtures("composed_once")

RECORDS = sorted(path.relative_to(RESULTS).as_posix() for path in RESULTS.glob("*/mcore-*/gpu_differential*.json*"))
WITNESS_RECORDS = sorted(path.relative_to(RESULTS).as_posix() for path in RESULTS.glob("*/mcore-*/gpu_witnesses*.json"))
"""Records of witness cases alone (--count 0 --witnesses)."""
TRAINS_NOW: Dict[Tuple[str, int], str] = {
    (record, index): "graphbridge handed megatron-core a copy of quick_gelu, and its checks compare by identity; "
                     "translation hands its own now (witness gpt_oss_bias_activation_fusion, completed since)"
    for record, index in (("h100/mcore-0.16.1/gpu_differential_610e521.json.gz", 96),
                          ("h100/mcore-0.16.1/gpu_differential_610e521.json.gz", 219))
} | {
    (record, index): "a pipeline rank with no layer of the TE scope (deepseek/tiny's MoE stage under te_mlp at PP2): "
                     "the engine refused to build graphs there while the other rank waited; it meets their capture "
                     "now (witnesses te_mlp_pp2_moe_stage, te_mlp_pp2_moe_stage_vpp and timeout_b15bb2a_320)"
    for record, index in (("h200/mcore-0.16.1/gpu_differential_2gpu_b15bb2a.json.gz", 320),
                          *(("h200/mcore-0.19.2/gpu_differential_2gpu_4ebf167.json.gz", run)
                            for run in (548, 679, 910, 945)))
}
"""Crashes after an accepting plan that no rule refuses, because graphbridge now makes the configuration train."""
AMPLIFIED_ROUNDING: Dict[Tuple[str, int], str] = {
    (record, index): "optimizer.adam_beta2=0.0 makes Adam step by the gradient's sign (its second moment is the last "
                     "squared gradient), so rounding differences near zero gradients become whole steps: decided by the "
                     "witness pair at c483bbc (--witness-twins, llama/tiny local_layer fp8_sc on an H100). On 0.16.1 "
                     "the graph rounds differently from eager at the default beta2 too (gap 0.00027, inside the "
                     "0.002 rounding tolerance), and beta2=0 amplified that to 0.036 (run 1713 against twin 1721); "
                     "on 0.19.2, where graph and eager agree bit for bit, both pairs matched. The graph trains the same "
                     "model; nothing to refuse"
    for record, index in (("h200/mcore-0.16.1/gpu_differential_schema_9901178.json", 1589),
                          ("h100/mcore-0.16.1/gpu_differential_schema_c483bbc.json", 1713))
}
"""Runs that left their eager twin because a setting amplifies the rounding by which a graph differs from eager
within the tolerance, shown by a witness pair trained at that setting and at the default, each beside its twin."""
UNDECIDED: Dict[Tuple[str, int], str] = {}
"""Crashes after an accepting plan, or runs that left their eager twin, whose cause no record shows yet, each with what
will decide it (b15bb2a's run 320, a hang, was decided: it hung as five runs of 4ebf167 did, each with a pipeline rank
that had no layer to graph, TRAINS_NOW; 9901178's run 1589 by its witness pair, AMPLIFIED_ROUNDING)."""
REFUSES_WHAT_TRAINS = {
    **{rule: "with the block inference scope (megatron-core 0.19) local whole-layer graphs capture nothing, so the "
             "dispatch's host syncs never meet a capture: gpt_oss/tiny trained eagerly so (run 1728 of "
             "h200/mcore-0.19.2/gpu_differential_schema_9901178.json), which inference_block_training refuses; "
             "wherever a graph holds the dispatch the capture fails (their witnesses)"
       for rule in ("allgather_dispatch_capture", "dropless_moe_capture")},
    "packed_sequence_micro_batch": "graphbridge's packed data makes each micro-batch one row whatever "
                                   "train.micro_batch_size says (bridge.data), so packed_micro_batch_2 trained on "
                                   "both releases (h100 gpu_witnesses.json at eae46ab) on half the tokens its config "
                                   "names; Megatron-Bridge 0.3.1 refuses the same configuration, and the fix trains "
                                   "those tokens",
    "legacy_flags": "an older spelling beside the canonical one is refused rather than one of them picked silently "
                    "(the config model); deepseek/tiny with te_attn and model.external_cuda_graph=true trained on the "
                    "canonical fields (run 1729 of h200/mcore-0.16.1/gpu_differential_schema_9901178.json)",
    **{rule: "two explicit values in conflict, or one the run cannot honour, are refused rather than one of them "
             "dropped silently (the config model): each trained on the value megatron-core kept, with the other "
             "unused (e6aa918, gpu_differential_schema_e6aa918.json on an H100: runs 1734 with model.cuda_graph_scope "
             "beside the modules, 1764 with model.seq_length 257 beside the data's 256, 1755 with "
             "model.recompute_num_layers without full recompute, 1737 with a mamba module the model has no layer "
             "for, 1733 and 1768 with fields 0.16.1 lacks)"
       for rule in ("legacy_scope", "static_shapes", "recompute_settings", "mamba_layers", "version_fields")},
    "config_choices": "a name the release lacks is refused rather than passed on to be ignored (the config model, as "
                      "version_fields): llama/tiny with model.moe_router_score_function=sqrtsoftplus trained on 0.16.1 "
                      "only because a dense model never runs the router that raises on it (run 1726 of "
                      "h100/mcore-0.16.1/gpu_differential_schema_c483bbc.json)",
    "packed_sequence_scope": "llama/tiny te_layer and qwen/tiny te_attn with packed sequences completed on 0.16.1 "
                             "(runs 1767 and 1750 of h100/mcore-0.16.1/gpu_differential_schema_b0ccb80.json), but a "
                             "layer graph is captured without packed_seq_params and a Transformer Engine graphed "
                             "callable drops at replay the keyword arguments it was not captured with (TE 2.10 "
                             "pytorch/graph.py), so their attention ran across the packed sequences' boundaries: "
                             "it trains something else",
    "te_rng_tracker": "te_mlp on llama/tiny (fp8_sc, no dropout) trained on 0.16.1 with megatron-core's tracker (run "
                      "1768 of h100/mcore-0.16.1/gpu_differential_schema_e6aa918.json), but Transformer Engine refuses "
                      "any other tracker where a captured layer draws random numbers (witness: run 711 of the h100 "
                      "0.19.2 gpu_differential.json), and the tracker is derived on for every graph unless the user "
                      "turns it off: the refusal stays until a record shows which captures need it on each release",
    "inference_block_training": "it trains, but eagerly: with the block inference scope megatron-core 0.19 gives the "
                                "layers no training graph, so cuda_graph=local_layer would capture nothing (gpt_oss/tiny, "
                                "run 1728 of h200/mcore-0.19.2/gpu_differential_schema_9901178.json)",
    "optimizer_graph_distributed": "at one GPU graphbridge's capturable AdamW steps the single shard whole, so it "
                                   "trains, but with whole, unsharded optimizer state, and it shards nothing at two "
                                   "GPUs or more; megatron-core 0.19's own optimizer graph does (0.16.1 run 1428 of the "
                                   "h100 gpu_differential_e15f81f.json.gz)",
    "mla_recompute_in_layer_graphs": "attention graphs alone with mla_up_proj recomputed train at one micro-batch a "
                                     "step (deepseek_v3_gb200_recompute_attn in gpu_witnesses_2gpu_cfa782d.json and "
                                     "gpu_differential_2gpu_5bba762.json.gz) and at two (0.19.2 run 1754 of the h200 "
                                     "gpu_differential_ec177b3.json.gz), but the same at four micro-batches aborted "
                                     "on both releases (mla_up_proj_recompute_attn_four_microbatches, 5bba762; 0.16.1 "
                                     "run 283 of the h100 gpu_differential.json), as did the GB200 preset's graphs at "
                                     "one: real steps have more micro-batches than two",
    "moe_norm_recompute_in_layer_graphs":
        "bf16 router graphs (te_moe_router, alltoall) trained at one GPU with it unasked (witness "
        "moe_norm_recompute_bf16_te_moe_router, 24488cb and c236fc3, both releases), but bf16 router graphs failed at "
        "two (0.19.2 runs 364 at PP2 and 619 at DP2 of h200 gpu_differential_2gpu_c236fc3.json.gz: an illegal address, "
        "and four gradients that never arrived); at one GPU too, four of 95 gradients never arrived once the "
        "overlapped reduce checked for them (witness moe_norm_recompute_bf16_te_moe_router_overlap_grad_reduce, "
        "h200 gpu_differential_0d3b80c.json.gz, begun at 1ab7470, both releases): the runs that completed had nothing "
        "to check for them",
    "optimizer_in_graph": "with cuda_graph=none nothing is captured: 0.16.1 run 1762 of the h200 "
                          "gpu_differential_4a94902.json.gz stepped graphbridge's capturable AdamW eagerly, so the "
                          "option the user set did nothing; two explicit values in conflict are a violation with its "
                          "fix, not a silent no-op",
    "expert_bias": "one-by-one experts with biases failed at the first forward pass in bf16, eagerly and under every "
                   "graph choice on both specs, on megatron-core 0.19.2 with Transformer Engine 2.20.2 (H100, da54611 "
                   "and daa2b42), but with Transformer Engine 2.10.0 they trained on both releases in bf16 and fp8_cs, "
                   "dropless and drop-and-pad (witnesses sequential_expert_bias_*, runs 1752-1755 of the h200 "
                   "gpu_differential.json begun at e925668, of gpu_differential_0433e38.json.gz and 1751-1754 of "
                   "gpu_differential_0dcdb17.json.gz; 0.19.2 run "
                   "1749 of gpu_differential_4a94902.json.gz under "
                   "te_layer): the refusal stays until a GPU run of those witnesses on Transformer Engine 2.20.2 says "
                   "whether it narrows to the releases where they fail",
}
"""Rules that stay although a configuration they refuse trained on a GPU with them unasked, and why."""


@pytest.mark.slow
@pytest.mark.parametrize("record", RECORDS)
def test_what_a_gpu_trained_is_accepted_and_what_crashed_is_refused_or_trains_now(record):
    content = read_record(record)
    summary = content["summary"]
    machine = record_machine(summary)
    trained_otherwise = trained_otherwise_than_eager(summary)
    refused_completed, accepted_crashed = {}, {}
    for run in content["runs"]:
        if run["kind"] not in ("accepted", "eager_twin") or run["status"] is None:
            continue
        rules = sorted({violation.rule for violation in bridge.plan(run["overrides"], machine=machine).violations})
        trained = run["status"] == "completed" and run["index"] not in trained_otherwise
        if trained and rules:
            refused_completed[run["index"]] = rules
        shared_gpu = any(text in (run["error"] or "") for text in SHARED_GPU_FAILURES)  # the other runs' fault
        explained = (record, run["index"]) in {**TRAINS_NOW, **AMPLIFIED_ROUNDING, **UNDECIDED}
        if not trained and not rules and not shared_gpu and not explained:
            accepted_crashed[run["index"]] = run["error"] or "its losses left its eager twin's"
    assert not refused_completed, f"refused now, yet trained on the GPU: {refused_completed}"
    assert not accepted_crashed, f"crashed or trained otherwise on the GPU, yet accepted now: {accepted_crashed}"


def test_a_rule_whose_refused_configuration_trained_with_it_unasked_no_longer_refuses_it_or_says_why_it_stays():
    # The refused samples and witnesses a record trained with rules unasked: few, so not slow.
    stays = {}
    for record in RECORDS + WITNESS_RECORDS:
        content = read_record(record)
        machine, otherwise = record_machine(content["summary"]), trained_otherwise_than_eager(content["summary"])
        for run in content["runs"]:
            if run["status"] == "completed" and run["index"] not in otherwise and run.get("unchecked_rules"):
                refusing = {violation.rule for violation in bridge.plan(run["overrides"], machine=machine).violations}
                stays.update({rule: (record, run["index"]) for rule in refusing & set(run["unchecked_rules"])})
    assert set(stays) <= set(REFUSES_WHAT_TRAINS), stays


def test_every_exception_names_a_recorded_crash_or_a_run_that_left_its_eager_twin():
    for (record, index), why in {**TRAINS_NOW, **AMPLIFIED_ROUNDING, **UNDECIDED}.items():
        content = read_record(record)
        run = next(run for run in content["runs"] if run["index"] == index)
        left_twin = index in trained_otherwise_than_eager(content["summary"])
        assert (run["status"] not in (None, "completed") or left_twin) and why


def trained_otherwise_than_eager(summary) -> set:
    """The graphed runs of a record whose losses left their eager twin's beyond the harness's tolerance."""
    return {pair["graphed"] for pair in summary["eager_twins"]["differ"]}
