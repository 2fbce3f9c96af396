#!/usr/bin/env bash
# Builds tests/.flashinfer-0.7.2/libfi_topk.so: fi_topk.cu (a C entry point to flashinfer's
# radix top-k) against the headers of the flashinfer-python wheel SGLang 0.5.23 pins
# (Requires-Dist: flashinfer_python==0.7.2), for sm_90, with the pinned nvcc of the README.
# The GPU machine has neither flashinfer nor a compiler: the library is built here and
# carried (`run` carry: tests/.flashinfer-0.7.2), then named by $DDTREE_FLASHINFER_TOPK or
# `python -m ddtree bench --device cuda --uno-topk PATH`. Usage: NVCC=... bash build.sh
set -euo pipefail
VERSION=0.7.2
here=$(cd "$(dirname "$0")" && pwd)
out="$here/../.flashinfer-$VERSION"
nvcc=${NVCC:?set NVCC to the pinned nvcc (README: the kernels build)}
mkdir -p "$out"
wheel=$(ls "$out"/flashinfer_python-$VERSION-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
    python3 -m pip download -q --no-deps -d "$out" "flashinfer-python==$VERSION"
    wheel=$(ls "$out"/flashinfer_python-$VERSION-*.whl | head -1)
fi
src="$out/src"
if [ ! -d "$src/flashinfer/data/include" ]; then
    rm -rf "$src" && mkdir -p "$src"
    python3 -m zipfile -e "$wheel" "$src" >/dev/null
fi
data="$src/flashinfer/data"
lib=$(dirname "$nvcc")/../lib
# flashinfer's own JIT flags for its top-k module (jit/core.py: -O3, fast math, F16/BF16).
"$nvcc" -std=c++17 -O3 -DNDEBUG -use_fast_math -DFLASHINFER_ENABLE_F16 -DFLASHINFER_ENABLE_BF16 \
    -I "$data/include" -I "$data/cccl/cub" -I "$data/cccl/libcudacxx/include" \
    -I "$data/cccl/thrust" -gencode arch=compute_90,code=sm_90 -Xfatbin=-compress-all \
    -Xcompiler -fPIC -shared -L "$lib" -o "$out/libfi_topk.so" "$here/fi_topk.cu"
rm -rf "$src" "$wheel"  # the library is all the GPU run needs (the carry is 64 MiB)
echo "$out/libfi_topk.so"
