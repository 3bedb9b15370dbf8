"""The megatron engine: megatron-core GPTModel, DDP, optimizer and schedule, graphed as configured.
Built the way Megatron-LM / Megatron-Bridge build a job: process group, a dedicated CUDA stream,
model-parallel groups, microbatch calculator, RNG tracker, GPTModel (Transformer Engine or
local layer spec) in Float16Module and megatron DDP (or Megatron-FSDP), megatron optimizer and
OptimizerParamScheduler, ``get_forward_backward_func``. The CUDA-graph mechanism is one lifecycle object per
impl (full_iteration.py, local.py, transformer_engine.py) behind one protocol (lifecycle.py). What the engine can
run, the catalogue decided before it was built.

Same seed, same weights and same data for every graph impl: the model is built before any graph
machinery runs, from RNG trackers seeded identically (Transformer Engine's attention sinks, which TE
before 2.14 leaves uninitialised, are zeroed: model_build.py), and the data depends only on the seed,
so loss curves compare across impls.

Every step records into a device-side ``FiniteCheck`` whether its loss and gradient norm were
finite (perf.nan_check_interval > 0); under full-iteration graphs both come out of the replay
without a host sync. perf.inject_nan_at_step multiplies the loss by NaN from that step on,
inside the (graphed) loss function, to test it.

One engine per process: megatron-core keeps graph, RNG and static-buffer state at class level;
``close`` deletes every graph and resets that state.
"""

import gc
import importlib
import logging
import math
import os
import threading
import warnings
from contextlib import nullcontext
from functools import partial
from typing import List, Optional, Set, Tuple

import torch
from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.num_microbatches_calculator import (
    destroy_num_microbatches_calculator,
    get_num_microbatches,
    init_num_microbatches_calculator,
)
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

from bridge.config.graphs import graph_impl
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig
from bridge.data import MockData
from bridge.diagnosis import graph_region
from bridge.engines.base import count_parameters
from bridge.engines.finite_check import FiniteCheck
from bridge.engines.megatron.capturable_optimizer import CapturableAdamW, ScheduleView
from bridge.engines.megatron.compat import batch_on_this_cp_rank
from bridge.engines.megatron.full_iteration import (
    FullIterationGraphs,
    full_iteration_state_is_clean,
    reset_full_iteration_state,
)
from bridge.engines.megatron.lifecycle import GraphLifecycle, NoGraphs
from bridge.engines.megatron.local import LocalLayerGraphs, local_graph_state_is_clean, reset_local_graph_state
from bridge.engines.megatron.model_build import build_model_chunks
from bridge.engines.megatron.transformer_engine import TransformerEngineGraphs
from bridge.translate import build_megatron_configs

PACKING_KEYS = ("cu_seqlens", "max_seqlen")
"""What a packed microbatch carries beside the model's inputs: it reaches the model as packed_seq_params."""
OPTIMIZER_GRAPH = "the optimizer graph (megatron-core OptimizerCudaGraphWrapper)"
RELEASE_TIMEOUT_S = 60.0
"""Longest wait for a half-built engine to release what it holds before its build's failure is reported."""
log = logging.getLogger("bridge.engines.megatron")


