"""Why a training run failed, in words a performance engineer can act on.

Graph code raises ``GraphCaptureError`` around capture and replay, naming the graph region;
the trainer knows the step. ``failure_reason`` turns any failure into the one-line reason
result.json carries: for a CUDA-graph failure the region, the step, the CUDA error, its likely
cause and the fix. ``KNOWN_FAILURES`` maps text that CUDA and PyTorch put into the exception to
that cause and fix; CUDA errors are asynchronous, so a replay failure may surface at the step's
synchronisation instead, and is still recognised by its text.
"""

import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple


class GraphCaptureError(RuntimeError):
    """A failure while capturing or replaying one graph region (phase "capture" or "replay")."""

    def __init__(self, region: str, phase: str, original: BaseException):
        super().__init__(f"CUDA graph {phase} of {region} failed: {type(original).__name__}: {first_line(original)}")
        self.region = region
        self.phase = phase
        self.original = original


class NonFiniteError(FloatingPointError):
    """The loss or the gradient norm stopped being finite; the message is the whole reason."""


@dataclass(frozen=True)
class KnownFailure:
    patterns: Tuple[str, ...]
    """Lower-case fragments of the error text; any one of them identifies the failure."""
    cuda_error: str
    cause: str
    fix: str


KNOWN_FAILURES = (
    KnownFailure(
        ("cudaerrorstreamcaptureunsupported", "operation not permitted when stream is capturing"),
        "cudaErrorStreamCaptureUnsupported",
        "a synchronising operation ran inside the captured region: .item(), .cpu(), .tolist(), print() of a CUDA "
        "tensor or another device-to-host copy, torch.cuda.synchronize(), or an op whose output size depends on "
        "the data (nonzero, masked_select, unique)",
        "move it out of the graphed region or keep the value on the device (torch.where instead of a Python if); "
        "the traceback points at the line"),
    KnownFailure(
        ("cudaerrorstreamcaptureimplicit", "legacy stream depend on a capturing blocking stream"),
        "cudaErrorStreamCaptureImplicit",
        "work went to the legacy default stream while another stream was capturing: AccumulateGrad nodes or "
        "DDP's gradient hooks set up on the default stream, or a synchronous copy elsewhere in the program",
        "run training on a dedicated stream set before the model is built "
        "(torch.cuda.set_stream(torch.cuda.Stream())), as Megatron does, with a few eager steps on it before capture"),
    KnownFailure(
        ("cudaerrorstreamcaptureunjoined", "capturing stream has unjoined work"),
        "cudaErrorStreamCaptureUnjoined",
        "a side stream forked inside the captured region never joined back into the capturing stream",
        "end the region with torch.cuda.current_stream().wait_stream(side_stream) for every side stream it used"),
    KnownFailure(
        ("cudaerrorstreamcaptureisolation", "dependency created on uncaptured work in another stream"),
        "cudaErrorStreamCaptureIsolation",
        "the captured region waited on an event or stream whose work was queued before capture began",
        "synchronise that stream before capture, or record the event inside the region"),
    KnownFailure(
        ("cudaerrorcapturedevent", "event last recorded in a capturing stream"),
        "cudaErrorCapturedEvent",
        "an event recorded inside the region was queried or synchronised (timing events, event.synchronize())",
        "time the whole replay from outside the region; never query events recorded inside it"),
    KnownFailure(
        ("cudaerrorstreamcaptureinvalidated", "operation failed due to a previous error during capture"),
        "cudaErrorStreamCaptureInvalidated",
        "something else broke the capture first: another thread used CUDA meanwhile (a data-loader pin-memory "
        "thread, an asynchronous checkpoint or logging thread), or an earlier illegal call in the region",
        "stop background CUDA work while capturing, or capture with capture_error_mode='thread_local'; if no "
        "thread is involved, the first error in the traceback names the illegal call"),
    KnownFailure(
        ("cuda graph replay detected", "dead tensor"),
        "freed graph input",
        "a tensor the graph reads was freed after capture",
        "keep every tensor the graph uses alive and write new data into it in place (static_input.copy_(batch))"),
    KnownFailure(
        ("cudaerrorillegaladdress", "illegal memory access"),
        "cudaErrorIllegalAddress",
        "a kernel touched memory it does not own; with graphs, most often a replay reading a tensor that was freed "
        "or replaced after capture (an input reassigned instead of copied into, parameters re-created by .to() or "
        "load_state_dict(assign=True), or megatron-core's selective recompute of a norm or of MLA's up-projections "
        "inside a per-layer graph, which frees their output in the forward graph and rebuilds it in the backward)",
        "keep every tensor the graph uses alive and copy new data into it in place (for megatron-core: drop "
        "layernorm and mla_up_proj from model.recompute_modules); "
        "torch.cuda.graph(..., check_input_liveness=True) names the freed tensor, CUDA_LAUNCH_BLOCKING=1 the kernel; "
        "the CUDA context is unusable afterwards, so the process exits"),
    KnownFailure(
        ("out of memory", "cudaerrormemoryallocation"),
        "cudaErrorMemoryAllocation (out of memory)",
        "the step needs more device memory than is free; with graphs, each keeps the memory of its captured "
        "region in a private pool on top of what eager steps use",
        "lower train.micro_batch_size, graph a smaller scope (cuda_graph=te_attn instead of te_layer or "
        "full_iteration), or share one pool across graphs (model.cuda_graph_use_single_mempool=true)"),
    KnownFailure(
        ("cannot copy between cpu and cuda tensors during cuda graph capture",),
        "host copy during capture",
        "a copy between host and device memory inside the captured region: megatron-core's allgather MoE "
        "dispatcher copies per-expert token counts to the host when the dispatch is graphed, and the experts' fused "
        "quick_geglu (GPT-OSS) copies its GLU offset",
        "model.moe_token_dispatcher_type=alltoall with drop-and-pad routing, model.bias_activation_fusion=false, or "
        "graph the router only (cuda_graph=te_attn_moe_router); in your own code, keep the value on the device or "
        "pin the host tensor"),
    KnownFailure(
        ("checkpointing is not compatible with .grad()",),
        "reentrant checkpoint in the captured region",
        "selective recompute checkpoints a graphed module reentrantly (megatron-core before 0.18: core_attn, mlp, "
        "moe, shared_experts; Transformer Engine's checkpoint under fp8), and capture's autograd.grad refuses it",
        "drop that module from model.recompute_modules, graph a scope without it, or cuda_graph=full_iteration"),
    KnownFailure(
        ("unsupported rng states tracker",),
        "RNG tracker not Transformer Engine's",
        "Transformer Engine layers were captured with megatron-core's RNG tracker",
        "rng.te_rng_tracker=true"),
    KnownFailure(
        ("could not infer dtype of _weakreftensor",),
        "graph output of an unsupported dtype",
        "a graph returns an fp64 tensor (model.moe_router_dtype=fp64 under a moe_router graph)",
        "model.moe_router_dtype=fp32, or a scope without moe_router"),
    KnownFailure(
        ("non-empty donated buffers",),
        "retained backward of a compiled function",
        "a torch.compile'd function (megatron-core's fused bias-dropout-add) in a graph captured with its backward "
        "retained (model.cuda_graph_retain_backward_graph=true)",
        "model.cuda_graph_retain_backward_graph=false, or model.bias_dropout_fusion=false"),
    KnownFailure(
        ("cudageneratorimpl", "cuda generator not in capture mode"),
        "random generator state read during capture",
        "the region seeded or read a random generator on the host (manual_seed, get_rng_state) or used a "
        "generator not registered with the graph",
        "seed before capture, register extra generators with graph.register_generator_state, and keep "
        "rng.te_rng_tracker=true on the megatron engine"),
)


