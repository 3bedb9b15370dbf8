#!/usr/bin/env bash
# On the development machine, from the project root, after scripts/gpu/fetch-wheels.sh: fill .gpu/bridge-*
# (git-ignored) with Megatron-Bridge 0.3.1 and what its pretraining imports, as cp312 wheels, for
# benchmarks/vs_bridge.py. graphbridge itself never needs Bridge (pyproject's megatron-bridge extra).
#
#   bash scripts/gpu/fetch-bridge-wheels.sh
#
# Bridge 0.3.1 runs on what fetch-wheels.sh already carries (megatron-core 0.16.1, Transformer Engine
# 2.10.0, hydra-core, omegaconf, pydantic) and what the GPU image has (torch, triton, numpy, packaging,
# pyyaml, rich, tqdm). Every wheel here comes --no-deps: Bridge's declared dependencies include
# mamba-ssm, causal-conv1d, flash-linear-attention, timm, open-clip-torch, qwen-vl-utils, wandb, mlflow,
# accelerate and nemo-run, and its pretraining path imports none of them (each import is guarded). What
# it does import, unguarded, was found by importing megatron.bridge.training.{pretrain,gpt_step,train,
# config} and the llama and qwen recipes on a machine with only the GPU image's packages, adding the
# missing module each time; the versions are the ones that import was done with:
#   .gpu/bridge-core     Bridge; transformers and the hub client its model conversion imports (with
#                        requests and its TLS/charset helpers); nvidia-modelopt and pulp (the training
#                        step imports modelopt's distillation plugin); nvidia-resiliency-ext, psutil
#                        and defusedxml (pretrain.py imports its in-process restart wrapper); tensorboard
#                        with protobuf and absl-py (the training state imports torch's SummaryWriter)
#   .gpu/bridge-data     datasets (Bridge's SFT data module) with pandas, dill, multiprocess, xxhash,
#                        httpx; megatron-energon (its VLM data module) with braceexpand, webdataset and
#                        multi-storage-client, and the eleven packages multi-storage-client imports; pillow
#                        (its VLM collate): none of them runs in mock-data pretraining, all are imported
#   .gpu/bridge-pyarrow  pyarrow (datasets imports it), about 42 MB
#   .gpu/bridge-scipy    scipy (modelopt's NAS module imports it), about 35 MB
# One group a device call: each stays under the 64 MiB a call carries. nvidia-resiliency-ext 0.4.1 is
# built for glibc 2.31 (manylinux_2_31); setup-bridge.sh says so when the image's glibc is older.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(git rev-parse --show-toplevel)
cd "$root"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
dl() { mkdir -p "$1" && python3 -m pip download -q --no-deps "${plat[@]}" -d "$1" "${@:2}"; }

dl .gpu/bridge-core megatron-bridge==0.3.1 transformers==4.57.6 huggingface-hub==0.36.2 tokenizers==0.22.2 \
   safetensors==0.7.0 regex==2026.11.19 einops==0.8.2 six==1.17.0 requests==2.34.2 urllib3==2.8.0 idna==3.20 \
   certifi==2026.10.19.post1 charset-normalizer==3.5.2 nvidia-modelopt==0.43.0 pulp==3.3.2 \
   nvidia-resiliency-ext==0.4.1 psutil==7.2.2 defusedxml==0.7.1 tensorboard==2.21.0 protobuf==7.36.2 \
   absl-py==2.5.1
dl .gpu/bridge-data datasets==4.8.3 pandas==3.1.1 python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6 dill==0.4.1 \
   multiprocess==0.70.19 xxhash==4.1.0 httpx==0.28.1 megatron-energon==6.0.1 multi-storage-client==1.3.1 \
   xattr==1.3.0 cffi==2.1.1 lark==1.3.1 wcmatch==12.0.1 bracex==3.2.2 jsonschema==4.26.0 \
   jsonschema-specifications==2025.9.1 referencing==0.37.0 attrs==26.1.0 rpds-py==2026.9.1 \
   opentelemetry-api==1.45.2 braceexpand==0.1.7 webdataset==1.0.2 pillow==13.0.0
dl .gpu/bridge-pyarrow pyarrow==26.0.1
dl .gpu/bridge-scipy scipy==1.17.1
mkdir -p .gpu/bin && cp "$here"/setup-bridge.sh .gpu/bin/
du -sh .gpu/bridge-* | sed 's/^/ready: /'
