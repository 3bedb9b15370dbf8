"""The torch engine: the native model trained with PyTorch alone (bridge.engines.torch.native_model).

How a step runs on CUDA, by ``model.cuda_graph_impl`` and ``torch_compile``:
    none               eager
    full_iteration     one torch.cuda.graph of the whole step with the optimizer inside
                       (capturable AdamW, learning rate as a device tensor); the torch engine
                       always captures the optimizer, whatever optimizer.optimizer_in_graph says
    local              make_graphed_callables over whole layers or the named modules
                       (attn, mlp, moe, moe_router)
    torch_compile      torch.compile of the model, mode default or reduce-overhead (CUDA graphs
                       through torch.compile's cudagraph trees); not combined with a graph impl
On the CPU every step runs eagerly in fp32, with one warning line if graphs were requested.
Every step records whether its loss and gradient norm are finite into a device counter
(``FiniteCheck``, inside the graph under full_iteration) unless perf.nan_check_interval is 0;
perf.inject_nan_at_step multiplies the loss by NaN from that step on, inside the step, to test it.
Training: AdamW (no weight decay on biases and norms), linear warmup then cosine or linear
decay to optimizer.min_lr over train_iters, gradient clipping, gradient accumulation over the
microbatches of the global batch, bf16 autocast on CUDA when model.bf16.
"""

import contextlib
import gc
import math
from typing import Dict, Optional, Set, Tuple

import torch

from bridge.config.graphs import compile_mode, compiled_impl, graph_impl
from bridge.config.schema import CudaGraphImpl, GraphBridgeConfig, OptimizerConfig
from bridge.data import MockData
from bridge.diagnosis import graph_region
from bridge.engines.base import count_parameters
from bridge.engines.finite_check import FiniteCheck
from bridge.engines.torch.graphs import FullIterationGraph, ModuleGraphs, select_modules
from bridge.engines.torch.native_model import build_native_model

BATCH_KEYS = ("tokens", "labels", "loss_mask")


class TorchEngine:
    name = "torch"

    def __init__(self, cfg: GraphBridgeConfig, device: Optional[str] = None):
        """``device``: "cuda" or "cpu", as the catalogue's target decided (by default: for this machine)."""
        if device is None:
            from bridge.validation import resolve_target

            device = resolve_target(cfg).device
        self.device = torch.device(device)
        self.cfg = cfg
        self.effective_impl = effective_impl(cfg, self.device)
        self.data = MockData(cfg)
        # The model's inputs, in its forward's order: packed rows add their positions.
        self.batch_keys = (*BATCH_KEYS, "position_ids") if self.data.packed else BATCH_KEYS
        self.model = build_native_model(cfg).to(self.device)
        graphs_optimizer = self.effective_impl == CudaGraphImpl.full_iteration.value
        self.optimizer = build_optimizer(self.model, cfg.optimizer, self.device, capturable=graphs_optimizer)
        self.capture_step = graph_impl(cfg.model.cuda_graph_impl).capture_step(cfg.model.cuda_graph_warmup_steps, "torch")
        self.finite_check = FiniteCheck(self.device) if cfg.perf.nan_check_interval > 0 else None
        # A device factor the step multiplies its loss by: 1, or NaN once the injection starts.
        self.inject_nan_at_step = cfg.perf.inject_nan_at_step
        self.loss_factor = torch.ones((), device=self.device) if self.inject_nan_at_step is not None else None
        self.full_graph = FullIterationGraph(self._step) if graphs_optimizer else None
        self.module_graphs = None
        if self.effective_impl == CudaGraphImpl.local.value:
            self.module_graphs = ModuleGraphs(select_modules(self.model, cfg.model.cuda_graph_modules))
        self.compile_mode = compile_mode(self.effective_impl)
        self.forward = self.model
        if self.compile_mode is not None:
            self.forward = torch.compile(self.model, mode=None if self.compile_mode == "default" else self.compile_mode)
        self._capture_steps: Set[int] = set()

    def train_step(self, step: int) -> torch.Tensor:
        self._set_learning_rate(learning_rate(self.cfg.optimizer, self.cfg.train.train_iters, step))
        if self.loss_factor is not None:
            self.loss_factor.fill_(math.nan if step >= self.inject_nan_at_step else 1.0)
        batch = self._load_batch(step)
        if self.full_graph is not None:
            if step < self.capture_step:
                return self.full_graph.warmup(batch)
            if step == self.capture_step:
                self.full_graph.capture(batch)
                self._capture_steps.add(step)
            return self.full_graph.replay(batch)
        if self.module_graphs is not None and step >= self.capture_step:
            if step == self.capture_step:
                with self._autocast():
                    self.module_graphs.capture(self.device)
                self._capture_steps.add(step)
            # The graphed modules replay inside the step's forward and backward.
            with graph_region(self.module_graphs.region, "replay"):
                return self._step(batch)
        if step in self._compile_steps():
            self._capture_steps.add(step)
        return self._step(batch)

    def capture_steps(self) -> Set[int]:
        return set(self._capture_steps)

    def graph_count(self) -> int:
        if self.full_graph is not None:
            return self.full_graph.count()
        if self.module_graphs is not None:
            return self.module_graphs.count()
        # cudagraph trees are owned by torch.compile; counted as one graph while alive.
        return int(self.compile_mode == "reduce-overhead" and bool(self._capture_steps))

    def parameter_counts(self) -> Tuple[int, int]:
        return count_parameters([self.model])

    def finite_steps(self) -> Optional[torch.Tensor]:
        """Steps before the first non-finite loss or gradient norm, on the device (None: check off)."""
        return None if self.finite_check is None else self.finite_check.finite_steps

    def close(self) -> None:
        for graphs in (self.full_graph, self.module_graphs):
            if graphs is not None:
                graphs.close()
        if self.compile_mode is not None:
            torch.compiler.reset()  # drops compiled code and the cudagraph-tree memory pools
        self.full_graph = self.module_graphs = self.compile_mode = None
        self.model = self.forward = self.optimizer = self.finite_check = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _step(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        """One optimizer step over the stacked microbatches; the full-iteration graph's body,
        so nothing here may read a device value on the host."""
        self.optimizer.zero_grad(set_to_none=True)
        count = len(batch["tokens"])
        total = torch.zeros((), device=self.device)
        for index in range(count):
            if self.compile_mode == "reduce-overhead":
                # The previous microbatch's graph outputs are dead; let cudagraph trees reuse them.
                torch.compiler.cudagraph_mark_step_begin()
            with self._autocast():
                loss = self.forward(*(batch[key][index] for key in self.batch_keys))
            if self.loss_factor is not None:
                loss = loss * self.loss_factor
            (loss / count).backward()
            total = total + loss.detach()
        grad_norm = None
        if self.cfg.optimizer.clip_grad > 0:
            # error_if_nonfinite=False keeps the norm on the device: no host sync inside a graph.
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optimizer.clip_grad,
                                                       error_if_nonfinite=False)
        self.optimizer.step()
        mean_loss = total / count
        if self.finite_check is not None:
            # Without clipping there is no norm to check; a non-finite gradient then shows in the
            # next step's loss.
            self.finite_check.record(mean_loss, grad_norm)
        return mean_loss

    def _load_batch(self, step: int) -> Dict[str, torch.Tensor]:
        microbatches = self.data.microbatches(step)
        if self.data.packed:
            # Unpadded packed rows have widths of their own: a list a key. Packed steps train eagerly
            # (packed_sequence_scope), so no graph needs them stacked.
            return {key: [mb[key].to(self.device) for mb in microbatches] for key in self.batch_keys}
        return {key: torch.stack([mb[key] for mb in microbatches]).to(self.device) for key in self.batch_keys}

    def _set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)  # a device write the captured optimizer step reads on replay
            else:
                group["lr"] = lr

    def _compile_steps(self) -> Set[int]:
        # Step 0 compiles; reduce-overhead records its CUDA graphs on the second call.
        return {"default": {0}, "reduce-overhead": {0, 1}}.get(self.compile_mode, set())

    def _autocast(self):
        if self.device.type == "cuda" and self.cfg.model.bf16:
            # Graphs must not keep autocast's cache of cast weights (PyTorch's CUDA-graph notes).
            return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
        return contextlib.nullcontext()


