"""How cuda_graph=auto decides from its probe's timings (synthesized here; the probe that times them:
test_auto_probe.py): the fastest graph choice only beyond the probe's noise, a failed one never, the clearly slower
stopped after screening, screening only where it pays, a probe that kept eager but cannot rule out a gain over 3 %
timed again in pairs until every run of the two settles it, and among graph choices the probe cannot tell apart the
one that captures all the fastest does and more; every committed probe decides today as it did."""

import json
from dataclasses import fields, replace
from typing import Optional

import pytest

from bridge.auto.decision import (Measurement, confirmation_order, confirmation_settled, decide, decide_confirmed,
                                  screening_pays, stopped_early, survivors, worth_confirming)
from tests.auto_probe_kit import SCOPES
from tests.gpu_witnesses import RESULTS


def timings(medians: dict, spread: float = 0.2, steps: Optional[int] = None) -> list:
    """Measurements in probe order (eager first and last), each of ``steps`` timed steps (None: unknown, as in
    records from before the probe kept them); a median of None is a failed job."""
    eager = medians["none"]
    graphs = [(choice, median) for choice, median in medians.items() if choice != "none"]
    return [Measurement(choice, "completed" if median is not None else "failed", median, spread if median else None,
                        steps=steps) for choice, median in [("none", eager[0]), *graphs, ("none", eager[1])]]


@pytest.mark.parametrize("medians, spread, chosen", [
    ({"none": (10.0, 10.1), "full_iteration": 9.0, "te_attn": 8.0}, 0.2, "te_attn"),  # the fastest, beyond noise
    ({"none": (10.0, 10.6), "te_attn": 9.6}, 0.2, "none"),  # within the noise between processes (0.6 ms)
    ({"none": (10.0, 10.0), "te_attn": 9.0}, 2.5, "none"),  # within the steps' own scatter (2.5 ms wide)
    ({"none": (10.0, 10.1), "te_attn": 10.5}, 0.2, "none"),  # slower than eager
    ({"none": (10.0, 10.1), "te_layer": None, "te_attn": 8.0}, 0.2, "te_attn"),  # the failed one is left out
    ({"none": (10.0, None), "te_attn": 8.0}, 0.2, "te_attn"),  # one eager run is enough to compare with
    ({"none": (None, None), "te_attn": 8.0}, 0.2, "none"),  # nothing to beat: eager
])
def test_the_fastest_graph_choice_is_kept_only_beyond_the_probes_noise(medians, spread, chosen):
    decision = decide(timings(medians, spread))
    assert decision.chosen == chosen, decision.reason


def dropless_probe(eager: tuple, contender: float, widths: tuple, steps) -> list:
    """The dropless Qwen3 proxy's probe as committed: eager first and last around te_attn_moe_router, each run's
    steps ``widths`` wide (eager's two, then the contender's), ``steps`` timed a run."""
    return [Measurement("none", "completed", eager[0], widths[0], steps=steps),
            Measurement("te_attn_moe_router", "completed", contender, widths[2], steps=steps),
            Measurement("none", "completed", eager[1], widths[1], steps=steps)]


@pytest.mark.parametrize("eager, contender, widths, steps, chosen", [
    # b217322: a 62 ms lead, three errors of the medians' difference 31 ms, eager's processes 7.7 ms apart
    ((404.93, 397.24), 335.1, (90.4, 91.31, 70.22), 30, "te_attn_moe_router"),
    # the same runs where the count of steps is unknown: half the widths (81 ms) keep eager
    ((404.93, 397.24), 335.1, (90.4, 91.31, 70.22), None, "none"),
    # the same widths over 3 steps a run: three errors of the difference come to 97 ms
    ((404.93, 397.24), 335.1, (90.4, 91.31, 70.22), 3, "none"),
    # bdbbf68: eager's two processes 92 ms apart, more than the contender's lead over the faster (24 ms)
    ((378.43, 470.67), 354.28, (93.36, 63.53, 93.68), 30, "none"),
])
def test_a_lead_must_clear_the_errors_of_the_two_medians_and_the_noise_between_processes(eager, contender, widths,
                                                                                         steps, chosen):
    decision = decide(dropless_probe(eager, contender, widths, steps))
    assert decision.chosen == chosen, decision.reason


