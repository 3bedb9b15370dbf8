"""The `graphbridge` command: compose, migrate, resolve the derived values, ask the rule
catalogue, translate; then print the plan (mode=plan) or train in a fresh process (mode=train).

This process never touches CUDA. Exit status 2: an invalid configuration, or (mode=train) one
this machine cannot run; a plan reports the latter and still exits 0, so planning for a cluster
works anywhere.
"""

import logging
import os
import sys
from pathlib import Path
from typing import Optional, Tuple

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge.auto.candidates import override_key, plan_auto
from bridge.config.graphs import MEASURED_CHOICE, chosen_graph_choice
from bridge.config.load import compose_config
from bridge.config.migration import migrate
from bridge.config.paths import config_dir
from bridge.config.schema import GraphBridgeConfig, Mode, PlanFormat
from bridge.config.store import register
from bridge.planning import build_plan
from bridge.prepare import prepare
from bridge.result import write_invalid_result
from bridge.translate.gate import check_wanted
from bridge.validation import Violation, judge_composed
from perf import bridge_config, callbacks
from perf.bridge_config_export import to_yaml
from perf.errors import one_line_errors
from perf.help import register_help
from perf.joblog import echo, job_log_path
from perf.auto_probe import choose_graphs
from perf.launch import job_record, run_job
from perf.preflight import check

log = logging.getLogger("graphbridge")
INVALID = 2
STARTED = False
"""Whether Hydra reached the task: before it, an exit of 1 is Hydra refusing the config."""


@hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
def app(composed: DictConfig) -> None:
    global STARTED
    STARTED = True
    hydra_cfg = HydraConfig.get()
    job_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    # Unresolved: an override's text may hold an interpolation ("train.train_iters=${oops}").
    job = job_record(OmegaConf.to_container(hydra_cfg.runtime.choices, resolve=False),
                     OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False))
    label = job_label(hydra_cfg) if multirun else ""
    unresolvable = judge_composed(composed)
    if unresolvable:
        refuse_unresolvable(unresolvable[0], composed, job_dir, job, label)
        return
    prepared = prepare(composed)
    measured, set_aside = graphs_measured(job, prepared.config)
    # megatron-core's config classes judge a training job here, before its launch (seconds; a plan opts in).
    plan = build_plan(prepared, graphs_measured=measured, check_megatron=check_wanted(prepared.config))
    plan.notes += [set_aside] if set_aside else []
    if measured:
        plan.auto = plan_auto(plan, job["overrides"])
    report_violations(plan, label)
    if plan.config.mode == Mode.plan:  # the plan itself carries its notes
        shown = rendered(plan)
        if shown is not None:
            show(shown)
        code = 0 if plan.valid else INVALID
    elif not plan.runnable_here:
        if multirun:  # the sweep's summary lists every job; a single run leaves nothing (perf/outputs.py)
            write_invalid_result(job_dir, plan.refused_here, job)
        code = INVALID
    else:
        for note in plan.notes + plan.machine_notes:
            log.info(note)
        config = choose_graphs(plan, job_dir) if plan.auto is not None else plan.config
        code = run_job(config, job_dir, job, job_log=job_log_path())
    if code and not multirun:  # a sweep records the failure and goes on with its other jobs
        sys.exit(code)
    if code == INVALID:
        callbacks.refused_job()


GRAPH_FIELDS = ("model.cuda_graph_impl", "model.cuda_graph_modules", "model.cuda_graph_scope",
                "model.enable_cuda_graph", "model.external_cuda_graph")
"""The fields that choose a job's graphs without the cuda_graph group (the older spellings among them)."""


def graphs_measured(job: dict, cfg: GraphBridgeConfig) -> Tuple[bool, Optional[str]]:
    """Whether the run measures its graph choice (cuda_graph=auto), and a note where the recipe's default auto
    steps aside. Typed on the command line, auto is what the user asked for, and its rules refuse what it cannot
    measure. As a recipe's default (llama/tiny's) it is not: graph fields on the command line choose the graphs
    instead, and a job of several nodes (the probe runs on one) trains eagerly."""
    choices = job["choices"]
    if choices.get("cuda_graph") is not None or chosen_graph_choice(choices) != MEASURED_CHOICE:
        return choices.get("cuda_graph") == MEASURED_CHOICE, None
    if any(override_key(text) in GRAPH_FIELDS for text in job["overrides"]):
        return False, None
    if cfg.train.num_nodes > 1:
        return False, (f"the recipe's graph choice, {MEASURED_CHOICE}, probes on one node and this job spans "
                       f"train.num_nodes={cfg.train.num_nodes}: it trains eagerly; cuda_graph=<choice> graphs it")
    return True, None


