"""The yardstick for the trainer's overhead: a minimal hand-written megatron-core training loop.

    python benchmarks/minimal_megatron_loop.py [--cuda-graph full_iteration] [--local-spec] [--rounds 2]
                                               [--cpus 2-5] [--profile-dir DIR]

The same model and graph impl as graphbridge's megatron engine (the megatron-core config
objects come from ``bridge.translate.build_megatron_configs``), written out as straight
megatron-core calls with no engine, trainer or data abstraction: one GPU, one random static
batch reused every step. In alternating fresh processes it times this loop, the megatron
engine under a bare loop, and the trainer (graphbridge's own path: a job directory and
``python -m bridge.run``), and prints the medians and the ratios to the minimal loop, so an
overhead shows where it comes from. Target: the trainer within 3 % of the minimal loop.

Every process is pinned to the same CPUs (``--cpus``): with the optimizer outside the graph a
step waits for host launches after the grad-norm sync, so where a process runs (core, NUMA
node) is part of its step time; unpinned runs landed on two levels up to ~15 % apart from one
process to the next. ``--profile-dir`` adds 10 steps under torch.profiler to each minimal and
engine run (after the timed ones) and writes, per run, the host ops by total CPU time and the
GPU time per step, to see where a difference comes from.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from itertools import repeat
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ("recipe=llama/tiny", "rerun_state_machine.check_for_nan_in_loss=false", "ddp.check_for_nan_in_grad=false")


def build_minimal_model(cfg, configs, total_steps: int):
    """megatron-core's GPTModel in DDP with its optimizer and learning-rate schedule, on GPU 0 of a
    one-process group, as graphbridge's megatron engine builds them: (model, optimizer, scheduler)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.module import Float16Module

    config = configs["transformer_config"]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    torch.cuda.set_device(0)
    torch.cuda.set_stream(torch.cuda.Stream())
    torch.distributed.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    parallel_state.initialize_model_parallel()
    micro = cfg.train.micro_batch_size
    init_num_microbatches_calculator(0, None, micro, micro, 1)
    graphed = config.cuda_graph_impl != "none"
    model_parallel_cuda_manual_seed(cfg.rng.seed, te_rng_tracker=graphed, use_cudagraphable_rng=graphed)

    if cfg.model.transformer_impl == "transformer_engine":
        spec = get_gpt_layer_with_transformer_engine_spec()
    else:
        spec = get_gpt_layer_local_spec(normalization=config.normalization)
    model = GPTModel(config=config, transformer_layer_spec=spec, **configs["gpt_model"]).cuda()
    model = DistributedDataParallel(config, configs["ddp_config"], Float16Module(config, model))
    optimizer = get_megatron_optimizer(configs["optimizer_config"], [model])
    scheduler = OptimizerParamScheduler(optimizer, 0.0, cfg.optimizer.lr, cfg.optimizer.min_lr,
                                        cfg.optimizer.lr_warmup_iters, total_steps, "cosine",
                                        cfg.optimizer.weight_decay, cfg.optimizer.weight_decay, total_steps,
                                        "constant")
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    return model, optimizer, scheduler


