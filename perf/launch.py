"""Starting one training job: the resolved config goes into the job directory and a fresh
process (plain python for one GPU, torchrun for several) trains from it.

A fresh process per job is what makes sweeps correct: megatron-core keeps graph, RNG-tracker
and static-buffer state at class level, so two jobs in one process are unsafe.

A job of ``train.num_nodes`` > 1 runs this on every node (under Slurm: one task per node, see
conf/hydra/launcher/submitit_slurm.yaml); each node starts one torchrun, and the nodes meet at node 0
through torchrun's static rendezvous, found from Slurm's variables or MASTER_ADDR/NODE_RANK.
Every rank gets this process's environment; the config's ``env_vars`` are applied by the
training process itself (bridge.run), before its first CUDA call, so a job started by hand gets
them too.

SIGINT and SIGTERM sent to this process while a job trains go on to the training process, which
stops at a step boundary and writes a partial result.json; one that is still running
``GRACE_S`` seconds later is killed. The signal then ends the whole command, a sweep included.
SIGUSR2, submitit's notice that the Slurm time limit is near, goes on as SIGTERM. SIGKILL reaches no
handler here: on Linux the kernel then sends the training process SIGTERM (its parent-death signal),
so it stops at its next step boundary too instead of training on, unseen, in the job directory.
"""

import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from bridge.atomic import WriteError, write_json_atomic, write_text_atomic
from bridge.config.plain import to_yaml
from bridge.config.schema import GraphBridgeConfig
from bridge.result import RESULT_FILE, write_missing_result
from perf.joblog import Tee

RESOLVED = "resolved.yaml"
JOB = "job.json"
RANKS = "ranks"
"""Per-rank logs: <job_dir>/ranks/node<N>/<run id>/attempt_0/<local rank>/{stdout,stderr}.log."""
GRACE_S = 60.0
"""How long a signalled training process may take to reach a step boundary and write its result."""
MASTER_PORT = 29500
"""torchrun's default port; under Slurm the job id is added (mod 1000) so that jobs which share
a first node do not share a port."""
LAUNCH_FAILED = 1

log = logging.getLogger(__name__)

class LaunchError(Exception):
    """The environment does not say where a multi-node job's node 0 is, or which node this is."""


def job_record(choices: Dict[str, str], overrides: Sequence[str]) -> dict:
    return {"choices": dict(choices), "overrides": list(overrides)}


def write_job(config: GraphBridgeConfig, job_dir: Path, job: dict) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(job_dir / RESOLVED, to_yaml(config))
    write_json_atomic(job_dir / JOB, job)


def training_command(config: GraphBridgeConfig, job_dir: Path, environ: Mapping[str, str]) -> List[str]:
    """The command that trains ``job_dir`` on this node: plain python for one GPU, else torchrun
    with one rank per GPU of the node; the nodes of a multi-node job meet at node 0. With
    perf.nsys each training process runs under ``nsys profile``."""
    train = ["-m", "bridge.run", str(job_dir)]
    gpus, nodes = config.train.num_gpus, config.train.num_nodes
    if gpus <= 1:
        return [*nsys_profile(config, job_dir, "0"), sys.executable, *train]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    if config.perf.nsys:  # each rank under its own nsys, which torchrun starts as a program
        torchrun.append("--no-python")
        train = [*nsys_profile(config, job_dir, "%q{RANK}"), sys.executable, *train]
    per_node = f"--nproc-per-node={gpus // nodes}"
    node = node_rank(config, environ)
    # Every rank's output goes to its own file; only local rank 0 also prints, one stream per node.
    logs = [f"--log-dir={job_dir / RANKS / f'node{node}'}", "--tee=3", "--local-ranks-filter=0"]
    if nodes == 1:
        return [*torchrun, "--standalone", per_node, *logs, *train]
    address, port = rendezvous(config, environ)
    return [*torchrun, f"--nnodes={nodes}", per_node, f"--node-rank={node}", f"--master-addr={address}",
            f"--master-port={port}", *logs, *train]


