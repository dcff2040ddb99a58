#!/usr/bin/env bash
# Focused GPU run for the batch buckets: configure (RelWithDebInfo, Torch + CUDA), build the
# cgt.torch tests only, run the [buckets] tests. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${OUT:-build-gpu/logs}"
mkdir -p "$logs"
if torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
  export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$torch_prefix"
fi
capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' ')
export TORCH_CUDA_ARCH_LIST="$capability"
start=$SECONDS
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON \
  -DCGT_BUILD_BENCHMARKS=OFF -DCMAKE_CUDA_ARCHITECTURES="${capability/./}" >"$logs/configure.log" 2>&1 ||
  { tail -30 "$logs/configure.log"; exit 1; }
cmake --build build-gpu -j 16 --target cgt_torch_tests >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
echo "configure + build: $((SECONDS - start)) s"
build-gpu/tests/cgt_torch_tests "[buckets]" --durations yes >"$logs/buckets.log" 2>&1
rc=$?
grep -vE "^\s*$" "$logs/buckets.log" | tail -150
exit $rc
