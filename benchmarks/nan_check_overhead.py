"""Cost of the device-side NaN check on the torch engine's full-iteration graph (target < 1%).

    python benchmarks/nan_check_overhead.py [--steps 400] [--rounds 5] [override ...]

Each round trains llama/tiny with cuda_graph=full_iteration once per variant, in alternating
order to cancel drift:
    off           perf.nan_check_interval=0: nothing in the graph, nothing read
    plain read    perf.nan_check_interval=10 as the trainer does it: the finite check inside
                  the graph, int() of its device counter every 10 steps, after the step's sync
    pinned read   the same check, read instead by a non-blocking copy into pinned memory and an
                  event, looked at one step later: the alternative the trainer does not use
A step is timed the way the trainer runs it: the engine's step, a device synchronise, the loss
read, then the variant's read. The per-step cost is the wall time of all timed steps over their
number, so a read every 10th step counts; each variant's figure is the median over rounds, and
its ratio is against "off".
"""

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch

import bridge
from bridge.engines.torch_engine import TorchEngine

WORKLOAD = ["recipe=llama/tiny", "engine=torch", "device=cuda", "cuda_graph=full_iteration"]
INTERVAL = 10
Reader = Callable[[TorchEngine, int], None]


def no_read(engine: TorchEngine, step: int) -> None:
    pass


def plain_read(engine: TorchEngine, step: int) -> None:
    if (step + 1) % INTERVAL == 0:
        int(engine.finite_steps())


def pinned_reader() -> Reader:
    host = torch.zeros((), dtype=torch.int64, pin_memory=True)
    copied = torch.cuda.Event()
    pending = []

    def read(engine: TorchEngine, step: int) -> None:
        if pending:
            copied.synchronize()
            int(host)
            pending.clear()
        if (step + 1) % INTERVAL == 0:
            host.copy_(engine.finite_steps(), non_blocking=True)
            copied.record()
            pending.append(step)

    return read


VARIANTS: Dict[str, tuple] = {
    "off": ("perf.nan_check_interval=0", lambda: no_read),
    "plain read": (f"perf.nan_check_interval={INTERVAL}", lambda: plain_read),
    "pinned read": (f"perf.nan_check_interval={INTERVAL}", pinned_reader),
}


def seconds_per_step(overrides: List[str], steps: int, read: Reader) -> float:
    cfg = bridge.load([*WORKLOAD, *overrides])
    engine = TorchEngine(cfg)
    untimed = cfg.model.cuda_graph_warmup_steps + 5  # eager warmup, capture, a few replays
    for step in range(untimed):
        float(engine.train_step(step))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(untimed, untimed + steps):
        loss = engine.train_step(step)
        torch.cuda.synchronize()
        float(loss)
        read(engine, step)
    elapsed = time.perf_counter() - start
    assert engine.graph_count() == 1
    engine.close()
    return elapsed / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.num_layers=4")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    train_iters = [f"train.train_iters={args.steps + 100}"]
    per_step: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds):
        order = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            override, make_reader = VARIANTS[name]
            per_step[name].append(seconds_per_step([override, *train_iters, *args.overrides], args.steps,
                                                   make_reader()))
    off = statistics.median(per_step["off"])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, llama/tiny full_iteration "
          f"{' '.join(args.overrides)}; {args.rounds} rounds x {args.steps} steps")
    print(f"{'variant':<14}{'ms/step':>10}{'ratio':>9}   per-round ms/step")
    for name, values in per_step.items():
        median = statistics.median(values)
        rounds = " ".join(f"{value * 1e3:.3f}" for value in values)
        print(f"{name:<14}{median * 1e3:>10.3f}{median / off:>9.4f}   {rounds}")


if __name__ == "__main__":
    main()