def nsys_profile(config: GraphBridgeConfig, job_dir: Path, rank: str) -> List[str]:
    """With perf.nsys, the ``nsys profile`` that runs one training process: it records only between
    the trainer's cudaProfilerStart and cudaProfilerStop, into ``<job_dir>/profile_<rank>.nsys-rep``
    (``%q{RANK}``: nsys reads the rank torchrun gave the process). Without it, nothing."""
    perf = config.perf
    if not perf.nsys:
        return []
    return ["nsys", "profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "-t", ",".join(perf.nsys_trace), "-o", str(job_dir / f"profile_{rank}"), *perf.nsys_extra_args]


def node_rank(config: GraphBridgeConfig, environ: Mapping[str, str]) -> int:
    """This node's index in the job: NODE_RANK, else Slurm's SLURM_NODEID; 0 for one node.
    Under Slurm the job is the whole allocation, one task per node, as submitit starts it."""
    nodes = config.train.num_nodes
    if nodes <= 1:
        return 0
    if environ.get("NODE_RANK"):
        return int(environ["NODE_RANK"])
    if not environ.get("SLURM_NODEID"):
        raise LaunchError(_unplaced(config, "this node's rank (NODE_RANK or SLURM_NODEID)"))
    allocated = int(environ.get("SLURM_JOB_NUM_NODES", nodes))
    if allocated != nodes:  # torchrun would wait for the missing nodes until its rendezvous times out
        raise LaunchError(
            f"train.num_nodes={nodes} but Slurm job {environ.get('SLURM_JOB_ID')} has {allocated} node(s) "
            "(SLURM_JOB_NUM_NODES): allocate as many nodes as train.num_nodes; hydra/launcher=submitit_slurm asks for "
            "train.num_nodes once per sweep, so use one command per node count")
    return int(environ["SLURM_NODEID"])


def rendezvous(config: GraphBridgeConfig, environ: Mapping[str, str]) -> Tuple[str, int]:
    """Node 0's address and port: MASTER_ADDR and MASTER_PORT where set, else the Slurm job's
    first host and a port derived from its job id, the same on every node."""
    if environ.get("MASTER_ADDR"):
        address = environ["MASTER_ADDR"]
    elif environ.get("SLURM_JOB_NODELIST"):
        address = first_host(environ["SLURM_JOB_NODELIST"])
    else:
        raise LaunchError(_unplaced(config, "node 0's address (MASTER_ADDR or SLURM_JOB_NODELIST)"))
    if environ.get("MASTER_PORT"):
        return address, int(environ["MASTER_PORT"])
    return address, MASTER_PORT + int(environ.get("SLURM_JOB_ID", "0")) % 1000


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list: ``gpu-[017-020,031],cpu01`` -> ``gpu-017``."""
    group = re.match(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist).group(0)
    return re.sub(r"\[([^\],-]*)[^\]]*\]", r"\1", group)


def _unplaced(config: GraphBridgeConfig, unknown: str) -> str:
    nodes = config.train.num_nodes
    return (f"train.num_nodes={nodes} but {unknown} is not set: run under Slurm (graphbridge -m "
            "hydra/launcher=submitit_slurm, or srun with one task per node), or set MASTER_ADDR=<node 0's host>, "
            f"MASTER_PORT=<port, default {MASTER_PORT}> and NODE_RANK=<0..{nodes - 1}> on every node")


def run_job(config: GraphBridgeConfig, job_dir: Path, job: dict, job_log: Optional[Path] = None) -> int:
    """Write the job's files, train in a fresh process, return its exit code (128 + N for
    signal N). A signal forwarded to the job raises SystemExit with that code instead, which
    ends a sweep too. ``job_log``: the file that also receives the training process's output."""
    env = dict(os.environ)
    try:
        node = node_rank(config, env)
        command = training_command(config, job_dir, env)
    except LaunchError as error:
        log.error("%s", error)
        stand_in_result(job_dir, job, str(error), interrupted=False)
        return LAUNCH_FAILED
    try:
        # Every node writes the job files (identical content, atomic writes), so that no node's
        # ranks depend on another node's write showing on the shared filesystem in time.
        write_job(config, job_dir, job)
    except WriteError as error:
        log.error("%s", error)
        return LAUNCH_FAILED
    with SignalForwarding() as forwarding:
        code = forwarding.run(command, env, job_log)
        # Node 0 alone stands in for a missing result.json: another node's torchrun may end before
        # rank 0 has written it, or before the shared filesystem shows it there.
        if node == 0 and not (job_dir / RESULT_FILE).exists():
            stand_in_result(job_dir, job, forwarding.why_no_result(code), interrupted=bool(forwarding.received))
    if forwarding.received:
        raise SystemExit(128 + forwarding.received)
    return code


