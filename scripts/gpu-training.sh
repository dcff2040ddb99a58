#!/usr/bin/env bash
# Training with graphs on a GPU machine, focused: builds only the training tests, the training
# benchmark and the training example, exports the AOTInductor training steps (the test's and the
# benchmark's) meanwhile; runs the [training] tests, one under compute-sanitizer, the
# example, and the benchmark (C++ and PyTorch), and prints a summary last. Logs go to $OUT (or
# build-gpu/training). From the project root:
#   bash .carry/on-device.sh scripts/gpu-training.sh [bench steps]
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
# Logs in the build tree; what matters (results, report, diffs, a tarball of the logs) is copied
# to $OUT at the end (the device tool brings back at most 8 files).
logs="$root/build-gpu/training"
rm -rf "$logs"
mkdir -p "$logs"
build=build-gpu
steps="${1:-200}"
summary=()
note() { summary+=("$1"); }

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
# The AOTInductor packages of training steps, exported while cgt builds (a minute or two each):
# the test's small MLP and the benchmark's transformer (scripts/aoti_training.py).
models="$root/$build/training-models"
mkdir -p "$models"
(timeout 400 env PYTHONUNBUFFERED=1 python3 scripts/export-test-models.py "$models" --training-only \
  >"$logs/export-test.log" 2>&1; echo "export exit status $?" >>"$logs/export-test.log") &
test_exporter=$!
(timeout 400 env PYTHONUNBUFFERED=1 python3 scripts/aoti_training.py "$models/training-step.pt2" \
  >"$logs/export-bench.log" 2>&1; echo "export exit status $?" >>"$logs/export-bench.log") &
bench_exporter=$!
start=$SECONDS
gpu_configure "$build" "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=ON || exit 1
cmake --build "$build" -j "$jobs" --target cgt_torch_training_tests cgt_torch_tests training_bench torch_training >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A3 "$logs/build.log" | head -40; exit 1; }
note "build: $((SECONDS - start))s"

start=$SECONDS
wait "$test_exporter"
note "export train_mlp.pt2: $(tail -1 "$logs/export-test.log") ($((SECONDS - start))s waited)"
export CGT_TEST_MODELS="$models"
start=$SECONDS
timeout 180 "$build/tests/cgt_torch_training_tests" "[training]" >"$logs/tests.log" 2>&1
rc=$?
grep -E "graph vs eager|per-function:|vs libtorch|vs eager, 100|FAILED|failed|with expansion|REQUIRE|CHECK" "$logs/tests.log" | head -60
note "tests [training]: rc $rc, $(grep -E '^test cases|All tests passed' "$logs/tests.log" | tail -1) ($((SECONDS - start))s)"
grep -E "graph vs eager|per-function:|vs libtorch|vs eager, 100" -A1 "$logs/tests.log" | grep -v "^--" | while read -r line; do echo "  $line"; done >"$logs/diffs.txt"
# The autograd functions (their gradient buffers adopt an optimizer's `.grad`).
start=$SECONDS
timeout 120 "$build/tests/cgt_torch_tests" "[autograd]" >"$logs/autograd.log" 2>&1
note "tests [autograd]: rc $?, $(grep -E '^test cases|All tests passed' "$logs/autograd.log" | tail -1) ($((SECONDS - start))s)"
grep -E "FAILED|with expansion" -A3 "$logs/autograd.log" | head -30

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# Leaks are not checked: the backward runs on autograd's device thread, whose cuBLAS handle
# libtorch never destroys (as for any thread: see scripts/gpu-test.sh).
start=$SECONDS
timeout 60 "$sanitizer" --tool memcheck --leak-check no "$build/tests/cgt_torch_training_tests" \
  "training/grad_replaced_by_another_tensor_is_an_error,training/optimizer_step_refuses_what_a_graph_cannot_follow" >"$logs/memcheck.log" 2>&1
note "memcheck (grad_replaced, optimizer_step tests): rc $?, $(grep -E 'ERROR SUMMARY' "$logs/memcheck.log" | tr '\n' ' ') ($((SECONDS - start))s)"
start=$SECONDS
timeout 60 "$sanitizer" --tool memcheck --leak-check no "$build/tests/cgt_torch_training_tests" \
  "training/per_step_grads_whole_step_graph_trains_as_eager" >"$logs/memcheck-per-step.log" 2>&1
note "memcheck (per_step_grads test, 200 steps): rc $?, $(grep -E 'ERROR SUMMARY' "$logs/memcheck-per-step.log" | tr '\n' ' ') ($((SECONDS - start))s)"

(cd "$logs" && timeout 60 "$root/$build/examples/torch_training" >"$logs/example.log" 2>&1)
note "example torch_training: rc $?, $(tail -1 "$logs/example.log")"
cat "$logs/example.log"

start=$SECONDS
wait "$bench_exporter"
note "export training-step.pt2: $(tail -1 "$logs/export-bench.log") ($((SECONDS - start))s waited)"
[ -f "$models/training-step.pt2" ] && export CGT_TRAINING_PACKAGE="$models/training-step.pt2"
start=$SECONDS
: >"$logs/results.csv"
for precision in fp32 tf32; do
  timeout 60 "$build/bench/training_bench" "$steps" $precision 2>>"$logs/bench.log" | tee -a "$logs/results.csv"
  timeout "${PY_TIMEOUT:-150}" env PYTHONUNBUFFERED=1 python3 bench/training.py "$steps" $precision \
    2>>"$logs/pytorch.log" | tee -a "$logs/results.csv"
done
tail -5 "$logs/pytorch.log"
python3 bench/training_report.py "$logs/results.csv" "$logs" "${CGT_COMMIT:-unknown}" "$gpu"
note "benchmark: $((SECONDS - start))s"

echo
echo "== summary ($gpu)"
printf '%s\n' "${summary[@]}"
cat "$logs/diffs.txt"
if [ -n "${OUT:-}" ]; then
  cp "$logs/results.csv" "$logs/training.md" "$logs/diffs.txt" "$OUT/" 2>/dev/null
  tar -czf "$OUT/training-logs.tgz" -C "$logs" .
fi
