#!/usr/bin/env bash
# On the GPU machine, after `bash .gpu/bin/setup.sh` (scripts/gpu/README.md), with the megatron-core and
# Transformer Engine releases to run on (default 0.16.1 and 2.10.0; TE= for none):
#   MCORE=0.19.2 TE=2.10.0 bash scripts/gpu_check.sh tests
#   MCORE=0.19.2 TE= bash scripts/gpu_check.sh fixture   # the release's fixture regenerated here (without TE,
#                                        # as CI records it) and compared with tests/fixtures/; the new one in $out
#   bash scripts/gpu_check.sh tests      # every gpu-marked test that needs one GPU (or: tests <paths>)
#   bash scripts/gpu_check.sh sweep      # the dense-scope sweep (profiled)
#   bash scripts/gpu_check.sh suite W... # the benchmark suite's workloads W (python benchmarks/suite.py --list)
#   bash scripts/gpu_check.sh workloads  # issue 83's workloads record (benchmarks/workloads.py)
#   bash scripts/gpu_check.sh host_noise W [ARGS] # workload W's eager step over fresh processes, unbound and bound
#                                        # to the GPU's own CPUs (benchmarks/host_noise.py)
#   bash scripts/gpu_check.sh auto [OVERRIDES] # cuda_graph=auto's probe from an empty cache (default llama/tiny)
#   bash scripts/gpu_check.sh differential [ARGS] # plan equals run: benchmarks/gpu_differential.py ARGS
#   bash scripts/gpu_check.sh differential2 [ARGS] # the same at two GPUs a configuration (*_2gpu files)
#   bash scripts/gpu_check.sh differential4 [ARGS] # four GPUs a configuration, mostly two parallelisms (*_4gpu)
#   bash scripts/gpu_check.sh differentials2 [ARGS] # both releases at two GPUs each, on four GPUs
#   bash scripts/gpu_check.sh witnesses LABEL...  # witness cases beside their eager twins (witnesses2: two GPUs a case)
#   bash scripts/gpu_check.sh differentials [ARGS] # two GPUs: 0.16.1 on GPU 0 and 0.19.2 on GPU 1 at once (TE 2.10.0),
#                                        # each with half the cores (nvidia-h100-x2: both releases in one session)
#   bash scripts/gpu_check.sh launchers2 LABEL... # witness cases by fresh processes and the preloaded launcher at once
#                                        # (launchers: a GPU each; launchers2: a pair each, or one pair shared on
#                                        # two GPUs); exit 1 unless the preloaded one trains them the same
#   bash scripts/gpu_check.sh equivalence [ARGS]  # graphed training against eager: benchmarks/equivalence.py ARGS
#                                        # (before tests: the loss tests read its rounding-only gap)
#   bash scripts/gpu_check.sh overhead   # trainer vs minimal megatron-core loop; torch engine vs torch.compile
#   bash scripts/gpu_check.sh nan        # the in-graph NaN check's overhead
#   bash scripts/gpu_check.sh memory [CASES] # the plan's memory estimate against peak reserved memory
#                                        # (benchmarks/memory_accuracy.py: memory_accuracy.json)
#   bash scripts/gpu_check.sh holders NAME OVERRIDES... # what the allocator holds at a graph's capture
#                                        # (benchmarks/capture_holders.py: holders_NAME.json)
#   bash scripts/gpu_check.sh multigpu [ARGS] # two or four GPUs: the multigpu tests (four-rank cases skip on two)
#   bash scripts/gpu_check.sh dp2        # two GPUs: the dense-scope sweep at data parallel 2
# Logs, summaries and JSON land in $OUT/mcore-<release> (the device tool brings that folder back);
# benchmarks/results/<gpu>/mcore-<release>/ keeps them.
set -uo pipefail
mcore=${MCORE:-0.16.1}
# GPU_ENV: what sets the releases up (setup.sh writes /tmp/gpu/env.sh; the CPU tests give a stand-in)
source "${GPU_ENV:-/tmp/gpu/env.sh}" "$mcore" "${TE-2.10.0}"
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpu-out}/mcore-$mcore
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "from bridge.machine import host_cpu; print('host:', host_cpu())" | tee -a "$out/gpu.txt"

commit() {  # what the logs name: the snapshot session.sh runs, else this tree's HEAD
  echo "${GRAPHBRIDGE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
}

sweep() {  # sweep DIR OVERRIDES...: a graph-scope sweep through the CLI; its summary into $out
  local dir=$1; shift
  python3 -m perf.main "$@" hydra.sweep.dir="$dir" 2>&1 | tail -25
  for name in summary.md summary.csv summary.png; do cp "$dir/$name" "$out/$(basename "$dir")_$name"; done
}