def stand_in_result(job_dir: Path, job: dict, reason: str, interrupted: bool) -> None:
    """result.json for a job that wrote none; a write that fails (disk full) is one logged line."""
    try:
        write_missing_result(job_dir, job, reason, interrupted)
    except WriteError as error:
        log.error("%s (the job's own failure: %s)", error, reason)


class SignalForwarding:
    """While a training process runs, SIGINT and SIGTERM sent here go on to it; if it has not
    exited GRACE_S seconds after the first, it is killed, so a stuck step cannot hang the launcher."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)
    # submitit sends SIGUSR2 signal_delay_s before the time limit; its own handler would fail the
    # job with training still running. The trainer stops at a step boundary on SIGTERM.
    PASSED_ON_AS = {signal.SIGUSR2: signal.SIGTERM}

    def __init__(self):
        self.received: Optional[int] = None
        self.killed = False
        self._child: Optional[subprocess.Popen] = None
        self._deadline: Optional[threading.Timer] = None
        self._previous: Dict[int, object] = {}

    def __enter__(self) -> "SignalForwarding":
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._forward)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self._deadline is not None:
            self._deadline.cancel()

    def run(self, command: List[str], env: Dict[str, str], job_log: Optional[Path] = None, shown: bool = True) -> int:
        """Start the process (unless a signal came first) and wait for it; its exit code. With a
        ``job_log``, its stdout and stderr go to this process's and into the log too (perf.joblog);
        not ``shown``, into the log only."""
        if self.received:
            return 128 + self.received
        piped = subprocess.PIPE if job_log is not None else None
        # Its own process group: a terminal's Ctrl-C reaches it once, through _forward, not twice
        # (torchrun would start its shutdown twice). torchrun passes signals on to its workers.
        self._child = subprocess.Popen(command, env=tee_environment(env) if job_log is not None else env,
                                       process_group=0, stdout=piped, stderr=piped,
                                       preexec_fn=ended_with_this_process())
        tees = [Tee(self._child.stdout, sys.stdout.buffer if shown else None, job_log),
                Tee(self._child.stderr, sys.stderr.buffer if shown else None, job_log)] if job_log is not None else []
        if self.received:  # came while it was starting
            self._forward(self.received, None)
        code = self._child.wait()
        for tee in tees:
            tee.join()
        return 128 - code if code < 0 else code

    def why_no_result(self, code: int) -> str:
        """Why the training process ended without writing result.json."""
        if self._child is None:
            return f"{signal_name(self.received)} received before the training process started"
        if self.killed:
            return f"killed {GRACE_S:.0f} s after {signal_name(self.received)}: it reached no step boundary in time"
        if code > 128:
            return f"training process ended by {signal_name(code - 128)} before writing result.json"
        return f"training process exited with status {code} before writing result.json"

    def _forward(self, signum: int, frame) -> None:
        self.received = self.received or signum
        if self._child is None:
            return
        self._signal_child(self.PASSED_ON_AS.get(signum, signum))
        if self._deadline is None:
            self._deadline = threading.Timer(GRACE_S, self._kill)
            self._deadline.daemon = True
            self._deadline.start()

    def _kill(self) -> None:
        self.killed = True
        self._signal_child(signal.SIGKILL)

    def _signal_child(self, signum: int) -> None:
        try:
            os.killpg(self._child.pid, signum)
        except ProcessLookupError:  # it has exited already
            pass


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def ended_with_this_process() -> Optional[Callable[[], None]]:
    """Popen's preexec_fn on Linux: the child gets SIGTERM when this process dies, of SIGKILL too (its
    own process group keeps it from a terminal's signals, so nothing else would tell it). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: between fork and exec only the call runs
    parent = os.getpid()

    def set_parent_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # this process died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)

    return set_parent_death_signal


def tee_environment(env: Dict[str, str]) -> Dict[str, str]:
    """A piped training process streams its lines as they come (no block buffering) and lays out
    its summary table for the terminal this process writes to."""
    env = {**env, "PYTHONUNBUFFERED": "1"}
    if sys.stdout.isatty() and "COLUMNS" not in env:
        env["COLUMNS"] = str(shutil.get_terminal_size().columns)
    return env


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
