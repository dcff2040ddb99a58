#!/usr/bin/env bash
# The test command: installs what is missing, builds everything, runs every test, then builds and
# runs the suite again with AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer (any
# report fails), and runs clang-tidy and clang-format checks. Prints the time of each phase.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"

phase "bootstrap (install what is missing)"
bash scripts/bootstrap.sh

phase "configure"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo

phase "build"
cmake --build build -j "$jobs"

phase "test"
ctest --test-dir build --output-on-failure -j "$jobs"

phase "sanitizer build (ASan + LSan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCGT_SANITIZE=ON -DCGT_WITH_TORCH=OFF -DCGT_WITH_CUDA=OFF \
  -DCGT_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build build-asan -j "$jobs"

phase "sanitizer test"
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="exitcode=23"
ctest --test-dir build-asan --output-on-failure -j "$jobs"

phase "static analysis (clang-tidy, clang-format)"
bash scripts/lint.sh build

print_phases
echo "all tests passed"