class MegatronEngine:
    name = "megatron"

    def __init__(self, cfg: GraphBridgeConfig):
        self.cfg = cfg
        self.effective_impl = CudaGraphImpl(cfg.model.cuda_graph_impl).value
        self.graphs: GraphLifecycle = NoGraphs()
        self.model_chunks: List[torch.nn.Module] = []
        self.optimizer = None
        self._closed = False
        try:
            self._build()
        except BaseException:
            self._release_half_built()
            raise

    def _release_half_built(self) -> None:
        """close() after a failed build, waited for at most RELEASE_TIMEOUT_S: a rank whose peer failed can wait
        for it in destroy_process_group without end, and the build's failure must still reach result.json
        (bridge.run bounds the release of a built engine the same way)."""
        device = getattr(self, "device", None)

        def release() -> None:
            try:
                if device is not None and device.type == "cuda":
                    torch.cuda.set_device(device)  # a new thread's current device is GPU 0
                self.close()
            except Exception as error:  # after a sticky CUDA error every call fails; nothing more to free
                log.error("releasing the half-built engine failed: %s", error)

        releasing = threading.Thread(target=release, name="release-half-built-engine", daemon=True)
        releasing.start()
        releasing.join(RELEASE_TIMEOUT_S)
        if releasing.is_alive():
            log.error("releasing the half-built engine took over %.0f s; leaving it to the process's exit",
                      RELEASE_TIMEOUT_S)

    def _build(self) -> None:
        cfg = self.cfg
        self.device = init_distributed()
        configs = build_megatron_configs(cfg)
        self.transformer_config = configs["transformer_config"]
        init_parallel_state(cfg)
        self.num_microbatches = get_num_microbatches()
        seed_rng_trackers(cfg, graphed=graph_impl(self.effective_impl).graphed)
        self.layer_spec = choose_layer_spec(cfg)
        self.model_chunks = build_model_chunks(
            self.transformer_config, configs["gpt_model"], configs["ddp_config"],
            use_transformer_engine=self.layer_spec == "transformer_engine",
            overlap_param_gather_with_optimizer_step=cfg.optimizer.overlap_param_gather_with_optimizer_step,
            peft=cfg.peft)
        # Graph machinery and optimizer come after the model, so the weights never depend on the impl.
        torch.cuda.synchronize()
        # Translation chose the in-graph optimizer: megatron-core's own optimizer graph (a capturable megatron
        # optimizer, optimizer_cuda_graph; the distributed optimizer on 0.19), else graphbridge's capturable
        # AdamW inside the full-iteration graph.
        self.optimizer_graph = getattr(configs["optimizer_config"], "optimizer_cuda_graph", False)
        self.optimizer_in_iteration = cfg.optimizer.optimizer_in_graph and not self.optimizer_graph
        if self.optimizer_in_iteration:
            self.optimizer = CapturableAdamW(self.model_chunks, cfg.optimizer, self.device)
            self.schedule_view = ScheduleView()
            schedule_target = self.schedule_view
        else:
            self.optimizer = get_megatron_optimizer(configs["optimizer_config"], self.model_chunks)
            self.transformer_config.grad_scale_func = self.optimizer.scale_loss
            schedule_target = self.optimizer
        self.scheduler = build_scheduler(cfg, schedule_target)
        set_model_config_hooks(self.transformer_config, self.model_chunks, cfg.ddp.overlap_grad_reduce)

        # Megatron-Bridge train.py: with the distributed optimizer gathering params behind the forward, the pre-hooks
        # stay off for the first step (nothing to wait for yet); Megatron-FSDP gathers through hooks of its own.
        self.toggle_forward_pre_hook = (cfg.ddp.use_distributed_optimizer and cfg.ddp.overlap_param_gather
                                        and not cfg.ddp.use_megatron_fsdp)
        if self.toggle_forward_pre_hook:
            for chunk in self.model_chunks:
                chunk.disable_forward_pre_hook(param_sync=False)

        self.graphs = self._graph_lifecycle()
        self.forward_backward = self.graphs.wrap(get_forward_backward_func())
        self.finite_check = FiniteCheck(self.device) if cfg.perf.nan_check_interval > 0 else None
        self.inject_nan_at_step = cfg.perf.inject_nan_at_step
        # A device tensor, so a captured loss function reads each step's value.
        self.loss_factor = torch.ones((), device=self.device) if self.inject_nan_at_step is not None else None
        self.forward_step = partial(forward_step, loss_factor=self.loss_factor)
        self.mock_data = MockData(cfg, parallel_state.get_data_parallel_rank(),
                                  parallel_state.get_data_parallel_world_size())
        self.prefetched = (0, pinned(self.mock_data.microbatches(0)))
        self.steps_done = 0

    def _graph_lifecycle(self) -> GraphLifecycle:
        """The lifecycle of the impl's megatron-core mechanism (bridge.config.graphs names them)."""
        cfg, impl = self.cfg, CudaGraphImpl(self.cfg.model.cuda_graph_impl)
        if impl == CudaGraphImpl.full_iteration:
            optimizer_step = self.optimizer.step if self.optimizer_in_iteration else None
            return FullIterationGraphs(self.transformer_config, optimizer_step,
                                       graphed_optimizer=self.optimizer if self.optimizer_graph else None)
        if impl == CudaGraphImpl.local:
            return LocalLayerGraphs(self.model_chunks)
        if impl == CudaGraphImpl.transformer_engine:
            return TransformerEngineGraphs(self.model_chunks, self.transformer_config, cfg.dataset.seq_length,
                                           cfg.train.micro_batch_size, self.optimizer, self.toggle_forward_pre_hook)
        return NoGraphs()

    def train_step(self, step: int) -> torch.Tensor:
        self.graphs.before_step(step)
        for chunk in self.model_chunks:
            chunk.zero_grad_buffer()
        if self.optimizer_in_iteration:
            self.optimizer.set_learning_rate(self.schedule_view.learning_rate)
        else:
            self.optimizer.zero_grad()
        if self.loss_factor is not None:
            self.loss_factor.fill_(math.nan if step >= self.inject_nan_at_step else 1.0)
        phase = self.graphs.phase(step)
        with graph_region(self.graphs.region, phase) if phase else nullcontext():
            losses = self.forward_backward(
                forward_step_func=self.forward_step, data_iterator=self._step_data(step), model=self.model_chunks,
                num_microbatches=self.num_microbatches, seq_length=self.cfg.dataset.seq_length,
                micro_batch_size=self.cfg.train.micro_batch_size, forward_only=False)
        # The GPU is still busy with this step: build the next step's batches meanwhile.
        self.prefetched = (step + 1, pinned(self.mock_data.microbatches(step + 1)))
        if self.optimizer_in_iteration:
            stepped, grad_norm = True, self.optimizer.grad_norm
        else:
            with graph_region(OPTIMIZER_GRAPH, phase) if phase and self.optimizer_graph else nullcontext():
                stepped, grad_norm, _ = self.optimizer.step()
        if stepped:
            self.scheduler.step(increment=1)
        if self.toggle_forward_pre_hook and self.steps_done == 0:
            for chunk in self.model_chunks:
                chunk.enable_forward_pre_hook()
        self.steps_done += 1
        loss = self._step_loss(losses)
        if self.finite_check is not None:
            self.finite_check.record(loss, self._device_grad_norm(grad_norm))
        return loss

    def _device_grad_norm(self, grad_norm) -> Optional[torch.Tensor]:
        """The capturable optimizer leaves the norm on the device. megatron-core's returns it as a
        float (it synced for it already): checked here, it costs a launch only when it is bad.
        None when clipping is off."""
        if grad_norm is None or isinstance(grad_norm, torch.Tensor):
            return grad_norm
        return None if math.isfinite(grad_norm) else torch.full((), grad_norm, device=self.device)

    def _step_data(self, step: int) -> List:
        """One iterator of this rank's microbatches per model chunk (each chunk reads them all)."""
        prefetched_step, microbatches = self.prefetched
        if prefetched_step != step:
            microbatches = self.mock_data.microbatches(step)
        if parallel_state.get_context_parallel_world_size() > 1:
            microbatches = [batch_on_this_cp_rank(batch) for batch in microbatches]
        return [iter(microbatches) for _ in self.model_chunks]

    def _step_loss(self, losses) -> torch.Tensor:
        """Mean over microbatches, on every rank (megatron computes it on the last stage only)."""
        if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
            loss = torch.stack([item["lm loss"] for item in losses]).mean()
        else:
            loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            torch.distributed.broadcast(loss, src=parallel_state.get_pipeline_model_parallel_last_rank(),
                                        group=parallel_state.get_pipeline_model_parallel_group())
        data_parallel = parallel_state.get_data_parallel_group(with_context_parallel=True)
        if data_parallel.size() > 1:
            torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.AVG, group=data_parallel)
        return loss

    def capture_steps(self) -> Set[int]:
        return self.graphs.capture_steps()

    def graph_count(self) -> int:
        return self.graphs.graph_count()

    def parameter_counts(self) -> Tuple[int, int]:
        return count_parameters(self.model_chunks)

    def finite_steps(self) -> Optional[torch.Tensor]:
        """Steps before the first non-finite loss or gradient norm, on the device (None: check off)."""
        return None if self.finite_check is None else self.finite_check.finite_steps

    def close(self) -> None:
        """Graphs first (they hold NCCL buffers that block destroy_process_group), then state."""
        if self._closed:
            return
        self._closed = True
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        self.graphs.delete()
        self.graphs = NoGraphs()
        # Also covers an engine that failed half-built, before its lifecycle existed.
        reset_full_iteration_state()
        reset_local_graph_state()
        self.model_chunks, self.optimizer, self.scheduler = [], None, None
        # The config's schedule hooks hold the model chunks and the optimizer.
        self.transformer_config, self.forward_backward, self.forward_step = None, None, None
        self.finite_check = self.loss_factor = None
        gc.collect()
        destroy_num_microbatches_calculator()
        parallel_state.destroy_model_parallel()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        torch.cuda.empty_cache()


