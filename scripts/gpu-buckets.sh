#!/usr/bin/env bash
# Focused GPU run for the batch buckets: configure (RelWithDebInfo, Torch + CUDA), build the
# cgt.torch tests only, run the [buckets] tests. Logs in $OUT.
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/logs}"
mkdir -p "$logs"
start=$SECONDS
gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=OFF || exit 1
cmake --build build-gpu -j 16 --target cgt_torch_tests >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
echo "configure + build: $((SECONDS - start)) s"
build-gpu/tests/cgt_torch_tests "[buckets]" --durations yes >"$logs/buckets.log" 2>&1
rc=$?
grep -vE "^\s*$" "$logs/buckets.log" | tail -150
exit $rc
