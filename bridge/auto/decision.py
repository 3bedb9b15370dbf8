"""How ``cuda_graph=auto`` decides from its probe: the fastest graph choice, kept only where it beats eager
by more than the probe's own noise, or where timed again it leads eager and could trail it by no more than the
noise between processes; otherwise eager. Pure: measurements in, a decision out.

The probe times eager twice, first and last, each in a process of its own. How far apart the two medians
land is how much a median moves between processes (host load, clocks, drift): the noise *between*
processes. Within a process the steps scatter, and a median of n of them is uncertain by its standard error:
for normal scatter 1.2533 sigma / sqrt(n), sigma being the p10-p90 width over 2.563. The noise *within* is
MEDIAN_ERRORS such errors of the difference between eager's median and the contender's (each run's own n; a run
whose n is unknown counts half its width, a bound for any n). The probe's noise is the larger of the two, and a
graph choice must beat the faster eager median by more than that. On one pair of eager runs a choice within the
noise never replaces eager; after the confirming round (below) one may, where it leads and could trail eager by no
more than a process's scatter: by its own probe, auto is never slower than eager beyond the noise.

The error, not the width, because the question is which median is lower, not whether most steps are: host-bound
steps scatter by a tenth either way. In the dropless Qwen3 proxy's probe at b217322 (30 steps a run) eager took
404.9 and 397.2 ms, 90 ms wide, and te_attn_moe_router 335.1, 70 ms wide; half the widths (81 ms) kept eager,
while its three suite processes then ran at 322-335 ms against eager's 320-471. Three errors of that difference
are 31 ms: the 62 ms lead is clear of it, and clear of the 7.7 ms between eager's two processes.

The probe runs in rounds of successive halving where that pays. Every round times eager first and last, so
every round has its own noise. After a short screening round, a graph choice slower than the round's fastest
run by more than that noise cannot win and stops there, and of the rest the faster half goes on, with any other
that the last round's tie-break (below) could take for the fastest graph choice; the decision
rests on the last round's runs, all timed as long as a sweep's report trusts a median. Screening saves steps
but adds a round of runs, and each round pays a start (a CUDA context, the model's build, the capture; the runs of
a round start together where they fit) besides its steps: where that costs more than the steps screening saves (a
small model), the first round times every run in full and decides alone (screening_pays).

Between graph choices the probe cannot tell apart, what they capture decides. Graphed runs move a few per cent
between processes (the Qwen3 proxy with the distributed optimizer, ec177b3: te_layer 197.9 ms and full_iteration
202.8 in the probe, 202.6 and 195.2 in the suite's own runs), so where a graph choice that captures all the fastest
one captures and more has its middle 80 % of steps overlapping the fastest's (their medians closer than half their
two p10-p90 widths) and lies within CLOSE_TO_FASTEST of it, or within MEDIAN_ERRORS errors of the difference between
the two medians where that is wider, the broader one is taken: it leaves fewer launches to the host, and in every
committed suite row the broadest graph variant was the fastest graph variant or within 0.6 % of it. It must still
beat eager beyond the noise itself. (The dropless Qwen3 proxy at cc26cf6: te_moe_router 300.2 ms, te_attn_moe_router
320.7, 6.8 % behind but inside the 34 ms two such runs can tell apart; te_moe_router then trained at 365.0 ms, while
te_attn_moe_router ran at 322-341 ms in the row's four suite rounds since bdbbf68.)

A probe that cannot tell is timed again where it matters. On a host whose speed drifts while the probe runs, eager's
two runs can land far apart (the dropless Qwen3 proxy at b5c423d: 420.5 and 497.6 ms first and last,
te_attn_moe_router 380.2 between them; at cc26cf6 319.3 and 381.5, every graph choice between), and one pair is too
few to tell drift from a real lead. Where eager was kept for the noise and the fastest graph choice's lead plus that
noise exceeds WORTH_CONFIRMING of eager's faster run (the probe cannot rule out a gain beyond the tolerance auto is
held to, even where the lead itself is negative), the choice the tie-break would take for it (the broadest within its
reach: at 448bff8 on an H100 the round timed the fastest, te_moe_router, and kept eager, while te_attn_moe_router,
20 ms behind it in the probe, ran fastest of the graph variants in both suite rounds) and eager run again in pairs,
alternating (confirmation_order), and every run of the two in the deciding and confirming rounds decides
(decide_confirmed): each process's median is one sample of its level, and the contender's mean must lead eager's by
more than the one-sided 99 % Student t bound of the difference between the two means, from the pooled scatter of those
medians. That scatter is the noise between processes measured with more than one pair, and it holds the steps' own
scatter too. A lead short of the bound still takes the contender where even at the bound it trails eager by no more
than one process's median scatters (the pooled standard deviation): on such a host a run lands that far from its level
anyway, so the faster mean costs at most what the noise costs, and on the dropless proxy at 3dfcfe6 eager kept for a
29 ms lead (8.4 %) against a 52.5 ms bound trained at 393.5 ms while te_attn_moe_router ran at 333.2. From the
FIRST_CONFIRMING_LOOK-th pair on, the round stops once that settles it (confirmation_settled): the lead is beyond the
bound, or the contender leads within the noise so, or the lead plus the bound is under WORTH_CONFIRMING (what could be
gained lies within the tolerance); else it stops after MOST_CONFIRMING_PAIRS and eager is kept. Simulated with the
proxy's scatter (benchmarks/confirming_rule.py: eager 343.6 +- 44 ms, the contender +- 24, 20,000 probes a level), a
confirming round takes a contender that trails eager by one process's scatter (35 ms) in 1.8 % of rounds, one 3 %
slower in 15 % and one level with eager in 30 %, which costs nothing; one 29 ms faster it takes in 82 % after 4.1
pairs on average, where the rule that asked for the bound alone took it in 18 % after 5.7 (2.2 % for a level one).
"""

