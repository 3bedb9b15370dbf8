"""An in-graph optimizer and megatron-core's step the same gradients, in a fresh process, recorded as JSON.

    python -m tests.gpu.optimizer_equivalence_job OUT.json CANDIDATE [override ...]

The reference is the megatron engine training as configured (cuda_graph=none: megatron-core's optimizer, eager).
A second copy of the model, built by the engine's own functions and given the reference's weights, is stepped by
the candidate: every step, the gradients the reference's backward left in its DDP buffers are copied into the
copy's buffers before the reference's optimizer steps on them (its clipping scales them in place), so both
optimizers see bit-identical gradients whatever their weights. After each of tests/optimizer_equivalence.py's
CHECKPOINTS the fp32 masters and bf16 weights are compared against its rounding bound.

Candidates:
- capturable_adamw: graphbridge's CapturableAdamW (the in-graph optimizer without the distributed optimizer),
  eager for the recipe's graph warmup steps, then captured in a CUDA graph of its own and replayed, as inside
  the full-iteration graph (capture and replay are exact: the same optimizer captured at step 95 instead of
  step 3 trained bit-identically on an H100, issue #29);
- megatron_optimizer_graph: megatron-core's optimizer as the engine builds it for the distributed optimizer on
  0.19 (translation's optimizer_cuda_graph, the step in megatron-core's OptimizerCudaGraphWrapper); its
  reference is then megatron-core's distributed optimizer, eager.

megatron-core keeps graph and parallel state at class level, so every case runs in its own process.
"""

import dataclasses
import json
import sys
from pathlib import Path

import torch
from megatron.core.optimizer import get_megatron_optimizer

import bridge
from bridge.engines.megatron.capturable_optimizer import CapturableAdamW, ScheduleView
from bridge.engines.megatron.compat import MEGATRON_CORE_VERSION
from bridge.engines.megatron.engine import MegatronEngine, build_scheduler
from bridge.engines.megatron.model_build import build_model_chunks
from bridge.engines.megatron.full_iteration import graph_optimizer_step
from bridge.translate import build_megatron_configs
from tests.optimizer_equivalence import CHECKPOINTS, RoundingBudget, WeightPair, compare, norm_gap, paired


def twin_chunks(engine: MegatronEngine, cfg) -> list:
    """The engine's model built a second time, as the engine builds it, holding the engine's weights."""
    configs = build_megatron_configs(cfg)
    chunks = build_model_chunks(engine.transformer_config, configs["gpt_model"], configs["ddp_config"],
                                use_transformer_engine=engine.layer_spec == "transformer_engine",
                                overlap_param_gather_with_optimizer_step=False)
    with torch.no_grad():
        for _, twin, original in paired(named(chunks), named(engine.model_chunks)):
            twin.copy_(original)
    return chunks


def named(chunks) -> list:
    return [(name, param) for chunk in chunks for name, param in chunk.named_parameters() if param.requires_grad]


class CapturableCandidate:
    def __init__(self, engine: MegatronEngine, cfg):
        self.chunks = twin_chunks(engine, cfg)
        self.optimizer = CapturableAdamW(self.chunks, cfg.optimizer, engine.device)
        self.view = ScheduleView()
        self.scheduler = build_scheduler(cfg, self.view)
        self.warmup, self.calls, self.graph = engine.transformer_config.cuda_graph_warmup_steps, 0, None

    def step(self):
        self.optimizer.set_learning_rate(self.view.learning_rate)
        if self.calls == self.warmup:
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.optimizer.step()
        if self.graph is None:
            self.optimizer.step()
        else:
            self.graph.replay()
        self.calls += 1
        self.scheduler.step(increment=1)
        return self.optimizer.grad_norm

    def masters(self) -> dict:
        return {id(param): master for param, master in zip(self.optimizer.model_params, self.optimizer.masters)}

    def close(self) -> None:
        if self.graph is not None:
            self.graph.reset()


class MegatronGraphCandidate:
    def __init__(self, engine: MegatronEngine, cfg):
        self.chunks = twin_chunks(engine, cfg)
        in_graph = dataclasses.replace(cfg, optimizer=dataclasses.replace(cfg.optimizer, optimizer_in_graph=True))
        optimizer_config = build_megatron_configs(in_graph)["optimizer_config"]
        assert optimizer_config.optimizer_cuda_graph, "translation gave megatron-core no optimizer graph"
        self.optimizer = get_megatron_optimizer(optimizer_config, self.chunks)
        graph_optimizer_step(self.optimizer, engine.transformer_config)
        self.scheduler = build_scheduler(cfg, self.optimizer)

    def step(self):
        self.optimizer.zero_grad()
        _, grad_norm, _ = self.optimizer.step()
        self.scheduler.step(increment=1)
        return grad_norm

    def masters(self) -> dict:
        return {id(param): param.main_param for _, param in named(self.chunks)}

    def close(self) -> None:
        """The optimizer graph is megatron-core's class-level state: the engine's close resets it."""


CANDIDATES = {"capturable_adamw": CapturableCandidate, "megatron_optimizer_graph": MegatronGraphCandidate}


def in_lockstep(engine: MegatronEngine, candidate, budget: RoundingBudget) -> None:
    """Make the reference's optimizer step hand its gradients to the candidate first and step it after."""
    reference_step = engine.optimizer.step

    def step():
        learning_rate = float(engine.optimizer.param_groups[0]["lr"])
        with torch.no_grad():
            for _, twin, original in paired(named(candidate.chunks), named(engine.model_chunks)):
                twin.main_grad.copy_(original.main_grad)
        stepped, grad_norm, zeros = reference_step()
        budget.add(learning_rate, norm_gap(grad_norm, candidate.step()))
        return stepped, grad_norm, zeros

    engine.optimizer.step = step


def weight_pairs(engine: MegatronEngine, candidate, initial: dict) -> list:
    masters = candidate.masters()
    return [WeightPair(name, reference.main_param, reference.detach(), masters[id(twin)], twin.detach(),
                       initial[name])
            for name, reference, twin in paired(named(engine.model_chunks), named(candidate.chunks))]


def run(candidate_name: str, overrides) -> dict:
    cfg = bridge.load(overrides)
    engine = MegatronEngine(cfg)
    candidate = None
    try:
        candidate = CANDIDATES[candidate_name](engine, cfg)
        budget, checkpoints = RoundingBudget(), []
        in_lockstep(engine, candidate, budget)
        initial = {name: param.main_param.detach().clone() for name, param in named(engine.model_chunks)}
        for step in range(max(CHECKPOINTS)):
            engine.train_step(step)
            if step + 1 in CHECKPOINTS:
                torch.cuda.synchronize()
                checkpoints.append(compare(weight_pairs(engine, candidate, initial), budget))
    finally:
        if candidate is not None:
            candidate.close()
        engine.close()
    return {"candidate": candidate_name, "overrides": list(overrides), "layer_spec": engine.layer_spec,
            "megatron_core": MEGATRON_CORE_VERSION, "gpu": torch.cuda.get_device_name(), "checkpoints": checkpoints}


def main() -> None:
    out, candidate_name, overrides = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    out.write_text(json.dumps(run(candidate_name, overrides), indent=1))


if __name__ == "__main__":
    main()