# --- a lead inside the noise, timed again -------------------------------------------------------------------

B5C423D = [Measurement("none", "completed", 420.48, 91.36, steps=31),
           Measurement("te_attn", "completed", 428.77, 71.66, steps=30),
           Measurement("te_attn_moe_router", "completed", 380.24, 82.62, steps=30),
           Measurement("te_moe_router", "completed", 434.61, 87.90, steps=30),
           Measurement("none", "completed", 497.64, 115.38, steps=31)]
"""The dropless Qwen3 proxy's probe at b5c423d (H200, 0.19.2): the host slowed while it ran, eager's two runs
landed 77 ms apart, and te_attn_moe_router's 40 ms lead lay inside that."""


@pytest.mark.parametrize("probe, contender", [
    (B5C423D, "te_attn_moe_router"),  # 9.6 % ahead of eager's faster run, inside the 77 ms between eager's two
    # b217322: the lead cleared the noise, so the decision is already the graph choice
    (dropless_probe((404.93, 397.24), 335.1, (90.4, 91.31, 70.22), 30), None),
    # llama32_1b at 3a791f9: local_layer 0.5 % ahead inside the noise, under the 3 % worth timing again
    ([Measurement("none", "completed", 1308.4, 30.0, steps=30), Measurement("local_layer", "completed", 1301.7, 30.0,
                                                                            steps=30),
      Measurement("none", "completed", 1309.4, 30.0, steps=30)], None),
    # slower than eager's faster run but between its two: the probe cannot rule out a gain over 3 %
    (timings({"none": (10.0, 13.0), "te_attn": 10.5}), "te_attn"),
    (timings({"none": (10.0, 10.1), "te_attn": 10.5}), None),  # slower than eager beyond the noise: nothing to confirm
    (timings({"none": (None, None), "te_attn": 8.0}), None),  # eager failed: nothing to compare with
])
def test_a_probe_is_timed_again_only_where_it_cannot_rule_out_a_gain_over_3_percent(probe, contender):
    found = worth_confirming(probe, decide(probe))
    assert (found.choice if found else None) == contender


def confirmed(probe: list, contender: str, contender_ms: tuple, eager_ms: tuple) -> list:
    """``probe`` and its confirming round (confirmation_order), the runs' medians given in that order."""
    medians = iter(value for pair in zip(contender_ms, eager_ms) for value in pair)
    return [*probe, *(Measurement(choice, "completed" if ms else "failed", ms, 80.0 if ms else None, steps=30)
                      for choice, ms in zip(confirmation_order(contender), medians))]


@pytest.mark.parametrize("contender_ms, eager_ms, chosen", [
    # the round's own processes at b5c423d (te_attn_moe_router 341.1, te_moe_router 353.1, eager 458.5) and another
    # eager process: four eager runs average 465.4 ms, the contender's three 358.4; the t bound is 75.2 ms
    ((341.1, 353.9), (458.5, 485.0), "te_attn_moe_router"),
    ((395.0, 410.0), (430.0, 415.0), "none"),  # the lead shrinks to 45.7 ms against a bound of 80.2 ms
    ((None, None), (458.5, 485.0), "none"),  # the confirming runs of the contender failed
])
def test_after_the_confirming_round_every_run_of_the_two_decides(contender_ms, eager_ms, chosen):
    decision = decide_confirmed(confirmed(B5C423D, "te_attn_moe_router", contender_ms, eager_ms),
                                "te_attn_moe_router")
    assert decision.chosen == chosen, decision.reason


def test_the_confirmed_noise_is_the_one_sided_99_percent_t_bound_of_the_difference_between_the_means():
    probe = [Measurement("none", "completed", 10.0, 0.1, steps=30), Measurement("te_attn", "completed", 9.0, 0.1,
                                                                                steps=30),
             Measurement("none", "completed", 12.0, 0.1, steps=30)]
    decision = decide_confirmed(confirmed(probe, "te_attn", (9.5, 8.5), (11.0, 11.0)), "te_attn")
    # eager 10, 12, 11, 11 (mean 11, squares 2); te_attn 9, 9.5, 8.5 (mean 9, squares 0.5); 5 degrees of freedom
    error = (2.5 / 5 * (1 / 4 + 1 / 3)) ** 0.5
    assert decision.eager_ms == 11.0 and decision.noise_ms == pytest.approx(3.365 * error)
    assert decision.chosen == "te_attn"
    assert "9.00 ms a step over 3 runs against eager's 11.00 ms over 4" in decision.reason


