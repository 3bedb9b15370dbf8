"""How often cuda_graph=auto's confirming round takes the contender, by simulation: the probe's deciding round
(eager, the contender, eager) and the confirming round's pairs drawn as process medians around given levels, and
decided by bridge/auto/decision.py's own functions as perf/auto_probe.py calls them. The numbers in that module's
docstring come from here.

    python benchmarks/confirming_rule.py [--trials 20000] [--seed 0]

Each scenario sets the contender's level against eager's: faster as the dropless Qwen3 proxy's te_attn_moe_router
was (its 3dfcfe6 probe: eager 343.6 +- 44 ms over eight processes, the contender 314.6 +- 24 over seven), level with
eager, 3 % slower, and slower by one process's scatter (what the rule must rarely take). Steps within a process
scatter 70 ms wide over 30 timed steps, as that probe's runs did. For each: how often the probe asks for the
confirming round, how often the contender is then taken, the pairs that took, and the chosen choice's mean level
against eager's.
"""

import argparse
import random
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridge.auto.decision import (FIRST_CONFIRMING_LOOK, MOST_CONFIRMING_PAIRS, Measurement,  # noqa: E402
                                  confirmation_order, confirmation_settled, decide, decide_confirmed,
                                  worth_confirming)
from bridge.config.graphs import EAGER_CHOICE  # noqa: E402

CONTENDER = "te_attn_moe_router"
EAGER_MS, EAGER_SCATTER_MS, CONTENDER_SCATTER_MS = 343.6, 44.0, 24.0
STEPS_WIDE_MS, TIMED_STEPS = 70.0, 30
POOLED_SCATTER_MS = ((EAGER_SCATTER_MS ** 2 + CONTENDER_SCATTER_MS ** 2) / 2) ** 0.5
SCENARIOS = {"faster as at 3dfcfe6": -29.0, "level with eager": 0.0, "3 % slower": 0.03 * EAGER_MS,
             "slower by one process's scatter": POOLED_SCATTER_MS}


def process(choice: str, level_ms: float, draw: random.Random) -> Measurement:
    scatter = EAGER_SCATTER_MS if choice == EAGER_CHOICE else CONTENDER_SCATTER_MS
    return Measurement(choice, "completed", draw.gauss(level_ms, scatter), STEPS_WIDE_MS, steps=TIMED_STEPS)


def one_probe(contender_ms: float, draw: random.Random) -> Dict[str, float]:
    """One probe's deciding round and, where it asks, its confirming round, as perf.auto_probe.run_probe runs them."""
    levels = {EAGER_CHOICE: EAGER_MS, CONTENDER: contender_ms}
    runs: List[Measurement] = [process(choice, levels[choice], draw) for choice in (EAGER_CHOICE, CONTENDER,
                                                                                      EAGER_CHOICE)]
    decision = decide(runs)
    if worth_confirming(runs, decision) is None:
        return {"confirmed": 0.0, "pairs": 0.0, "chosen_ms": levels[decision.chosen]}
    runs += [process(choice, levels[choice], draw) for choice in confirmation_order(CONTENDER)]
    pairs = FIRST_CONFIRMING_LOOK
    while pairs < MOST_CONFIRMING_PAIRS and not confirmation_settled(runs, CONTENDER):
        runs += [process(choice, levels[choice], draw) for choice in confirmation_order(CONTENDER, 1)]
        pairs += 1
    chosen = decide_confirmed(runs, CONTENDER).chosen
    return {"confirmed": 1.0, "pairs": float(pairs), "chosen_ms": levels[chosen],
            "took": float(chosen == CONTENDER)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    draw = random.Random(args.seed)
    print(f"eager {EAGER_MS} +- {EAGER_SCATTER_MS} ms, the contender +- {CONTENDER_SCATTER_MS} "
          f"(one process's scatter, pooled: {POOLED_SCATTER_MS:.1f} ms); {args.trials} probes a scenario")
    for name, offset_ms in SCENARIOS.items():
        probes = [one_probe(EAGER_MS + offset_ms, draw) for _ in range(args.trials)]
        confirmed = [probe for probe in probes if probe["confirmed"]]
        took = sum(probe["took"] for probe in confirmed) / max(len(confirmed), 1)
        pairs = sum(probe["pairs"] for probe in confirmed) / max(len(confirmed), 1)
        chosen_ms = sum(probe["chosen_ms"] for probe in probes) / len(probes)
        print(f"contender {offset_ms:+.1f} ms ({name}): confirming round in {len(confirmed) / len(probes):.1%} of "
              f"probes, which took the contender in {took:.1%} after {pairs:.1f} pairs on average; the chosen "
              f"level {chosen_ms / EAGER_MS:.3f}x eager's")


if __name__ == "__main__":
    main()
