"""Hydra callbacks of the harness, registered in conf/config.yaml under hydra.callbacks.

Hydra instantiates callbacks at the start of every run, so this module imports nothing heavy;
the report (and matplotlib) load only when a multirun ends.
"""

import logging
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

SWEEP_EXIT_CODE = 0
"""The verdict of the last sweep this process ran (perf.report.exit_code); graphbridge exits with it
after Hydra returns, so that a sweep with failed or refused jobs does not end in status 0."""


def refused_job() -> None:
    """A job of this sweep was refused (exit 2). A plan sweep writes no results for its summary to
    judge, so this is its verdict; a training sweep's summary, which reads every job's result, has the
    last word."""
    global SWEEP_EXIT_CODE
    SWEEP_EXIT_CODE = SWEEP_EXIT_CODE or 2


class SummaryCallback(Callback):
    """Writes summary.md, summary.csv and summary.png into the sweep directory."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global SWEEP_EXIT_CODE
        from bridge.atomic import WriteError
        from perf.report import build_summary, exit_code, print_summary, write_summary

        if config.get("mode") == "plan":
            return  # a plan sweep printed its plans and wrote nothing: nothing to summarise
        summary = build_summary(Path(config.hydra.sweep.dir))
        if all(row["status"] == "missing" for row in summary.rows):
            # Zero jobs (glob() over nested groups launches none, silently), or none got as far as a record.
            log.info("no job in %s wrote a result.json; no summary", summary.directory)
            return
        SWEEP_EXIT_CODE = exit_code(summary)
        try:
            write_summary(summary)
        except WriteError as error:
            print(f"graphbridge: {error}; the summary of this sweep was not written", file=sys.stderr)
            SWEEP_EXIT_CODE = SWEEP_EXIT_CODE or 1
        print_summary(summary)