@pytest.mark.parametrize("contender_ms, eager_ms, chosen, shown", [
    # eager 10.5 +- 0.49 over four processes, te_attn 9.6 over three: 0.9 ms ahead inside the 1.27 ms bound, which
    # leaves it at most 0.37 ms behind eager, less than one process's median scatters
    ((9.0, 10.2, 9.6), (10.0, 11.0, 10.5, 10.5), "te_attn", "trails eager by at most 0.37 ms, within the 0.49 ms"),
    # 0.7 ms ahead: at the bound 0.57 ms behind, beyond that scatter
    ((9.2, 10.4, 9.8), (10.0, 11.0, 10.5, 10.5), "none", "could trail eager by more than the 0.49 ms"),
    ((10.6, 10.4), (10.0, 11.0, 10.5), "none", "no lead, so training eagerly"),
], ids=["ahead-within-the-noise", "could-trail-beyond-it", "behind"])
def test_a_lead_inside_the_bound_is_taken_where_even_at_the_bound_it_trails_eager_by_no_more_than_one_process_scatters(
        contender_ms, eager_ms, chosen, shown):
    runs = [Measurement("none", "completed", ms, 0.2, steps=30) for ms in eager_ms] + [
        Measurement("te_attn", "completed", ms, 0.2, steps=30) for ms in contender_ms]
    decision = decide_confirmed(runs, "te_attn")
    assert decision.chosen == chosen and shown in decision.reason, decision.reason
    assert confirmation_settled(runs, "te_attn") is (chosen == "te_attn")


@pytest.mark.parametrize("contender_ms, eager_ms, settled", [
    ((10.0, 10.05, 9.95), (10.0, 10.1, 9.9, 10.0), True),  # no lead, and the bound (0.18 ms) leaves no 3 % gain: eager
    ((9.0, 9.1), (10.0, 10.2, 9.9), True),  # a 1.0 ms lead beyond the bound of 0.54 ms: the contender
    ((9.6, 9.7), (10.0, 10.2, 9.9), False),  # 0.38 ms ahead, inside the bound, which leaves room for a 3 % gain: go on
], ids=["equal", "ahead", "undecided"])
def test_the_confirming_round_stops_once_its_runs_settle_it_either_way(contender_ms, eager_ms, settled):
    runs = [Measurement("none", "completed", ms, 0.2, steps=30) for ms in eager_ms] + [
        Measurement("te_attn", "completed", ms, 0.2, steps=30) for ms in contender_ms]
    assert confirmation_settled(runs, "te_attn") is settled
    assert confirmation_settled(runs[:1] + runs[-1:], "te_attn")  # too few completed to weigh: nothing to wait for


def committed_probes():
    """(where, the probe's record, what it chose) of every probe the GPU runs committed: each suite round's auto
    variant that probed, and gpu_check.sh auto's records."""
    for path in sorted(RESULTS.rglob("*.json")):
        record = json.loads(path.read_text())
        for number, round_ in enumerate(record.get("round_records", [])):
            auto = round_["rows"].get("auto", {})
            if auto.get("auto_probe"):
                yield f"{path.relative_to(RESULTS)} round {number + 1}", auto["auto_probe"], auto["auto_chosen"]
        auto = record.get("auto") or {}  # a run's result.json: gpu_check.sh auto's records
        if auto.get("source") == "probe":
            yield str(path.relative_to(RESULTS)), auto, auto["chosen"]


