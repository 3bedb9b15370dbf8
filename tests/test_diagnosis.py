"""Capture and replay failures become one reason naming the region, the step, the CUDA error,
its likely cause and the fix; the table is checked here on synthetic error texts written the way
PyTorch formats CUDA errors, the trainer and the training process on a scripted engine.
"""

import json
import re
import threading
from pathlib import Path

import pytest
import torch

from bridge import run
from bridge.diagnosis import (KNOWN_FAILURES, GraphCaptureError, NonFiniteError, diagnose, failure_reason,
                              graph_region)

README = Path(__file__).resolve().parents[1] / "README.md"


def cuda_error(text: str, name: str) -> RuntimeError:
    """A CUDA error as PyTorch raises it (torch.AcceleratorError since 2.8, RuntimeError before)."""
    return torch.AcceleratorError(
        f"CUDA error: {text}\n"
        f"Search for `{name}' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more "
        "information.\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1")


# (error raised inside the region, the CUDA error named, a phrase of the fix)
CASES = {
    "item in the region": (cuda_error("operation not permitted when stream is capturing",
                                      "cudaErrorStreamCaptureUnsupported"),
                           "cudaErrorStreamCaptureUnsupported", "move it out of the graphed region"),
    "sync without the error name": (RuntimeError("CUDA error: operation not permitted when stream is capturing"),
                                    "cudaErrorStreamCaptureUnsupported", "keep the value on the device"),
    "background thread": (cuda_error("operation failed due to a previous error during capture",
                                     "cudaErrorStreamCaptureInvalidated"),
                          "cudaErrorStreamCaptureInvalidated", "capture_error_mode='thread_local'"),
    "unjoined side stream": (cuda_error("capturing stream has unjoined work", "cudaErrorStreamCaptureUnjoined"),
                             "cudaErrorStreamCaptureUnjoined", "wait_stream(side_stream)"),
    "legacy stream": (cuda_error("operation would make the legacy stream depend on a capturing blocking stream",
                                 "cudaErrorStreamCaptureImplicit"),
                      "cudaErrorStreamCaptureImplicit", "dedicated stream set before the model is built"),
    "isolation": (cuda_error("dependency created on uncaptured work in another stream",
                             "cudaErrorStreamCaptureIsolation"),
                  "cudaErrorStreamCaptureIsolation", "synchronise that stream before capture"),
    "captured event": (cuda_error("operation not permitted on an event last recorded in a capturing stream",
                                  "cudaErrorCapturedEvent"),
                       "cudaErrorCapturedEvent", "time the whole replay"),
    "freed input": (cuda_error("an illegal memory access was encountered", "cudaErrorIllegalAddress"),
                    "cudaErrorIllegalAddress", "copy new data into it in place"),
    "liveness check": (RuntimeError("CUDA graph replay detected 1 dead tensor(s).\nDead tensor #1 (data_ptr=0x7f):"),
                       "freed graph input", "keep every tensor the graph uses alive"),
    "allocator oom": (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                             "capacity of 79.19 GiB of which 1.02 GiB is free."),
                      "cudaErrorMemoryAllocation (out of memory)", "lower train.micro_batch_size"),
    "driver oom": (cuda_error("out of memory", "cudaErrorMemoryAllocation"),
                   "cudaErrorMemoryAllocation (out of memory)", "model.cuda_graph_use_single_mempool=true"),
    "allgather dispatch": (RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless "
                                        "the CPU tensor is pinned. Please use tensor.pin_memory()"),
                           "host copy during capture", "model.moe_token_dispatcher_type=alltoall"),
    "reentrant recompute": (RuntimeError("Checkpointing is not compatible with .grad(), please use .backward() if "
                                         "possible"), "reentrant checkpoint in the captured region",
                            "drop that module from model.recompute_modules"),
    "megatron tracker": (AssertionError("Unsupported RNG states tracker."), "RNG tracker not Transformer Engine's",
                         "rng.te_rng_tracker=true"),
    "fp64 router": (RuntimeError("Could not infer dtype of _WeakRefTensor"), "graph output of an unsupported dtype",
                    "model.moe_router_dtype=fp32"),
    "retained compiled backward": (RuntimeError("This backward function was compiled with non-empty donated buffers "
                                                "which requires create_graph=False and retain_graph=False."),
                                   "retained backward of a compiled function",
                                   "model.cuda_graph_retain_backward_graph=false"),
    "rng": (RuntimeError("Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture. If you need this "
                         "call to be captured, please file an issue."),
            "random generator state read during capture", "rng.te_rng_tracker=true"),
    "unregistered generator": (RuntimeError("Attempt to increase offset for a CUDA generator not in capture mode."),
                               "random generator state read during capture", "rng.te_rng_tracker=true"),
}


def raised_in(region: str, phase: str, error: BaseException) -> GraphCaptureError:
    with pytest.raises(GraphCaptureError) as caught:
        with graph_region(region, phase):
            raise error
    return caught.value


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_known_failure_gets_its_cause_and_fix(case):
    error, name, fix = CASES[case]
    wrapped = raised_in("the full-iteration graph", "capture", error)
    assert wrapped.original is error and wrapped.__cause__ is error
    reason = failure_reason(wrapped, step=3)
    assert reason.startswith(f"CUDA graph capture of the full-iteration graph failed at step 3: {name}. Likely cause:")
    assert fix in reason and "Fix:" in reason
    assert reason.endswith(f"[{type(error).__name__}: {str(error).splitlines()[0]}]")