import math
from dataclasses import asdict, dataclass, replace
from typing import FrozenSet, List, Mapping, Optional, Sequence

from bridge.config.graphs import EAGER_CHOICE

COMPLETED = "completed"
STOPPED_EARLY = "stopped_early"


@dataclass(frozen=True)
class Measurement:
    """One probe job: its choice, how it ended and, when it completed, its timed steps in ms."""

    choice: str
    status: str
    """completed, or why it was not measured: the job's own status (failed, invalid, interrupted,
    missing ...), ``no_timed_steps``, ``ran_eagerly`` (a graph choice that captured nothing), or
    ``stopped_early`` (clearly slower in a screening round: its numbers are that round's)."""
    median_ms: Optional[float] = None
    spread_ms: Optional[float] = None
    """p90 - p10 of the timed steps (warmup and capture steps excluded)."""
    reason: Optional[str] = None
    steps: Optional[int] = None
    """The timed steps the median and spread come from; None where unknown."""
    job: Optional[str] = None
    """The probe job's directory."""
    wall_s: Optional[float] = None
    """The run's wall time, from its start to its end, less any wait at its gate while other runs of the probe
    timed their steps: its start-up (a CUDA context, the model, the capture), its steps and its teardown."""

    @property
    def measured(self) -> bool:
        return self.status == COMPLETED and self.median_ms is not None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Scope:
    """What a graph choice captures, to tell whether one choice captures all another does and more."""

    level: int
    """LAYER_GRAPHS, ITERATION_GRAPH or ITERATION_AND_OPTIMIZER_GRAPH: each captures all of the one before."""
    modules: FrozenSet[str] = frozenset()
    """Per-layer graphs: the modules of each layer captured; empty for whole layers."""

    def covers(self, other: "Scope") -> bool:
        """Whether this captures everything ``other`` does, and more."""
        if self.level != other.level:
            return self.level > other.level
        if self.level != LAYER_GRAPHS or not other.modules:
            return False
        return not self.modules or self.modules > other.modules