def refuse_unresolvable(refused: Violation, composed: DictConfig, job_dir: Path, job: dict, label: str) -> None:
    """One line and exit 2; in a sweep (``label`` names the job) the job is refused like one that breaks
    a rule (a training sweep's summary lists it) and the sweep goes on with its other jobs."""
    keys = "".join(f"{key}: " for key in refused.keys)
    print(f"graphbridge: {label}{keys}{refused.message}", file=sys.stderr)
    if not label:
        sys.exit(INVALID)
    if OmegaConf.select(composed, "mode", throw_on_resolution_failure=False) != Mode.plan.value:
        write_invalid_result(job_dir, [refused], job)
    callbacks.refused_job()


def rendered(plan) -> Optional[str]:
    """The plan as plan.format asks; for bridge the config as a Bridge ConfigContainer YAML, which an
    invalid config does not get (its violations are on stderr)."""
    if plan.config.plan.format == PlanFormat.json:
        return plan.to_json()
    if plan.config.plan.format == PlanFormat.bridge:
        return to_yaml(plan.config) if plan.valid else None
    return plan.to_text()


def show(text: str) -> None:
    """Print the plan; a reader that stops early (``| head``) is no error and no traceback."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python would fail again flushing stdout at exit: the rest goes nowhere, the exit status stays.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def job_label(hydra_cfg) -> str:
    """Which job of a sweep a block on stderr belongs to: its number and overrides, as Hydra lists them."""
    return f"job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}): "


def report_violations(plan, label: str = "") -> None:
    """Every problem at once on stderr: the config's, then (for a run, which refuses them too; a
    plan shows them in itself) this machine's. A run's job log keeps them too; a plan writes nothing.
    In a sweep ``label`` names the job, whose blocks would otherwise be told apart by position only."""
    train = plan.config.mode == Mode.train
    if plan.config_violations:
        echo(f"{label}invalid configuration:\n" + "\n".join(f"  {v}" for v in plan.config_violations), sys.stderr,
             logged=train)
    lacking = plan.machine_violations + plan.here_violations
    if lacking and train:
        echo(f"{label}cannot run on this machine:\n" + "\n".join(f"  {v}" for v in lacking), sys.stderr)


def main() -> None:
    if bridge_config.requested(sys.argv[1:]):  # the file's fields take its place, and graphbridge goes on with them
        sys.argv[1:] = bridge_config.command_line(sys.argv[1:])
    problem = check(sys.argv[1:])
    if problem:
        print(f"graphbridge: {problem}", file=sys.stderr)
        sys.exit(INVALID)
    register()
    register_help(sys.argv[1:])
    with one_line_errors():  # Hydra's refusals and its failed writes: one line
        try:
            app()
        except SystemExit as exit:
            # A few refusals Hydra prints itself and exits 1 before the job starts (--package naming
            # no package): that is bad input, and bad input exits 2.
            if exit.code == 1 and not STARTED:
                sys.exit(INVALID)
            raise
    if any(arg.split("=", 1)[0] in ("--cfg", "-c") for arg in sys.argv[1:]):
        say_what_a_run_migrates(sys.argv[1:])
    # A sweep goes on past failed and refused jobs, then says so in its exit status (after its report).
    sys.exit(callbacks.SWEEP_EXIT_CODE)


def say_what_a_run_migrates(argv) -> None:
    """After ``--cfg``: Hydra printed the config as composed; a run first migrates the older CUDA-graph
    spellings (and its derived values follow the migrated impl), so name each change on stderr."""
    if any(arg.split("=", 1)[0] in ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
           for arg in argv):
        return  # composed from another tree than graphbridge's own
    try:
        notes = migrate(compose_config([arg for arg in argv if "=" in arg and not arg.startswith("-")]).model).notes
    except (HydraException, OmegaConfBaseException):
        return  # Hydra has printed what it could; mode=plan names the problem
    for note in notes:
        print(f"graphbridge: note: {note}", file=sys.stderr)
    if notes:
        print("graphbridge: the config above is as composed; a run migrates it first, and mode=plan and the run's "
              "resolved.yaml show what runs", file=sys.stderr)


if __name__ == "__main__":
    main()
