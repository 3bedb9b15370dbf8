"""One rank of a parallel job, built on the CPU as the megatron engine builds it: megatron-core's parallel state,
the GPTModel chunks with their block specs, the DDP wrapper and the optimizer, then one forward-backward step and
the optimizer step where the CPU allows.

Any world size runs in this one process: PyTorch's fake process group (``torch.testing._internal.distributed.
fake_pg``) makes rank ``r`` of ``N`` without the other ranks, as torchtitan's fake-backend dry run builds one rank of
a large job. Its collectives move nothing, so the step's numbers mean nothing; what counts is that megatron-core
builds the rank and runs its checks (its constructors' asserts, the MoE layer's and the schedules' own) on it.

What megatron-core needs CUDA for only while building (CUDA streams, device tensors, the device RNG) runs on the
CPU here (``cuda_on_cpu``), so a configuration is not left unbuilt for it. What only a GPU can show (capture,
kernels, memory, Transformer Engine) stays with the GPU differential (benchmarks/gpu_differential.py). Run one
configuration a process (megatron-core keeps global state); ``build_rank`` tears its own state down after."""

import contextlib
import warnings
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

COUNT_EXCHANGING_DISPATCHERS = ("alltoall", "flex")
"""Dispatchers whose step cannot run on fake collectives: they size their buffers from token counts the other
ranks send (an all-to-all and all-gather of counts), which a fake process group leaves unwritten."""


HOPPER = (9, 0)
"""The compute capability the stand-in GPU reports: the differential's machine is H100s."""
NOT_HERE = ("not compiled with CUDA", "Found no NVIDIA driver", "CUDA driver", "dummy base class", "NameError")
"""What an error says when it asked for CUDA itself, or for a name megatron-core imports from Transformer Engine
only where it is installed (a NameError), which the CPU cannot give: not megatron-core's refusal."""


@dataclass
class RankBuild:
    """What building one rank reached: ``stage`` is the last step taken (parallel state, model, optimizer, step),
    ``error`` megatron-core's refusal, ``not_here`` what stopped it that only a GPU machine has (CUDA, Transformer
    Engine), ``stepped`` whether a training step ran; ``parameters`` (every one, the trainable ones) and
    ``gradient_buffer`` (the elements DDP's gradient buffers hold) once the model is built; ``gradient_sum`` the
    absolute sum of what a step left in those buffers."""
    rank: int
    stage: str
    error: Optional[str] = None
    not_here: Optional[str] = None
    stepped: bool = False
    parameters: Optional[Tuple[int, int]] = None
    gradient_buffer: Optional[int] = None
    gradient_sum: Optional[float] = None

    @property
    def built(self) -> bool:
        """Model, wrapper and optimizer were built (a step that needed CUDA leaves the build standing)."""
        return self.error is None and self.stage in ("built", "step", "stepped")


class _Stream:
    """A CUDA stream that orders nothing: the CPU runs everything in order."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args):
        pass

    def wait_event(self, *args):
        pass

    def synchronize(self):
        pass

    def record_event(self, *args):
        return _Event()


class _Event:
    """A CUDA event that has always happened."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args):
        pass

    def synchronize(self):
        pass

    def wait(self, *args):
        pass

    def query(self) -> bool:
        return True


_MISSING = object()


def _on_cuda(device) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):  # an index is a CUDA device (current_device's 0)
        return True
    try:
        return device is not None and torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


_UNWRITTEN = {torch.empty: torch.zeros, torch.empty_like: torch.zeros_like}


