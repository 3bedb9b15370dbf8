"""What graphbridge does with the user's files, through the real command line: a run deletes only
what it created, owns its directory alone (an OS lock), never overwrites an earlier result, and
writes results atomically with the user's umask; a failed write (a full disk, a process killed
while it writes) is one line and loses nothing."""

import errno
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bridge.atomic import WriteError, write_json_atomic, write_text_atomic
from perf.outputs import LOCK_FILE

PLAN = ("mode=plan",)
INVALID = ("cuda_graph=full_iteration", "ddp.check_for_nan_in_grad=true")
TINY_RUN = ("model.num_layers=2", "model.hidden_size=128", "dataset.seq_length=64", "train.train_iters=3",
            "perf.warmup_steps=1")


def listing(directory):
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


@pytest.mark.parametrize("args", [PLAN, INVALID, (*PLAN, *INVALID)], ids=["plan", "invalid", "invalid plan"])
def test_a_run_in_the_working_directory_keeps_everything_that_was_there(cli, tmp_path, args):
    for name in ("main.log", "notes.txt", ".hydra/config.yaml", "sub/data.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(f"the user's {name}")
    before = {name: (tmp_path / name).read_text() for name in listing(tmp_path) if (tmp_path / name).is_file()}
    entries = listing(tmp_path)
    result = cli(*args, "hydra.run.dir=.", cwd=tmp_path)
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert listing(tmp_path) == entries


@pytest.mark.parametrize("args", [PLAN, INVALID, ("engine=torch", "hydra/job_logging=disabled", *INVALID)],
                         ids=["plan", "invalid", "invalid unlogged"])
def test_a_directory_of_log_files_is_left_as_it_was(cli, tmp_path, args):
    logs = {"main.log": "the user's log\n", "train.log": "x\n", "nohup.out": "y\n"}
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
    result = cli(*args, "hydra.run.dir=.", cwd=tmp_path)
    assert result.returncode in (0, 2) and "Traceback" not in result.stderr
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == logs
    if args != PLAN:  # a run would append its log to the user's main.log: refused before it writes
        assert result.stderr == (f"graphbridge: {tmp_path} holds main.log, which this run's log would be appended "
                                 "to: choose another hydra.run.dir (the default is a new timestamped one) or move "
                                 "it away\n")


@pytest.mark.parametrize("run_dir", ["runs/mine/new/deeper", "runs/mine", "runs"])
def test_an_invalid_run_removes_only_the_directories_it_made(cli, tmp_path, run_dir):
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    result = cli(*INVALID, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2
    assert listing(tmp_path) == ["runs", "runs/mine"]


def test_a_finished_run_keeps_its_results_and_no_lock(cpu_run):
    names = {path.name for path in cpu_run["run_dir"].iterdir()}
    assert {"result.json", "job.json", "resolved.yaml", "main.log"} <= names and LOCK_FILE not in names


def test_a_second_run_in_a_busy_directory_is_refused_naming_the_owner(cli, tmp_path):
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    with open(run_dir / LOCK_FILE, "w") as lock:
        lock.write(json.dumps({"pid": 4242, "host": "node7", "since": "today", "command": "graphbridge x=1"}))
        lock.flush()
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        result = cli(*PLAN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "is in use by graphbridge pid 4242 on node7" in result.stderr and "run_directory.wait=true" in result.stderr
    assert listing(run_dir) == [LOCK_FILE]


def test_a_free_directory_is_taken_at_once_without_a_waiting_line(cli, tmp_path):
    result = cli(*PLAN, f"hydra.run.dir={tmp_path / 'free'}", "hydra.callbacks.run_directory.wait=true", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_two_real_runs_in_one_directory_and_an_interrupt_keep_the_users_files(cli, tmp_path):
    """A training run holds the directory: a second run is refused naming it, a third waits for it;
    Ctrl-C ends the first with a partial result, the third then plans; the user's files stay, and
    what the first wrote has the permissions its umask (077) gives."""
    run_dir = tmp_path / "shared"
    user_files = {"notes.txt": "mine\n", "train.log": "an older log\n", "data/tokens.bin": "0123"}
    for name, text in user_files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    progress = tmp_path / "first.err"
    with open(progress, "w") as stderr:
        # More steps than any machine trains before the interrupt below: it must hold the directory till then.
        first = cli.start("engine=torch", *TINY_RUN, "train.train_iters=100000", f"hydra.run.dir={run_dir}",
                          cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr, umask=0o077)
    waiting = None
    try:
        wait_for(lambda: re.search(r"\b[1-9]\d*/100000\b", progress.read_text()), first)  # a step done: it trains
        second = cli("engine=torch", *TINY_RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
        assert f"{run_dir} is in use by graphbridge pid {first.pid} on " in second.stderr
        waiting = cli.start(*PLAN, f"hydra.run.dir={run_dir}", "hydra.callbacks.run_directory.wait=true",
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert waiting.stderr.readline().startswith(f"graphbridge: waiting for {run_dir} (graphbridge pid {first.pid}")
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=120) == 130
        assert waiting.wait(timeout=60) == 0, waiting.stderr.read()
    finally:
        for process in (first, waiting):
            if process is not None and process.poll() is None:
                process.kill()
    assert {name: (run_dir / name).read_text() for name in user_files} == user_files
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "interrupted" and result["reason"].startswith("SIGINT received")
    written = ("job.json", "resolved.yaml", "result.json", "main.log", ".hydra/config.yaml")
    assert {name: (run_dir / name).stat().st_mode & 0o777 for name in written} == dict.fromkeys(written, 0o600)


def wait_for(condition, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"exited with {process.returncode}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_run_asked_to_wait_starts_when_the_directory_is_free(cli, tmp_path):
    # The lock goes once the run says it waits, not after a fixed time: a busy machine may take longer
    # than any such time to start the command, which then finds the directory free and never waits.
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    with open(run_dir / LOCK_FILE, "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        waiting = cli.start(*PLAN, f"hydra.run.dir={run_dir}", "hydra.callbacks.run_directory.wait=true",
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert waiting.stderr.readline().startswith(f"graphbridge: waiting for {run_dir} ")
        time.sleep(1.0)
        assert waiting.poll() is None  # it waits while the directory is held (leaving the block frees it)
    assert waiting.wait(timeout=120) == 0, waiting.stderr.read()


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(cli, tmp_path):
    run_dir = tmp_path / "killed"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, time
        lock = open({str(run_dir / LOCK_FILE)!r}, "w"); fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        print("locked", flush=True); time.sleep(60)""")], stdout=subprocess.PIPE, text=True)
    run_dir.mkdir()
    try:
        assert holder.stdout.readline().strip() == "locked"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    result = cli(*PLAN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_a_run_never_overwrites_an_earlier_result(cli, tmp_path):
    run_dir = tmp_path / "done"
    run_dir.mkdir()
    (run_dir / "result.json").write_text('{"status": "completed"}')
    result = cli("engine=torch", *TINY_RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2 and "holds an earlier run's result.json" in result.stderr
    assert listing(run_dir) == ["result.json"] and (run_dir / "result.json").read_text() == '{"status": "completed"}'


def test_a_sweep_never_mixes_with_an_earlier_sweep(cli, tmp_path):
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "0").mkdir(parents=True)
    (sweep_dir / "0" / "result.json").write_text("{}")
    result = cli("-m", *PLAN, "cuda_graph=none,full_iteration", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 2 and "holds 1 job(s) of an earlier sweep" in result.stderr
    assert listing(sweep_dir) == ["0", "0/result.json"]


def test_a_plan_sweep_leaves_nothing_behind(cli, tmp_path):
    result = cli("-m", *PLAN, "cuda_graph=none,full_iteration", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert listing(tmp_path) == []


@pytest.mark.parametrize("run_dir", ["/proc/graphbridge-cannot-write-here", "a_file/run"])
def test_an_unusable_run_directory_is_one_line(cli, tmp_path, run_dir):
    (tmp_path / "a_file").write_text("not a directory")
    result = cli(*PLAN, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith("graphbridge: cannot use ")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


# --- a full disk and a kill while the result is written, through the real command -------------

# Runs inside a private mount namespace: a 4 MB tmpfs holds the run directory; once the job's files
# are written and the training process starts, a filler takes every free block, so the disk is full
# when the finished run writes result.json. Prints what happened as JSON (the mount dies with it).
FULL_DISK_RUN = textwrap.dedent("""
    import json, os, subprocess, sys, time
    disk, command = sys.argv[1], sys.argv[2:]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk], check=True)
    run = subprocess.Popen(command, cwd=disk, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not os.path.exists(os.path.join(disk, "run", "job.json")) and run.poll() is None:
        time.sleep(0.02)
    with open(os.path.join(disk, "filler"), "wb", buffering=0) as filler:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    filler.write(bytes(size))
            except OSError:
                pass
    out, err = run.communicate(timeout=600)
    run_dir = os.path.join(disk, "run")
    files = {name: open(os.path.join(run_dir, name), errors="replace").read()
             for name in os.listdir(run_dir) if os.path.isfile(os.path.join(run_dir, name))}
    print(json.dumps({"code": run.returncode, "stdout": out, "stderr": err, "files": files}))
""")


@pytest.fixture(scope="module")
def private_mounts():
    """The command that runs a process in a private mount namespace (where it may mount a tmpfs)."""
    for command in (["unshare", "--mount", "--propagation", "private"], ["unshare", "--user", "--map-root-user",
                                                                         "--mount"]):
        try:
            if subprocess.run([*command, "true"], capture_output=True, timeout=30).returncode == 0:
                return command
        except OSError:
            break
    pytest.skip("no mount namespace here (unshare is missing or user namespaces are off): no small disk to fill")


def test_a_disk_that_fills_during_training_is_one_line_and_loses_no_file(cli, private_mounts, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    done = subprocess.run([*private_mounts, sys.executable, "-c", FULL_DISK_RUN, str(disk), *cli.argv,
                           "engine=torch", *TINY_RUN, "hydra.run.dir=run"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    output = run["stdout"] + run["stderr"]
    assert run["code"] == 1 and "Traceback" not in output, output
    result = disk / "run" / "result.json"
    # The training process and the launcher each say it in one line; the result is lost, nothing else.
    assert f"ERROR cannot write {result}: No space left on device (the result of this run is lost" in run["stderr"]
    assert f"[perf.launch][ERROR] - cannot write {result}: No space left on device" in run["stdout"]
    # TensorBoard's scalars (perf.tensorboard, on by default) stop with one line of their own.
    assert "perf.tensorboard: cannot write" in run["stderr"] and "No space left on device" in run["stderr"]
    assert "result.json" not in run["files"] and not [name for name in run["files"] if name.endswith(".tmp")]
    assert json.loads(run["files"]["job.json"])["overrides"] and "model:" in run["files"]["resolved.yaml"]


# The training process stops for good inside the write of result.json (before the rename), where the
# test kills it: the fault the atomic write exists for. Only the first result.json write stalls.
STALL_IN_RESULT_WRITE = textwrap.dedent("""
    import os, time
    fsync = os.fsync

    def stalling_fsync(fd):
        marker = os.environ["GRAPHBRIDGE_TEST_STALLED"]
        if ".result.json." in os.readlink(f"/proc/self/fd/{fd}") and not os.path.exists(marker):
            with open(marker, "w") as note:
                note.write(str(os.getpid()))
            time.sleep(3600)
        fsync(fd)

    os.fsync = stalling_fsync
""")


def test_a_training_process_killed_while_writing_its_result_leaves_no_partial_one(cli, tmp_path, read_result):
    hook, stalled, run_dir = tmp_path / "hook", tmp_path / "stalled", tmp_path / "run"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(STALL_IN_RESULT_WRITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")]),
           "GRAPHBRIDGE_TEST_STALLED": str(stalled)}
    process = cli.start("engine=torch", *TINY_RUN, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: stalled.exists() and stalled.read_text(), process)
        os.kill(int(stalled.read_text()), signal.SIGKILL)
        out, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 137 and "Traceback" not in out + err, err
    # What the launcher stands in with is whole; the half-written file never took result.json's name.
    assert read_result(run_dir) == {"status": "failed", "reason": "training process ended by SIGKILL before "
                                    "writing result.json", "job": json.loads((run_dir / "job.json").read_text())}


# --- atomic results ---------------------------------------------------------------------------


def test_a_failed_write_is_one_line_and_keeps_the_earlier_result(tmp_path, monkeypatch):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"status": "completed"})

    def disk_full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(WriteError) as error:
        write_json_atomic(path, {"status": "failed"})
    assert str(error.value) == f"cannot write {path}: No space left on device"
    assert json.loads(path.read_text()) == {"status": "completed"} and listing(tmp_path) == ["result.json"]


def test_a_directory_in_the_way_is_one_line(tmp_path):
    (tmp_path / "result.json").mkdir()
    with pytest.raises(WriteError, match=r"cannot write .*result.json: Is a directory"):
        write_text_atomic(tmp_path / "result.json", "{}")
    assert listing(tmp_path) == ["result.json"]


def test_a_writer_killed_mid_write_leaves_the_earlier_result_whole(tmp_path):
    path = tmp_path / "result.json"
    write_json_atomic(path, {"status": "completed", "steps": 50})
    writer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys
        import bridge.atomic as atomic
        def stall(fd):
            print("writing", flush=True); sys.stdin.read()
        atomic.os.fsync = stall
        atomic.write_json_atomic({str(path)!r}, {{"status": "partial" * 100000}})""")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "writing"
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    assert json.loads(path.read_text()) == {"status": "completed", "steps": 50}


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_results_honour_the_umask(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "result.json", "{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "result.json").stat().st_mode & 0o777 == mode


def test_a_result_that_cannot_be_written_ends_the_training_process_in_one_line(small_config, write_job, tmp_path,
                                                                                 monkeypatch, caplog):
    from bridge import run

    job_dir = write_job(tmp_path, small_config())
    (job_dir / "result.json").mkdir()  # in the way of the result
    assert run.main([str(job_dir)]) == run.FAILED
    errors = [record.getMessage() for record in caplog.records if record.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith(f"cannot write {job_dir / 'result.json'}: Is a directory")