python3 -W ignore -c "import megatron.core as m; print('megatron-core', m.__version__)" | tee -a "$out/gpu.txt"
python3 -W ignore -c "import transformer_engine as te; print('transformer-engine', te.__version__)" 2>/dev/null \
  | tee -a "$out/gpu.txt"

case "${1:-tests}" in
  fixture)
    if python3 -W ignore scripts/megatron_fixture.py --check >"$out/fixture.log" 2>&1; then
      echo "tests/fixtures/megatron_core_$mcore.json: recorded here the same" | tee -a "$out/fixture.log"
    else
      tail -3 "$out/fixture.log"
    fi
    python3 -W ignore scripts/megatron_fixture.py >/dev/null 2>&1
    cp tests/fixtures/megatron_core_"$mcore".json "$out/"
    ;;
  tests)
    targets=("${@:2}")
    { echo "commit $(commit) with megatron-core $mcore, TE ${TE-2.10.0}"
      python3 -m pytest -o addopts= -m "gpu and not multigpu" "${targets[@]:-tests}" -q -rA --durations=15 \
        -p no:cacheprovider 2>&1; } \
      | tee "$out/gpu_tests.log" | tail -70
    ;;
  host_noise)  # WORKLOAD [ARGS]: a variant's step time over fresh processes, unbound and bound to the GPU's CPUs
    shift
    python3 benchmarks/host_noise.py "$@" --out "$out/host_noise_$1.json" 2>&1 | tee "$out/host_noise_$1.log" | tail -12
    ;;
  sweep)
    sweep /tmp/sweep_dense sweep=dense_scopes recipe=llama/tiny perf.profile=true
    ;;
  suite)  # bash scripts/gpu_check.sh suite <workload>...: the benchmark suite's JSON into $out
    shift
    python3 benchmarks/suite.py "$@" --out "$out" 2>&1 | grep -v "step/s\|it/s" | tail -40
    ;;
  workloads)  # issue 83's record: LoRA, packed SFT and 70B LoRA eager and graphed, into $out/workloads.json
    shift
    python3 benchmarks/workloads.py --out "$out" "$@" 2>&1 | grep -v "step/s\|it/s" | tee "$out/workloads.log" | tail -20
    ;;
  auto)  # [OVERRIDES] (default recipe=llama/tiny): cuda_graph=auto from an empty decision cache, so that it probes;
    # its run directory (each probe run's log and result, result.json with the auto record) into $out/auto_<time>,
    # and beside it, as flat files the device call brings back (it leaves deep folders out), the run's
    # result.json as auto_<time>.json and what this prints as auto_<time>.log
    shift
    dir="$out/auto_$(date +%H%M%S)"
    {
      XDG_CACHE_HOME="$dir.cache" python3 -m perf.main cuda_graph=auto "${@:-recipe=llama/tiny}" hydra.run.dir="$dir" \
        2>&1 | grep -v "step/s\|it/s" | tail -25
      rm -rf "$dir.cache"
      cp "$dir/result.json" "$dir.json"
      python3 - "$dir.json" <<'PY'
import json, sys
auto = json.load(open(sys.argv[1]))["auto"]
probe = auto.get("probe") or {}
print(f"auto chose {auto['chosen']} ({auto['source']}): probe {probe.get('wall_s')} s, of which imports "
      f"{probe.get('imports_s')} s; rounds {probe.get('rounds')}")
for run in auto["candidates"]:
    print(f"  {run['choice']:<36} {run['status']:<14} median {run['median_ms']} ms, run {run.get('wall_s')} s")
PY
    } | tee "$dir.log"
    ;;
  differential|differential2|differential4)  # the GPU differential's JSON (rewritten after every run), its log and
    # the GPUs' load; differentialN trains each configuration on N GPUs (*_Ngpu files)
    gpus=${1#differential}; suffix=${gpus:+_${gpus}gpu}
    shift
    [ -n "$suffix" ] && set -- --gpus "$gpus" "$@"
    nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv -l 5 >"$out/gpu_load$suffix.csv" &
    python3 benchmarks/gpu_differential.py --out "$out/gpu_differential$suffix.json" "$@" 2>&1 \
      | tee "$out/gpu_differential$suffix.log" | tail -40
    kill %1
    ;;
  witnesses|witnesses2)  # LABEL... [ARGS]: witness cases alone (a GPU, or two a case), each graphed one beside its
    # eager twin: whether a case that completes with its rule unasked trains the same (gpu_witnesses[_2gpu].json)
    gpus=${1#witnesses}; suffix=${gpus:+_${gpus}gpu}
    shift
    python3 benchmarks/gpu_differential.py --gpus "${gpus:-1}" --count 0 --witness-twins --launcher preloaded \
      --out "$out/gpu_witnesses$suffix.json" --witnesses "$@" 2>&1 | tee "$out/gpu_witnesses$suffix.log" | tail -20
    ;;
  differentials|differentials2)  # a differential a release, side by side on GPUs of their own, rendezvous ports apart
    # (both ranges below 32768, where Linux's ephemeral ports begin: gpu_differential.py refuses a range that reaches them)
    # differentials: GPU 0 and GPU 1 (nvidia-h100-x2); differentials2: GPUs 0,1 and 2,3 (nvidia-h100-x4)
    mode=${1/differentials/differential}; shift  # differentials2 -> differential2
    per_run=1; [ "$mode" = differential2 ] && per_run=2
    workers=$(( $(nproc) / 2 / per_run ))
    devices=(0 1); [ "$per_run" = 2 ] && devices=(0,1 2,3)
    CUDA_VISIBLE_DEVICES=${devices[0]} MCORE=0.16.1 bash "$0" "$mode" --workers "$workers" --port-base 20000 "$@" \
      > "$out/${mode}s_0.16.1.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=${devices[1]} MCORE=0.19.2 bash "$0" "$mode" --workers "$workers" --port-base 26000 "$@" \
      > "$out/${mode}s_0.19.2.log" 2>&1 &
    wait
    tail -n 3 "$out"/${mode}s_*.log
    ;;
  launchers|launchers2)  # LABEL... [ARGS]: witness cases trained by both launchers at once, each on GPUs of its own
    # (launchers: GPU 0 and GPU 1; launchers2: pairs 0,1 and 2,3, or both on 0,1 where there are two GPUs: at once,
    # so that each meets the other's load); exits 1 unless the preloaded one holds
    gpus=1; devices=(0 1)
    if [ "$1" = launchers2 ]; then
      gpus=2; devices=(0,1 2,3)
      [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 4 ] && devices=(0,1 0,1)
    fi
    shift
    python3 benchmarks/launchers.py --gpus "$gpus" --devices "${devices[@]}" --witnesses "$@" \
      --out "$out/launchers_${gpus}gpu.json" 2>&1 | tee "$out/launchers_${gpus}gpu.log" | tail -20
    exit "${PIPESTATUS[0]}"
    ;;
  equivalence)  # per-step losses of graphed runs beside their eager twins' into $out/equivalence.json, and the log
    shift
    python3 benchmarks/equivalence.py --out "$out/equivalence.json" "$@" 2>&1 | tee "$out/equivalence.log" | tail -60
    # The GPU loss tests take their tolerance from the committed record of this GPU and release: this one, from now
    # on in this tree (run equivalence before tests; commit the record from $out).
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'gb?[0-9]00|[ahb][0-9]00' | head -1 \
      | tr 'A-Z' 'a-z')
    [ -n "$gpu" ] && mkdir -p "benchmarks/results/$gpu/mcore-$mcore" && cp "$out/equivalence.json" "benchmarks/results/$gpu/mcore-$mcore/"
    ;;
  overhead)
    timeout 360 python3 benchmarks/minimal_megatron_loop.py --rounds 3 --profile-dir /tmp/profiles 2>&1 | tee "$out/minimal_loop.log" | tail -12
    tar czf "$out/profiles.tgz" -C /tmp profiles
    python3 benchmarks/compare.py --set torch_engine --rounds 2 --json "$out/torch_engine.json" 2>&1 | tee "$out/torch_engine.log" | tail -12
    ;;
  memory)
    shift
    python3 benchmarks/memory_accuracy.py --out "$out/memory_accuracy.json" "$@" 2>&1 | tee "$out/memory_accuracy.log" \
      | tail -30
    ;;
  holders)
    name=$2; shift 2
    python3 benchmarks/capture_holders.py --out "$out/holders_$name.json" "$@" 2>&1 | grep -v "step/s\|it/s" \
      | tee "$out/holders_$name.log" | tail -12
    ;;
  nan)
    python3 benchmarks/nan_check_overhead.py 2>&1 | tee "$out/nan_check.log" | tail -8
    ;;
  multigpu)  # [PYTEST ARGS]; on the GPUs CUDA_VISIBLE_DEVICES leaves: multigpu_tests.log on two, _4gpu.log on four
    shift
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    log=multigpu_tests.log; [ "$gpus" -gt 2 ] && log=multigpu_tests_${gpus}gpu.log
    { echo "commit $(commit) with megatron-core $mcore, TE ${TE-2.10.0}, on $gpus GPUs"
      python3 -m pytest -o addopts= -m multigpu tests -q -rA --durations=15 -p no:cacheprovider "$@" 2>&1; } | tee "$out/$log" | tail -40
    ;;
  dp2)
    sweep /tmp/sweep_dp2 sweep=dense_scopes recipe=llama/tiny train.num_gpus=2 train.global_batch_size=4
    ;;
esac