def minimal_loop(overrides, total_steps: int, skipped: int, profile_to=None) -> float:
    """Median step time (ms) of a plain megatron-core loop over steps[skipped:]."""
    import torch
    from megatron.core.full_cuda_graph import FullCudaGraphWrapper
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.cuda_graphs import TECudaGraphHelper
    from megatron.core.transformer.enums import CudaGraphScope

    import bridge
    from bridge.translate import build_megatron_configs

    cfg = bridge.load(overrides)
    configs = build_megatron_configs(cfg)
    config = configs["transformer_config"]
    model, optimizer, scheduler = build_minimal_model(cfg, configs, total_steps)
    micro, seq = cfg.train.micro_batch_size, cfg.dataset.seq_length
    forward_backward = get_forward_backward_func()
    if CudaGraphScope.full_iteration in config.cuda_graph_scope:
        forward_backward = FullCudaGraphWrapper(forward_backward, cuda_graph_warmup_steps=config.cuda_graph_warmup_steps)
    te_graphs = None
    if config.cuda_graph_impl == "transformer_engine":
        te_graphs = TECudaGraphHelper(model=[model], config=config, seq_length=seq, micro_batch_size=micro,
                                      optimizers=[optimizer])

    tokens = torch.randint(0, cfg.model.vocab_size, (micro, seq), device="cuda")
    batch = {"tokens": tokens, "labels": tokens.roll(-1, dims=1),
             "loss_mask": torch.ones(micro, seq, device="cuda"),
             "position_ids": torch.arange(seq, device="cuda").expand(micro, seq)}

    def loss_func(output):
        loss = output.float().mean()
        return loss, {"lm loss": loss.detach().clone()}

    def forward_step(data, model):
        b = next(data)
        return model(b["tokens"], b["position_ids"], None, labels=b["labels"]), loss_func

    def train_step(step: int) -> None:
        if te_graphs is not None and step == config.cuda_graph_warmup_steps:
            te_graphs.create_cudagraphs()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        forward_backward(forward_step_func=forward_step, data_iterator=repeat(batch), model=[model],
                         num_microbatches=1, seq_length=seq, micro_batch_size=micro, forward_only=False)
        optimizer.step()
        scheduler.step(1)
        torch.cuda.synchronize()

    median = timed_median(train_step, total_steps, skipped)
    if profile_to is not None:
        profile_steps(train_step, total_steps, profile_to)
    return median


def timed_median(train_step, total_steps: int, skipped: int) -> float:
    """Median wall time (ms) of train_step(step) over steps[skipped:]; train_step synchronises."""
    seconds = []
    for step in range(total_steps):
        start = time.perf_counter()
        train_step(step)
        seconds.append(time.perf_counter() - start)
    return 1000 * statistics.median(seconds[skipped:])


def profile_steps(train_step, first_step: int, path: Path, steps: int = 10) -> None:
    """Host ops by total CPU time and GPU time per step over ``steps`` more steps, into ``path``."""
    from torch.profiler import ProfilerActivity, profile

    from bridge.profiling import gpu_busy_us

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for step in range(first_step, first_step + steps):
            train_step(step)
        wall_ms = 1000 * (time.perf_counter() - start) / steps
    gpu_ms = gpu_busy_us(prof) / 1e3 / steps
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=70)
    path.write_text(f"profiled step {wall_ms:.3f} ms (profiler on), GPU busy {gpu_ms:.3f} ms per step\n\n{table}")


def engine_loop(overrides, total_steps: int, skipped: int, profile_to=None) -> float:
    """Median step time (ms) of the megatron engine driven by a bare loop (no trainer)."""
    import torch

    import bridge
    from bridge.engines.megatron.engine import MegatronEngine

    engine = MegatronEngine(bridge.load(overrides))

    def train_step(step: int) -> None:
        float(engine.train_step(step))
        torch.cuda.synchronize()  # as the trainer does

    try:
        median = timed_median(train_step, total_steps, skipped)
        if profile_to is not None:
            profile_steps(train_step, total_steps, profile_to)
    finally:
        engine.close()
    return median