def test_the_root_cause_wins_over_the_capture_it_invalidated():
    # torch.cuda.graph's exit calls capture_end, which fails too; the sync is what to fix.
    with pytest.raises(GraphCaptureError) as caught:
        with graph_region("the full-iteration graph", "capture"):
            try:
                raise cuda_error("operation not permitted when stream is capturing", "cudaErrorStreamCaptureUnsupported")
            finally:
                raise cuda_error("operation failed due to a previous error during capture",
                                 "cudaErrorStreamCaptureInvalidated")
    assert diagnose(caught.value).cuda_error == "cudaErrorStreamCaptureUnsupported"


def test_an_unknown_failure_still_names_region_and_step():
    reason = failure_reason(raised_in("the per-module graphs (2 x TransformerLayer)", "replay", ValueError("odd")), 7)
    assert reason == ("CUDA graph replay of the per-module graphs (2 x TransformerLayer) failed at step 7: "
                      "ValueError: odd (no known cause matches; see the traceback)")


def test_an_asynchronous_cuda_error_outside_the_region_is_recognised():
    # An illegal address from a replay surfaces at the trainer's synchronisation, unwrapped.
    reason = failure_reason(cuda_error("an illegal memory access was encountered", "cudaErrorIllegalAddress"), 5)
    assert reason.startswith("step 5 failed: cudaErrorIllegalAddress. Likely cause:")


def test_plain_errors_and_non_finite_values_keep_their_message():
    assert failure_reason(RuntimeError("boom"), 2) == "RuntimeError: boom"
    assert failure_reason(NonFiniteError("non-finite loss or grad norm at step 4 (detected at step 9)"), 9) == (
        "non-finite loss or grad norm at step 4 (detected at step 9)")


def test_an_error_without_a_message_is_named_by_the_line_that_raised_it():
    # megatron-core's scheduler asserts this way; "AssertionError: " alone would leave nothing to go on.
    # (pytest rewrites asserts in test files to carry a message, hence the explicit raise.)
    def scheduler(warmup, decay):
        if warmup >= decay:
            raise AssertionError

    try:
        scheduler(10, 8)
    except AssertionError as error:
        reason = failure_reason(error, None)
    assert re.fullmatch(r"AssertionError at .*tests/test_diagnosis\.py:\d+: raise AssertionError", reason), reason


def test_the_region_wrapper_wraps_once_and_lets_interrupts_through():
    inner = raised_in("inner", "replay", RuntimeError("x"))
    assert raised_in("outer", "capture", inner) is inner
    with pytest.raises(KeyboardInterrupt):
        with graph_region("the full-iteration graph", "replay"):
            raise KeyboardInterrupt


def test_every_known_failure_is_complete_and_in_the_readme():
    readme = README.read_text()
    for known in KNOWN_FAILURES:
        assert known.patterns and all(pattern == pattern.lower() for pattern in known.patterns)
        assert known.cause and known.fix
        assert f"`{known.cuda_error}`" in readme, f"README's troubleshooting table lacks {known.cuda_error}"


@pytest.fixture
def failing_capture(scripted_engine):
    """An engine that raises a diagnosed capture failure at its capture step."""

    class FailingCapture(scripted_engine):
        def train_step(self, step):
            if step == self.capture_step:
                with graph_region("the full-iteration graph", "capture"):
                    raise cuda_error("capturing stream has unjoined work", "cudaErrorStreamCaptureUnjoined")
            return super().train_step(step)

    return FailingCapture


def test_a_failed_capture_writes_the_diagnosis_and_releases_the_graphs(failing_capture, read_result, small_config,
                                                                       write_job, tmp_path, monkeypatch, caplog):
    engine = failing_capture([3.0, 2.5, 2.0, 1.5, 1.0], capture_step=2)
    monkeypatch.setattr("bridge.trainer.build_engine", lambda cfg, target: engine)
    job_dir = write_job(tmp_path, small_config("llama/tiny", "cuda_graph=full_iteration"))
    assert run.main([str(job_dir)]) == run.FAILED
    result = read_result(job_dir)
    assert result["status"] == "failed" and result["steps_completed"] == 2 and result["loss"] == [3.0, 2.5]
    assert result["reason"].startswith("CUDA graph capture of the full-iteration graph failed at step 2: "
                                       "cudaErrorStreamCaptureUnjoined.")
    assert engine.closed == 1 and engine.graph_count() == 0
    assert caplog.records[-1].getMessage() == result["reason"]  # the diagnosis is the last thing said


def test_a_close_that_hangs_cannot_keep_the_process_alive(monkeypatch):
    released = threading.Event()
    exits = []

    class HangingTrainer:
        def close(self):
            released.wait(5)

    def record_exit(code, seconds):
        exits.append(code)
        released.set()

    monkeypatch.setattr(run, "_exit_now", record_exit)
    run.close_within(HangingTrainer(), 0.2, code=1)
    assert exits == [1]


def test_a_failure_at_the_first_step_leaves_a_whole_result_and_no_temporary_files(failing_capture, small_config,
                                                                                    write_job, tmp_path, monkeypatch):
    monkeypatch.setattr("bridge.trainer.build_engine", lambda cfg, target: failing_capture([1.0] * 5, capture_step=0))
    job_dir = write_job(tmp_path, small_config())
    run.main([str(job_dir)])
    assert json.loads((job_dir / "result.json").read_text())["steps_completed"] == 0
    assert [path.name for path in job_dir.iterdir() if path.name.startswith(".")] == []
