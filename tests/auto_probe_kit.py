"""What the cuda_graph=auto tests share (tests/test_auto_decision.py, tests/test_auto_probe.py,
tests/test_auto_probe_forked.py): the scopes of the graph candidates, a GPU machine as bridge.machine.probe()
describes one, the plan of a small auto workload on it, and a probe trainer that trains nothing and leaves the
result a run would, from synthesized timings."""

import json
import time
from typing import Optional

import bridge
from bridge.auto.candidates import plan_auto
from bridge.auto.decision import ITERATION_AND_OPTIMIZER_GRAPH, ITERATION_GRAPH, LAYER_GRAPHS, Scope
from bridge.machine import GPU, Machine
from bridge.planning import build_plan
from bridge.prepare import prepare
from perf import auto_probe
from perf.auto_probe import ProbeRuns

SCOPES = {
    "full_iteration+optimizer_in_graph": Scope(ITERATION_AND_OPTIMIZER_GRAPH),
    "full_iteration": Scope(ITERATION_GRAPH),
    "te_layer": Scope(LAYER_GRAPHS),
    "local_layer": Scope(LAYER_GRAPHS),
    "te_attn_mlp": Scope(LAYER_GRAPHS, frozenset({"attn", "mlp"})),
    "te_attn": Scope(LAYER_GRAPHS, frozenset({"attn"})),
    "te_mlp": Scope(LAYER_GRAPHS, frozenset({"mlp"})),
    "te_attn_moe_router": Scope(LAYER_GRAPHS, frozenset({"attn", "moe_router", "moe_preprocess"})),
    "te_moe_router": Scope(LAYER_GRAPHS, frozenset({"moe_router", "moe_preprocess"})),
}
"""What llama/tiny's and the Qwen3 proxy's graph candidates capture, as bridge.auto.candidates reads them from their
plans (test_auto_probe.py checks it there)."""

SMALL = ("model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64", "train.train_iters=5")
AUTO = ("recipe=llama/tiny", "cuda_graph=auto")
H100 = Machine(gpus=(GPU("NVIDIA H100 80GB HBM3", (9, 0), 80 * 10**9),),
               packages={"torch": "2.13.0", "megatron-core": "0.16.1", "transformer-engine": "2.10.0"})
"""A GPU machine as bridge.machine.probe() describes one: the candidates are judged for it."""
OPTIMIZER_IN_GRAPH = "full_iteration+optimizer_in_graph"


def gpu_plan(*overrides: str, machine: Machine = H100):
    """The plan of ``graphbridge <AUTO> <overrides>`` on ``machine``, with its auto section."""
    words = [*AUTO, *overrides]
    plan = build_plan(prepare(bridge.compose(words)), machine, graphs_measured=True)
    plan.auto = plan_auto(plan, words, machine)
    return plan


class Finished:
    """A probe run that ended as it was launched."""

    def ended(self) -> bool:
        return True

    def kill(self) -> None:
        pass


def synthesized_trainer(medians: dict, trained: list, start_s: float = 0.0, confirming: Optional[dict] = None
                        ) -> ProbeRuns:
    """Trains nothing: leaves the result.json a probe run leaves, its median from ``medians`` by choice (a pair
    for eager, its first and last run of a round; None: the run failed; a choice not named: 50 ms), in the
    confirming round from ``confirming`` (a pair by choice, its two runs there), and notes
    ``round/choice/train_iters`` in ``trained``; the first run takes ``start_s`` (what starting it cost), the
    launcher's start 0.5 s. Each run has ended when launched."""
    def train(config, run_dir):
        job = json.loads((run_dir / "job.json").read_text())
        choice = job["choices"]["cuda_graph"]
        trained.append(f"{run_dir.parent.name}/{choice}/{config.train.train_iters}")
        if not trained[1:]:
            time.sleep(start_s)
        if run_dir.parent.name == auto_probe.CONFIRM_ROUND:
            median = confirming[choice][int(run_dir.name) // 2]
        else:
            median = medians["none"][run_dir.name != "0"] if choice == "none" else medians.get(choice, 50.0)
        steps = {"median": median, "p10": median - 0.1, "p90": median + 0.1, "count": 30} if median else None
        result = {"status": "failed", "reason": "replay failed", "job": job} if median is None else {
            "status": "completed", "effective_impl": config.model.cuda_graph_impl.value, "step_time_ms": steps,
            "job": job}
        (run_dir / "result.json").write_text(json.dumps(result))
        return Finished()

    return ProbeRuns(lambda: 0.5, lambda config, run_dir, gate, port: train(config, run_dir))
