"""``cuda_graph=auto``, the measured choice: its candidates in the plan (candidates), the decision from the
probe's timings (decision) and the cache of decisions per workload, GPU and packages (cache). The probe
itself runs in the harness (perf/auto_probe.py): it starts training processes, which the library never does."""

from bridge.auto.cache import cache_path, decision_key, read_decisions
from bridge.auto.candidates import AutoPlan, Candidate, plan_auto
from bridge.auto.decision import Decision, Measurement, decide

__all__ = ["AutoPlan", "Candidate", "Decision", "Measurement", "cache_path", "decide", "decision_key", "plan_auto",
           "read_decisions"]