def effective_impl(cfg: GraphBridgeConfig, device: torch.device) -> str:
    """What actually runs; on the CPU that is always eager ("none"). The plan's note says so once, before
    the run (bridge.planning.eager_on_cpu), and the run's table shows requested -> effective."""
    if device.type != "cuda":
        return "none"
    if cfg.torch_compile != "none":
        return compiled_impl(cfg.torch_compile)
    return CudaGraphImpl(cfg.model.cuda_graph_impl).value


def build_optimizer(model: torch.nn.Module, config: OptimizerConfig, device: torch.device,
                    capturable: bool) -> torch.optim.AdamW:
    """AdamW over the trainable weights (the adapters alone under LoRA); ``capturable`` keeps its step count and
    learning rate on the device for graphs."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    decayed = [p for name, p in trainable if p.dim() >= 2 and not name.endswith("bias")]
    not_decayed = [p for name, p in trainable if p.dim() < 2 or name.endswith("bias")]
    groups = [{"params": decayed, "weight_decay": config.weight_decay},
              {"params": not_decayed, "weight_decay": 0.0}]
    lr = torch.tensor(config.lr, device=device) if capturable else config.lr
    return torch.optim.AdamW(groups, lr=lr, betas=(config.adam_beta1, config.adam_beta2), eps=config.adam_eps,
                             capturable=capturable)


def learning_rate(config: OptimizerConfig, train_iters: int, step: int) -> float:
    """Linear warmup over lr_warmup_iters, then lr_decay_style down to min_lr at train_iters."""
    if step < config.lr_warmup_iters:
        return config.lr * (step + 1) / config.lr_warmup_iters
    if config.lr_decay_style == "constant":
        return config.lr
    progress = (step - config.lr_warmup_iters) / max(1, train_iters - config.lr_warmup_iters)
    remaining = 0.5 * (1.0 + math.cos(math.pi * progress)) if config.lr_decay_style == "cosine" else 1.0 - progress
    return config.min_lr + (config.lr - config.min_lr) * remaining
