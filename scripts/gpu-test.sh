#!/usr/bin/env bash
# The GPU test command, for the lent GPU machine (no package registry there: installs nothing).
# Run it through the carried toolchain, from the project root:
#   bash .carry/on-device.sh scripts/gpu-test.sh
# Configures with Torch and CUDA, builds, runs every test including the [gpu] ones, runs the GPU
# tests under compute-sanitizer (memcheck with a full leak check), runs the torch example, and
# prints a table last. Logs go to $OUT (or build-gpu/logs).
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-$root/build-gpu/logs}"
mkdir -p "$logs"
build=build-gpu
rows=()
status=0
record() {  # record <name> <rc> <seconds> <detail>
  local verdict=ok
  [ "$2" -eq 0 ] || { verdict="FAILED (rc $2)"; status=1; }
  rows+=("$(printf '%-34s %-16s %6ss  %s' "$1" "$verdict" "$3" "$4")")
}
timed() {  # timed <name> <log> <command...>: runs, logs, records
  local name="$1" log="$2"
  shift 2
  local start=$SECONDS
  "$@" >"$logs/$log" 2>&1
  local rc=$?
  record "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$logs/$log" | cut -c1-90)"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
timed "configure (torch + cuda)" configure.log \
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON || { printf '%s\n' "${rows[@]}"; exit 1; }
timed "build" build.log cmake --build "$build" -j "$jobs" || { tail -40 "$logs/build.log"; printf '%s\n' "${rows[@]}"; exit 1; }
timed "ctest (host + gpu)" ctest.log ctest --test-dir "$build" --output-on-failure -j 8 --timeout 300
grep -E "tests passed|tests failed|Not Run|Failed|\*\*\*" "$logs/ctest.log" | tail -20
skipped=$(grep -c "Skipped" "$logs/ctest.log" || true)
rows+=("$(printf '%-34s %s' "  gpu tests skipped" "$skipped")")

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# libtorch's cuBLAS handles live as long as the process (see tests/torch/main.cpp): their
# allocations, made in one place, are recorded once and suppressed in the full run; every other
# allocation must be freed. The property test is left out (10,000 steps under memcheck are slow).
timed "cuBLAS handle leak record" cublas-handle.log "$sanitizer" --tool memcheck --leak-check full --xml \
  --save "$logs/cublas-handle.xml" "$build/tests/cgt_torch_tests" --only-create-cublas-handle
grep -c "<kind>Leak" "$logs/cublas-handle.xml" | sed 's/^/  cuBLAS handle allocations recorded: /'
# A record matches by its kind and backtrace; its address differs from run to run.
sed -i '/<address>/d' "$logs/cublas-handle.xml"
timed "compute-sanitizer cgt.torch tests" memcheck.log timeout 300 "$sanitizer" --tool memcheck --leak-check full \
  --suppressions "$logs/cublas-handle.xml" --error-exitcode 9 "$build/tests/cgt_torch_tests" "~[property]"
grep -E "ERROR SUMMARY|LEAK SUMMARY|test cases|assertions" "$logs/memcheck.log" | tail -5
if [ -x "$build/tests/cgt_cuda_tests" ]; then
  timed "compute-sanitizer cgt.cuda tests" memcheck-cuda.log timeout 300 "$sanitizer" --tool memcheck --leak-check full \
    --error-exitcode 9 "$build/tests/cgt_cuda_tests" "~[property]"
  grep -E "ERROR SUMMARY|LEAK SUMMARY|test cases|assertions" "$logs/memcheck-cuda.log" | tail -5
fi

if [ -x "$build/examples/torch_decoder" ]; then
  timed "example torch_decoder" decoder.log bash -c "cd '$logs' && '$root/$build/examples/torch_decoder'"
  cat "$logs/decoder.log"
fi

echo
printf '%-34s %-16s %7s  %s\n' "phase" "result" "time" "last line"
printf '%s\n' "${rows[@]}"
exit $status
