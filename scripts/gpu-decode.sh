#!/usr/bin/env bash
# Focused GPU run for decoding with a static KV cache: builds the decode tests and example, runs
# them, and the cgt.torch tests (TORCH_TESTS: a Catch2 spec, by default all but the long ones). Logs in $OUT (or build-gpu/decode).
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${OUT:-build-gpu/decode}"
mkdir -p "$logs"
if torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
  export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$torch_prefix"
fi
capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' ')
export TORCH_CUDA_ARCH_LIST="$capability"
start=$SECONDS
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${capability/./}" >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
cmake --build build-gpu -j 16 --target cgt_torch_decode_tests torch_kv_decode cgt_torch_tests >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -60; exit 1; }
echo "configure + build: $((SECONDS - start)) s"
build-gpu/tests/cgt_torch_decode_tests --durations yes >"$logs/tests.log" 2>&1
rc=$?
grep -vE "^\s*$" "$logs/tests.log" | tail -30
build-gpu/tests/cgt_torch_tests "${TORCH_TESTS:-~[property]~[threads]~[models]}" >"$logs/torch-tests.log" 2>&1
echo "cgt_torch_tests rc $?: $(grep -E '^test cases|All tests passed' "$logs/torch-tests.log" | tail -1)"
grep -E "FAILED" -A4 "$logs/torch-tests.log" | head -20
build-gpu/examples/torch_kv_decode 64 >"$logs/example.log" 2>&1
echo "example rc $?"
cat "$logs/example.log"
exit $rc
