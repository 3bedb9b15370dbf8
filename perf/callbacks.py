"""Hydra callbacks of the harness, registered in conf/config.yaml under hydra.callbacks.

Hydra instantiates callbacks at the start of every run, so this module imports nothing heavy;
the report (and matplotlib) load only when a multirun ends.
"""

import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class SummaryCallback(Callback):
    """Writes summary.md, summary.csv and summary.png into the sweep directory."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from perf.report import build_summary, print_summary, write_summary

        summary = build_summary(Path(config.hydra.sweep.dir))
        if all(row["status"] == "missing" for row in summary.rows):
            # A plan sweep, or zero jobs (glob() over nested groups launches none, silently).
            log.info("no job in %s wrote a result.json; no summary", summary.directory)
            return
        write_summary(summary)
        print_summary(summary)
