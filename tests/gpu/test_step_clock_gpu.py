"""bridge.step_clock on a GPU: the host queues the next step while the GPU runs the current one,
each step is timed by the GPU stream, and losses come back in order."""

import time

import pytest
import torch

from bridge.step_clock import StepClock

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPU_MS, HOST_MS = 8.0, 3.0


@pytest.fixture(scope="module")
def cycles_per_ms():
    """torch.cuda._sleep spins for a number of clock cycles: measure how many make a millisecond."""
    torch.cuda._sleep(1_000_000)  # warm up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def step_of(step: int, gpu_ms: float, host_ms: float, cycles_per_ms: float):
    """A training step's shape: the host prepares for ``host_ms``, then queues ``gpu_ms`` of GPU work
    whose result (the loss) is the step number."""
    def train_step():
        time.sleep(host_ms / 1e3)
        torch.cuda._sleep(int(gpu_ms * cycles_per_ms))
        return torch.full((), float(step), device="cuda")
    return train_step


def run_steps(clock: StepClock, steps: int, gpu_ms: float, host_ms: float, cycles_per_ms: float):
    finished = []
    for step in range(steps):
        finished += clock.run(step, step_of(step, gpu_ms, host_ms, cycles_per_ms))
    return finished + clock.finish()


def median_ms(finished):
    return sorted(done.seconds for done in finished[2:])[(len(finished) - 2) // 2] * 1e3


def test_a_gpu_bound_step_takes_its_gpu_time_not_gpu_plus_host(cycles_per_ms):
    finished = run_steps(StepClock(torch.device("cuda")), 12, GPU_MS, HOST_MS, cycles_per_ms)
    assert [done.step for done in finished] == list(range(12))
    assert [done.loss for done in finished] == [float(step) for step in range(12)]
    # One step at a time would take GPU_MS + HOST_MS = 11 ms.
    assert 0.95 * GPU_MS <= median_ms(finished) <= GPU_MS + 0.3 * HOST_MS


def test_a_host_bound_step_takes_its_host_time(cycles_per_ms):
    finished = run_steps(StepClock(torch.device("cuda")), 12, 1.0, 3 * HOST_MS, cycles_per_ms)
    assert 0.95 * 3 * HOST_MS <= median_ms(finished) <= 3 * HOST_MS + 1.0


def test_a_synchronous_step_finishes_the_queued_one_first_and_runs_alone(cycles_per_ms):
    clock = StepClock(torch.device("cuda"))
    assert clock.run(0, step_of(0, GPU_MS, 0.0, cycles_per_ms)) == []
    finished = clock.run(1, step_of(1, GPU_MS, HOST_MS, cycles_per_ms), synchronous=True)
    assert [done.step for done in finished] == [0, 1]
    # Run alone, the step's time is its host time plus its GPU time.
    assert finished[1].seconds * 1e3 >= 0.95 * (GPU_MS + HOST_MS)
    assert clock.finish() == []
