#!/usr/bin/env bash
# The test command. On a fresh Debian 12 machine it installs what is missing, obtains libtorch from
# PyPI when no CUDA-enabled Torch is installed, builds every module, test, example and benchmark
# (the torch and cuda backends too: they compile and link without a GPU), runs every test (GPU
# tests report SKIPPED without a device), builds and runs the host suite again under ASan + LSan +
# UBSan (any report fails), builds the host and core tests under TSan and runs them with the
# [threads] cases (any report fails), and runs clang-format and clang-tidy. Prints the time of each
# phase.
# The lint runs in the background from the end of the build, beside the tests and the sanitizer
# builds, whose waits (configures, links, single-threaded tests) it fills.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"

phase "bootstrap (install what is missing)"
bash scripts/bootstrap.sh

phase "libtorch"
torch_prefix=""
torch_note=""
if [ -n "${CGT_TORCH_PREFIX:-}" ]; then
  torch_prefix="$CGT_TORCH_PREFIX"
elif python3 -c 'import torch, sys; sys.exit(0 if torch.version.cuda else 1)' >/dev/null 2>&1; then
  torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  echo "using the installed PyTorch: $torch_prefix"
elif torch_prefix=$(bash scripts/fetch-libtorch.sh); then
  echo "using libtorch from PyPI: $torch_prefix"
else
  torch_prefix=""
  torch_note="libtorch could not be obtained (see the message above): cgt.torch is not built"
  echo "WARNING: $torch_note" >&2
fi

phase "configure"
# Release: the tests run optimised, as RelWithDebInfo's did, without its debug info (a fifth of
# every compile here, and much of the torch tests' links).
configure_args=(-DCMAKE_BUILD_TYPE=Release)
if [ -n "$torch_prefix" ]; then
  configure_args+=(-DCMAKE_PREFIX_PATH="$torch_prefix")
else
  configure_args+=(-DCGT_WITH_TORCH=OFF)
fi
mkdir -p build
cmake -S . -B build "${configure_args[@]}" | tee build/configure.log
backends=$(grep -E "cgt backend" build/configure.log 2>/dev/null || true)

phase "build"
cmake --build build -j "$jobs"

# It reads the build's compile commands and module files, which nothing below changes.
lint_log=build/lint.log
bash scripts/lint.sh build >"$lint_log" 2>&1 &
lint_pid=$!
trap 'kill "$lint_pid" 2>/dev/null || true' EXIT

phase "test"
ctest --test-dir build --output-on-failure -j "$jobs" | tee build/ctest.log
passed=$(grep -cE "Test +#[0-9]+: .*Passed" build/ctest.log || true)
skipped=$(grep -cE "Test +#[0-9]+: .*Skipped" build/ctest.log || true)

phase "sanitizer build (ASan + LSan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCGT_SANITIZE=ON -DCGT_WITH_TORCH=OFF -DCGT_WITH_CUDA=OFF \
  -DCGT_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-asan -j "$jobs"

phase "sanitizer test"
# allocator_may_return_null: a nothrow allocation the system refuses must return null (a test
# checks that an impossible arena segment is out_of_memory), not abort the process.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:allocator_may_return_null=1"
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
ctest --test-dir build-asan --output-on-failure -j "$jobs" | tee build-asan/ctest.log
sanitized=$(grep -cE "Test +#[0-9]+: .*Passed" build-asan/ctest.log || true)

phase "thread sanitizer build (TSan, host and core tests)"
# Handles may be dropped on any thread: the host and core tests, and the stress test's [threads]
# mode (a second thread drops leases, Outputs, Functions and Pools while the main thread calls the
# pool), run under ThreadSanitizer; any report fails.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCGT_SANITIZE_THREAD=ON -DCGT_WITH_TORCH=OFF -DCGT_WITH_CUDA=OFF \
  -DCGT_BUILD_BENCHMARKS=OFF -DCGT_BUILD_EXAMPLES=OFF >/dev/null
cmake --build build-tsan -j "$jobs" --target cgt_host_tests cgt_core_tests cgt_stress_tests

phase "thread sanitizer test"
# allocator_may_return_null: as for ASan above (an impossible arena segment is out_of_memory).
export TSAN_OPTIONS="halt_on_error=1:abort_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1"
export TSAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
ctest --test-dir build-tsan -R '^(host|core)/' --output-on-failure -j "$jobs" | tee build-tsan/ctest.log
thread_sanitized=$(grep -cE "Test +#[0-9]+: .*Passed" build-tsan/ctest.log || true)

phase "static analysis (clang-format, clang-tidy): the rest of it"
lint_status=0
wait "$lint_pid" || lint_status=$?
trap - EXIT
cat "$lint_log"
[ "$lint_status" -eq 0 ] || { echo "static analysis failed (above)" >&2; exit "$lint_status"; }

print_phases
echo "backends:"
echo "$backends" | sed 's/^-- /  /'
[ -z "$torch_note" ] || echo "  $torch_note"
echo "tests: $passed passed, $skipped skipped (GPU tests without a device); sanitizer build: $sanitized passed;"
echo "  TSan build: $thread_sanitized host and core tests passed (the [threads] ones among them)"
echo "all tests passed"
