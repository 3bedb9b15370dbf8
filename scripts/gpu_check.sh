#!/usr/bin/env bash
# On the GPU machine, after `bash .gpu/bin/setup.sh` (see ../shared/gpu/README.md):
#   bash scripts/gpu_check.sh tests   # every gpu-marked test
#   bash scripts/gpu_check.sh bench   # the sweep and benchmarks behind docs/benchmarks.md
# Logs and the sweep summary land in $OUT (the device tool brings that folder back).
set -uo pipefail
source /tmp/gpu/env.sh
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
case "${1:-tests}" in
  tests)
    python3 -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -60
    ;;
  bench)
    sweep=/tmp/sweep_dense
    python3 -m perf.main sweep=dense_scopes recipe=llama/tiny hydra.sweep.dir=$sweep 2>&1 | tail -25
    cp $sweep/summary.md $sweep/summary.csv $sweep/summary.png "$out/"
    python3 benchmarks/compare.py --set torch_engine --rounds 2 --json "$out/torch_engine.json" 2>&1 | tee "$out/torch_engine.log" | tail -12
    python3 benchmarks/nan_check_overhead.py 2>&1 | tee "$out/nan_check.log" | tail -8
    ;;
esac
