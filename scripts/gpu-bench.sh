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
rounds=3
build=build-gpu
# The benchmark transformer's training step as an AOTInductor package, exported while cgt builds.
mkdir -p "$build"
(timeout 400 python3 scripts/aoti_training.py "$build/training-step.pt2" >"$out/export-training.log" 2>&1) &
exporter=$!
if [ ! -x "$build/bench/gpu_bench" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON >"$out/configure.log" 2>&1
  cmake --build "$build" -j "$jobs" --target gpu_bench training_bench >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
fi
[ -x "$build/bench/training_bench" ] || cmake --build "$build" -j "$jobs" --target training_bench >>"$out/build.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
commit="${CGT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"  # the device copy has no .git
: >"$out/results.csv"
trees() { PYTHONUNBUFFERED=1 python3 bench/pytorch_trees.py "$@" 2>>"$out/pytorch.log" | tee -a "$out/results.csv"; }
# The overhead table compares two processes (C++ and Python), and the machine's speed drifts over
# tens of seconds: they take turns, in rounds, and the report keeps each cell's median round.
for round in $(seq "$rounds"); do
  echo "# overhead, round $round of $rounds"
  "$build/bench/gpu_bench" overhead $((calls / rounds)) | tee -a "$out/results.csv" || exit 1
  trees overhead $((calls / rounds)) || exit 1
done
for what in memory scaling capture; do
  "$build/bench/gpu_bench" "$what" "$calls" | tee -a "$out/results.csv" || exit 1
done
trees memory || exit 1
trees capture || exit 1
# Training: one step of a small transformer, eager, cgt's whole-step graph, and reduce-overhead.
wait "$exporter"
[ -f "$build/training-step.pt2" ] && export CGT_TRAINING_PACKAGE="$root/$build/training-step.pt2"
for precision in fp32 tf32; do
  "$build/bench/training_bench" 200 $precision | tee -a "$out/results.csv" || exit 1
  PYTHONUNBUFFERED=1 python3 bench/training.py 200 $precision 2>>"$out/pytorch.log" | tee -a "$out/results.csv" || exit 1
done
python3 bench/report.py "$out/results.csv" "$out" "$commit" "$gpu"
python3 bench/training_report.py "$out/results.csv" "$out" "$commit" "$gpu"
