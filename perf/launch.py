"""Starting one training job: the resolved config goes into the job directory and a fresh
process (plain python for one GPU, torchrun for several) trains from it.

A fresh process per job is what makes sweeps correct: megatron-core keeps graph, RNG-tracker
and static-buffer state at class level, so two jobs in one process are unsafe.
"""

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Sequence

from omegaconf import OmegaConf

from bridge.atomic import write_json_atomic, write_text_atomic
from bridge.config.schema import GraphBridgeConfig
from bridge.validation.violation import Violation

RESOLVED = "resolved.yaml"
JOB = "job.json"
RESULT = "result.json"


def job_record(choices: Dict[str, str], overrides: Sequence[str]) -> dict:
    return {"choices": dict(choices), "overrides": list(overrides)}


def write_job(config: GraphBridgeConfig, job_dir: Path, job: dict) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(job_dir / RESOLVED, OmegaConf.to_yaml(OmegaConf.structured(config)))
    write_json_atomic(job_dir / JOB, job)


def write_invalid_result(job_dir: Path, violations: List[Violation], job: dict) -> None:
    write_json_atomic(job_dir / RESULT, {
        "status": "invalid",
        "reason": "; ".join(str(v) for v in violations),
        "violations": [v.as_dict() for v in violations],
        "job": job,
    })


def training_command(config: GraphBridgeConfig, job_dir: Path) -> List[str]:
    gpus = config.train.num_gpus
    if gpus <= 1:
        return [sys.executable, "-m", "bridge.run", str(job_dir)]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
            "-m", "bridge.run", str(job_dir)]


def run_job(config: GraphBridgeConfig, job_dir: Path, job: dict) -> int:
    """Write the job's files, train in a fresh process, return its exit code."""
    write_job(config, job_dir, job)
    env = {**os.environ, **{key: str(value) for key, value in config.env_vars.items()}}
    return subprocess.run(training_command(config, job_dir), env=env, check=False).returncode
