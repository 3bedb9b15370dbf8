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
its ratio is against "off". Each step's GPU time is also taken from CUDA events around it
(median over the steps): the device's side alone, without the host's reads.
"""

import argparse
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch

import bridge
from bridge.engines.torch.engine import TorchEngine

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


def time_steps(overrides: List[str], steps: int, read: Reader) -> Tuple[float, float]:
    """(wall seconds per step, median GPU seconds per step)."""
    cfg = bridge.load([*WORKLOAD, *overrides])
    engine = TorchEngine(cfg)
    untimed = cfg.model.cuda_graph_warmup_steps + 5  # eager warmup, capture, a few replays
    for step in range(untimed):
        float(engine.train_step(step))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for step, (began, ended) in zip(range(untimed, untimed + steps), events):
        began.record()
        loss = engine.train_step(step)
        ended.record()
        torch.cuda.synchronize()
        float(loss)
        read(engine, step)
    elapsed = time.perf_counter() - start
    assert engine.graph_count() == 1
    engine.close()
    gpu_ms = statistics.median(began.elapsed_time(ended) for began, ended in events)
    return elapsed / steps, gpu_ms / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. model.num_layers=4")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    train_iters = [f"train.train_iters={args.steps + 100}"]
    wall: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    gpu: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds):
        order = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
        for name in order:
            override, make_reader = VARIANTS[name]
            seconds, gpu_seconds = time_steps([override, *train_iters, *args.overrides], args.steps, make_reader())
            wall[name].append(seconds)
            gpu[name].append(gpu_seconds)
    wall_off, gpu_off = statistics.median(wall["off"]), statistics.median(gpu["off"])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, llama/tiny full_iteration "
          f"{' '.join(args.overrides)}; {args.rounds} rounds x {args.steps} steps")
    print(f"{'variant':<14}{'wall ms':>9}{'ratio':>8}{'GPU ms':>9}{'ratio':>8}   per-round wall ms/step")
    for name in VARIANTS:
        wall_median, gpu_median = statistics.median(wall[name]), statistics.median(gpu[name])
        rounds = " ".join(f"{value * 1e3:.3f}" for value in wall[name])
        print(f"{name:<14}{wall_median * 1e3:>9.3f}{wall_median / wall_off:>8.4f}"
              f"{gpu_median * 1e3:>9.3f}{gpu_median / gpu_off:>8.4f}   {rounds}")


if __name__ == "__main__":
    main()
