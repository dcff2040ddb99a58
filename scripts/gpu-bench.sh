#!/usr/bin/env bash
# The GPU benchmarks, for the lent GPU machine (installs nothing). From the project root:
#   bash .carry/on-device.sh scripts/gpu-bench.sh [calls]
# Builds gpu_bench, runs it and PyTorch's Python trees on the same work, and writes the tables
# (and the scaling plot) to $OUT (or build-gpu/bench-results), ready for bench/results/.
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
out="${OUT:-$root/build-gpu/bench-results}"
mkdir -p "$out"
calls="${1:-3000}"
build=build-gpu
if [ ! -x "$build/bench/gpu_bench" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$jobs" --target gpu_bench >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
commit="${CGT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"  # the device copy has no .git
"$build/bench/gpu_bench" all "$calls" | tee "$out/results.csv"
PYTHONUNBUFFERED=1 python3 bench/pytorch_trees.py all "$calls" 2>"$out/pytorch.log" | tee -a "$out/results.csv"
python3 bench/report.py "$out/results.csv" "$out" "$commit" "$gpu"
