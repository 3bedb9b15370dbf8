"""scripts/gpu/session.sh, which keeps GPU runs longer than one device call going: a job runs from its commit's
snapshot in the background, and collect stops it and brings back what it wrote."""

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

SESSION = Path(__file__).resolve().parents[1] / "scripts" / "gpu" / "session.sh"


def session(*args: str, cwd: Path, state: Path, out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SESSION_STATE": str(state), "OUT": str(out)}
    return subprocess.run(["bash", str(SESSION), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.harness
def test_a_job_runs_from_its_snapshot_and_collect_stops_it_and_returns_its_output(tmp_path):
    checkout, state, out = tmp_path / "checkout", tmp_path / "state", tmp_path / "out"
    (checkout / ".snap" / "abc1234").mkdir(parents=True)
    (checkout / ".snap" / "abc1234" / "marker").write_text("snapshot\n")
    out.mkdir()
    started = session("start", "abc1234", "demo",
                      'mkdir -p $OUT/mcore-0.16.1 && cat marker > $OUT/mcore-0.16.1/seen && echo $GRAPHBRIDGE_COMMIT; '
                      'sleep 300', cwd=checkout, state=state, out=out)
    assert started.returncode == 0, started.stderr
    group = int((state / "demo.pgid").read_text())
    os.killpg(group, 0)  # the job runs on after the call that started it

    collected = session("collect", cwd=checkout, state=state, out=out)
    assert collected.returncode == 0, collected.stderr
    assert [path.name for path in out.iterdir()] == ["collected.tgz.00"]  # one part: all it wrote is small
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(f"cat {out}/collected.tgz.* | tar xz -C {unpacked}", shell=True, check=True)
    assert (unpacked / "mcore-0.16.1" / "seen").read_text() == "snapshot\n"
    assert (unpacked / "demo.log").read_text().startswith("abc1234")
    try:
        os.killpg(group, signal.SIGKILL)
        stopped = False
    except ProcessLookupError:
        stopped = True
    assert stopped, "collect left the job running"


def test_a_job_without_its_snapshot_is_refused_with_the_fix(tmp_path):
    refused = session("start", "abc1234", "demo", "true", cwd=tmp_path, state=tmp_path / "state", out=tmp_path)
    assert refused.returncode == 2
    assert "carry .snap" in refused.stdout


@pytest.mark.harness
def test_a_later_job_of_the_same_commit_runs_from_the_snapshot_already_here(tmp_path):
    checkout, state, out = tmp_path / "checkout", tmp_path / "state", tmp_path / "out"
    (checkout / ".snap" / "abc1234").mkdir(parents=True)
    out.mkdir()
    assert session("start", "abc1234", "first", "true", cwd=checkout, state=state, out=out).returncode == 0
    (checkout / ".snap" / "abc1234").rmdir()  # the next call carried no .snap
    later = session("start", "abc1234", "later", "echo ran > $OUT/later", cwd=checkout, state=state, out=out)
    assert later.returncode == 0, later.stdout
    session("wait", "20", cwd=checkout, state=state, out=out)
    assert (state / "out" / "later").read_text() == "ran\n"  # the jobs' OUT


def test_wait_ends_with_the_jobs_and_brings_back_what_they_wrote(tmp_path):
    checkout, state, out = tmp_path / "checkout", tmp_path / "state", tmp_path / "out"
    (checkout / ".snap" / "abc1234").mkdir(parents=True)
    out.mkdir()
    session("start", "abc1234", "short", "mkdir -p $OUT/mcore-0.19.2 && echo 42 > $OUT/mcore-0.19.2/record.json",
            cwd=checkout, state=state, out=out)
    started = time.monotonic()
    waited = session("wait", "50", cwd=checkout, state=state, out=out)
    assert waited.returncode == 0 and "finished: short (exit 0)" in waited.stdout
    assert time.monotonic() - started < 30  # not the whole 50 s: the job had ended
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    subprocess.run(f"cat {out}/collected.tgz.* | tar xz -C {unpacked}", shell=True, check=True)
    assert (unpacked / "mcore-0.19.2" / "record.json").read_text() == "42\n"
