#!/usr/bin/env bash
# Focused GPU run for cgt.torch under hostile tensors (tests/torch/test_hostile_tensors.cpp):
# builds cgt_torch_tests (RelWithDebInfo, Torch + CUDA), runs the [hostile] tests with Catch2's
# console reporter into $OUT/hostile.log (and JUnit into $OUT/hostile.xml), then the other [gpu]
# tests of cgt_torch_tests but the long ones ([property], [threads], [models]) as a regression check
# of the replay change (it rebuilds outputs whose metadata a caller changed), and prints a summary
# table last. Logs in $OUT (default build-gpu/hostile). From the project root:
#   bash .carry/on-device.sh scripts/gpu-hostile-tensors.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/hostile}"
mkdir -p "$logs"
summary=()
note() { summary+=("$1"); }
result() { grep -E '^test cases|All tests passed' "$1" | tail -1; }

start=$SECONDS
gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=OFF || exit 1
cmake --build build-gpu -j 16 --target cgt_torch_tests >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
note "configure + build: $((SECONDS - start)) s"

started=$SECONDS
timeout 150 build-gpu/tests/cgt_torch_tests "[hostile]" --reporter console::out="$logs/hostile.log" \
  --reporter junit::out="$logs/hostile.xml" >"$logs/hostile-stdout.log" 2>&1
hostile_rc=$?
note "[hostile]: rc $hostile_rc, $(result "$logs/hostile.log") ($((SECONDS - started)) s)"

started=$SECONDS
timeout 120 build-gpu/tests/cgt_torch_tests "[gpu]~[hostile]~[property]~[threads]~[models]" >"$logs/others.log" 2>&1
others_rc=$?
note "other [gpu] tests (rc 124 is a timeout): rc $others_rc, $(result "$logs/others.log") ($((SECONDS - started)) s)"

echo "---- failures of [hostile] (full log: $logs/hostile.log)"
grep -E "^torch/hostile|FAILED:|unexpected exception" -A12 "$logs/hostile.log" | head -200
echo "---- failures of the other tests (full log: $logs/others.log)"
grep -E "FAILED" -A12 "$logs/others.log" | head -60

echo
echo "== summary ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%-78s %s\n' "[hostile] test case (torch/hostile: ...)" "result"
# One row per [hostile] test case, from the JUnit report: passed, FAILED or SKIPPED.
python3 - "$logs/hostile.xml" <<'PY' 2>/dev/null || echo "(no JUnit report)"
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    state = "FAILED" if case.find("failure") is not None or case.find("error") is not None else \
            "SKIPPED" if case.find("skipped") is not None else "passed"
    name = case.get("name").removeprefix("torch/hostile: ")
    print(f"{name[:78]:<78} {state} ({float(case.get('time', 0)):.2f} s)")
PY
printf '%s\n' "${summary[@]}"
[ "$hostile_rc" -eq 0 ] && [ "$others_rc" -eq 0 ]
