#!/usr/bin/env bash
# ON the GPU machine, from the project root: bash .gpu/bin/setup.sh
# Idempotent: installs whatever of .gpu/ (scripts/gpu/fetch-wheels.sh) has arrived and says what it
# still waits for. Each release goes to its own folder, so both megatron-core releases live side by side:
#   /tmp/site          hydra-core, omegaconf, pydantic & co.
#   /tmp/mcore/<v>     megatron-core <v>
#   /tmp/te/<v>        Transformer Engine <v>: Python package, core library, PyTorch extension
# Afterwards each command there starts with:  source /tmp/gpu/env.sh <megatron-core> [<TE>]
set -uo pipefail
mkdir -p /tmp/gpu/parts /tmp/site /tmp/mcore /tmp/te
install() { local target=$1; shift; python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$target" "$@"; }
cat > /tmp/gpu/env.sh <<ENV
# source /tmp/gpu/env.sh <megatron-core version> [<Transformer Engine version>]
# The checkout is the one the command runs in: the device's copy, or a snapshot (scripts/gpu/session.sh).
export PYTHONPATH=/tmp/mcore/\${1:?megatron-core version, e.g. 0.19.2}\${2:+:/tmp/te/\$2}:/tmp/site:\$PWD
ENV

if [ -d .gpu/base ] && [ ! -d /tmp/site/hydra ]; then
  install /tmp/site .gpu/base/*.whl && echo "installed: hydra-core, omegaconf, pydantic, einops"
fi
for dir in .gpu/mcore-*; do
  [ -d "$dir" ] || continue
  v=${dir#.gpu/mcore-}
  [ -d "/tmp/mcore/$v/megatron" ] || { install "/tmp/mcore/$v" "$dir"/*.whl && echo "installed: megatron-core $v"; }
done

# Transformer Engine: its core library arrives in parts over several calls; the Python package
# and the extension (a wheel, or a source archive for build-te.sh) wait for it in /tmp/gpu/te-<v>.
for dir in .gpu/te-*; do
  [ -d "$dir" ] || continue
  case $dir in
    *-core) v=${dir#.gpu/te-}; v=${v%-core}; mkdir -p "/tmp/gpu/parts/$v"; cp "$dir"/* "/tmp/gpu/parts/$v/" ;;
    *) v=${dir#.gpu/te-}; mkdir -p "/tmp/gpu/te-$v"; cp "$dir"/* "/tmp/gpu/te-$v/" ;;
  esac
done
for parts in /tmp/gpu/parts/*; do
  [ -f "$parts/MANIFEST" ] || continue
  v=$(basename "$parts")
  [ -f "/tmp/te/$v/transformer_engine/wheel_lib/libtransformer_engine.so" ] && continue
  wheel=$(awk '$1=="wheel"{print $2}' "$parts/MANIFEST")
  want=$(awk '$1=="parts"{print $2}' "$parts/MANIFEST")
  have=$(ls "$parts" | grep -c '^part')
  if [ "$have" -lt "$want" ] || ! ls /tmp/gpu/te-"$v"/transformer_engine-"$v"-*.whl >/dev/null 2>&1; then
    echo "Transformer Engine $v: $have of $want core parts here ($(ls "$parts" | grep '^part' | tr '\n' ' ')); carry the next"
    waiting=1; continue
  fi
  cat "$parts"/part* > "/tmp/gpu/$wheel"
  if [ "$(sha256sum "/tmp/gpu/$wheel" | cut -c1-64)" != "$(awk '$1=="sha256"{print $2}' "$parts/MANIFEST")" ]; then
    echo "Transformer Engine $v: the parts do not add up (checksum); carry them again"; rm -f "$parts"/part* "/tmp/gpu/$wheel"
    continue
  fi
  install "/tmp/te/$v" "/tmp/gpu/$wheel" /tmp/gpu/te-"$v"/transformer_engine-"$v"-*.whl && rm -f "/tmp/gpu/$wheel"
  if ls /tmp/gpu/te-"$v"/transformer_engine_torch-"$v"-*.whl >/dev/null 2>&1; then
    # pip --target will not merge into an existing package folder: unpack the extension by hand.
    python3 -m zipfile -e /tmp/gpu/te-"$v"/transformer_engine_torch-"$v"-*.whl "/tmp/te/$v/"
    echo "installed: Transformer Engine $v"
  else
    echo "installed: Transformer Engine $v without its PyTorch extension: bash .gpu/bin/build-te.sh $v"
  fi
done

# Exit 3 while anything is missing, so that `setup.sh && <jobs>` starts no job on a half set-up machine: a set-up
# call that got no machine leaves the next call of its message to start a bare one.
[ -d /tmp/site/hydra ] || { echo "hydra-core & co. are not installed: carry .gpu/base"; waiting=1; }
ls -d /tmp/mcore/*/megatron >/dev/null 2>&1 || { echo "no megatron-core is installed: carry .gpu/mcore-<v>"; waiting=1; }
# The import check takes a while; it waits until nothing waits for a part.
[ -z "${waiting:-}" ] || exit 3
for mcore in /tmp/mcore/*; do
  [ -d "$mcore/megatron" ] || continue
  for te in "" /tmp/te/*; do
    [ -z "$te" ] || [ -d "$te/transformer_engine" ] || continue
    (source /tmp/gpu/env.sh "$(basename "$mcore")" ${te:+$(basename "$te")}; python3 - <<'PY'
import importlib, warnings
warnings.simplefilter("ignore")
found = []
for name in ("megatron.core", "transformer_engine.pytorch", "hydra", "omegaconf"):
    try:
        found.append(f"{name} {getattr(importlib.import_module(name), '__version__', 'ok')}")
    except Exception as error:  # report, do not fail: TE may still be on its way
        found.append(f"{name} MISSING ({type(error).__name__}: {str(error)[:60]})")
print("; ".join(found))
PY
    )
  done
done
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
