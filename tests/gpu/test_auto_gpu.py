"""cuda_graph=auto on a GPU, through the real command line: llama/tiny probes every candidate its plan lists
(the optimizer inside the full-iteration graph among them), in rounds of successive halving where that pays,
each run forked from one process that imported the training stack, the runs that fit the GPU started together
and timed one at a time; it trains with the one it chose (eager unless a candidate beat eager by more than the
probe's noise), records the probe in result.json and the run directory, and a second run of the same workload
takes the decision from the cache without probing. The probe's wall time is printed, not judged: issue 40's 60 s goal is a measurement on a
machine of its own (`gpu_check.sh auto`, docs/benchmarks.md), and this test runs beside the other release's."""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

AUTO = ("recipe=llama/tiny", "cuda_graph=auto")
PROBE_TIMEOUT_S = 900  # the probe's forked runs, each building megatron-core, then the 50-step run


def test_auto_probes_what_the_plan_lists_trains_the_winner_and_caches_it(cli, tmp_path):
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    planned = json.loads(cli("mode=plan", "plan.format=json", *AUTO, cwd=tmp_path, env=env).stdout)["auto"]
    first = cli(*AUTO, "hydra.run.dir=first", cwd=tmp_path, env=env, timeout=PROBE_TIMEOUT_S)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    result = json.loads((tmp_path / "first" / "result.json").read_text())
    auto = result["auto"]
    assert auto["source"] == "probe"
    assert sorted({c["choice"] for c in auto["candidates"]}) == sorted(set(planned["probe"]["runs"]))  # plan = run
    assert "full_iteration+optimizer_in_graph" in planned["probe"]["runs"]
    failed = [c for c in auto["candidates"] if c["status"] not in ("completed", "stopped_early")]
    assert not failed, failed  # each one is a plan-equals-run bug
    assert all(c["median_ms"] > 0 and c["spread_ms"] >= 0 for c in auto["candidates"])
    print("MEASURED probe", json.dumps(auto["probe"]))  # its rounds and runs, in the log whether it passes or not
    assert all(round_["runs_at_once"] > 1 for round_ in auto["probe"]["rounds"]), auto["probe"]  # tiny: they fit
    chosen = [c["median_ms"] for c in auto["candidates"]
              if c["choice"] == auto["chosen"] and c["status"] == "completed"]
    if auto["chosen"] != "none":  # never slower than eager, by the probe's own numbers (every run, where confirmed)
        assert sum(chosen) / len(chosen) < auto["eager_ms"] - auto["noise_ms"]
    expected = next(c for c in planned["candidates"] if c["choice"] == auto["chosen"])
    assert expected["accepted"] and result["status"] == "completed"
    assert result["effective_impl"] != "none" or auto["chosen"] == "none"
    for name in ("summary.md", "summary.png", "round1/0/train.log"):
        assert (tmp_path / "first" / "auto" / name).is_file(), name
    # the decision is logged once; the closing lines name it again, under "graphed:" (bridge.run_report)
    said = [line for line in first.stdout.splitlines() if "cuda_graph=auto chose" in line]
    assert len(said) == 2 and said[1].startswith("graphed:"), said

    second = cli(*AUTO, "hydra.run.dir=second", cwd=tmp_path, env=env, timeout=PROBE_TIMEOUT_S)
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads((tmp_path / "second" / "result.json").read_text())
    assert again["auto"]["source"] == "cache" and again["auto"]["chosen"] == auto["chosen"]
    assert again["impl"] == result["impl"] and again["modules"] == result["modules"]
    assert not (tmp_path / "second" / "auto").exists()
    assert any("from the cache, so the probe is skipped" in line for line in second.stdout.splitlines())