def megatron_graph_state_is_clean() -> bool:
    """megatron-core's class-level graph state is as a fresh process has it."""
    return full_iteration_state_is_clean() and local_graph_state_is_clean()


def init_distributed() -> torch.device:
    """torchrun's environment, or a one-process NCCL group when started without torchrun (the
    catalogue's process_count rule checked that the process count is train.num_gpus)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # One process keeps its rendezvous store in memory and takes no port: a port found free first can be another
    # process's before the group binds it (EADDRINUSE on a busy machine, tests/gpu/test_failures_gpu.py at c236fc3).
    store = torch.distributed.HashStore() if world_size == 1 else None
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    # Graph capture on the legacy default stream fails (cudaErrorStreamCaptureImplicit in TE's
    # make_graphed_callables); Megatron-Bridge also moves to a side stream before building anything.
    torch.cuda.set_stream(torch.cuda.Stream())
    # No device_id: bound to a device, PyTorch creates the NCCL communicator of every group megatron-core makes
    # at once, used or not (benchmarks/results/h100/*/run_footprint.json: the device memory that cost). Unbound,
    # a group's communicator comes with its first collective, which the eager steps before any capture make.
    torch.distributed.init_process_group("nccl", store=store, rank=int(os.environ.get("RANK", "0")),
                                         world_size=world_size)
    return device



def init_parallel_state(cfg: GraphBridgeConfig) -> None:
    """megatron-core's model-parallel groups and its global microbatch calculator."""
    model = cfg.model
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=model.tensor_model_parallel_size,
        pipeline_model_parallel_size=model.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=model.virtual_pipeline_model_parallel_size,
        context_parallel_size=model.context_parallel_size,
        expert_model_parallel_size=model.expert_model_parallel_size,
        expert_tensor_parallel_size=model.expert_tensor_parallel_size)
    init_num_microbatches_calculator(
        rank=torch.distributed.get_rank(), rampup_batch_size=None,
        global_batch_size=cfg.train.global_batch_size, micro_batch_size=cfg.train.micro_batch_size,
        data_parallel_size=parallel_state.get_data_parallel_world_size())


