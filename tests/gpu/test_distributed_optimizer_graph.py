"""The in-graph optimizer where Bridge's perf presets train, with the distributed optimizer: on megatron-core 0.19,
megatron-core's own optimizer graph (OptimizerCudaGraphWrapper) beside the full-iteration graph. The
Qwen3-30B-A3B one-GPU proxy (benchmarks/suite.py's qwen3_moe_distributed_optimizer) trains with it and with the
optimizer outside the graph, 100 steps each, one after the other (each holds 35-46 GiB of the GPU):

- both graphs are captured once and replayed every later step, memory stays flat while replaying;
- the losses start equal and their window means (steps 10-29) agree within the rounding tolerance of
  tests/gpu/megatron_cases.py;
- the plan's memory estimate agrees with the measured peak within 15 % (issue #29).

On 0.16.1 the catalogue refuses the configuration (optimizer_graph_distributed) and the test skips.
"""

import sys

import pytest

import bridge
from tests.gpu.megatron_cases import (
    FIRST_PORT, OPTIMIZER_IN_GRAPH, ROOT, TrainingCase, assert_captured_and_replayed, assert_matches_eager,
    assert_memory_flat, run_job, skip_reason,
)

sys.path.insert(0, str(ROOT / "benchmarks"))
import suite_workloads  # noqa: E402  (benchmarks/ is a directory of scripts)

pytestmark = pytest.mark.gpu
PROXY = suite_workloads.WORKLOADS[suite_workloads.DISTRIBUTED_OPTIMIZER_PROXY].base
RECIPE = PROXY[0].removeprefix("recipe=")
OUTSIDE = TrainingCase(RECIPE, "full_iteration", PROXY[1:])
IN_GRAPH = TrainingCase(RECIPE, "full_iteration", (*PROXY[1:], OPTIMIZER_IN_GRAPH))
MEMORY_AGREEMENT = 0.15
GIB = 2 ** 30


def test_the_qwen3_proxy_trains_with_megatron_cores_optimizer_graph_as_with_the_optimizer_outside(tmp_path):
    for case in (IN_GRAPH, OUTSIDE):
        reason = skip_reason(case)
        if reason:
            pytest.skip(reason)
    results = {case: run_job(case, tmp_path, FIRST_PORT + 80 + index) for index, case in enumerate((IN_GRAPH, OUTSIDE))}
    for result in results.values():
        assert "error" not in result, result.get("error")
    in_graph, outside = results[IN_GRAPH], results[OUTSIDE]
    assert_captured_and_replayed(IN_GRAPH, in_graph, IN_GRAPH.graphs_per_iteration)
    assert_captured_and_replayed(OUTSIDE, outside, OUTSIDE.graphs_per_iteration)
    assert in_graph["graph_count_after_close"] == 0 and in_graph["megatron_state_clean"]
    # The optimizer outside the graph is the reference here: the full-iteration graph replays eager's kernels.
    assert_matches_eager(IN_GRAPH, in_graph, outside)
    assert_memory_flat(in_graph["allocated"][in_graph["capture_steps"][0] + 1:])
    estimate, peak = bridge.plan(list(IN_GRAPH.overrides)).memory().total_gib, in_graph["peak_allocated"] / GIB
    print(f"Qwen3 proxy, distributed optimizer in megatron-core's optimizer graph: peak {peak:.2f} GiB, "
          f"estimate {estimate:.2f} GiB; outside the graph: peak {outside['peak_allocated'] / GIB:.2f} GiB")
    assert abs(estimate - peak) <= MEMORY_AGREEMENT * peak, f"estimate {estimate:.2f} GiB, measured {peak:.2f} GiB"
