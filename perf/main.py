"""The `graphbridge` command: compose, migrate, resolve the derived values, ask the rule
catalogue, translate; then print the plan (mode=plan) or train in a fresh process (mode=train).

This process never touches CUDA. Exit status 2: an invalid configuration, or (mode=train) one
this machine cannot run; a plan reports the latter and still exits 0, so planning for a cluster
works anywhere.
"""

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from bridge.config.paths import config_dir
from bridge.config.schema import Mode, PlanFormat
from bridge.config.store import register
from bridge.planning import build_plan
from bridge.prepare import prepare
from bridge.result import write_invalid_result
from perf.launch import job_record, run_job
from perf.outputs import discard_job_dir
from perf.preflight import check

log = logging.getLogger("graphbridge")
INVALID = 2


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def app(composed: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    job = job_record(hydra_cfg.runtime.choices, hydra_cfg.overrides.task)
    plan = build_plan(prepare(composed))
    report_violations(plan)
    if plan.config.mode == Mode.plan:  # the plan itself carries its notes
        print(plan.to_json() if plan.config.plan.format == PlanFormat.json else plan.to_text())
        discard_job_dir(job_dir, multirun)
        code = 0 if plan.valid else INVALID
    elif not plan.runnable_here:
        write_invalid_result(job_dir, plan.violations, job) if multirun else discard_job_dir(job_dir, multirun)
        code = INVALID
    else:
        for note in plan.notes + plan.machine_notes:
            log.info(note)
        code = run_job(plan.config, job_dir, job)
    if code and not multirun:  # a sweep records the failure and goes on with its other jobs
        sys.exit(code)


def report_violations(plan) -> None:
    """Every problem at once on stderr: the config's, then (for a run, which refuses them too; a
    plan shows them in itself) this machine's."""
    if plan.config_violations:
        print("invalid configuration:\n" + "\n".join(f"  {v}" for v in plan.config_violations), file=sys.stderr)
    if plan.machine_violations and plan.config.mode == Mode.train:
        print("cannot run on this machine:\n" + "\n".join(f"  {v}" for v in plan.machine_violations),
              file=sys.stderr)


def main() -> None:
    problem = check(sys.argv[1:])
    if problem:
        sys.exit(f"graphbridge: {problem}")
    register()
    app()


if __name__ == "__main__":
    main()
