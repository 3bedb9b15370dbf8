"""What a training process imports before it trains, imported once by the preloaded launcher's forkserver
(perf/preloaded.py) so that each child it forks starts past them. Never imported by the graphbridge process
itself, which stays light and never touches CUDA."""

import os

# megatron-core asks torch.cuda.is_available() while importing (dist_checkpointing/strategies/torch.py, 0.19.2), and
# without this PyTorch answers through the CUDA runtime, which initialises the driver in this process: a CUDA
# driver initialised before fork() fails in every child. NVML answers the same question without it.
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

for _heavy in ("torch", "transformer_engine.pytorch", "megatron.core", "bridge.run"):
    try:  # a missing or broken package fails the child's own import the way it fails a fresh process
        __import__(_heavy)
    except Exception:  # noqa: BLE001 - e.g. OSError from a Transformer Engine without its extension
        pass
