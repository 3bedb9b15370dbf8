"""What graphbridge does with the user's files, through the real command line: a run deletes only
what it created, owns its directory alone (an OS lock), never overwrites an earlier result, and
writes results atomically with the user's umask; a failed write is one line and loses nothing."""

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
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


def test_an_invalid_run_removes_only_the_directories_it_made(cli, tmp_path):
    (tmp_path / "runs" / "mine").mkdir(parents=True)
    result = cli(*INVALID, "hydra.run.dir=runs/mine/new/deeper", cwd=tmp_path)
    assert result.returncode == 2
    assert listing(tmp_path) == ["runs", "runs/mine"]


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


def test_a_run_asked_to_wait_starts_when_the_directory_is_free(cli, tmp_path):
    run_dir = tmp_path / "shared"
    run_dir.mkdir()
    lock = open(run_dir / LOCK_FILE, "w")
    fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
    threading.Timer(2.0, lock.close).start()
    started = time.monotonic()
    result = cli(*PLAN, f"hydra.run.dir={run_dir}", "hydra.callbacks.run_directory.wait=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 2.0 and "waiting for" in result.stderr


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