LAYER_GRAPHS, ITERATION_GRAPH, ITERATION_AND_OPTIMIZER_GRAPH = range(3)
CLOSE_TO_FASTEST = 0.03
"""How far behind the fastest graph choice a broader one may lie in the probe and still be taken for it: the
tolerance auto is held to against a suite row's best variant (docs/benchmarks.md), so that where the probe was
right, the broader choice costs no more than that. In the H100 llama/tiny rows te_layer ran 5 % behind
te_attn_mlp: beyond it, the faster choice stays."""


@dataclass(frozen=True)
class Decision:
    chosen: str
    reason: str
    eager_ms: Optional[float] = None
    """The faster of eager's two medians, what a graph choice must beat; after confirming runs, the mean of
    eager's medians."""
    noise_ms: Optional[float] = None


def decide(measurements: Sequence[Measurement], scopes: Optional[Mapping[str, Scope]] = None) -> Decision:
    """The choice to train with: the fastest graph choice beyond the noise, or a broader one its steps overlap,
    else eager (see the module). ``scopes`` says what each graph choice captures; a choice without one is never
    taken for another."""
    eager = [m for m in measurements if m.choice == EAGER_CHOICE and m.measured]
    graphs = [m for m in measurements if m.choice != EAGER_CHOICE and m.measured]
    if not eager:
        return Decision(EAGER_CHOICE, "eager did not complete in the probe, so no graph choice can be shown "
                                      "to beat it: training eagerly")
    if not graphs:
        return Decision(EAGER_CHOICE, "no graph choice completed the probe: training eagerly")
    eager_ms = min(m.median_ms for m in eager)
    best = min(graphs, key=lambda m: m.median_ms)
    noise_ms = probe_noise_ms(eager, best)
    gain_ms = eager_ms - best.median_ms
    against = f"{best.median_ms:.2f} ms a step against eager's {eager_ms:.2f} ms"
    if gain_ms <= noise_ms:
        verdict = "slower than eager" if gain_ms <= 0 else f"within the probe's noise of {noise_ms:.2f} ms"
        return Decision(EAGER_CHOICE, f"the fastest graph choice, {best.choice}, is {verdict} ({against}): "
                                      "training eagerly", eager_ms, noise_ms)
    reason = f"{against} ({gain_ms / eager_ms:.1%} faster), beyond the probe's noise of {noise_ms:.2f} ms"
    broader = broadest_overlapping(best, graphs, scopes or {})
    if broader is best or eager_ms - broader.median_ms <= probe_noise_ms(eager, broader):
        return Decision(best.choice, reason, eager_ms, noise_ms)
    return Decision(broader.choice, f"{broader.choice} captures all that the fastest, {best.choice}, does and more, "
                                    f"and their steps overlap ({broader.median_ms:.2f} ms against {best.median_ms:.2f}"
                                    f" ms, closer than half their p10-p90 widths and than {CLOSE_TO_FASTEST:.0%} or "
                                    f"{MEDIAN_ERRORS:g} errors of their difference): "
                                    f"{best.choice} measured {reason}",
                    eager_ms, probe_noise_ms(eager, broader))


def broadest_overlapping(best: Measurement, graphs: Sequence[Measurement],
                         scopes: Mapping[str, Scope]) -> Measurement:
    """Of the graph choices whose steps overlap ``best``'s within CLOSE_TO_FASTEST of it, the broadest that captures
    all it does, faster first among equals; ``best`` itself where none does."""
    chosen = best
    for other in sorted(graphs, key=lambda m: m.median_ms):
        if captures_more(other, chosen, scopes) and within_reach(best, other):
            chosen = other
    return chosen


def captures_more(wider: Measurement, narrower: Measurement, scopes: Mapping[str, Scope]) -> bool:
    """Whether ``wider``'s choice captures all that ``narrower``'s does and more; False for a choice without a
    scope."""
    wide, narrow = scopes.get(wider.choice), scopes.get(narrower.choice)
    return bool(wide and narrow and wide.covers(narrow))


