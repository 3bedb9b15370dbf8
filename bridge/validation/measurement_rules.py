"""Rules on what a run measures: a profiled window must leave steps to time and must see
replays, not the capture; one profiler at a time."""

from bridge.config.schema import profiling_window
from bridge.validation.graph_facts import is_graphed
from bridge.validation.registry import rule, violation


@rule("profile_window",
      rejects="a profiling window (`perf.profile` or `perf.nsys`) outside the run, over warmup or capture steps, "
              "or leaving no timed step",
      fix="raise `train.train_iters`, move `perf.profile_start_step` or lower `perf.profile_steps`")
def profile_window(cfg, target):
    perf, iters = cfg.perf, cfg.train.train_iters
    if not (perf.profile or perf.nsys):
        return None
    if perf.profile_steps < 1:
        return violation("profile_window", ["perf.profile_steps"],
                         f"perf.profile_steps={perf.profile_steps} traces nothing; set perf.profile_steps=5")
    window = profiling_window(perf, iters)
    # Only replays are worth tracing: the window starts after the eager warmup and, with graphs, the capture.
    first_timed = max(perf.warmup_steps, cfg.model.cuda_graph_warmup_steps + 1 if is_graphed(cfg) else 0)
    if perf.profile_start_step is None:
        needed = first_timed + 1 + perf.profile_steps
        if iters < needed:
            return violation(
                "profile_window", ["perf.profile_steps", "train.train_iters"],
                f"perf.profile_steps={perf.profile_steps} leaves no timed step after warmup and capture "
                f"(step {first_timed} on) in train_iters={iters}; set train.train_iters={needed} "
                "or more, or lower perf.profile_steps")
        return None
    keys = ["perf.profile_start_step", "perf.profile_steps", "train.train_iters"]
    if window.start < first_timed or window.stop > iters:
        return violation(
            "profile_window", keys,
            f"the profiling window, steps {window.start}..{window.stop - 1}, must lie within steps {first_timed}.."
            f"{iters - 1} (after warmup and capture, inside train_iters={iters}); set perf.profile_start_step="
            f"{first_timed} with perf.profile_steps <= {max(1, iters - first_timed - 1)}, or raise train.train_iters")
    if iters - first_timed - perf.profile_steps < 1:
        return violation(
            "profile_window", keys,
            f"steps {first_timed}..{iters - 1} are all profiled, so no step is timed; raise train.train_iters "
            f"to {iters + 1} or more, or lower perf.profile_steps")
    return None


@rule("nsys_with_profile",
      rejects="`perf.nsys=true` with `perf.profile=true` (Nsight Systems and torch.profiler both need CUPTI)",
      fix="one profiler per run: `perf.profile=false` (nsys records CUDA and the NVTX step ranges) or `perf.nsys=false`")
def nsys_with_profile(cfg, target):
    if cfg.perf.nsys and cfg.perf.profile:
        return violation("nsys_with_profile", ["perf.nsys", "perf.profile"],
                         "perf.nsys=true and perf.profile=true both trace CUDA through CUPTI, which serves one "
                         "profiler at a time; set perf.profile=false (nsys records the kernels and the NVTX step "
                         "ranges) or perf.nsys=false")
    return None
