#!/usr/bin/env bash
# Focused GPU run for decoding with a static KV cache: builds the decode tests and example, runs
# them, and the cgt.torch tests (TORCH_TESTS: a Catch2 spec, by default all but the long ones). Logs in $OUT (or build-gpu/decode).
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/decode}"
mkdir -p "$logs"
start=$SECONDS
gpu_configure build-gpu "$logs/configure.log" || exit 1
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
