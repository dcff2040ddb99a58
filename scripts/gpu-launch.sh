#!/usr/bin/env bash
# Focused GPU run for launch cost against node types (issue 12, item 4): configure (RelWithDebInfo,
# Torch + CUDA, benchmarks on), build the cuda and torch tests and bench/launch_bench, run the
# [launch] tests, the benchmark, then the rest of both test suites (the rewrite is on by default:
# every graph with a memset or memcpy node goes through it). Logs in $OUT; a summary last.
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/logs}"
mkdir -p "$logs"
summary=()
note() { summary+=("$1"); echo "$1"; }
start=$SECONDS
gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=ON || exit 1
# All three at once (-j 16 overlaps them); when that fails, the tests alone.
cmake --build build-gpu -j 16 --target cgt_cuda_tests cgt_torch_tests launch_bench >"$logs/build.log" 2>&1 || {
  grep -E "error" -A5 "$logs/build.log" | head -40
  cmake --build build-gpu -j 16 --target cgt_cuda_tests cgt_torch_tests >"$logs/build-tests.log" 2>&1 ||
    { grep -E "error" -A5 "$logs/build-tests.log" | head -80; exit 1; }
}
note "configure + build: $((SECONDS - start)) s"
status=0
run() {  # run <name> <seconds> <command...>
  local name="$1" limit="$2"
  shift 2
  local begun=$SECONDS
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || status=1
  note "$(printf '%-28s rc %-3s %4ss  %s' "$name" "$rc" "$((SECONDS - begun))" "$(grep -E 'test cases|All tests' "$logs/$name.log" | tail -1)")"
}
run cuda-launch 60 build-gpu/tests/cgt_cuda_tests "[launch]"
run torch-launch 60 build-gpu/tests/cgt_torch_tests "[launch]"
grep -B2 -A12 -E "FAILED|failed" "$logs/cuda-launch.log" "$logs/torch-launch.log" | head -60
run bench 100 build-gpu/bench/launch_bench
cat "$logs/bench.log"
run cuda-all 40 build-gpu/tests/cgt_cuda_tests "~[property]~[launch]"
run torch-all 60 build-gpu/tests/cgt_torch_tests "~[property]~[launch]~[threads]"
grep -B2 -A12 -E "FAILED" "$logs/cuda-all.log" "$logs/torch-all.log" | head -60
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
run memcheck-cuda-launch 60 "$sanitizer" --tool memcheck build-gpu/tests/cgt_cuda_tests "[launch]"
tail -3 "$logs/memcheck-cuda-launch.log"
# libtorch's cuBLAS handle and workspaces live as long as the process: memory is checked, not leaks.
run memcheck-torch-launch 60 "$sanitizer" --tool memcheck build-gpu/tests/cgt_torch_tests "[launch]"
tail -3 "$logs/memcheck-torch-launch.log"
echo
printf '%s\n' "${summary[@]}"
exit $status
