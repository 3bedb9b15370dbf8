"""perf.nsys through the real CLI on a GPU: the launcher starts the training process under `nsys
profile` with the cudaProfilerApi capture range, and the graphed run around the NVTX ranges and
cudaProfilerStart/Stop trains as without them. The GPU machines have no working Nsight Systems,
so a stand-in `nsys` on PATH logs its arguments and runs the program it was given; what nsys
itself records is not checked here."""

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

STAND_IN = """#!/bin/sh
# nsys profile [options] program...: log the call, skip the options, run the program.
echo "$@" > "{log}"
shift
while [ "$#" -gt 0 ]; do
  case "$1" in
    -t|-o) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec "$@"
"""


@pytest.fixture
def nsys_on_path(tmp_path):
    bin_dir, log = tmp_path / "bin", tmp_path / "nsys_args.txt"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(STAND_IN.format(log=log))
    nsys.chmod(nsys.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, log


@pytest.mark.parametrize("graphs", ["cuda_graph=full_iteration", "cuda_graph=te_attn_mlp"])
def test_a_graphed_run_under_nsys_profiles_its_window_and_times_the_rest(cli, nsys_on_path, graphs, tmp_path):
    env, log = nsys_on_path
    run_dir = tmp_path / "run"
    result = cli("recipe=llama/tiny", graphs, "perf.nsys=true", "perf.profile_start_step=6", "perf.profile_steps=2",
                 "train.train_iters=12", f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    called = log.read_text().split()
    assert called[:3] == ["profile", "--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
    assert called[called.index("-o") + 1] == str(run_dir / "profile_0")
    assert called[-3:] == ["-m", "bridge.run", str(run_dir)] and sys.executable.endswith(Path(called[-4]).name)
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "completed" and record["profiled_steps"] == [6, 7]
    assert record["graph_count"] > 0
    # Timed: every step after perf.warmup_steps (3), but the capture step and the window.
    timed = [step for step in range(3, 12) if step != record["capture_step"] and step not in (6, 7)]
    assert record["step_time_ms"]["count"] == len(timed)