MEASUREMENT_FIELDS = {field.name for field in fields(Measurement)}
CONFIRMED_IN = {"superseded/qwen3_moe_dropless_h200_mcore0.19.2_bdbbf68.json round 2",
                "superseded/qwen3_moe_dropless_h200_mcore0.19.2_bdbbf68.json round 3",
                "superseded/qwen3_moe_dropless_h200_mcore0.19.2_b5c423d.json round 1",
                "superseded/qwen3_moe_dropless_h200_mcore0.19.2_3dfcfe6.json round 1",
                "h200/mcore-0.19.2/auto_probe_qwen3_moe_dropless_again.json",
                "superseded/qwen3_moe_dropless_h100_mcore0.19.2_448bff8.json round 1",
                "qwen3_moe_dropless_h100_mcore0.19.2.json round 1"}
"""The committed probes that today's rule would time again, unable to rule out a gain over 3 %: the dropless Qwen3
proxy's, the host-bound row whose eager runs moved by up to 24 % within a probe (at cc26cf6 by 19 %, every graph
choice between them)."""
DECIDED_OTHERWISE_TODAY = {"superseded/qwen3_moe_dropless_h200_mcore0.19.2_3dfcfe6.json round 1": "te_attn_moe_router"}
"""The committed probes that today's rule decides otherwise, and how: at 3dfcfe6 the confirming round kept eager for
te_attn_moe_router's 29 ms lead inside the 52.5 ms bound; since, a contender that leads and at the bound trails eager
by no more than one process's median scatters (23.5 ms against 36.7) is taken (bridge/auto/decision.py)."""


def test_every_committed_probe_decides_today_as_it_did_or_as_recorded_otherwise_and_only_dropless_ones_confirm():
    probes = list(committed_probes())
    assert len(probes) >= 10
    for where, probe, chosen in probes:
        measurements = [Measurement(**{key: value for key, value in candidate.items() if key in MEASUREMENT_FIELDS})
                        for candidate in probe["candidates"]]
        decision = decide(measurements)  # without scopes: the records keep none
        contender = worth_confirming(measurements, decision)
        assert (contender is not None) is (where in CONFIRMED_IN), where
        # Then as perf.auto_probe.run_probe goes on (a probe from before the round has no confirming runs: eager).
        if contender is not None:
            decision = decide_confirmed(measurements, contender.choice)
        assert decision.chosen == DECIDED_OTHERWISE_TODAY.get(where, chosen), where


def test_a_failed_candidate_is_never_chosen_even_with_the_fastest_steps():
    probe = timings({"none": (10.0, 10.0), "te_attn": 8.0})
    probe.insert(1, Measurement("te_layer", "interrupted", 1.0, 0.1, "SIGTERM received"))  # fast, but it did not finish
    assert decide(probe).chosen == "te_attn"


@pytest.mark.parametrize("medians, spread, going_on", [
    # fastest 8.0, noise 0.2: 8.1 is within it, 9.0 and 10.5 are clearly slower; at most half of 4 (2) go on
    ({"none": (10.0, 10.1), "te_attn": 8.0, "te_mlp": 8.1, "te_layer": 9.0, "local_layer": 10.5}, 0.2,
     ["te_attn", "te_mlp"]),
    # all four within the noise: the faster half goes on, fastest first
    ({"none": (10.0, 10.1), "te_attn": 8.3, "te_mlp": 8.0, "te_layer": 8.2, "local_layer": 8.1}, 0.5,
     ["te_mlp", "local_layer"]),
    # eager is the round's fastest: a graph choice clearly slower than eager cannot win and stops
    ({"none": (10.0, 10.1), "te_attn": 12.0, "te_mlp": 10.05}, 0.2, ["te_mlp"]),
    # wide noise between eager's two runs keeps a slower one in the race (three graphs: two go on)
    ({"none": (10.0, 13.0), "te_attn": 8.0, "te_mlp": 10.5, "te_layer": 11.5}, 0.2, ["te_attn", "te_mlp"]),
    ({"none": (10.0, 10.1), "te_attn": 8.0, "te_layer": None}, 0.2, ["te_attn"]),  # a failed one never goes on
    ({"none": (None, None), "te_attn": 8.0}, 0.2, []),  # nothing to beat: the probe stops
])
def test_successive_halving_stops_the_clearly_slower_and_keeps_the_faster_half(medians, spread, going_on):
    measurements = timings(medians, spread)
    kept = survivors(measurements)
    assert [m.choice for m in kept] == going_on
    stopped = stopped_early(measurements, kept, 1)
    assert {m.choice for m in stopped} == set(medians) - {"none"} - set(going_on)
    assert all((m.status == "stopped_early") == (medians[m.choice] is not None) for m in stopped)
    assert all(m.median_ms == medians[m.choice] for m in stopped if m.status == "stopped_early")


