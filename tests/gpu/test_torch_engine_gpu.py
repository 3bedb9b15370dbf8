"""The torch engine's graph modes on CUDA: each trains 30 steps with per-step losses equal to
the eager run of the same seed (within a measured tolerance), really replays its graphs every
step after capture, and leaves no graph and no allocated memory behind after close().

The torch engine keeps no class-level state, so jobs share this process; the trainer path
(result.json included) is the one ``python -m bridge.run`` takes.
"""

from dataclasses import dataclass
from typing import Dict, Tuple

import pytest
import torch

import bridge
from perf.launch import write_job
from bridge.config.paths import recipes_dir
from bridge.trainer import Trainer

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


STEPS = 30
RECIPES = ("llama/tiny", "qwen/tiny")
TWO_MICROBATCHES = ("train.global_batch_size=4",)
# Per-step |loss - eager loss| allowed over 30 bf16 steps. Not yet measured on the torch
# engine (the shared GPU budget ran out before its first run): the values follow the megatron
# engine's measurements (tests/gpu/test_megatron_engine.py). Local graphs replay the very
# kernels eager runs, so only float noise may differ. The full-iteration graph trains with the
# capturable AdamW, mathematically equal to eager's but rounded differently, which the megatron
# engine measured at up to 2e-2 after 30 steps. torch.compile fuses elementwise chains and so
# rounds bf16 differently from eager: allowed the same order, with margin. Each run prints a
# MEASURED line; tighten these from it.
TOLERANCE = {"full_iteration": 2e-2, "local_layer": 1e-3, "local_attn": 1e-3,
             "compile_default": 5e-2, "compile_reduce_overhead": 5e-2}
MODES: Dict[str, Tuple[str, ...]] = {
    "full_iteration": ("cuda_graph=full_iteration",),
    "local_layer": ("cuda_graph=local_layer",),
    "local_attn": ("model.cuda_graph_impl=local", "model.cuda_graph_modules=[attn]"),
    "compile_default": ("torch_compile=default",),
    "compile_reduce_overhead": ("torch_compile=reduce-overhead",),
}
EFFECTIVE_IMPL = {"full_iteration": "full_iteration", "local_layer": "local", "local_attn": "local",
                  "compile_default": "torch_compile:default",
                  "compile_reduce_overhead": "torch_compile:reduce-overhead"}


@dataclass
class Run:
    result: dict
    replays: int
    graphs_after_close: int
    allocated_before: int
    allocated_after_close: int
    reserved_after_close: int


def train(tmp_path, recipe: str, *overrides: str) -> Run:
    if not (recipes_dir() / f"{recipe}.yaml").exists():
        pytest.skip(f"recipe {recipe} is not written yet")
    cfg = bridge.load([f"recipe={recipe}", "engine=torch", "device=cuda", f"train.train_iters={STEPS}", *overrides])
    replays = 0
    replay = torch.cuda.CUDAGraph.replay

    def counting_replay(graph):
        nonlocal replays
        replays += 1
        replay(graph)

    allocated_before = settled_allocation()
    torch.cuda.CUDAGraph.replay = counting_replay
    try:
        write_job(cfg, tmp_path, {"choices": {"recipe": recipe}, "overrides": list(overrides)})
        trainer = Trainer(cfg, tmp_path)
        result = trainer.run()
        trainer.close()
    finally:
        torch.cuda.CUDAGraph.replay = replay
    return Run(result, replays, trainer.engine.graph_count(), allocated_before,
               settled_allocation(), torch.cuda.memory_reserved())


def settled_allocation() -> int:
    """Allocated bytes without cuBLAS workspaces: PyTorch keeps one per stream that ran a GEMM
    (the H200 run saw exactly +64 MiB per side stream a graph mode warmed up or captured on),
    and they are no graph memory."""
    torch.cuda.synchronize()
    torch._C._cuda_clearCublasWorkspaces()
    return torch.cuda.memory_allocated()


@pytest.fixture(scope="module")
def eager_runs(tmp_path_factory):
    runs = {}

    def eager(recipe: str, extra: Tuple[str, ...]) -> Run:
        if (recipe, extra) not in runs:
            runs[recipe, extra] = train(tmp_path_factory.mktemp("eager"), recipe, "cuda_graph=none", *extra)
        return runs[recipe, extra]

    return eager


CASES = [(recipe, mode, ()) for recipe in RECIPES for mode in MODES]
CASES.append(("llama/tiny", "full_iteration", TWO_MICROBATCHES))


@pytest.mark.parametrize("recipe, mode, extra", CASES)
def test_graph_mode_trains_like_eager_and_releases_its_graphs(tmp_path, eager_runs, recipe, mode, extra):
    eager = eager_runs(recipe, extra)
    run = train(tmp_path, recipe, *MODES[mode], *extra)
    result = run.result
    worst = max(abs(graphed - plain) for graphed, plain in zip(result["loss"], eager.result["loss"]))
    print(f"\nMEASURED {recipe} {mode} {extra}: max|dloss| {worst:.3e}; median step "
          f"{result['step_time_ms']['median']:.2f} ms vs eager {eager.result['step_time_ms']['median']:.2f} ms; "
          f"capture step {result['capture_step']} {result['capture_time_s']} s; graphs {result['graph_count']}; "
          f"replays {run.replays}; allocated {run.allocated_before} -> {run.allocated_after_close} B after close, "
          f"reserved {run.reserved_after_close} B; losses {result['loss'][0]:.4f} -> {result['loss'][-1]:.4f}")

    assert result["status"] == "completed" and result["effective_impl"] == EFFECTIVE_IMPL[mode]
    assert len(result["loss"]) == STEPS
    assert worst <= TOLERANCE[mode]
    assert run.graphs_after_close == 0
    assert run.allocated_after_close <= run.allocated_before + 2**20
    if mode.startswith("compile"):
        assert (run.replays > 0) == (mode == "compile_reduce_overhead")
        return
    warmup = 3
    assert result["capture_step"] == warmup and result["graph_count"] > 0
    microbatches = 2 if extra == TWO_MICROBATCHES else 1
    replays_per_step = 1 if mode == "full_iteration" else result["graph_count"] * microbatches
    assert run.replays == replays_per_step * (STEPS - warmup)
