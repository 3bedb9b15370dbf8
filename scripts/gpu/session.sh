#!/usr/bin/env bash
# Runs longer than one device call (at most 10 minutes), on the GPU machine after `bash .gpu/bin/setup.sh`.
# The machine goes back 30 s after the last call ends, and every job with it: keep one call in flight.
# Each job runs from a snapshot of a commit, so that the next call's copy of the working tree changes nothing
# under it. On the development machine, before the call that starts a job (carry .snap, which git ignores):
#   c=$(git rev-parse --short HEAD); mkdir -p .snap/$c && git archive HEAD | tar x -C .snap/$c
# Then, on the GPU machine:
#   bash scripts/gpu/session.sh start C NAME 'COMMAND'  # COMMAND in the snapshot of C, in the background;
#                                                      # OUT, GRAPHBRIDGE_COMMIT set; its output in NAME.log
#   bash scripts/gpu/session.sh wait SECONDS            # progress after SECONDS or when every job ended (a call
#                                                      # that keeps the machine), and what they wrote so far
#   bash scripts/gpu/session.sh collect                 # stop every job; what they wrote, as $OUT/collected.tgz.NN
# For example, both releases' differentials on nvidia-h100-x2, one GPU each:
#   bash scripts/gpu/session.sh start 6ba2ec3 differentials \
#     'bash scripts/gpu_check.sh differentials --seed 8 --count 1400 --witnesses --deadline-s 1000'
# Jobs run in their own session (setsid); collect stops them by process group, from the ids start wrote.
set -uo pipefail
state=${SESSION_STATE:-/tmp/session}  # the jobs' scripts, logs, process groups and output
mkdir -p "$state/out"

progress() {
  for record in "$state"/out/mcore-*/gpu_differential*.json; do
    [ -f "$record" ] && python3 - "$record" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))["summary"]
counts = {key: summary[key] for key in ("drawn", "accepted", "trained", "completed", "crash_after_accept")}
print(sys.argv[1].split("/")[-2], counts, f"{summary['elapsed_s']:.0f} s")
for group in summary.get("failure_classes", []):
    print(f"  {group['count']} x {group['cause'][:160]} (run {group['example']})")
PY
  done
  for log in "$state"/*.log; do [ -f "$log" ] && echo "== $(basename "$log"): $(tail -n 2 "$log" | cut -c1-300 | tr '\n' ' ')"; done
  for done in "$state"/*.done; do [ -f "$done" ] && echo "finished: $(basename "$done" .done) (exit $(cat "$done"))"; done
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
  uptime
}

finished() {  # whether every job started has ended
  for group in "$state"/*.pgid; do [ -f "${group%.pgid}.done" ] || return 1; done
}

pack() {
  # What the jobs wrote so far, as one archive in parts of 15 MiB in this call's $OUT: the device call brings
  # back 8 files of 16 MiB at most, and chose itself which loose files to leave out; a machine lost between
  # calls leaves the last call's archive. Here: cat collected.tgz.* | tar xz -C <folder>
  cp "$state"/*.log "$state/out/" 2>/dev/null
  tar czf - -C "$state/out" --exclude='*.pt' . 2>/dev/null | split -b 15M -d - "${OUT:?}/collected.tgz."
}

case ${1:-} in
  start)
    commit=${2:?commit}; name=${3:?job name}; command=${4:?command}
    # A snapshot that an earlier start of this machine copied serves later jobs: a call need not carry it again.
    if [ ! -d "$state/snap-$commit" ]; then
      [ -d ".snap/$commit" ] || { echo "no snapshot .snap/$commit: carry .snap (see this script's header)"; exit 2; }
      cp -a ".snap/$commit" "$state/snap-$commit"
    fi
    cat > "$state/$name.sh" <<JOB
cd $state/snap-$commit
export OUT=$state/out GRAPHBRIDGE_COMMIT=$commit
$command
echo \$? > $state/$name.done
JOB
    setsid nohup bash "$state/$name.sh" > "$state/$name.log" 2>&1 < /dev/null &
    echo $! > "$state/$name.pgid"
    echo "started $name at $commit"
    sleep 2
    progress
    ;;
  wait)  # until SECONDS have passed or every job has ended
    until=$((SECONDS + ${2:?seconds}))
    while [ "$SECONDS" -lt "$until" ] && ! finished; do sleep 5; done
    progress
    pack
    ;;
  collect)
    progress
    for group in "$state"/*.pgid; do [ -f "$group" ] && kill -- -"$(cat "$group")" 2>/dev/null; done
    sleep 3
    pack
    ls -l "$OUT"
    cat "$OUT"/collected.tgz.* | tar tzvf - | head -60
    ;;
  *)
    sed -n '2,16p' "$0"
    exit 2
    ;;
esac
