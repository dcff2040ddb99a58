#!/usr/bin/env bash
# The model benchmark (issue 12): BERT-base and ResNet-18 with random weights, exported on this
# machine from its transformers / torchvision (nothing downloaded), served by eager PyTorch,
# torch.compile(mode="reduce-overhead"), eager libtorch and cgt.torch (TorchScript and
# AOTInductor). For the GPU machine; installs nothing. From the project root:
#   bash .carry/on-device.sh scripts/gpu-bench-models.sh [CALLS] [MODEL ...]
# CALLS: timed calls per cell (default 150); MODELS: bert resnet (default both).
# PHASES (default "export build python cpp python2 cpp2 report") picks phases; python2 and cpp2
# serve again (Python and C++ take turns, so that a drift of the machine reaches both; the report
# averages the passes). The exported models
# (build-gpu/bench-models) and the build are reused when present, so a second run can skip them.
# Writes results.csv, models.md and the logs to $OUT (or build-gpu/bench-results).
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
out="${OUT:-$root/build-gpu/bench-results}"
mkdir -p "$out"
calls="${1:-150}"
shift || true
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(bert resnet)
phases="${PHASES:-export build python cpp python2 cpp2 report}"
build=build-gpu
dir="$root/build-gpu/bench-models"
mkdir -p "$dir"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
commit="${CGT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
start=$SECONDS
has() { [[ " $phases " == *" $1 "* ]]; }

exporters=()
if has export; then  # AOTInductor compiles C++ and Triton: minutes; one process per model, beside the build
  for model in "${models[@]}"; do
    (env PYTHONUNBUFFERED=1 python3 bench/models/models.py export "$dir" "$model" >"$out/export-$model.tmp" 2>&1
     echo "export $model exit status $?" >>"$out/export-$model.tmp") &
    exporters+=($!)
  done
fi
if has build; then
  # ON explicitly: a build directory that scripts/gpu-models.sh configured has them OFF.
  gpu_configure "$build" "$out/configure.log" -DCGT_BUILD_BENCHMARKS=ON || exit 1
  cmake --build "$build" -j "$jobs" --target model_bench >"$out/build.log" 2>&1 ||
    { grep -E "error" -A5 "$out/build.log" | head -60; exit 1; }
  echo "configure + build: $((SECONDS - start)) s"
fi
if [ ${#exporters[@]} -gt 0 ]; then
  wait "${exporters[@]}"
  cat "$out"/export-*.tmp >"$out/export.log" && rm -f "$out"/export-*.tmp
  echo "export done: $((SECONDS - start)) s"
  grep -E "^export|Error|error" "$out/export.log" | tail -20
fi
ls -la "$dir" >"$out/models.txt"

touch "$out/results.csv"
if has python; then
  echo "---- Python: eager PyTorch, PyTorch's trees, reduce-overhead ($((SECONDS - start)) s)"
  CALLS="$calls" PYTHONUNBUFFERED=1 python3 bench/models/models.py measure "$dir" "${models[@]}" \
    2>"$out/python.log" | tee -a "$out/results.csv"
fi
cpp_pass() {
  for model in "${models[@]}"; do
    echo "---- C++: $model ($((SECONDS - start)) s)"
    "$build/bench/model_bench" "$dir" "$model" "$calls" 2>>"$out/cpp.log" | tee -a "$out/results.csv"
  done
}
has cpp && cpp_pass
if has python2; then
  echo "---- Python, second pass ($((SECONDS - start)) s)"
  SECOND_PASS=1 CALLS="$calls" PYTHONUNBUFFERED=1 python3 bench/models/models.py measure "$dir" "${models[@]}" \
    2>>"$out/python.log" | tee -a "$out/results.csv"
fi
has cpp2 && CGT_BENCH_SECOND_PASS=1 cpp_pass
if has report; then
  python3 bench/models/report.py "$out/results.csv" "$out" "$commit" "$gpu" >/dev/null
  echo "==== $((SECONDS - start)) s; bench/models/report.py wrote $out/models.md:"
  grep -E "^## |^\| [0-9]+ \| [0-9.]+x|^\| [0-9]+ \| (AOTI|TorchScript)|^\| (cgt|PyTorch).*\| [0-9.]+ \| [0-9. ]+ \|$" "$out/models.md"
fi