def within_reach(best: Measurement, other: Measurement) -> bool:
    """Whether ``other``'s steps overlap those of ``best`` (the fastest graph choice) and it lies within
    CLOSE_TO_FASTEST of it, or within the errors of their two medians where wider (only where both runs' counts of
    steps are known: half the widths would always be wider): near enough to be taken for it where it captures
    more."""
    reach_ms = CLOSE_TO_FASTEST * best.median_ms
    if median_error_ms(best) is not None and median_error_ms(other) is not None:
        reach_ms = max(reach_ms, within_noise_ms(best, other))
    return steps_overlap(best, other) and other.median_ms - best.median_ms <= reach_ms


def steps_overlap(first: Measurement, second: Measurement) -> bool:
    """Whether the two runs' middle 80 % of steps overlap: their medians closer than half their p10-p90 widths."""
    return abs(first.median_ms - second.median_ms) <= ((first.spread_ms or 0.0) + (second.spread_ms or 0.0)) / 2


def probe_noise_ms(eager: List[Measurement], contender: Measurement) -> float:
    """The larger of the noise between processes (eager's two medians) and within them (the medians' errors)."""
    medians = [m.median_ms for m in eager]
    between = max(medians) - min(medians)
    return max(between, within_noise_ms(max(eager, key=lambda m: m.spread_ms or 0.0), contender))


MEDIAN_ERRORS = 3.0
"""How many standard errors of the difference between two medians a lead must clear: a lead of three errors
arises by chance about once in 700 probes (one-sided, normal scatter)."""


def within_noise_ms(eager: Measurement, contender: Measurement) -> float:
    """MEDIAN_ERRORS standard errors of the difference between the two medians; half the two widths where either
    run's count of steps is unknown."""
    errors = [median_error_ms(eager), median_error_ms(contender)]
    if None in errors:
        return ((eager.spread_ms or 0.0) + (contender.spread_ms or 0.0)) / 2
    return MEDIAN_ERRORS * math.hypot(*errors)


def median_error_ms(run: Measurement) -> Optional[float]:
    """The standard error of the run's median step, for normal scatter: 1.2533 sigma / sqrt(steps), sigma its
    p10-p90 width over 2.563 (twice the 90th percentile of the standard normal). None without a count of steps
    (a record from before the probe kept it); 0 without a width."""
    if not run.steps:
        return None
    return 1.2533 * (run.spread_ms or 0.0) / 2.5631 / math.sqrt(run.steps)


WORTH_CONFIRMING = CLOSE_TO_FASTEST
"""The gain, as a share of eager's step, that a probe which kept eager must be unable to rule out for its fastest graph
choice to be timed again (worth_confirming): below it, training eagerly gives away no more than the tolerance auto
is held to."""
ONE_SIDED_T_99 = (31.821, 6.965, 4.541, 3.747, 3.365, 3.143, 2.998, 2.896, 2.821, 2.764)
"""Student's t at 99 % one-sided for 1 to 10 degrees of freedom; beyond, the last (a bound for any more)."""


def worth_confirming(measurements: Sequence[Measurement], decision: Decision,
                     scopes: Optional[Mapping[str, Scope]] = None) -> Optional[Measurement]:
    """The graph choice to time again where ``decision`` kept eager for the probe's noise: the one decide() would
    have taken had its lead been clear (the broadest within reach of the fastest, as ``scopes`` say, else the
    fastest), where its lead over eager's faster run plus the noise exceeds WORTH_CONFIRMING of that run; None
    otherwise (the module says why not the fastest alone)."""
    graphs = [m for m in measurements if m.choice != EAGER_CHOICE and m.measured]
    if decision.chosen != EAGER_CHOICE or decision.eager_ms is None or decision.noise_ms is None or not graphs:
        return None
    best = min(graphs, key=lambda m: m.median_ms)
    for contender in (broadest_overlapping(best, graphs, scopes or {}), best):
        if decision.eager_ms - contender.median_ms + decision.noise_ms > WORTH_CONFIRMING * decision.eager_ms:
            return contender
    return None


FIRST_CONFIRMING_LOOK, MOST_CONFIRMING_PAIRS = 2, 6
"""The confirming round's pairs (the contender, then eager): every run of the two is first weighed after this many,
then after each further pair, and the round ends after the most."""


