#!/usr/bin/env bash
# Focused GPU run for the model adapters (cgt::torch::add_jit_module, add_aoti_package): exports the
# test models with the machine's python3 (TorchScript and AOTInductor, random weights, nothing
# downloaded) while it configures and builds cgt_torch_tests and examples/serve_model
# (RelWithDebInfo, Torch + CUDA), then runs the [models] tests and the example on each model.
# Logs and the exported models' listing in $OUT (default build-gpu/logs).
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/logs}"
mkdir -p "$logs"
models="$PWD/build-gpu/models"
mkdir -p "$models"
start=$SECONDS

# The export (about a minute: AOTInductor compiles C++ and Triton kernels) runs beside the build.
(timeout "${EXPORT_TIMEOUT:-200}" env PYTHONUNBUFFERED=1 python3 scripts/export-test-models.py "$models" \
  >"$logs/export.log" 2>&1; echo "export exit status $?" >>"$logs/export.log") &
exporter=$!

gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=OFF || exit 1
cmake --build build-gpu -j 16 --target cgt_torch_tests serve_model >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
echo "configure + build: $((SECONDS - start)) s"
wait "$exporter"
echo "---- export ($((SECONDS - start)) s)"
grep -vE "^\s*$" "$logs/export.log" | tail -25
ls -la "$models" | tee "$logs/models.txt"

echo "---- [models] tests"
CGT_TEST_MODELS="$models" build-gpu/tests/cgt_torch_tests "[models]" --durations yes >"$logs/models.log" 2>&1
rc=$?
grep -vE "^\s*$" "$logs/models.log" | tail -60

status=0
for run in "mlp.pt 256" "block.pt 16x64" "block.pt2 16x64"; do
  set -- $run
  [ -f "$models/$1" ] || { echo "---- serve_model $1: not exported"; continue; }
  echo "---- serve_model $1 $2"
  timeout 60 build-gpu/examples/serve_model "$models/$1" "$2" 200 >"$logs/serve-$1.log" 2>&1 || status=1
  grep -v "^\s*$" "$logs/serve-$1.log" | head -9
  grep -c "^" "$logs/serve-$1.log" | sed 's/^/  lines of output (with the DOT): /'
done
echo "==== summary: tests exit $rc, examples exit $status, $((SECONDS - start)) s"
[ "$rc" -eq 0 ] && [ "$status" -eq 0 ]
