"""Capture failures (a sync inside the region, an unjoined side stream, a background thread
synchronising, out of memory), a freed graph input and a NaN on a real GPU, through the real
training process: the diagnosis in result.json, every graph released, and a bounded, non-zero
exit.

A failed capture can poison the CUDA context, so each case runs in its own process:

    python -m tests.gpu.test_failures_gpu <case> <job_dir>

injects the fault into the torch engine's full-iteration step (or, for megatron_sync, into the
megatron engine's loss function, which megatron-core's FullCudaGraphWrapper captures), runs
``bridge.run.main`` on the job and writes ``probe.json`` with the graphs left after close and
whether megatron-core's class-level graph state is clean again.
"""

import json
import math
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import bridge
from bridge import run
from bridge.engines.torch.engine import TorchEngine
from bridge.engines.torch.graphs import FullIterationGraph
from bridge.trainer import Trainer
from perf.launch import write_job

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


ROOT = Path(__file__).resolve().parents[2]
CAPTURE_STEP = 3  # model.cuda_graph_warmup_steps
EXIT_WITHIN_S = 180  # start, eager steps, capture, failure and cleanup, generously
FULL_ITERATION = ("recipe=llama/tiny", "engine=torch", "device=cuda", "cuda_graph=full_iteration",
                  "model.num_layers=2", "train.train_iters=8")
MEGATRON_FULL_ITERATION = ("recipe=llama/tiny", "engine=megatron", "cuda_graph=full_iteration",
                           "model.num_layers=2", "train.train_iters=8")


def synchronise_inside_the_step() -> None:
    step = TorchEngine._step

    def step_reading_its_loss(self, batch):
        loss = step(self, batch)
        loss.item()  # a host read: harmless eagerly, illegal while capturing
        return loss

    TorchEngine._step = step_reading_its_loss


def leave_a_side_stream_unjoined() -> None:
    step = TorchEngine._step

    def step_forking_a_stream(self, batch):
        loss = step(self, batch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            loss * 2  # work the capturing stream never waits for
        return loss

    TorchEngine._step = step_forking_a_stream


def free_an_input_before_replay() -> None:
    step, replay = TorchEngine._step, FullIterationGraph.replay
    held = {}

    def step_reading_a_big_tensor(self, batch):
        if "tensor" not in held:
            held["tensor"] = torch.ones(64 * 2**20, device=self.device)  # 256 MiB: a segment of its own
        return step(self, batch) + held["tensor"].sum() * 0

    def replay_after_freeing_it(self, batch):
        if held.pop("tensor", None) is not None:
            torch.cuda.empty_cache()  # its segment goes back to the driver; the graph still reads it
        return replay(self, batch)

    TorchEngine._step, FullIterationGraph.replay = step_reading_a_big_tensor, replay_after_freeing_it


def synchronise_from_a_background_thread() -> None:
    step = TorchEngine._step

    def keep_synchronising():  # a logging or checkpoint thread would do this
        while True:
            torch.cuda.synchronize()  # fails here once the main thread captures; the thread ends

    def step_with_a_busy_thread(self, batch):
        if not any(thread.name == "synchroniser" for thread in threading.enumerate()):
            threading.Thread(target=keep_synchronising, name="synchroniser", daemon=True).start()
        return step(self, batch)

    TorchEngine._step = step_with_a_busy_thread


def run_out_of_memory_while_capturing() -> None:
    step = TorchEngine._step

    def step_asking_for_a_terabyte(self, batch):
        if torch.cuda.is_current_stream_capturing():
            torch.empty(2**40, dtype=torch.uint8, device=self.device)  # more than any GPU has
        return step(self, batch)

    TorchEngine._step = step_asking_for_a_terabyte


def synchronise_inside_the_megatron_loss() -> None:
    import bridge.engines.megatron.engine as megatron_engine  # here: importing megatron-core at collection is slow

    loss_function = megatron_engine.masked_mean_loss

    def loss_reading_itself(*args):
        loss, reported = loss_function(*args)
        loss.item()
        return loss, reported

    megatron_engine.masked_mean_loss = loss_reading_itself  # forward_step looks it up per call


INJECTIONS = {"sync": synchronise_inside_the_step, "unjoined": leave_a_side_stream_unjoined,
              "freed": free_an_input_before_replay, "oom": run_out_of_memory_while_capturing,
              "thread": synchronise_from_a_background_thread,
              "megatron_sync": synchronise_inside_the_megatron_loss}


def main(case: str, job_dir: str) -> int:
    INJECTIONS[case]()
    close = Trainer.close

    def close_and_count(trainer):
        import bridge.engines.megatron.engine as megatron_engine

        try:
            close(trainer)
        finally:
            (Path(job_dir) / "probe.json").write_text(json.dumps({
                "graphs_after_close": trainer.engine.graph_count(),
                "megatron_state_clean": megatron_engine.megatron_graph_state_is_clean()}))

    Trainer.close = close_and_count
    return run.main([job_dir])


def run_case(tmp_path, case, *overrides, engine_overrides=FULL_ITERATION):
    job_dir = tmp_path
    write_job(bridge.load([*engine_overrides, *overrides]), job_dir, {"choices": {}, "overrides": list(overrides)})
    command = ([sys.executable, "-m", "tests.gpu.test_failures_gpu", case, str(job_dir)] if case else
               [sys.executable, "-m", "bridge.run", str(job_dir)])
    start = time.monotonic()
    # The timeout is the bound on the exit: a hang fails the test.
    process = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=EXIT_WITHIN_S)
    result = json.loads((job_dir / "result.json").read_text())
    print(f"\nMEASURED {case or 'nan'}: exit {process.returncode} after {time.monotonic() - start:.1f} s; "
          f"reason: {result['reason']}")
    return process, result, job_dir