@contextmanager
def graph_region(region: str, phase: str) -> Iterator[None]:
    """Re-raise any failure inside as a GraphCaptureError naming ``region`` and ``phase``."""
    try:
        yield
    except GraphCaptureError:
        raise
    except Exception as error:
        raise GraphCaptureError(region, phase, error) from error


def failure_reason(error: BaseException, step: Optional[int] = None) -> str:
    """The reason result.json gives for a run that ``error`` ended at ``step`` (None: unknown)."""
    if isinstance(error, NonFiniteError):
        return str(error)
    known = diagnose(error)
    in_graph = isinstance(error, GraphCaptureError)
    if not in_graph and known is None:
        return f"{type(error).__name__}: {error}" if str(error).strip() else raised_at(error)
    if in_graph:
        where = f"CUDA graph {error.phase} of {error.region} failed" + ("" if step is None else f" at step {step}")
    else:  # a CUDA error reported outside any region: asynchronously, or in an eager step
        where = "the run failed" if step is None else f"step {step} failed"
    original = error.original if in_graph else error
    error_text = f"{type(original).__name__}: {first_line(original)}"
    if known is None:
        return f"{where}: {error_text} (no known cause matches; see the traceback)"
    return f"{where}: {known.cuda_error}. Likely cause: {known.cause}. Fix: {known.fix}. [{error_text}]"


def diagnose(error: BaseException) -> Optional[KnownFailure]:
    """The known failure behind ``error``, judged from its root cause outwards: a failed capture
    often ends in a later 'previous error during capture' whose context is the real culprit."""
    for cause in reversed(causes(error)):
        text = str(cause).lower()
        for known in KNOWN_FAILURES:
            if any(pattern in text for pattern in known.patterns):
                return known
    return None


def causes(error: BaseException) -> List[BaseException]:
    """``error`` and the exceptions it was raised from or during, outermost first."""
    chain: List[BaseException] = []
    current: Optional[BaseException] = error
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def raised_at(error: BaseException) -> str:
    """An exception without a message (a bare ``assert`` inside a library) named by the line that
    raised it, which is all there is to go on."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return type(error).__name__
    frame = frames[-1]
    path = frame.filename.split("site-packages/")[-1]
    return f"{type(error).__name__} at {path}:{frame.lineno}: {frame.line}"
