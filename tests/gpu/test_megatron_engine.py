"""The megatron engine trains each CUDA-graph choice correctly: graphs are captured and replayed,
losses follow the eager run of the same seed (step by step where the graphs replay eager's kernels, by
their mean over steps 10-29 where they round differently: tests/gpu/megatron_cases.py), memory stays flat
while replaying, and close() leaves no graph and megatron-core's class-level graph state clean.

Every training runs in its own process (tests/gpu/megatron_job.py): megatron-core keeps graph
state at class level. The jobs the selected tests need are started together, a few at a time
on the one GPU (correctness only; timings are the benchmarks' business).
"""

import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.gpu.megatron_cases import (
    CASES, CONCURRENT_JOBS, FIRST_PORT, FROZEN, FROZEN_MARGIN, LOCAL_SPEC, STEPS, TRAINED, TrainingCase,
    assert_captured_and_replayed, assert_matches_eager, assert_memory_flat, memory_spread, run_job, skip_reason,
    window_gap, window_tolerance,
)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="session")
def jobs(request, tmp_path_factory):
    """Results of every job the selected tests need, run CONCURRENT_JOBS at a time."""
    wanted = set()
    for item in request.session.items:
        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        for case in params:
            if isinstance(case, TrainingCase) and skip_reason(case) is None:
                wanted |= {case, case.eager}
    directory = tmp_path_factory.mktemp("megatron_jobs")
    wanted = sorted(wanted, key=str)
    with ThreadPoolExecutor(CONCURRENT_JOBS) as pool:
        results = pool.map(lambda index: run_job(wanted[index], directory, FIRST_PORT + index), range(len(wanted)))
        return dict(zip(wanted, results))


def result_of(jobs, case: TrainingCase) -> dict:
    result = jobs[case]
    assert "error" not in result, result.get("error")
    return result


@pytest.mark.parametrize("case", CASES, ids=str)
def test_trains_and_cleans_up(case, jobs):
    reason = skip_reason(case)
    if reason:
        pytest.skip(reason)
    result = result_of(jobs, case)
    assert result["layer_spec"] == ("local" if LOCAL_SPEC in case.extra else "transformer_engine")
    losses = result["losses"]
    assert len(losses) == STEPS and all(map(math.isfinite, losses))
    assert result["graph_count_after_close"] == 0
    assert result["megatron_state_clean"], "megatron-core class-level graph state left behind"
    if case.cuda_graph == "none":
        assert result["graph_counts"][-1] == 0 and sum(result["replays"]) == 0
        assert_memory_flat(result["allocated"][1:], memory_spread(case))
        return
    if case.recipe == "llama/tiny":
        expected_graphs = case.graphs_per_iteration if case.cuda_graph == "full_iteration" else 8  # one per layer
    else:
        expected_graphs = None
    assert_captured_and_replayed(case, result, expected_graphs)
    assert_matches_eager(case, result, result_of(jobs, case.eager))
    capture = result["capture_steps"][0]
    assert_memory_flat(result["allocated"][capture + 1:], memory_spread(case))


@pytest.mark.parametrize("case, trained", [(FROZEN, TRAINED)], ids=str)
def test_loss_comparison_sees_training(case, trained, jobs):
    reason = skip_reason(case)
    if reason:
        pytest.skip(reason)
    gap = abs(window_gap(result_of(jobs, case)["losses"], result_of(jobs, trained)["losses"]))
    assert gap > FROZEN_MARGIN * window_tolerance(), f"an untrained run's window mean is only {gap:.2%} from eager's"