@pytest.mark.parametrize("start_s, step_ms, graph_candidates, at_once, pays", [
    (4.3, 51.0, 7, 1, False),  # llama/tiny on an H200: a run starts in seconds, 20 steps fewer save 1 s each
    (15.0, 320.0, 4, 1, False),  # the Qwen3 proxy: its steps are long, but so is its start
    (20.0, 2000.0, 7, 1, True),  # seconds a step: the steps screening saves outweigh a second round's runs
    (0.5, 20.0, 1, 1, False),  # one graph choice: nothing to halve
    (20.0, 400.0, 7, 1, False),  # a second round's three starts, one after another, outweigh what screening saves
    (20.0, 400.0, 7, 3, True),  # the same three starting together cost one start
])
def test_screening_pays_only_where_the_steps_it_saves_outweigh_the_runs_it_adds(start_s, step_ms, graph_candidates,
                                                                                at_once, pays):
    first = Measurement("none", "completed", step_ms, 1.0, wall_s=start_s + 34 * step_ms / 1e3)
    assert screening_pays(first, 34, graph_candidates, 10, 30, at_once) is pays
    assert screening_pays(replace(first, status="failed", median_ms=None), 34, graph_candidates, 10, 30, at_once)


# --- graph choices the probe cannot tell apart ---------------------------------------------------------------

@pytest.mark.parametrize("wider, narrower, covers", [
    ("full_iteration+optimizer_in_graph", "full_iteration", True),
    ("full_iteration", "te_layer", True),
    ("full_iteration", "te_attn", True),
    ("te_layer", "te_attn_mlp", True),
    ("te_attn_mlp", "te_attn", True),
    ("te_layer", "local_layer", False),  # the same layers by another mechanism: neither captures more
    ("te_attn", "te_mlp", False),  # different modules
    ("te_attn", "te_attn", False),  # not more than itself
    ("te_layer", "full_iteration", False),
])
def test_a_scope_covers_another_only_where_it_captures_all_it_does_and_more(wider, narrower, covers):
    assert SCOPES[wider].covers(SCOPES[narrower]) is covers


@pytest.mark.parametrize("medians, spread, steps, chosen", [
    # The Qwen3 proxy's distributed-optimizer probe (ec177b3): te_layer fastest, full_iteration 2.5 % behind, each
    # run's steps 8 ms wide: they overlap, and full_iteration captures all te_layer does
    ({"none": (461.7, 432.6), "full_iteration": 202.8, "local_layer": 204.9, "te_layer": 197.9}, 8.0, None,
     "full_iteration"),
    # the same two 5 ms apart with steps 2 ms wide: the probe tells them apart, the fastest stays
    ({"none": (461.7, 432.6), "full_iteration": 202.8, "te_layer": 197.9}, 2.0, None, "te_layer"),
    # of several broader ones within the scatter, the broadest
    ({"none": (20.0, 20.1), "te_attn": 10.0, "te_attn_mlp": 10.05, "full_iteration": 10.1,
      "full_iteration+optimizer_in_graph": 10.15}, 0.4, None, "full_iteration+optimizer_in_graph"),
    # the H100 llama/tiny pair: te_layer 5 % behind te_attn_mlp, overlapping, but beyond 3 % and beyond the 0.76 ms
    # that two runs of 30 steps 2 ms wide tell apart: the fastest stays
    ({"none": (66.0, 60.4), "te_attn_mlp": 15.65, "te_layer": 16.47}, 2.0, 30, "te_attn_mlp"),
    # the dropless Qwen3 proxy at cc26cf6 (steps about 90 ms wide): te_attn_moe_router 6.8 % behind te_moe_router,
    # beyond 3 % but inside the 34 ms two such runs tell apart, and 80 ms ahead of eager: the broader is taken
    ({"none": (401.0, 403.4), "te_attn": 336.0, "te_attn_moe_router": 320.7, "te_moe_router": 300.2}, 90.0, 30,
     "te_attn_moe_router"),
    # overlapping, but capturing no more than the fastest: the fastest stays
    ({"none": (20.0, 20.1), "te_layer": 10.0, "local_layer": 10.05, "te_mlp": 10.02}, 0.4, None, "te_layer"),
    # a broader choice within the scatter of the fastest but not beyond eager's noise is not taken
    ({"none": (10.0, 10.1), "te_attn": 9.4, "full_iteration": 9.8}, 0.5, None, "te_attn"),
])
def test_among_choices_the_probe_cannot_tell_apart_the_broadest_is_taken(medians, spread, steps, chosen):
    decision = decide(timings(medians, spread, steps), SCOPES)
    assert decision.chosen == chosen, decision.reason