def trainer_median(overrides, job_dir: Path) -> float:
    """Median step time (ms) of graphbridge's own path: a job directory and ``python -m bridge.run``."""
    import bridge
    from perf.launch import RESULT, job_record, training_command, write_job

    config = bridge.load(overrides)
    write_job(config, job_dir, job_record({}, overrides))
    done = subprocess.run(training_command(config, job_dir, child_env()), cwd=ROOT, env=child_env(), capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"trainer failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads((job_dir / RESULT).read_text())["step_time_ms"]["median"]


def child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuda-graph", nargs="*", default=["none", "full_iteration"])
    parser.add_argument("--local-spec", action="store_true", help="megatron-core's local layer spec, not TE's")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs-dir", type=Path, default=Path("/tmp/graphbridge-minimal-loop"))
    parser.add_argument("--cpus", default="2-5", help="CPU list every process is pinned to (Linux), '' for none")
    parser.add_argument("--profile-dir", type=Path, help="write a torch.profiler summary per minimal/engine run")
    parser.add_argument("--child", nargs=3, metavar=("LOOP", "CUDA_GRAPH", "LOCAL_SPEC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpus and not args.child:
        from bridge.machine import cpu_list

        os.sched_setaffinity(0, cpu_list(args.cpus))  # the children inherit it
    # The first replay follows capture at step cuda_graph_warmup_steps (3); both sides skip it.
    skipped = 5

    def overrides_for(choice: str, local_spec: bool):
        spec = ["model.transformer_impl=local"] if local_spec else []
        return [*COMMON, f"cuda_graph={choice}", *spec, f"train.train_iters={skipped + args.steps}",
                f"perf.warmup_steps={skipped}"]

    if args.child:
        run_as_child(args, overrides_for, skipped)
        return
    spec = "local" if args.local_spec else "te"
    times = {"minimal": {}, "engine": {}, "trainer": {}}

    def run_child(loop: str, choice: str, round_index: int) -> float:
        command = [sys.executable, __file__, "--child", loop, choice, spec, "--steps", str(args.steps)]
        # Profile the first round only: its runs are timed before the profiler starts.
        if args.profile_dir is not None and round_index == 0:
            command += ["--profile-dir", str(args.profile_dir)]
        done = subprocess.run(command, cwd=ROOT, env=child_env(), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{loop} loop {choice} failed:\n{done.stderr[-4000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def run_trainer(choice: str, round_index: int) -> float:
        job_dir = args.jobs_dir / f"{spec}-{choice}-{round_index}"
        return trainer_median(overrides_for(choice, args.local_spec), job_dir)

    runners = {"minimal": partial(run_child, "minimal"), "engine": partial(run_child, "engine"),
               "trainer": run_trainer}
    for round_index in range(args.rounds):
        # Alternate which variant and which side goes first, so drift cancels.
        choices = args.cuda_graph if round_index % 2 == 0 else args.cuda_graph[::-1]
        sides = list(runners) if round_index % 2 == 0 else list(runners)[::-1]
        for choice in choices:
            for side in sides:
                times[side].setdefault(choice, []).append(runners[side](choice, round_index))
            print(f"round {round_index + 1}: {spec}/{choice}: "
                  + ", ".join(f"{side} {times[side][choice][-1]:.2f} ms" for side in runners), flush=True)
    print_medians(times, args.cuda_graph, spec)


def run_as_child(args, overrides_for, skipped: int) -> None:
    """One loop in this process (``--child LOOP CUDA_GRAPH LOCAL_SPEC``): its median step time on stdout."""
    loops = {"minimal": minimal_loop, "engine": engine_loop}
    loop, choice, local_spec = args.child[0], args.child[1], args.child[2] == "local"
    profile_to = None
    if args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        profile_to = args.profile_dir / f"{loop}_{args.child[2]}_{choice}.txt"
    print(json.dumps(loops[loop](overrides_for(choice, local_spec), skipped + args.steps, skipped, profile_to)))


def print_medians(times: dict, choices, spec: str) -> None:
    """Per graph choice, each side's median over the rounds and its ratio to the minimal loop."""
    print(f"\n{'variant':24} {'minimal ms':>10} {'engine ms':>10} {'trainer ms':>10} {'engine/min':>10} "
          f"{'trainer/min':>11}")
    for choice in choices:
        minimal, engine, trainer = (statistics.median(times[side][choice]) for side in ("minimal", "engine", "trainer"))
        print(f"{spec + '/' + choice:24} {minimal:10.2f} {engine:10.2f} {trainer:10.2f} {engine / minimal:9.3f}x "
              f"{trainer / minimal:10.3f}x")


if __name__ == "__main__":
    main()
