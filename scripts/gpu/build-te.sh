#!/usr/bin/env bash
# ON the GPU machine, after setup.sh installed Transformer Engine <v>'s core library and Python package:
#   bash .gpu/bin/build-te.sh 2.20.2
# builds TE's PyTorch extension from its source archive against this machine's PyTorch and CUDA
# (the 2.10.0 one took 1 m 41 s on an H100 with MAX_JOBS=16), installs it into /tmp/te/<v>, and
# copies the wheel to $OUT: keep it in ../shared/gpu/wheels and fetch-wheels.sh carries it instead.
# If the build fails on NCCL EP (TE >= 2.18 wants NCCL >= 2.30.7), run it again with NVTE_WITH_NCCL_EP=0.
set -euo pipefail
v=${1:?Transformer Engine version, e.g. 2.20.2}
src=/tmp/gpu/te-$v/transformer_engine_torch-$v.tar.gz
[ -f "$src" ] || { echo "no source archive at $src: run setup.sh with .gpu/te-$v carried"; exit 2; }
[ -d "/tmp/te/$v/transformer_engine" ] || { echo "Transformer Engine $v's core is not installed yet: setup.sh"; exit 2; }
mkdir -p /tmp/gpu/build /tmp/gpu/wheels
tar xzf "$src" -C /tmp/gpu/build
export PYTHONPATH=/tmp/te/$v:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
start=$(date +%s)
MAX_JOBS=${MAX_JOBS:-16} NVTE_FRAMEWORK=pytorch python3 -m pip wheel -q --no-build-isolation --no-deps --no-index \
  -w /tmp/gpu/wheels "/tmp/gpu/build/transformer_engine_torch-$v"
echo "built the PyTorch extension of Transformer Engine $v in $(( $(date +%s) - start )) s"
python3 -m zipfile -e /tmp/gpu/wheels/transformer_engine_torch-"$v"-*.whl "/tmp/te/$v/"
mkdir -p "${OUT:-/tmp/gpu-out}" && cp /tmp/gpu/wheels/transformer_engine_torch-"$v"-*.whl "${OUT:-/tmp/gpu-out}/"
python3 -c "import transformer_engine.pytorch as te, transformer_engine; print('ok', transformer_engine.__version__)"
