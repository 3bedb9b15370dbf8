"""Compose + migrate + validate + translate time for one recipe, in-process (target < 0.5 s).

    python benchmarks/plan_time.py [recipe] [repeats]

The first plan pays for Hydra's initialisation; the median of the following ones is what a
sweep of plans costs per job.
"""

import statistics
import sys
import time

import bridge


def main() -> None:
    recipe = sys.argv[1] if len(sys.argv) > 1 else "llama/tiny"
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    overrides = [f"recipe={recipe}", "cuda_graph=full_iteration"]
    timings = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        plan = bridge.plan(overrides)
        plan.megatron()
        timings.append(time.perf_counter() - start)
    first, rest = timings[0], timings[1:]
    print(f"recipe={recipe} valid={plan.valid}")
    print(f"first plan {first * 1000:.0f} ms; median of {repeats} more {statistics.median(rest) * 1000:.0f} ms "
          f"(p90 {statistics.quantiles(rest, n=10)[-1] * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
