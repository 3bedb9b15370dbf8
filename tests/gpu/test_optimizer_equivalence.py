"""Parameter-level equivalence: the in-graph optimizer and megatron-core's optimizer step the same gradients,
and after 1, 10 and 100 steps of llama/tiny their fp32 master weights agree within fp32 rounding and each side's
bf16 weights are its masters rounded (tests/optimizer_equivalence.py states the bound and derives it), on both
layer specs and on whichever megatron-core release is installed (scripts/gpu_check.sh: MCORE=0.16.1 or 0.19.2):

- graphbridge's capturable AdamW (the in-graph optimizer without the distributed optimizer, every release),
  captured and replayed, against megatron-core's mixed-precision optimizer, eager;
- megatron-core's own optimizer graph (the in-graph optimizer with the distributed optimizer, 0.19 on; skipped
  where the catalogue refuses it) against megatron-core's distributed optimizer, eager.

Each case trains in its own process (tests/gpu/optimizer_equivalence_job.py); the measured sizes of the
rounding noise are printed, so the log of a run records them.
"""

import json
import subprocess
import sys

import pytest
import torch

import bridge
from tests.gpu import megatron_cases
from tests.gpu.megatron_cases import HAVE_TE, LOCAL_SPEC, ROOT, job_environment
from tests.optimizer_equivalence import CHECKPOINTS, violations

pytestmark = pytest.mark.gpu
FIRST_PORT = megatron_cases.FIRST_PORT + 200
SPECS = {"local": (LOCAL_SPEC,), "transformer_engine": ()}
CANDIDATES = {"capturable_adamw": (), "megatron_optimizer_graph": ("ddp.use_distributed_optimizer=true",)}
CASES = [(spec, candidate) for spec in SPECS for candidate in CANDIDATES]


def overrides(spec: str, candidate: str, in_graph: bool = False) -> list:
    """The reference's training (llama/tiny eager, for as many steps as the last comparison needs), or with
    ``in_graph`` the candidate's as the engine would train it."""
    graphs = ("cuda_graph=full_iteration", "optimizer.optimizer_in_graph=true") if in_graph else ("cuda_graph=none",)
    return ["recipe=llama/tiny", *graphs, f"train.train_iters={max(CHECKPOINTS)}", *SPECS[spec],
            *CANDIDATES[candidate]]


def skip_reason(spec: str, candidate: str):
    if not torch.cuda.is_available():
        return "needs CUDA"
    if spec == "transformer_engine" and not HAVE_TE:
        return "needs Transformer Engine"
    # Refused where the in-graph optimizer cannot run here: megatron-core's optimizer graph before 0.19, or without
    # Transformer Engine 2.14.
    refused = bridge.validate(bridge.load(overrides(spec, candidate, in_graph=True)))
    return "not allowed here: " + "; ".join(str(v) for v in refused) if refused else None


@pytest.mark.parametrize("spec, candidate", CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_the_in_graph_optimizer_steps_as_megatron_cores_within_rounding(spec, candidate, tmp_path):
    reason = skip_reason(spec, candidate)
    if reason:
        pytest.skip(reason)
    out = tmp_path / "equivalence.json"
    command = [sys.executable, "-m", "tests.gpu.optimizer_equivalence_job", str(out), candidate,
               *overrides(spec, candidate)]
    port = FIRST_PORT + CASES.index((spec, candidate))
    done = subprocess.run(command, cwd=ROOT, env=job_environment(port), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    record = json.loads(out.read_text())
    assert record["layer_spec"] == spec
    assert [checkpoint["steps"] for checkpoint in record["checkpoints"]] == list(CHECKPOINTS)
    for checkpoint in record["checkpoints"]:
        print(f"{spec} {candidate} megatron-core {record['megatron_core']} on {record['gpu']}: {checkpoint}")
        assert not violations(checkpoint), (violations(checkpoint), checkpoint)
