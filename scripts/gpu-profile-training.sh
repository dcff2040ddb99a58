#!/usr/bin/env bash
# Where the whole-step training graph's GPU time goes: builds the training benchmark, times the
# whole-step graph (per-step gradients), then runs it under Nsight Compute (ncu, from the CUDA
# toolkit) for a few steps and prints GPU time per kernel name per step (bench/kernel_summary.py).
# For the GPU machine; installs nothing. From the project root:
#   bash .carry/on-device.sh scripts/gpu-profile-training.sh [fp32|tf32]
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
out="${OUT:-$root/build-gpu/profile}"
mkdir -p "$out"
precision="${1:-fp32}"
build=build-gpu
gpu_configure "$build" "$out/configure.log" -DCGT_BUILD_BENCHMARKS=ON || exit 1
cmake --build "$build" -j "$jobs" --target training_bench >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
method="whole-step graph (per-step"
CGT_BENCH_METHOD="$method" "$build/bench/training_bench" 200 "$precision"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
CGT_BENCH_METHOD="$method" timeout 300 "$ncu" --metrics gpu__time_duration.sum --print-summary per-kernel --csv \
  "$build/bench/training_bench" 3 "$precision" >"$out/ncu-$precision.csv" 2>"$out/ncu-$precision.err" ||
  { tail -5 "$out/ncu-$precision.err"; exit 1; }
python3 bench/kernel_summary.py "$out/ncu-$precision.csv" | tee "$out/kernels-$precision.md"
