"""One MegatronEngine run in a fresh process, recorded as JSON for the GPU tests.

    python -m tests.gpu.megatron_job OUT.json STEPS [override ...]
    torchrun --standalone --nproc-per-node N -m tests.gpu.megatron_job OUT.json STEPS [override ...]

Under torchrun each rank writes OUT.rank<R>.json.

megatron-core keeps graph, RNG and static-buffer state at class level, so every training the
tests compare runs in its own process. Per step it records the loss, allocated memory, graph
count and how many CUDA graphs were replayed (every graph mechanism, megatron-core's and
Transformer Engine's, replays through torch.cuda.CUDAGraph.replay); at the end, whether close()
left no graph and megatron-core's class-level graph state clean.
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch

import bridge
from bridge.engines.megatron.engine import MegatronEngine, megatron_graph_state_is_clean


class ReplayCounter:
    def __init__(self):
        self.count = 0
        replay = torch.cuda.CUDAGraph.replay

        def counting_replay(graph):
            self.count += 1
            replay(graph)

        torch.cuda.CUDAGraph.replay = counting_replay


def weights_digest(engine: MegatronEngine) -> str:
    digest = hashlib.sha256()
    for chunk in engine.model_chunks:
        for name, param in chunk.named_parameters():
            digest.update(name.encode())
            digest.update(param.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def run(steps: int, overrides) -> dict:
    replays = ReplayCounter()
    engine = MegatronEngine(bridge.load(overrides))
    record = {"overrides": list(overrides), "layer_spec": engine.layer_spec, "impl": engine.effective_impl,
              "weights_sha256": weights_digest(engine), "losses": [], "allocated": [], "graph_counts": [],
              "replays": [], "step_seconds": []}
    try:
        for step in range(steps):
            replays_before, start = replays.count, time.perf_counter()
            loss = engine.train_step(step)
            torch.cuda.synchronize()
            record["step_seconds"].append(time.perf_counter() - start)
            record["losses"].append(loss.item())
            record["allocated"].append(torch.cuda.memory_allocated())
            record["graph_counts"].append(engine.graph_count())
            record["replays"].append(replays.count - replays_before)
        record["capture_steps"] = sorted(engine.capture_steps())
        record["peak_allocated"] = torch.cuda.max_memory_allocated()
    finally:
        # Asked after close, the lifecycle counts what its megatron-core objects still hold.
        lifecycle = engine.graphs
        engine.close()
    record["graph_count_after_close"] = lifecycle.graph_count()
    record["megatron_state_clean"] = megatron_graph_state_is_clean()
    return record


def main() -> None:
    out, steps, overrides = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    if "RANK" in os.environ:
        out = out.with_suffix(f".rank{os.environ['RANK']}.json")
    out.write_text(json.dumps(run(steps, overrides), indent=1))


if __name__ == "__main__":
    main()