def confirmation_order(contender: str, pairs: int = FIRST_CONFIRMING_LOOK) -> List[str]:
    """The confirming round's first ``pairs`` pairs, the contender first: the round before ended on eager."""
    return [contender, EAGER_CHOICE] * pairs


@dataclass(frozen=True)
class Confirmation:
    """Every run of the contender and of eager so far, weighed: the means of their medians, how many, the one-sided
    99 % t bound of the difference between the means, and how far one process's median scatters (the pooled
    standard deviation of the medians: the noise between processes)."""

    contender_ms: float
    eager_ms: float
    runs: int
    eager_runs: int
    bound_ms: float
    process_noise_ms: float

    @property
    def gain_ms(self) -> float:
        return self.eager_ms - self.contender_ms

    @property
    def beyond_the_bound(self) -> bool:
        """The contender's lead clears the bound: it is faster."""
        return self.gain_ms > self.bound_ms

    @property
    def ahead_within_the_noise(self) -> bool:
        """The contender's mean leads, and even at the bound it trails eager by no more than one process's median
        scatters: taking the faster mean can cost no more than the noise between processes."""
        return self.gain_ms > 0 and self.bound_ms - self.gain_ms <= self.process_noise_ms

    @property
    def settled(self) -> bool:
        """The lead is beyond the bound, or it leads within the noise, or even the bound above its gain is no gain
        beyond WORTH_CONFIRMING."""
        return (self.beyond_the_bound or self.ahead_within_the_noise
                or self.gain_ms + self.bound_ms <= WORTH_CONFIRMING * self.eager_ms)


def weigh_confirming(measurements: Sequence[Measurement], contender: str) -> Optional[Confirmation]:
    """The runs of ``contender`` and eager weighed; None with fewer than two measured of either."""
    eager = [m.median_ms for m in measurements if m.choice == EAGER_CHOICE and m.measured]
    mine = [m.median_ms for m in measurements if m.choice == contender and m.measured]
    if len(eager) < 2 or len(mine) < 2:
        return None
    eager_ms, contender_ms = sum(eager) / len(eager), sum(mine) / len(mine)
    freedom = len(eager) + len(mine) - 2
    scatter = sum((x - eager_ms) ** 2 for x in eager) + sum((x - contender_ms) ** 2 for x in mine)
    error = math.sqrt(scatter / freedom * (1 / len(eager) + 1 / len(mine)))
    bound_ms = ONE_SIDED_T_99[min(freedom, len(ONE_SIDED_T_99)) - 1] * error
    return Confirmation(contender_ms, eager_ms, len(mine), len(eager), bound_ms, math.sqrt(scatter / freedom))


def confirmation_settled(measurements: Sequence[Measurement], contender: str) -> bool:
    """Whether the confirming round can stop: its runs settle it (Confirmation.settled), or too few completed."""
    weighed = weigh_confirming(measurements, contender)
    return weighed is None or weighed.settled


def decide_confirmed(measurements: Sequence[Measurement], contender: str) -> Decision:
    """``contender`` where the mean of its runs' medians leads eager's by more than the one-sided 99 % t bound of
    the difference between the two means, or leads by less but, even at that bound, trails eager by no more than one
    process's median scatters (the module says why); else eager."""
    weighed = weigh_confirming(measurements, contender)
    if weighed is None:
        return Decision(EAGER_CHOICE, f"{contender} could not be timed again against eager (its confirming runs "
                                      "did not complete): training eagerly")
    against = (f"{contender} {weighed.contender_ms:.2f} ms a step over {weighed.runs} runs against eager's "
               f"{weighed.eager_ms:.2f} ms over {weighed.eager_runs}")
    lead = f"{weighed.gain_ms / weighed.eager_ms:.1%} faster"
    if weighed.beyond_the_bound:
        reason = f"timed again, {against} ({lead}), beyond the noise of {weighed.bound_ms:.2f} ms between the runs"
        return Decision(contender, reason, weighed.eager_ms, weighed.bound_ms)
    if weighed.ahead_within_the_noise:
        reason = (f"timed again, {against} ({lead}): a lead within the noise of {weighed.bound_ms:.2f} ms between the "
                  f"runs, but even at that bound {contender} trails eager by at most "
                  f"{weighed.bound_ms - weighed.gain_ms:.2f} ms, within the {weighed.process_noise_ms:.2f} ms that one "
                  "process's median scatters, so training with the faster mean")
        return Decision(contender, reason, weighed.eager_ms, weighed.bound_ms)
    verdict = ("no lead" if weighed.gain_ms <= 0 else
               f"a lead within the noise of {weighed.bound_ms:.2f} ms between the runs, and at that bound it could "
               f"trail eager by more than the {weighed.process_noise_ms:.2f} ms that one process's median scatters")
    return Decision(EAGER_CHOICE, f"timed again, {against}: {verdict}, so training eagerly", weighed.eager_ms,
                    weighed.bound_ms)