@pytest.mark.parametrize("full_iteration, spread, going_on", [
    # within reach of te_layer (its steps overlap, 2 % behind) but outside the faster half: it goes on beside it
    (10.2, 0.4, ["te_layer", "local_layer", "full_iteration"]),
    # within the noise but 5 % behind: the tie-break could not take it, so the faster half alone goes on
    (10.5, 1.2, ["te_layer", "local_layer"]),
])
def test_screening_keeps_a_broader_choice_the_tie_break_could_take_for_the_fastest(full_iteration, spread, going_on):
    measurements = timings({"none": (20.0, 20.1), "te_layer": 10.0, "local_layer": 10.05, "te_attn": 10.1,
                            "full_iteration": full_iteration}, spread)
    assert [m.choice for m in survivors(measurements, SCOPES)] == going_on
    assert [m.choice for m in survivors(measurements)] == ["te_layer", "local_layer"]  # no scopes: the half alone


def test_the_reason_names_the_fastest_and_why_a_broader_choice_replaced_it():
    probe = timings({"none": (461.7, 432.6), "full_iteration": 202.8, "te_layer": 197.9}, 8.0)
    decision = decide(probe, SCOPES)
    assert decision.reason.startswith("full_iteration captures all that the fastest, te_layer, does and more, and "
                                      "their steps overlap (202.80 ms against 197.90 ms")
    assert "te_layer measured 197.90 ms a step against eager's 432.60 ms" in decision.reason
    assert decide(probe).chosen == "te_layer"  # without the scopes, nothing is taken for another


def h100_dropless_probe(te_attn_moe_router_ms: float = 427.17, its_width: float = 78.15) -> list:
    """The dropless Qwen3 proxy's first pass at 448bff8 on an H100 (benchmarks/results/superseded/
    qwen3_moe_dropless_h100_mcore0.19.2_448bff8.json, round 1): eager 468.5 and 329.9 ms, te_moe_router fastest at
    407.1, te_attn_moe_router 20 ms behind it; steps 76-134 ms wide, 30 timed a run (eager 31)."""
    return [Measurement("none", "completed", 468.54, 133.95, steps=31),
            Measurement("te_attn", "completed", 463.98, 75.90, steps=30),
            Measurement("te_attn_moe_router", "completed", te_attn_moe_router_ms, its_width, steps=30),
            Measurement("te_moe_router", "completed", 407.05, 93.71, steps=30),
            Measurement("none", "completed", 329.88, 86.01, steps=31)]


@pytest.mark.parametrize("probe, scopes, contender", [
    # te_attn_moe_router 20 ms behind, inside the 33 ms that two such runs tell apart, and capturing all
    # te_moe_router does: the round times the choice the tie-break would take
    (h100_dropless_probe(), SCOPES, "te_attn_moe_router"),
    (h100_dropless_probe(), None, "te_moe_router"),  # without scopes nothing is taken for another
    (h100_dropless_probe(450.0), SCOPES, "te_moe_router"),  # 43 ms behind: beyond reach, the fastest
    # within reach only by its own steps, 900 ms wide, and so slow that even with the noise it could not gain 3 %
    (h100_dropless_probe(480.0, 900.0), SCOPES, "te_moe_router"),
])
def test_the_confirming_round_times_the_graph_choice_the_tie_break_would_take(probe, scopes, contender):
    decision = decide(probe, scopes)
    assert decision.chosen == "none", decision.reason
    assert worth_confirming(probe, decision, scopes).choice == contender
