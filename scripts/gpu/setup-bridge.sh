#!/usr/bin/env bash
# ON the GPU machine, from the project root, after .gpu/bin/setup.sh installed megatron-core 0.16.1 and
# Transformer Engine 2.10.0:  bash .gpu/bin/setup-bridge.sh
# Idempotent: installs whatever of .gpu/bridge-* (scripts/gpu/fetch-bridge-wheels.sh) has arrived into
# /tmp/bridge (--no-deps, no index) and, once all four have arrived, imports Bridge 0.3.1's pretraining path on megatron-core 0.16.1
# and TE 2.10.0 and names what is still missing. benchmarks/vs_bridge.py then runs with:
#   source /tmp/gpu/env.sh 0.16.1 2.10.0 && export PYTHONPATH=$PYTHONPATH:/tmp/bridge
set -uo pipefail
mkdir -p /tmp/bridge
for dir in .gpu/bridge-*; do
  [ -d "$dir" ] || continue
  [ -f "/tmp/bridge/.installed-$(basename "$dir")" ] && continue
  # pip --target skips a top-level folder that exists already, and Bridge, megatron-energon share
  # `megatron/`: install each group apart, then merge it in.
  staging=/tmp/bridge-staging/$(basename "$dir")
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$staging" "$dir"/*.whl \
    && cp -a "$staging"/. /tmp/bridge/ && rm -rf "$staging" \
    && touch "/tmp/bridge/.installed-$(basename "$dir")" && echo "installed: $(basename "$dir")"
done
groups=$(ls -d /tmp/bridge/.installed-* 2>/dev/null | wc -l)
[ "$groups" -ge 4 ] || { echo "$groups of 4 groups (core, data, pyarrow, scipy) here; carry the next"; exit 0; }
source /tmp/gpu/env.sh 0.16.1 2.10.0
PYTHONPATH=$PYTHONPATH:/tmp/bridge python3 - <<'PY'
import importlib, traceback, warnings
warnings.simplefilter("ignore")
modules = ("megatron.bridge.training.pretrain", "megatron.bridge.training.gpt_step", "megatron.bridge.training.train",
           "megatron.bridge.training.config", "megatron.bridge.recipes.llama", "megatron.bridge.recipes.qwen")
try:
    for name in modules:
        importlib.import_module(name)
    import megatron.bridge
    print("Megatron-Bridge", megatron.bridge.__version__, "imports its pretraining path here")
except ImportError as error:  # the first missing module, and which file imports it
    where = [frame for frame in traceback.extract_tb(error.__traceback__) if "/tmp/" in frame.filename][-1:]
    shown = f" (imported at {where[0].filename}:{where[0].lineno})" if where else ""
    print(f"Bridge does not import yet: {error}{shown}; carry the .gpu/bridge-* groups still missing")
PY
