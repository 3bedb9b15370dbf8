"""A gate before a run's first timed step, for cuda_graph=auto's probe (perf.auto_probe).

The probe starts several runs at once, so that their builds, warm-ups and captures overlap, and lets one at a time
time its steps while the others wait here, idle: no run is timed while another builds, captures or steps. The probe
names the gate's folder in the run's environment (GATE_ENV); a run without it never waits.

Each rank of a run marks itself ready (``ready.<rank>`` in the folder) and waits until the probe opens the gate
(``open``). Files, polled, because the ranks are processes forked elsewhere and the probe may stop them at any time.
"""

import os
import time
from pathlib import Path
from typing import Optional

GATE_ENV = "GRAPHBRIDGE_START_GATE"
POLL_S = 0.01
"""How often a waiting rank looks: its wake-ups cost the timed run next to nothing."""
OPEN = "open"


def gate_of_this_run() -> Optional[Path]:
    """The gate this process waits at, where the probe named one."""
    folder = os.environ.get(GATE_ENV)
    return Path(folder) if folder else None


def wait_for_turn(folder: Path, rank: int) -> None:
    """Mark ``rank`` ready and wait until the gate opens. Raises GateAbandoned once this process has lost its parent
    (the probe's launcher ends with the probe): nobody would open the gate, and a run waiting without end would keep
    its GPU memory."""
    parent = os.getppid()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ready.{rank}").touch()
    while not (folder / OPEN).exists():
        if os.getppid() != parent:
            raise GateAbandoned(f"the probe that started this run ended before letting it time its steps ({folder})")
        time.sleep(POLL_S)


class GateAbandoned(RuntimeError):
    """The probe that started a run waiting at its gate ended."""


def ready_ranks(folder: Path) -> int:
    return len(list(folder.glob("ready.*"))) if folder.is_dir() else 0


def open_gate(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / OPEN).touch()
