#!/usr/bin/env bash
# On the GPU machine, after `bash .gpu/bin/setup.sh` (see ../shared/gpu/README.md):
#   bash scripts/gpu_check.sh tests      # every gpu-marked test that needs one GPU
#   bash scripts/gpu_check.sh sweep      # the dense-scope sweep (profiled)
#   bash scripts/gpu_check.sh suite W... # the benchmark suite's workloads W (python benchmarks/suite.py --list)
#   bash scripts/gpu_check.sh overhead   # trainer vs minimal megatron-core loop; torch engine vs torch.compile
#   bash scripts/gpu_check.sh nan        # the in-graph NaN check's overhead
#   bash scripts/gpu_check.sh multigpu   # two GPUs: the multigpu tests
#   bash scripts/gpu_check.sh dp2        # two GPUs: the dense-scope sweep at data parallel 2
# Logs, summaries and JSON land in $OUT (the device tool brings that folder back).
set -uo pipefail
source /tmp/gpu/env.sh
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

sweep() {  # sweep DIR OVERRIDES...: a graph-scope sweep through the CLI; its summary into $out
  local dir=$1; shift
  python3 -m perf.main "$@" hydra.sweep.dir="$dir" 2>&1 | tail -25
  for name in summary.md summary.csv summary.png; do cp "$dir/$name" "$out/$(basename "$dir")_$name"; done
}

case "${1:-tests}" in
  tests)
    python3 -m pytest -m "gpu and not multigpu" tests -q -rA -p no:cacheprovider 2>&1 | tee "$out/gpu_tests.log" | tail -70
    ;;
  sweep)
    sweep /tmp/sweep_dense sweep=dense_scopes recipe=llama/tiny perf.profile=true
    ;;
  suite)  # bash scripts/gpu_check.sh suite <workload>...: the benchmark suite's JSON into $out
    shift
    python3 benchmarks/suite.py "$@" --out "$out" 2>&1 | grep -v "step/s\|it/s" | tail -40
    ;;
  overhead)
    timeout 360 python3 benchmarks/minimal_megatron_loop.py --rounds 3 --profile-dir /tmp/profiles 2>&1 | tee "$out/minimal_loop.log" | tail -12
    tar czf "$out/profiles.tgz" -C /tmp profiles
    python3 benchmarks/compare.py --set torch_engine --rounds 2 --json "$out/torch_engine.json" 2>&1 | tee "$out/torch_engine.log" | tail -12
    ;;
  nan)
    python3 benchmarks/nan_check_overhead.py 2>&1 | tee "$out/nan_check.log" | tail -8
    ;;
  multigpu)
    python3 -m pytest -m multigpu tests -q -rA -p no:cacheprovider 2>&1 | tee "$out/multigpu_tests.log" | tail -40
    ;;
  dp2)
    sweep /tmp/sweep_dp2 sweep=dense_scopes recipe=llama/tiny train.num_gpus=2 train.global_batch_size=4
    ;;
esac
