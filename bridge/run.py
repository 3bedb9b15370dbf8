"""The training process: ``python -m bridge.run <job_dir>`` (or under torchrun).

The Hydra process has already written ``<job_dir>/resolved.yaml`` (finished and validated)
and ``job.json``. This process trains one job and always leaves a result.json behind.
Exit status: 0 completed, 1 failed, 2 configuration the engine cannot run, 130 interrupted.
"""

import logging
import os
import sys
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from bridge.config.schema import GraphBridgeConfig
from bridge.engines import ConfigError
from bridge.result import RunRecord, build_result, failure, write_result
from bridge.trainer import Trainer

log = logging.getLogger("bridge.run")


def load_resolved(job_dir: Path) -> GraphBridgeConfig:
    schema = OmegaConf.structured(GraphBridgeConfig)
    return OmegaConf.to_object(OmegaConf.merge(schema, OmegaConf.load(job_dir / "resolved.yaml")))


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bridge.run <job_dir>", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    job_dir = Path(args[0])
    cfg = trainer = None
    try:
        cfg = load_resolved(job_dir)
        os.environ.update(cfg.env_vars)  # before the first CUDA call reads them
        trainer = Trainer(cfg, job_dir)
        trainer.run()  # writes result.json itself, whatever happens
        return 0
    except (Exception, KeyboardInterrupt) as error:
        status, reason = failure(error)
        if trainer is None:
            write_result(job_dir, build_result(cfg, job_dir, status, reason, RunRecord()))
        if isinstance(error, ConfigError):
            log.error("%s", error)
            return 2
        if status == "interrupted":
            return 130
        traceback.print_exc()
        return 1
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
