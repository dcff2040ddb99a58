#!/usr/bin/env bash
# Focused GPU run of some cgt.torch tests: configure (RelWithDebInfo, Torch + CUDA), build the
# cgt.torch tests only, run the tests a Catch2 spec picks. Logs in $OUT (or build-gpu/logs).
#   bash .carry/on-device.sh scripts/gpu-torch-tests.sh "[buckets]"
#   bash .carry/on-device.sh scripts/gpu-torch-tests.sh "[autograd],torch/check_rng"
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
spec="${1:?usage: gpu-torch-tests.sh <Catch2 test spec>}"
logs="${OUT:-build-gpu/logs}"
mkdir -p "$logs"
start=$SECONDS
gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=OFF || exit 1
cmake --build build-gpu -j "$jobs" --target cgt_torch_tests >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
echo "configure + build: $((SECONDS - start)) s"
build-gpu/tests/cgt_torch_tests "$spec" --durations yes >"$logs/tests.log" 2>&1
rc=$?
grep -vE "^\s*$" "$logs/tests.log" | tail -150
exit $rc
