#!/usr/bin/env bash
# The long run of the randomized adversarial stress test (tests/host/test_stress.cpp, executable
# cgt_stress_tests). Each seed builds host pools with random options and functions and drives them
# as a hostile user would: leases borrowed, moved into calls, dropped and reset at random, random
# steps, injected throws (std and non-std) and out-of-memory, wrong calls, shutdown() midway,
# random teardown orders; after every call every value the test holds is checked against an eager
# model (debug_checks on). CI runs a bounded version of the same test (a few seconds, seeds 1-4) in
# the normal ctest; this script runs it for minutes in three builds: plain (Debug), ASan + LSan +
# UBSan, and TSan, each single-threaded and in the [threads] mode (a second thread drops the
# leases, Outputs, Functions and Pool handles while the main thread calls the pool).
#
#   scripts/stress.sh                 # 120 s single-threaded + 60 s [threads], in each build
#   scripts/stress.sh 600             # 600 s + 300 s in each build
#   STRESS_BUILDS="plain tsan" scripts/stress.sh 60
#
# Environment (see tests/stress/config.hpp): CGT_STRESS_SEED (first seed, default 1000, so that
# the long run covers other seeds than CI's), CGT_STRESS_SEQUENCES (pools per seed, 6),
# CGT_STRESS_STEPS (actions per pool, 200), CGT_STRESS_ENABLE / CGT_STRESS_DISABLE (named moves;
# "all" enables every move, also those off by default because they hit an open library bug),
# CGT_STRESS_VERBOSE=1 (the whole action log of a failing sequence). A failing sequence is printed
# with its seed, options and last actions; re-run one seed with CGT_STRESS_SEED=N CGT_STRESS_SEEDS=1.
# Build directories: build-stress, build-stress-asan, build-stress-tsan. Prints a table of seeds,
# sequences, calls and failures per build and mode; exits non-zero on any failure or sanitizer report.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"

seconds="${1:-120}"
thread_seconds=$(( (seconds + 1) / 2 ))
builds="${STRESS_BUILDS:-plain asan tsan}"
export CGT_STRESS_SEED="${CGT_STRESS_SEED:-1000}"

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=1:allocator_may_return_null=1"
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# Keep going after a race report so that the figures still come out; the exit code says it.
export TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1:allocator_may_return_null=1"
export TSAN_SYMBOLIZER_PATH=/usr/lib/llvm-19/bin/llvm-symbolizer

table=""
status=0
for build in $builds; do
  case "$build" in
    plain) dir=build-stress flags=() ;;
    asan) dir=build-stress-asan flags=(-DCGT_SANITIZE=ON) ;;
    tsan) dir=build-stress-tsan flags=(-DCGT_SANITIZE_THREAD=ON) ;;
    *) echo "unknown build '$build' (plain, asan, tsan)" >&2; exit 2 ;;
  esac
  phase "build $build ($dir)"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Debug -DCGT_WITH_TORCH=OFF -DCGT_WITH_CUDA=OFF -DCGT_BUILD_BENCHMARKS=OFF \
    -DCGT_BUILD_EXAMPLES=OFF "${flags[@]}" >/dev/null
  cmake --build "$dir" -j "$jobs" --target cgt_stress_tests
  for mode in single threads; do
    if [ "$mode" = single ]; then
      filter="[stress]~[threads]~[repro]" secs="$seconds"
    else
      filter="[threads]" secs="$thread_seconds"
    fi
    phase "stress $build $mode (${secs}s)"
    log="$dir/stress-$mode.log"
    rc=0
    CGT_STRESS_SECONDS="$secs" "$dir/tests/cgt_stress_tests" "$filter" >"$log" 2>&1 || rc=$?
    grep -E "^stress\[|^  (call kinds|errors|calls padded up to a bucket|calls of forwards that began a step):" "$log" || true
    reports=$(grep -cE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer" "$log" || true)
    line=$(grep -E "^stress\[" "$log" | tail -1 || true)
    figures=$(echo "$line" | sed -E 's/.*seeds ([0-9]+) \(from ([0-9]+)\), sequences ([0-9]+), actions ([0-9]+), calls ([0-9]+) \(([0-9]+) succeeded\), checks ([0-9]+), failures ([0-9]+).*/\1 \2 \3 \5 \6 \7 \8/')
    if [ -z "$line" ]; then
      figures="- - - - - - crashed"
      echo "no figures: the run ended early (exit $rc); see $log" >&2
      tail -40 "$log" >&2
    fi
    if [ "$rc" -ne 0 ] || [ "$reports" -ne 0 ]; then
      status=1
      grep -m5 -E "STRESS FAILURE|ERROR: |WARNING: ThreadSanitizer|runtime error:" "$log" >&2 || true
    fi
    table="${table}$(printf '  %-6s %-8s %6s %6s %9s %9s %9s %10s %8s %8s %4s' "$build" "$mode" $figures "$reports" "$rc")"$'\n'
  done
done

print_phases
echo "stress figures (single: one thread; threads: a second thread drops handles):"
printf '  %-6s %-8s %6s %6s %9s %9s %9s %10s %8s %8s %4s\n' build mode seeds from sequences calls succeeded checks failures reports exit
printf '%s' "$table"
if [ "$status" -ne 0 ]; then
  echo "stress: FAILED (see the logs in build-stress*/stress-*.log)"
  exit 1
fi
echo "stress: no failure, no sanitizer report"
