#!/usr/bin/env bash
# Focused GPU run for batch buckets and training modes: builds cgt_torch_tests,
# cgt_torch_training_tests and cgt_host_tests (RelWithDebInfo, Torch + CUDA), runs the [buckets]
# and [training] tests of cgt.torch (among them the pad values an integer input cannot hold) and
# the host tests of the same tags, and prints a summary last. Logs in $OUT (default
# build-gpu/buckets-edges). From the project root:
#   bash .carry/on-device.sh scripts/gpu-buckets-edges.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/buckets-edges}"
mkdir -p "$logs"
summary=()
note() { summary+=("$1"); }
result() { grep -E '^test cases|All tests passed' "$1" | tail -1; }

start=$SECONDS
gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=OFF || exit 1
cmake --build build-gpu -j 16 --target cgt_torch_tests cgt_torch_training_tests cgt_host_tests \
  >"$logs/build.log" 2>&1 || { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
note "configure + build: $((SECONDS - start)) s"

run() {  # run <name> <binary> <tags>
  local started=$SECONDS
  timeout 150 "build-gpu/tests/$2" "$3" >"$logs/$1.log" 2>&1
  local rc=$?
  grep -E "FAILED|with expansion|REQUIRE|CHECK\(" -A3 "$logs/$1.log" | head -40
  note "$1 ($3): rc $rc, $(result "$logs/$1.log") ($((SECONDS - started)) s)"
}
run torch-buckets cgt_torch_tests "[buckets]"
run torch-training cgt_torch_training_tests "[training]"
run host cgt_host_tests "[buckets],[training],[options]"

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%s\n' "${summary[@]}"
