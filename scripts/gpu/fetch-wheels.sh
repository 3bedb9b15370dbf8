#!/usr/bin/env bash
# On the development machine, from the project root: fill .gpu/ (git-ignored) with what the GPU
# machine lacks to run graphbridge on each supported megatron-core release, as cp312 wheels.
#
#   bash scripts/gpu/fetch-wheels.sh                 # megatron-core 0.16.1 and 0.19.2, TE 2.10.0
#   bash scripts/gpu/fetch-wheels.sh 2.10.0 2.20.2   # and TE 2.20.2 (its extension is built there)
#
#   .gpu/base             hydra-core, omegaconf, antlr4 (built here), pydantic & co. (TE's), einops (Megatron-FSDP)
#   .gpu/mcore-<v>        one megatron-core release (2.4 MB for 0.19.2; it needs only torch, numpy,
#                         packaging and triton, which the GPU image has)
#   .gpu/te-<v>           Transformer Engine's Python package, and its PyTorch extension: the wheel
#                         built on an H100 where ../shared/gpu/wheels has one, else the source tree
#                         that scripts/gpu/build-te.sh builds there
#   .gpu/te-<v>-core      TE's core library wheel (~180 MB) in parts of 16 MiB, and MANIFEST
#   .gpu/bin              setup.sh and build-te.sh (scripts/gpu/)
# Each device call carries at most 64 MiB: see scripts/gpu/README.md for the order of the calls.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
cd "$root"
shared_wheels="$root/../shared/gpu/wheels"
megatron_core=(0.16.1 0.19.2)
transformer_engine=("${@:-2.10.0}")
mkdir -p .gpu/base .gpu/bin
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
dl() { python3 -m pip download -q --no-deps "${plat[@]}" -d "$1" "${@:2}"; }

dl .gpu/base hydra-core==1.3.2 omegaconf==2.3.0 pydantic==2.14.3 pydantic-core==2.50.4 einops==0.8.2 \
   annotated-types==0.8.0 typing-inspection==0.4.5
# antlr4 4.9.3 (omegaconf's parser runtime) ships only as a source archive: make a wheel.
if ! ls .gpu/base/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" antlr4-python3-runtime==4.9.3
  python3 -m pip wheel -q --no-deps -w .gpu/base "$tmp"/antlr4*
  rm -rf "$tmp"
fi

for v in "${megatron_core[@]}"; do
  mkdir -p ".gpu/mcore-$v" && dl ".gpu/mcore-$v" "megatron-core==$v"
done

for v in "${transformer_engine[@]}"; do
  mkdir -p ".gpu/te-$v" ".gpu/te-$v-core"
  dl ".gpu/te-$v" "transformer-engine==$v"
  if ls "$shared_wheels"/transformer_engine_torch-"$v"-*.whl >/dev/null 2>&1; then
    cp "$shared_wheels"/transformer_engine_torch-"$v"-*.whl ".gpu/te-$v/"
  elif [ ! -f ".gpu/te-$v/transformer_engine_torch-$v.tar.gz" ]; then
    # The extension exists only as a source archive, whose metadata step needs a CUDA build of
    # PyTorch; pip fails there here, so keep the tree it unpacked (--no-clean) and pack that.
    tmp=$(mktemp -d)
    TMPDIR="$tmp" python3 -m pip download -q --no-clean --no-deps --no-build-isolation \
      --no-binary transformer-engine-torch -d "$tmp/dl" "transformer-engine-torch==$v" >/dev/null 2>&1 || true
    src=$(ls -d "$tmp"/pip-download-*/transformer-engine-torch_* | head -1)
    tar czf ".gpu/te-$v/transformer_engine_torch-$v.tar.gz" -C "$src" --transform "s,^\.,transformer_engine_torch-$v," .
    rm -rf "$tmp"
  fi
  if [ ! -f ".gpu/te-$v-core/MANIFEST" ]; then
    tmp=$(mktemp -d)
    dl "$tmp" "transformer-engine-cu13==$v"
    wheel=$(ls "$tmp"/transformer_engine_cu13-*.whl)
    (cd ".gpu/te-$v-core" && rm -f part* && split -b 8M "$wheel" part)
    printf 'wheel %s\nparts %s\nsha256 %s\n' "$(basename "$wheel")" "$(ls ".gpu/te-$v-core" | grep -c '^part')" \
      "$(sha256sum "$wheel" | cut -c1-64)" > ".gpu/te-$v-core/MANIFEST"
    rm -rf "$tmp"
  fi
done
cp "$here"/setup.sh "$here"/build-te.sh .gpu/bin/
du -sh .gpu/* | sed 's/^/ready: /'