def seed_rng_trackers(cfg: GraphBridgeConfig, graphed: bool) -> None:
    """Megatron-Bridge's _set_random_seed, with force_reset: the tracker is process-global."""
    seed = cfg.rng.seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed, te_rng_tracker=cfg.rng.te_rng_tracker,
                                    inference_rng_tracker=cfg.rng.inference_rng_tracker,
                                    use_cudagraphable_rng=graphed, force_reset_rng=True)


def choose_layer_spec(cfg: GraphBridgeConfig) -> str:
    if cfg.model.transformer_impl != "transformer_engine":
        return "local"
    try:
        importlib.import_module("transformer_engine.pytorch")
    except (ImportError, OSError) as missing:
        warnings.warn(f"model.transformer_impl=transformer_engine but Transformer Engine does not import "
                      f"({missing}); building megatron-core's local layer spec instead")
        return "local"
    return "transformer_engine"


def build_scheduler(cfg: GraphBridgeConfig, optimizer) -> OptimizerParamScheduler:
    """Linear warmup from zero, then decay to min_lr at train_iters (counted in iterations)."""
    opt = cfg.optimizer
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=opt.lr, min_lr=opt.min_lr, lr_warmup_steps=opt.lr_warmup_iters,
        lr_decay_steps=cfg.train.train_iters, lr_decay_style=opt.lr_decay_style,
        start_wd=opt.weight_decay, end_wd=opt.weight_decay, wd_incr_steps=cfg.train.train_iters,
        wd_incr_style="constant")


