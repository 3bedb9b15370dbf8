"""How ``cuda_graph=auto`` decides from its probe: the fastest graph choice, kept only where it beats eager
by more than the probe's own noise; otherwise eager. Pure: measurements in, a decision out.

The probe times eager twice, first and last, each in a process of its own. How far apart the two medians
land is how much a median moves between processes (host load, clocks, drift): the noise *between*
processes. Within a process the steps scatter: the noise *within* is half the p10-p90 width of eager's
steps plus half that of the contender's, so a contender kept has its middle 80 % of steps clear of eager's.
The probe's noise is the larger of the two, and a graph choice must beat the faster eager median by more
than that. A choice within the noise never replaces eager: by its own probe, auto is never slower than eager.
"""

from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

from bridge.config.graphs import EAGER_CHOICE

COMPLETED = "completed"


@dataclass(frozen=True)
class Measurement:
    """One probe job: its choice, how it ended and, when it completed, its timed steps in ms."""

    choice: str
    status: str
    """completed, or why it was not measured: the job's own status (failed, invalid, interrupted,
    missing ...), ``no_timed_steps``, or ``ran_eagerly`` (a graph choice that captured nothing)."""
    median_ms: Optional[float] = None
    spread_ms: Optional[float] = None
    """p90 - p10 of the timed steps (warmup and capture steps excluded)."""
    reason: Optional[str] = None
    job: Optional[str] = None
    """The probe job's directory."""

    @property
    def measured(self) -> bool:
        return self.status == COMPLETED and self.median_ms is not None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    chosen: str
    reason: str
    eager_ms: Optional[float] = None
    """The faster of eager's two medians: what a graph choice must beat."""
    noise_ms: Optional[float] = None


def decide(measurements: Sequence[Measurement]) -> Decision:
    """The choice to train with: the fastest graph choice beyond the noise, else eager (see the module)."""
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
    if gain_ms > noise_ms:
        return Decision(best.choice, f"{against} ({gain_ms / eager_ms:.1%} faster), beyond the probe's noise of "
                                     f"{noise_ms:.2f} ms", eager_ms, noise_ms)
    verdict = "slower than eager" if gain_ms <= 0 else f"within the probe's noise of {noise_ms:.2f} ms"
    return Decision(EAGER_CHOICE, f"the fastest graph choice, {best.choice}, is {verdict} ({against}): training "
                                  "eagerly", eager_ms, noise_ms)


def probe_noise_ms(eager: List[Measurement], contender: Measurement) -> float:
    """The larger of the noise between processes (eager's two medians) and within them (half-widths)."""
    medians = [m.median_ms for m in eager]
    between = max(medians) - min(medians)
    within = (max(m.spread_ms or 0.0 for m in eager) + (contender.spread_ms or 0.0)) / 2
    return max(between, within)