class _CudaOnCpu(TorchFunctionMode):
    """Tensors asked for on a CUDA device are made on the CPU, and zeroed; megatron-core's type checks see CUDA
    types."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return func(*args).replace("torch.", "torch.cuda.", 1)  # "Wrapped parameters must be ... cuda ..."
        if func is torch.Tensor.is_cuda.__get__:
            return True
        if func in _UNWRITTEN:  # what a fake receive or gather leaves unwritten reads as zeros, not as NaN garbage
            func = _UNWRITTEN[func]
        if _on_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _on_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_on_cpu(capability=HOPPER) -> Iterator[None]:
    """CUDA's streams, device, RNG and tensors stood in by the CPU's, a GPU of ``capability``, and megatron-core's
    Gloo groups made fake (a fake store cannot rendezvous Gloo)."""
    from megatron.core.distributed.fsdp import mcore_fsdp_adapter
    from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer as fsdp_buffer
    from megatron.core.fusions import fused_softmax
    from megatron.core.tensor_parallel import random as megatron_random
    from megatron.core.transformer.moe import moe_utils

    stream, te_linear = _Stream(), getattr(mcore_fsdp_adapter, "TELinear", None)
    stand_ins = [
        (torch.cuda, "current_device", lambda: "cpu"), (torch.cuda, "Stream", _Stream), (torch.cuda, "Event", _Event),
        # torch.compile'd fusions (megatron-core's jit_fuser) would trace the function mode below: run them eagerly
        (torch._dynamo.config, "disable", True),
        (torch.cuda, "stream", lambda s: contextlib.nullcontext()), (torch.cuda, "default_stream", lambda *a: stream),
        (torch.cuda, "current_stream", lambda *a: stream), (torch.cuda, "synchronize", lambda *a: None),
        (torch.cuda, "set_stream", lambda *a: None), (torch.cuda, "get_rng_state", lambda *a: torch.get_rng_state()),
        (torch.cuda, "manual_seed", torch.manual_seed), (torch.cuda, "get_device_capability", lambda *a: capability),
        (megatron_random, "_get_cuda_rng_state", _rng_state), (megatron_random, "_set_cuda_rng_state", _set_rng_state),
        (dist, "new_group", _fake_instead_of_gloo(dist.new_group)),
        (dist, "batch_isend_irecv", _received_as_activations(dist.batch_isend_irecv)),
        # Megatron-FSDP's adapter broadcasts the first tensor-parallel rank's RNG states as pickled objects, which a
        # fake broadcast leaves unsent: each rank keeps its own
        (mcore_fsdp_adapter.FullyShardedDataParallel, "sync_rng_states_across_tp_group", lambda self: None),
        # what megatron-core's graph-safe RNG tracker asks of PyTorch (a CPU build of PyTorch has no CUDA graphs)
        (torch.cuda.CUDAGraph, "register_generator_state", lambda *a: None),
        (torch.cuda, "graph_pool_handle", lambda: (0, 0)),  # CudaGraphManager takes its memory pool at model build
        # autograd runs a custom Function's backward, and so recompute's second forward, outside the function mode
        # below: the causal mask that forward makes on "cuda" is made here on the CPU
        (fused_softmax, "get_default_causal_mask", _causal_mask),
        # megatron-core 0.16.1's router names Transformer Engine's GEMM unguarded where TE is missing (NameError);
        # the GPU node the plan is for has TE, and without it the router computes the same GEMM in torch
        (moe_utils, "te_general_gemm", getattr(moe_utils, "te_general_gemm", None)),
        # 0.16.1's Megatron-FSDP adapter marks TP parameters by their module's class, TELinear, unguarded where TE
        # is missing (not a class then; 0.19.2 matches the name); no module of the CPU's local spec is one
        (mcore_fsdp_adapter.FullyShardedDataParallel, "__init__",
         _on_device_zero(mcore_fsdp_adapter.FullyShardedDataParallel.__init__)),
        (mcore_fsdp_adapter, "TELinear", te_linear if isinstance(te_linear, type) else _NoSuchModule),
        # Megatron-FSDP checks that the ranks' chunks of each sharded parameter tile it by gathering them and
        # all-reducing boundary flags, which a fake process group leaves unsent: the GPU checks it
        (fsdp_buffer, "validate_uneven_dtensor", lambda dtensor: None),
    ]
    saved = [(owner, name, getattr(owner, name, _MISSING)) for owner, name, _ in stand_ins]
    for owner, name, value in stand_ins:
        setattr(owner, name, value)
    try:
        with _CudaOnCpu():
            yield
    finally:
        for owner, name, value in saved:
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _on_device_zero(init):
    """Megatron-FSDP names its device cuda:<current_device()>, which the stand-in's "cpu" makes no device string:
    while it is built, the current device is 0 (tensors asked for on cuda:0 the function mode makes on the CPU).
    Elsewhere it stays "cpu": autograd's backward runs outside the function mode, where "cpu" is a real device."""
    def on_device_zero(self, *args, **kwargs):
        current = torch.cuda.current_device
        torch.cuda.current_device = lambda: 0
        try:
            init(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = current
    return on_device_zero


class _NoSuchModule:
    """A class no module is an instance of."""


def _causal_mask(sq: int) -> torch.Tensor:
    return torch.triu(torch.ones(sq, sq), diagonal=1).bool()


def _rng_state(*args, graph_safe: bool = False, **kwargs):
    """The CPU's RNG state; a generator of its own where megatron-core keeps graph-safe states (generators)."""
    return torch.Generator() if graph_safe else torch.get_rng_state()


def _set_rng_state(state, *args, **kwargs) -> None:
    if isinstance(state, torch.Tensor):
        torch.set_rng_state(state)  # a graph-safe state is a generator of its own: nothing to restore


def _received_as_activations(batch_isend_irecv):
    """A pipeline stage's fake receive reads as unit-scale noise (a fixed draw), as a real stage's activations and
    gradients do: zeros made RMSNorm's gradient 1/sqrt(eps) a norm, and eight chained MTP layers overflowed on the last
    stage of a draw that trains at one stage (differential seed 302, two ranks, draw 71)."""
    noise = torch.Generator().manual_seed(0)

    def receive(ops):
        with torch.no_grad():  # a received activation is a leaf that requires a gradient
            for op in ops:
                if op.op.__name__ == "irecv" and op.tensor.is_floating_point():
                    op.tensor.copy_(torch.randn(op.tensor.shape, generator=noise))
        return batch_isend_irecv(ops)
    return receive


def _fake_instead_of_gloo(new_group):
    def fake_group(*args, **kwargs):
        if kwargs.get("backend") == "gloo":
            kwargs["backend"] = None  # the default backend: fake
        return new_group(*args, **kwargs)
    return fake_group


def roles(cfg) -> List[int]:
    """One rank of each role: the first, a middle and the last pipeline stage (each builds all its virtual
    stages), and the last rank of the world (the last tensor, context, expert and data-parallel ranks)."""
    world = cfg.train.num_gpus
    stages = cfg.model.pipeline_model_parallel_size
    per_stage = world // stages
    picks = [0, (stages // 2) * per_stage, (stages - 1) * per_stage, world - 1]
    return sorted(set(picks))


def build_rank(cfg, rank: int, step: bool = True) -> RankBuild:
    """Build rank ``rank`` of ``cfg`` (a finished config that plans valid) and train one step where the CPU allows;
    megatron-core's refusal comes back as ``error``, anything else raises."""
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from bridge.engines.megatron.local import reset_local_graph_state

    result = RankBuild(rank, "parallel state")
    with warnings.catch_warnings(), cuda_on_cpu():
        warnings.simplefilter("ignore")
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cfg.train.num_gpus)
        try:
            _build_and_step(cfg, result, step)
        except REFUSALS as error:
            message = f"{type(error).__name__}: {first_line(error)}"[:300]
            if any(text in message for text in NOT_HERE):
                result.not_here = message
            else:
                result.error = message
        finally:
            reset_local_graph_state()
            _forget_loss_trackers()
            parallel_state.destroy_model_parallel()
            destroy_num_microbatches_calculator()
            dist.destroy_process_group()
    return result


def _forget_loss_trackers() -> None:
    """megatron-core's MoE metrics and multi-token-prediction losses are process-global, sized by the layer counts of
    the first model that records (differential seed 302, two ranks, draw 71: eight MTP layers after a draw of four,
    'IndexError: index 4 is out of bounds', which no training process, holding one model, meets)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()
    try:
        from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker  # 0.19
    except ImportError:  # 0.16.1 keeps them in a module dict
        from megatron.core.transformer.moe import moe_utils

        moe_utils._MOE_LAYER_WISE_LOGGING_TRACKER.clear()
    else:
        destroy_moe_metrics_tracker()


REFUSALS = (AssertionError, ValueError, KeyError, NotImplementedError, TypeError, RuntimeError, ImportError,
            AttributeError, NameError, ArithmeticError, IndexError)
"""What megatron-core raises on a configuration it will not build or train (TypeError, AttributeError, a division
by a zero size and an index past a list are its crashes on inputs it never expected, which a user meets all the
same)."""


def first_line(error: BaseException) -> str:
    """The innermost message of an error that megatron-core's spec builder may have wrapped several times."""
    while error.__context__ is not None and str(error).startswith(str(error.__context__).split("\n")[0]):
        error = error.__context__
    return str(error).splitlines()[0] if str(error) else ""


def _build_and_step(cfg, result: RankBuild, step: bool) -> None:
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from bridge.config.graphs import graph_impl
    from bridge.config.schema import CudaGraphImpl
    from bridge.engines.base import count_parameters
    from bridge.engines.megatron import engine
    from bridge.engines.megatron.model_build import build_model_chunks
    from bridge.translate import build_megatron_configs

    configs = build_megatron_configs(cfg)
    transformer_config = configs["transformer_config"]
    transformer_config.use_cpu_initialization = True
    engine.init_parallel_state(cfg)
    # The engine's seeding with megatron-core's own tracker (Transformer Engine's needs its package), graph-safe where
    # the model is graphed, as megatron-core checks at model build.
    model_parallel_cuda_manual_seed(cfg.rng.seed, use_cudagraphable_rng=graph_impl(cfg.model.cuda_graph_impl).graphed,
                                    force_reset_rng=True)
    result.stage = "model"
    chunks = build_model_chunks(transformer_config, configs["gpt_model"], configs["ddp_config"],
                                use_transformer_engine=engine.choose_layer_spec(cfg) == "transformer_engine",
                                overlap_param_gather_with_optimizer_step=cfg.optimizer.
                                overlap_param_gather_with_optimizer_step, peft=cfg.peft)
    result.parameters = count_parameters(chunks)
    result.gradient_buffer = sum(count for count, _ in gradient_buffers(chunks))
    result.stage = "optimizer"
    optimizer = get_megatron_optimizer(configs["optimizer_config"], chunks)
    engine.set_model_config_hooks(transformer_config, chunks, cfg.ddp.overlap_grad_reduce)
    # The engine refuses local graphs on a rank without a layer, Transformer Engine's where no pipeline rank has one:
    # one rank's build tells that only without pipeline parallelism (with it, mlp_needs_dense_layers and its kin
    # refuse a scope no layer has).
    impl = CudaGraphImpl(cfg.model.cuda_graph_impl)
    refused_on_this_rank = impl == CudaGraphImpl.local or (
        impl == CudaGraphImpl.transformer_engine and cfg.model.pipeline_model_parallel_size == 1)
    if refused_on_this_rank and not graphed_layers(chunks, transformer_config):
        raise ValueError(f"the engine's {impl.value} per-layer graphs find no layer on this rank")
    if not (step and steppable(cfg)):
        result.stage = "built"
        return
    result.stage = "step"
    _train_one_step(cfg, chunks, optimizer)
    result.gradient_sum = sum(grads.abs().sum().item() for _, grads in gradient_buffers(chunks))
    result.stage, result.stepped = "stepped", True


def gradient_buffers(chunks) -> List[Tuple[int, torch.Tensor]]:
    """(parameters, gradient tensor) of each gradient buffer this rank holds: DDP's dense and expert buffers
    (unpadded), or Megatron-FSDP's shard of each parameter group's (ddp.use_megatron_fsdp)."""
    buffers = []
    for chunk in chunks:
        if chunk.ddp_config.use_megatron_fsdp:
            grads = [group.main_grad_buffer.data for group in chunk.param_and_grad_buffer.parameter_groups
                     if group.main_grad_buffer is not None]
            buffers += [(tensor.numel(), tensor) for tensor in grads]
        else:
            buffers += [(buffer.numel_unpadded, buffer.grad_data)
                        for buffer in chunk.buffers + chunk.expert_parallel_buffers]
    return buffers


def graphed_layers(chunks, transformer_config) -> int:
    """The layers this rank's per-layer graphs take, counted as the engine finds them: under local graphs the
    CudaGraphManagers megatron-core built into them (LocalLayerGraphs), under Transformer Engine's those that
    megatron-core's TECudaGraphHelper would take, as its constructor counts them (it needs Transformer Engine)."""
    from megatron.core.transformer.cuda_graphs import CudaGraphManager, _layer_is_graphable
    from megatron.core.utils import get_attr_wrapped_model

    if transformer_config.cuda_graph_impl == "local":
        return sum(isinstance(module, CudaGraphManager) for chunk in chunks for module in chunk.modules())
    count = 0
    for chunk in chunks:
        try:
            model = get_attr_wrapped_model(chunk, "decoder", allow_none=False, return_model_obj=True)
        except RuntimeError:  # a chunk without a decoder, as the helper allows
            continue
        layers = list(model.decoder.layers)
        if getattr(model, "mtp", None) is not None:  # the MTP block's layer: mtp_model_layer on 0.19, before that
            layers += [getattr(layer, "mtp_model_layer", None) or layer.transformer_layer for layer in model.mtp.layers]
        count += sum(bool(_layer_is_graphable(layer, transformer_config)) for layer in layers)
    return count


def steppable(cfg) -> bool:
    """A step runs on fake collectives and without CUDA: not under expert parallelism with a dispatcher that sizes
    buffers from the counts other ranks send, nor with local per-layer graphs (CudaGraphManager captures inside the
    first step), nor with Transformer Engine's fused cross entropy (the loss alone needs its kernel; the model,
    wrapper and optimizer build without it)."""
    model = cfg.model
    exchanges_counts = (model.num_moe_experts and model.expert_model_parallel_size > 1
                        and model.moe_token_dispatcher_type in COUNT_EXCHANGING_DISPATCHERS)
    te_loss = model.cross_entropy_loss_fusion and model.cross_entropy_fusion_impl == "te"
    return not exchanges_counts and model.cuda_graph_impl != "local" and not te_loss


def _train_one_step(cfg, chunks, optimizer) -> None:
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import get_num_microbatches
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from bridge.data import MockData
    from bridge.engines.megatron.engine import forward_step

    data = MockData(cfg, parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size())
    # lists, as the engine passes them: the interleaved schedule (any virtual pipeline size, 1 too) indexes them
    batches = [iter(data.microbatches(0)) for _ in chunks]
    get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=batches, model=chunks, num_microbatches=get_num_microbatches(),
        seq_length=cfg.dataset.seq_length, micro_batch_size=cfg.train.micro_batch_size, forward_only=False)
    optimizer.step()
