"""The training process: ``python -m bridge.run <job_dir>`` (or under torchrun).

The Hydra process has already written ``<job_dir>/resolved.yaml`` (finished and validated)
and ``job.json``. This process applies the config's ``env_vars`` (their one owner) and, for a graphed job, the allocator
options its captures need that the user left unset (bridge.allocator), asks the rule
catalogue again, for this machine and the processes started, and only then builds the engine:
a job started by hand is refused exactly as ``graphbridge`` refuses it. It always leaves a
result.json behind.
Exit status: 0 completed, 1 failed, 2 refused by the catalogue (status invalid), 128 + N stopped by
signal N at a step boundary (130 SIGINT, 143 SIGTERM; train.exit_signal_handler=true).
"""

import json
import logging
import os
import sys
import threading
import traceback
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bridge.allocator import graph_allocator_settings
from bridge.config.schema import GraphBridgeConfig
from bridge.atomic import WriteError
from bridge.diagnosis import GraphCaptureError, NonFiniteError, diagnose
from bridge.result import RunRecord, build_result, failure, write_invalid_result, write_result
from bridge.trainer import ExitSignals, Trainer
from bridge.validation import Refused, resolve_target, validate

log = logging.getLogger("bridge.run")

COMPLETED, FAILED, CANNOT_RUN, KEYBOARD_INTERRUPT = 0, 1, 2, 130
CLOSE_TIMEOUT_S = 60.0
"""Longest wait for the engine to release its graphs once result.json is written: a dead NCCL
peer or a broken CUDA context must not keep a sweep waiting."""


def load_resolved(job_dir: Path) -> GraphBridgeConfig:
    schema = OmegaConf.structured(GraphBridgeConfig)
    return OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(job_dir / "resolved.yaml")))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bridge.run <job_dir>", file=sys.stderr)
        return CANNOT_RUN
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    job_dir = Path(args[0])
    exit_signals = ExitSignals()
    cfg = trainer = None
    code = FAILED
    try:
        cfg = load_resolved(job_dir)
        os.environ.update({key: str(value) for key, value in cfg.env_vars.items()})  # before any CUDA call
        allocator = graph_allocator_settings(cfg, os.environ, torch.__version__)
        if allocator:
            log.info("graphed job: %s (bridge/allocator.py)", " ".join(f"{k}={v}" for k, v in allocator.items()))
            os.environ.update(allocator)
        target = resolve_target(cfg, processes=int(os.environ.get("WORLD_SIZE", "1")))
        violations = refusals(cfg, target)
        if violations:
            raise Refused(violations)
        if cfg.train.exit_signal_handler:
            exit_signals.install()
        trainer = Trainer(cfg, job_dir, target, exit_signals if cfg.train.exit_signal_handler else None)
        trainer.run()  # writes result.json itself, whatever happens
        code = 128 + trainer.stopped_by if trainer.stopped_by else COMPLETED
    except (Exception, KeyboardInterrupt) as error:
        code = report_failure(error, cfg, job_dir, trainer)
    finally:
        if trainer is not None:
            close_within(trainer, CLOSE_TIMEOUT_S, code)
        exit_signals.restore()
    return code


def refusals(cfg: GraphBridgeConfig, target):
    """What the catalogue refuses in a training process: the very rules the plan ran."""
    return validate(cfg, target)


def report_failure(error: BaseException, cfg, job_dir: Path, trainer) -> int:
    """Log why the run ended (result.json is written unless the trainer never started); its exit code."""
    try:
        return _report(error, cfg, job_dir, trainer)
    except WriteError as unwritten:  # the result could not be written either: one line, the earlier file stays
        log.error("%s", unwritten)
        return FAILED


def _report(error: BaseException, cfg, job_dir: Path, trainer) -> int:
    if isinstance(error, WriteError):
        log.error("%s (the result of this run is lost; an earlier one is kept as it was)", error)
        return FAILED
    if isinstance(error, Refused):
        write_invalid_result(job_dir, error.violations, _read_job(job_dir))
        log.error("refused:\n%s", "\n".join(f"  {v}" for v in error.violations))  # every problem, no traceback
        return CANNOT_RUN
    status, reason = failure(error, trainer.steps.failing_step if trainer is not None else None)
    if trainer is None:
        write_result(job_dir, build_result(cfg, job_dir, status, reason, RunRecord()))
    if status == "interrupted":
        return KEYBOARD_INTERRUPT
    if isinstance(error, NonFiniteError):
        log.error("%s", reason)  # the message says it all: no traceback
        return FAILED
    traceback.print_exc()
    if isinstance(error, GraphCaptureError) or diagnose(error) is not None:
        log.error("%s", reason)  # the diagnosis, below the traceback that shows the offending line
    return FAILED


def _read_job(job_dir: Path) -> dict:
    path = job_dir / "job.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def close_within(trainer: Trainer, seconds: float, code: int) -> None:
    """Release every graph; if that hangs, exit with ``code`` anyway (result.json is written)."""
    watchdog = threading.Timer(seconds, _exit_now, args=(code, seconds))
    watchdog.daemon = True
    watchdog.start()
    try:
        trainer.close()
    except Exception as error:  # after a sticky CUDA error every call fails; nothing more to free
        log.error("releasing the engine failed: %s", error)
    finally:
        watchdog.cancel()


def _exit_now(code: int, seconds: float) -> None:
    log.error("releasing the engine took over %.0f s; exiting without waiting for it", seconds)
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
