"""Step time and memory of every megatron-core CUDA-graph impl against eager, llama/tiny shape.

    python benchmarks/megatron_graphs.py [--steps 30] [--rounds 2] [--out results.json]

llama/tiny: 8 layers, hidden 512, seq 256, micro-batch 2, vocab 4096, bf16, one GPU. Local
layer spec: eager, local per-layer graphs, full iteration, full iteration with the optimizer
step inside; Transformer Engine spec: eager, TE whole layer, TE attention, TE attention+MLP,
full iteration. Each variant trains in its own process (megatron-core's graph state is
class-level); variants run in order in odd rounds and reversed in even rounds so clock and
thermal drift cancel. Both NaN checks are off for every variant, as in Bridge's perf presets,
so eager pays no host sync the graphed variants do not.

Per variant: median step time over ``--steps`` steps after warmup (steps up to the first
replay after capture are excluded), its speedup over eager of the same layer spec, and graph
memory overhead = peak allocated / eager peak allocated of the same spec.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ("recipe=llama/tiny", "rerun_state_machine.check_for_nan_in_loss=false", "ddp.check_for_nan_in_grad=false")
LOCAL_SPEC = "model.transformer_impl=local"
VARIANTS = {
    "local/none": ("cuda_graph=none", LOCAL_SPEC),
    "local/local_layer": ("cuda_graph=local_layer", LOCAL_SPEC),
    "local/full_iteration": ("cuda_graph=full_iteration", LOCAL_SPEC),
    "local/full_iteration+optimizer": ("cuda_graph=full_iteration", LOCAL_SPEC, "optimizer.optimizer_in_graph=true"),
    "te/none": ("cuda_graph=none",),
    "te/te_layer": ("cuda_graph=te_layer",),
    "te/te_attn": ("cuda_graph=te_attn",),
    "te/te_attn_mlp": ("cuda_graph=te_attn_mlp",),
    "te/full_iteration": ("cuda_graph=full_iteration",),
}


def measure(variant: str, timed_steps: int) -> dict:
    """In the child process: train one variant and time its steps."""
    import torch

    import bridge
    from bridge.engines.megatron.engine import MegatronEngine

    warmup = bridge.load(list(COMMON)).model.cuda_graph_warmup_steps
    # Capture lands at step `warmup` at the latest; its first replay follows.
    skipped = warmup + 2
    overrides = [*COMMON, *VARIANTS[variant], f"train.train_iters={skipped + timed_steps}"]
    engine = MegatronEngine(bridge.load(overrides))
    seconds = []
    try:
        for step in range(skipped + timed_steps):
            start = time.perf_counter()
            engine.train_step(step)
            torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
        assert max(engine.capture_steps(), default=0) < skipped
        result = {"variant": variant, "layer_spec": engine.layer_spec, "graphs": engine.graph_count(),
                  "median_ms": 1000 * statistics.median(seconds[skipped:]),
                  "peak_allocated": torch.cuda.max_memory_allocated(),
                  "versions": versions()}
    finally:
        engine.close()
    return result


def versions() -> str:
    import megatron.core
    import torch

    text = f"{torch.cuda.get_device_name()}, torch {torch.__version__}, megatron-core {megatron.core.__version__}"
    try:
        import transformer_engine
    except ImportError:
        return text
    return f"{text}, Transformer Engine {transformer_engine.__version__}"


def run_child(variant: str, timed_steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, __file__, "--child", variant, "--steps", str(timed_steps)],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{variant} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(results) -> str:
    by_variant = {}
    for result in results:
        by_variant.setdefault(result["variant"], []).append(result)
    medians = {name: statistics.median(r["median_ms"] for r in runs) for name, runs in by_variant.items()}
    peaks = {name: max(r["peak_allocated"] for r in runs) for name, runs in by_variant.items()}
    lines = [f"{'variant':34} {'rounds (ms)':>17} {'median ms':>9} {'speedup':>8} {'graphs':>6} "
             f"{'peak MiB':>8} {'mem x':>6}"]
    for name, runs in by_variant.items():
        eager = name.split("/")[0] + "/none"
        rounds = " ".join(f"{r['median_ms']:.2f}" for r in runs)
        lines.append(f"{name:34} {rounds:>17} {medians[name]:9.2f} {medians[eager] / medians[name]:7.2f}x "
                     f"{runs[0]['graphs']:6d} {peaks[name] / 2**20:8.0f} {peaks[name] / peaks[eager]:5.2f}x")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant (>= 30)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, help="also write every run as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.steps)))
        return
    # Every layer spec measured needs its eager baseline.
    variants = args.variants + [f"{spec}/none" for spec in {v.split("/")[0] for v in args.variants}
                                if f"{spec}/none" not in args.variants]
    results = []
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for variant in order:
            results.append(run_child(variant, args.steps))
            print(f"round {round_index + 1}: {variant:34} {results[-1]['median_ms']:.2f} ms", flush=True)
    print(f"\n{results[0]['versions']}; median of {args.steps} steps per run\n")
    print(table(sorted(results, key=lambda r: variants.index(r["variant"]))))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
