"""Rules on what a run measures: a profiled window must leave steps to time and must see
replays, not the capture."""

from bridge.validation.graph_facts import is_graphed
from bridge.validation.registry import rule, violation


@rule("profile_window",
      rejects='`perf.profile=true` whose traced steps leave no timed step after warmup and capture',
      fix='raise `train.train_iters` or lower `perf.profile_steps`')
def profile_window(cfg, target):
    perf = cfg.perf
    if not perf.profile:
        return None
    if perf.profile_steps < 1:
        return violation("profile_window", ["perf.profile_steps"],
                         f"perf.profile_steps={perf.profile_steps} traces nothing; set perf.profile_steps=5")
    # The last timed step must come after the eager warmup and, with graphs, after the capture step.
    first_timed = max(perf.warmup_steps, cfg.model.cuda_graph_warmup_steps + 1 if is_graphed(cfg) else 0)
    needed = first_timed + 1 + perf.profile_steps
    if cfg.train.train_iters < needed:
        return violation(
            "profile_window", ["perf.profile_steps", "train.train_iters"],
            f"perf.profile_steps={perf.profile_steps} leaves no timed step after warmup and capture "
            f"(step {first_timed} on) in train_iters={cfg.train.train_iters}; set train.train_iters={needed} "
            "or more, or lower perf.profile_steps")
    return None
