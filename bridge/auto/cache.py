"""The decisions of ``cuda_graph=auto``, cached so that a second run of the same workload skips the probe.

One JSON file that the user can read and delete: ``$XDG_CACHE_HOME/graphbridge/cuda_graph_auto.json``
(``~/.cache/graphbridge/cuda_graph_auto.json`` by default). A decision is keyed by the configuration without
its graph fields (and without what does not change a step: the run's length, the plan's options, what a run
records beside its steps), the choices the catalogue accepted for it, the GPU's name and the installed
package versions: another workload, GPU or software release probes again.

Writers hold an OS file lock beside the file (filelock; the kernel releases it when a process dies) while
they read, add and write, so that concurrent runs do not lose each other's decisions; the file itself is
replaced atomically, so a reader never sees half of it. A file that cannot be read is reported in one line
and treated as empty; the next decision rewrites it.
"""

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from filelock import FileLock

from bridge.atomic import WriteError, write_json_atomic
from bridge.config.schema import GraphBridgeConfig
from bridge.machine import Machine

CACHE_NAME = "cuda_graph_auto.json"
FORMAT = 1
NOT_THE_WORKLOAD = ("model.cuda_graph_impl", "model.cuda_graph_modules",  # what auto decides
                    "mode", "plan", "train.train_iters", "optimizer.lr_warmup_iters",  # the run's length, the plan
                    "perf.profile", "perf.profile_steps", "perf.profile_start_step", "perf.nsys", "perf.nsys_trace",
                    "perf.nsys_extra_args", "perf.tensorboard")  # what a run records beside its steps
"""Keys (or whole sections) left out of a decision's key: they do not change what a step costs."""
LOCK_TIMEOUT_S = 60.0
"""Writers hold the lock for a read and a write of a small file; a longer wait means something is wrong."""


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "graphbridge" / CACHE_NAME


def decision_key(cfg: GraphBridgeConfig, accepted: Sequence[str], machine: Machine) -> Optional[str]:
    """The key of a decision for ``cfg`` among ``accepted`` on ``machine``; None without a GPU (no decision)."""
    if not machine.gpus:
        return None
    workload = {key: value for key, value in flat(dataclasses.asdict(cfg)).items()
                if not any(key == left or key.startswith(f"{left}.") for left in NOT_THE_WORKLOAD)}
    material = {"workload": workload, "candidates": list(accepted), "gpu": machine.gpus[0].name,
                "versions": dict(machine.packages)}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:16]


def flat(node: dict, prefix: str = "") -> Dict[str, object]:
    found = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            found.update(flat(value, f"{prefix}{key}."))
        else:
            found[f"{prefix}{key}"] = value
    return found


def read_decisions(path: Path) -> Tuple[Dict[str, dict], Optional[str]]:
    """The decisions in the cache file (none when there is no file), and why it cannot be read, if so."""
    if not path.exists():
        return {}, None
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return {}, _unreadable(path, f"{type(error).__name__}: {error}")
    problem = _malformed(document)
    return ({}, _unreadable(path, problem)) if problem else (document["decisions"], None)


def _malformed(document) -> Optional[str]:
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return f"not a decision cache of format {FORMAT}"
    decisions = document.get("decisions")
    if not isinstance(decisions, dict):
        return "its 'decisions' is not an object"
    for key, record in decisions.items():
        if not (isinstance(record, dict) and isinstance(record.get("chosen"), str)
                and isinstance(record.get("candidates"), list)):
            return f"decision {key} has no 'chosen' choice or no 'candidates' list"
    return None


def _unreadable(path: Path, why: str) -> str:
    return (f"the cuda_graph=auto decision cache {path} cannot be read ({why[:200]}); it is treated as empty and "
            "rewritten by the next decision (delete it to start afresh)")


def store(path: Path, key: str, record: dict) -> Optional[str]:
    """Add ``record`` under ``key``, keeping every other decision; why it could not be written, if so."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock", timeout=LOCK_TIMEOUT_S):
            decisions, _ = read_decisions(path)  # an unreadable file was reported when it was read
            write_json_atomic(path, {"format": FORMAT, "decisions": {**decisions, key: record}})
    except OSError as error:  # WriteError and filelock's Timeout are OSErrors too
        why = str(error) if isinstance(error, WriteError) else f"{type(error).__name__}: {error}"
        return f"the cuda_graph=auto decision was not cached ({why}): the next run of this workload probes again"
    return None
