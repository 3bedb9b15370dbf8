"""Bytes the loss and the gated activation keep, measured on the CPU with megatron-core's own code (the terms of
bridge/memory/activations.py that follow from what autograd and torch.compile keep, not from the GPU).

    python benchmarks/memory_terms.py [--json benchmarks/results/cpu/memory_terms.json]

Each case runs in a process of its own (megatron-core's parallel state is global; a fresh process has no pages of
another case) and reads its resident memory from /proc: the peak since a reset (VmHWM after clear_refs 5) above
what it held before the case. PyTorch's CPU allocator returns large blocks to the system when they are freed, so
the peak is what was live at once. Per case:

- ``loss_native`` / ``loss_unfused``: megatron-core's fused cross-entropy (cross_entropy_fusion_impl=native, its
  kernels compiled by torch.compile as megatron.core.jit does on torch >= 2.2) and the unfused one, on bf16 logits
  of [tokens, 1, vocab]: the forward's peak with the output layer's bf16 logits, what it keeps for the backward once
  they are gone, and the backward's peak; in bytes per logit entry.
- ``glu_fused`` / ``glu_unfused``: SwiGLU as megatron-core's MLP runs it with and without bias_activation_fusion,
  on an fc1 output of [tokens, 1, 2 x ffn]: what is kept for the backward beside the output, per token and ffn
  channel.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from datetime import date
from pathlib import Path
from typing import Dict

from bridge.atomic import write_json_atomic

TOKENS, VOCAB, FFN = 2048, 65536, 8192
CASES = ("loss_native", "loss_unfused", "glu_fused", "glu_unfused")
ROUNDS = 3
"""Each case runs this many times in its process; the last is kept (the first pays torch.compile's own pages)."""


def resident(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def loss_case(fused: bool) -> Dict[str, float]:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29600 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    group = parallel_state.get_tensor_model_parallel_group()
    weight = torch.randn(VOCAB, 256, dtype=torch.bfloat16, requires_grad=True)
    hidden = torch.randn(TOKENS, 1, 256, dtype=torch.bfloat16)
    target = torch.randint(0, VOCAB, (TOKENS, 1))
    entries = TOKENS * VOCAB
    for _ in range(ROUNDS):
        weight.grad = None
        before = resident("VmRSS")
        reset_peak()
        logits = hidden @ weight.t()  # the output layer's bf16 logits
        loss = (fused_vocab_parallel_cross_entropy(logits, target, group) if fused
                else vocab_parallel_cross_entropy(logits, target))
        forward = resident("VmHWM")
        del logits  # the loss keeps what its backward needs; GPTModel lets the bf16 logits go
        kept = resident("VmRSS")
        reset_peak()
        loss.sum().backward()
        backward = resident("VmHWM")
        del loss
    return {"forward_peak": (forward - before) / entries, "kept_for_backward": (kept - before) / entries,
            "backward_peak": (backward - before) / entries}


def glu_case(fused: bool) -> Dict[str, float]:
    import torch
    import torch.nn.functional as F
    from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl

    def unfused(x):  # megatron.core.transformer.mlp's glu without the fused kernel
        halves = torch.chunk(x, 2, dim=-1)
        return F.silu(halves[0]) * halves[1]

    for _ in range(ROUNDS):
        leaf = torch.randn(TOKENS, 1, 2 * FFN, dtype=torch.bfloat16, requires_grad=True)
        fc1 = leaf * 1  # fc1's output, not a leaf
        before = resident("VmRSS") - fc1.numel() * fc1.element_size()
        out = bias_swiglu_impl(fc1, None) if fused else unfused(fc1)
        del fc1  # only what autograd saved keeps it now
        kept = resident("VmRSS") - before - out.numel() * out.element_size()
        out.sum().backward()
        del out, leaf
    return {"kept_beside_output": kept / (TOKENS * FFN)}


def run_case(case: str) -> Dict[str, float]:
    kind, variant = case.split("_")
    if kind == "loss":
        return loss_case(fused=variant == "native")
    return glu_case(fused=variant == "fused")


def versions() -> Dict[str, str]:
    import megatron.core
    import torch

    return {"torch": torch.__version__, "megatron_core": megatron.core.__version__, "python": platform.python_version()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in its own process
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return
    measured = {}
    for case in CASES:
        child = subprocess.run([sys.executable, __file__, "--case", case], capture_output=True, text=True, check=True)
        measured[case] = json.loads(child.stdout.strip().splitlines()[-1])
        print(case, ", ".join(f"{key} {value:.2f}" for key, value in measured[case].items()), flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        record = {"commit": os.environ.get("GRAPHBRIDGE_COMMIT", commit), "date": date.today().isoformat(),
                  "machine": platform.processor() or platform.machine(), "versions": versions(),
                  "command": "python benchmarks/memory_terms.py --json " + str(args.json),
                  "shapes": {"tokens": TOKENS, "vocab": VOCAB, "ffn": FFN},
                  "units": {"loss_*": "bytes per logit entry", "glu_*": "bytes per token and ffn channel"},
                  "cases": measured}
        write_json_atomic(args.json, record)


if __name__ == "__main__":
    main()