def set_model_config_hooks(transformer_config, model_chunks, overlap_grad_reduce: bool) -> None:
    """The schedule's hooks into DDP, as Megatron-LM's training.py sets them."""
    transformer_config.finalize_model_grads_func = finalize_model_grads
    if overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in model_chunks]
        grad_sync = [chunk.start_grad_sync for chunk in model_chunks]
        transformer_config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
        transformer_config.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync


def pinned(microbatches: List) -> List:
    """Page-locked copies: their host-to-device copies do not hold up the CPU."""
    return [{key: None if value is None else value.pin_memory() for key, value in batch.items()}
            for batch in microbatches]


def forward_step(data_iterator, model, *, loss_factor: Optional[torch.Tensor] = None):
    # Batches arrive on the CPU, as from a data loader: FullCudaGraphWrapper copies them into its
    # static buffers on a side stream that does not wait for work queued on ours. Tensors already
    # on the GPU (those static buffers) pass through unchanged.
    batch = next(data_iterator)
    packed = packed_seq_params(batch)
    batch = {key: value.cuda(non_blocking=True) for key, value in batch.items()
             if value is not None and key not in PACKING_KEYS}
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                   loss_mask=batch["loss_mask"], packed_seq_params=packed)
    return output, partial(masked_mean_loss, batch["loss_mask"], loss_factor)


def packed_seq_params(batch) -> Optional[PackedSeqParams]:
    """megatron-core's parameters of a packed microbatch (bridge.data), as Megatron-Bridge builds them for its
    packed SFT data: one thd sequence a sample, q and kv alike; None for an unpacked one. The bound on a
    sequence's length stays on the host, where Transformer Engine's kernels read it."""
    if batch.get("cu_seqlens") is None:
        return None
    boundaries = batch["cu_seqlens"].cuda(non_blocking=True)
    longest = int(batch["max_seqlen"])
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=boundaries, cu_seqlens_kv=boundaries,
                           max_seqlen_q=longest, max_seqlen_kv=longest)


def masked_mean_loss(loss_mask: torch.Tensor, loss_factor: Optional[torch.Tensor], output: torch.Tensor):
    mask = loss_mask.reshape(-1).float()
    loss = torch.sum(output.float().reshape(-1) * mask) / mask.sum()
    if loss_factor is not None:
        loss = loss * loss_factor
    # The schedule divides the returned loss in place by the microbatch count; report a copy.
    return loss, {"lm loss": loss.detach().clone()}
