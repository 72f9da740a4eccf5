#!/bin/sh
# The wheels the lent GPU machine's image lacks for benchmarks/gpu_check.py, downloaded HERE (a machine with PyPI)
# into .whl/ (git-ignored), for the image's Python 3.12. The image has jax 0.11.2 with CUDA, torch with Triton,
# flax, optax, orbax-checkpoint, transformers; it lacks ml_collections (configs/), diffusers (the torch rows) and
# fla (the delta rule against fla's chunk_kda). Then, on the device (BENCHMARKS.md, "Ready for the first lent GPU"):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
#   export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && python3 benchmarks/gpu_check.py 2>&1 | tee $OUT/gpu_check.log
#
# with .whl carried. About 8 MB.
set -eu
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .whl \
  diffusers==0.42.1 ml-collections==1.1.0 flash-linear-attention==0.6.0 fla-core==0.6.0
ls -l .whl
