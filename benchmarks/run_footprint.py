"""What one training process costs the GPU machine besides its steps: wall time by phase, and device memory
outside PyTorch's allocator. The GPU differential's concurrency (its --workers) rests on these numbers.

    python benchmarks/run_footprint.py --out footprint.json \
        --variant default --variant one_compile_thread:TORCHINDUCTOR_COMPILE_THREADS=1 \
        -- recipe=qwen/tiny cuda_graph=te_moe train.train_iters=6

Each variant (a name and environment settings) trains the same configuration alone on the GPU, so that the
device memory in use while it runs is its own. The training process is the one the CLI starts (bridge.run on
the job directory the launcher writes), started through this file (--child), which times its imports, its
process-group set-up, the build and the steps, and sums torch.compile's time. The CLI's own share (composing,
planning, writing the job) is timed apart, as a `mode=plan` process.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from bridge.atomic import write_json_atomic  # noqa: E402
from differential_launch import GRAPHBRIDGE  # noqa: E402
from gpu_differential import environment  # noqa: E402

PHASES_FILE = "footprint_phases.json"
SAMPLE_S = 0.2


def child(job_dir: str) -> int:
    """The training process of ``job_dir`` (bridge.run) with its expensive set-up calls timed, written to
    PHASES_FILE."""
    phases: Dict[str, float] = {}
    start = time.monotonic()

    def timed(name, function):
        def wrapper(*args, **kwargs):
            began = time.monotonic()
            try:
                return function(*args, **kwargs)
            finally:
                phases[name] = phases.get(name, 0.0) + time.monotonic() - began
        return wrapper

    for name in ("torch", "transformer_engine.pytorch", "megatron.core", "bridge.run"):
        began = time.monotonic()
        __import__(name)
        phases[f"import {name}"] = time.monotonic() - began
    import torch
    from megatron.core import parallel_state

    torch.distributed.init_process_group = timed("init_process_group", torch.distributed.init_process_group)
    parallel_state.initialize_model_parallel = timed("initialize_model_parallel",
                                                     parallel_state.initialize_model_parallel)
    from bridge import run, trainer

    trainer.Trainer.__init__ = timed("trainer build", trainer.Trainer.__init__)
    trainer.Trainer.run = timed("trainer run", trainer.Trainer.run)
    try:
        return run.main([job_dir])
    finally:
        phases["torch.compile"] = compile_seconds()
        phases["process"] = time.monotonic() - start
        write_json_atomic(Path(os.environ["FOOTPRINT_DIR"], PHASES_FILE), phases)


def compile_seconds() -> float:
    from torch._dynamo.utils import compile_times

    names, values = compile_times(repr="csv", aggregate=True)
    return float(dict(zip(names, values)).get("_compile.compile_inner", 0.0))


def device_used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def descendants(pid: int) -> int:
    """How many processes ``pid`` has started that still run (torch.compile's workers among them)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = 0, [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += len(children)
        frontier = children
    return found


def measure(name: str, settings: Dict[str, str], overrides: List[str], workdir: Path) -> Dict[str, object]:
    import bridge
    from perf.launch import job_record, write_job

    run_dir = workdir / name
    env = {**os.environ, **settings, "FOOTPRINT_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"}
    began = time.monotonic()
    subprocess.run([*GRAPHBRIDGE, "mode=plan", *overrides], cwd=ROOT, env=env, capture_output=True)
    cli_s = time.monotonic() - began
    write_job(bridge.plan(overrides).config, run_dir, job_record({}, overrides))
    idle = device_used_mib()
    peaks = {"used": idle, "processes": 0}
    began = time.monotonic()
    with open(run_dir / "train.log", "w") as log:
        process = subprocess.Popen([sys.executable, __file__, "--child", str(run_dir)], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)

        def sample() -> None:
            while process.poll() is None:
                peaks["used"] = max(peaks["used"], device_used_mib())
                peaks["processes"] = max(peaks["processes"], descendants(process.pid))
                time.sleep(SAMPLE_S)

        sampler = threading.Thread(target=sample)
        sampler.start()
        process.wait()
        sampler.join()
    result_file = run_dir / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() else {}
    reserved = (result.get("memory") or {}).get("peak_reserved_gb")
    phases_file = run_dir / PHASES_FILE
    used_gib = (peaks["used"] - idle) / 1024
    return {
        "variant": name, "env": settings, "status": result.get("status", "no result"), "reason": result.get("reason"),
        "wall_s": round(time.monotonic() - began, 2), "cli_plan_s": round(cli_s, 2),
        "phases_s": {key: round(value, 2) for key, value in
                     (json.loads(phases_file.read_text()) if phases_file.exists() else {}).items()},
        "capture_time_s": result.get("capture_time_s"), "step_time_ms": result.get("step_time_ms"),
        "device_used_gib": round(used_gib, 2), "peak_reserved_gib": reserved,
        "outside_pytorch_gib": round(used_gib - reserved, 2) if reserved is not None else None,
        "processes_started": peaks["processes"],
    }


def parse_variant(text: str):
    name, _, settings = text.partition(":")
    return name, dict(item.split("=", 1) for item in settings.split(",") if item)


def main() -> int:
    if sys.argv[1:2] == ["--child"]:
        return child(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", action="append", type=parse_variant, required=True,
                        help="NAME[:KEY=VALUE,...], run in the order given")
    parser.add_argument("overrides", nargs="+")
    args = parser.parse_args()
    record = {**environment(["python", "benchmarks/run_footprint.py", *sys.argv[1:]]), "overrides": args.overrides,
              "variants": []}
    workdir = Path(tempfile.mkdtemp(prefix="run_footprint_"))
    for name, settings in args.variant:
        record["variants"].append(measure(name, settings, args.overrides, workdir))
        print(json.dumps(record["variants"][-1]), flush=True)
        write_json_atomic(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