FULL_GRAPH = r"CUDA graph capture of the full-iteration graph \(forward, backward and optimizer step\) failed at step 3"


@pytest.mark.parametrize("case, reason", [
    ("sync", FULL_GRAPH + r": cudaErrorStreamCaptureUnsupported\. Likely cause: a synchronising operation"),
    ("unjoined", FULL_GRAPH + r": cudaErrorStreamCaptureUnjoined\. Likely cause: a side stream"),
    ("thread", FULL_GRAPH + r": cudaErrorStreamCaptureInvalidated\. Likely cause: something else broke the capture "
               r"first: another thread used CUDA meanwhile"),
    ("oom", FULL_GRAPH + r": cudaErrorMemoryAllocation \(out of memory\)\. Likely cause: the step needs more device memory"),
    # CUDA reports the illegal access asynchronously, mostly at the step's synchronisation after the replay.
    ("freed", r"(step 3 failed|CUDA graph replay of the full-iteration graph .* at step 3): cudaErrorIllegalAddress\. "
              r"Likely cause: a kernel touched memory it does not own"),
])
def test_a_failing_graph_is_diagnosed_released_and_exits(tmp_path, case, reason):
    process, result, job_dir = run_case(tmp_path, case)
    assert process.returncode == run.FAILED, process.stderr[-3000:]
    assert result["status"] == "failed" and re.match(reason, result["reason"]), result["reason"]
    assert "Fix:" in result["reason"] and result["reason"] in process.stderr
    assert result["steps_completed"] == CAPTURE_STEP and len(result["loss"]) == CAPTURE_STEP
    assert json.loads((job_dir / "probe.json").read_text()) == {"graphs_after_close": 0, "megatron_state_clean": True}


def test_a_sync_inside_megatron_cores_full_iteration_capture_is_diagnosed(tmp_path):
    process, result, job_dir = run_case(tmp_path, "megatron_sync", engine_overrides=MEGATRON_FULL_ITERATION)
    assert process.returncode == run.FAILED, process.stderr[-3000:]
    assert re.match(r"CUDA graph capture of the full-iteration graph \(megatron-core FullCudaGraphWrapper\) "
                    r"failed at step 3: cudaErrorStreamCaptureUnsupported\. Likely cause: a synchronising operation",
                    result["reason"]), result["reason"] + "\n" + process.stderr[-4000:]
    assert result["steps_completed"] == CAPTURE_STEP
    assert json.loads((job_dir / "probe.json").read_text()) == {"graphs_after_close": 0, "megatron_state_clean": True}


def test_a_nan_inside_the_graph_is_caught_at_the_next_check(tmp_path):
    # Injected at step 6, three replays after capture; read at steps 3 and 7.
    process, result, _ = run_case(tmp_path, None, "train.train_iters=12", "perf.inject_nan_at_step=6",
                                     "perf.nan_check_interval=4")
    assert process.returncode == run.FAILED, process.stderr[-3000:]
    assert result["reason"] == "non-finite loss or grad norm at step 6 (detected at step 7)"
    assert result["steps_completed"] == 8 and result["graph_count"] == 1
    assert all(math.isfinite(loss) for loss in result["loss"][:6]) and math.isnan(result["loss"][6])
    assert "Traceback" not in process.stderr


def test_a_nan_in_megatron_cores_full_iteration_graph_is_caught_at_the_next_check(tmp_path):
    process, result, _ = run_case(tmp_path, None, "train.train_iters=12", "perf.inject_nan_at_step=6",
                                  "perf.nan_check_interval=4", engine_overrides=MEGATRON_FULL_ITERATION)
    assert process.returncode == run.FAILED, process.stderr[-3000:]
    assert result["reason"] == "non-finite loss or grad norm at step 6 (detected at step 7)"
    assert result["steps_completed"] == 8 and result["graph_count"] == 1
    assert all(math.isfinite(loss) for loss in result["loss"][:6]) and math.isnan(result["loss"][6])
    assert "Traceback" not in process.stderr


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