def survivors(measurements: Sequence[Measurement], scopes: Optional[Mapping[str, Scope]] = None) -> List[Measurement]:
    """The graph choices of a screening round that go on to the next round, fastest first: of those not clearly
    slower than the round's fastest run (eager included) - slower by more than the probe's noise for them - at
    most the faster half (rounded up), and beside it any other that captures all the fastest graph choice does
    and more within its reach (``scopes``, as decide() reads them): the last round's tie-break may take it for the
    fastest, so it must reach that round. None when eager did not complete: nothing could be shown to beat it."""
    eager = [m for m in measurements if m.choice == EAGER_CHOICE and m.measured]
    graphs = sorted((m for m in measurements if m.choice != EAGER_CHOICE and m.measured), key=lambda m: m.median_ms)
    if not eager or not graphs:
        return []
    fastest = min(m.median_ms for m in [*eager, *graphs])
    close = [m for m in graphs if m.median_ms - fastest <= probe_noise_ms(eager, m)]
    half = close[:(len(graphs) + 1) // 2]
    reachable = [m for m in close[len(half):] if captures_more(m, close[0], scopes or {}) and within_reach(close[0], m)]
    return half + reachable


def stopped_early(measurements: Sequence[Measurement], kept: Sequence[Measurement],
                  round_number: int) -> List[Measurement]:
    """The graph choices of screening round ``round_number`` (from 1) that do not go on: a completed one as
    stopped_early with that round's numbers, one that did not complete as it ended."""
    going_on = {m.choice for m in kept}
    why = (f"stopped after probe round {round_number}: slower than the round's fastest by more than the probe's "
           "noise, or not in the faster half and capturing no more than the fastest graph choice")
    return [replace(m, status=STOPPED_EARLY, reason=why) if m.measured else m
            for m in measurements if m.choice != EAGER_CHOICE and m.choice not in going_on]


def screening_pays(first_eager: Measurement, train_iters: int, graph_candidates: int, screening_steps: int,
                   deciding_steps: int, runs_at_once: int = 1) -> bool:
    """Whether a short screening round costs less than timing every run of the first round in full, judged from
    the first run: eager, ``train_iters`` steps of which ``deciding_steps`` timed. Its step time stands for
    every run's (graph choices are rarely slower) and its wall time less its steps is what starting a run
    costs. Screening saves ``deciding_steps - screening_steps`` steps on each of the round's other runs (the
    graph choices and the last eager run) and adds a second round of at least three full runs (eager, one
    survivor, eager), whose starts overlap ``runs_at_once`` at a time while their steps do not. Without the
    first run's numbers it screens, as the probe always did."""
    if not first_eager.measured or first_eager.wall_s is None:
        return True
    step_s = first_eager.median_ms / 1e3
    start_s = max(first_eager.wall_s - train_iters * step_s, 0.0)
    saved_s = (graph_candidates + 1) * (deciding_steps - screening_steps) * step_s
    second_round_starts = -(-3 // max(runs_at_once, 1))
    return saved_s > second_round_starts * start_s + 3 * train_iters * step_s
