#!/usr/bin/env bash
# The engine's bookkeeping cost per replay on the host backend (a 4-input, 4-output function):
# instructions counted by callgrind (stable on a noisy machine) and nanoseconds, for a call through
# a pool against the same work done directly. Prints a table.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
build="${1:-build}"
[ -x "$build/bench/host_overhead" ] || { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null; cmake --build "$build" --target host_overhead -j "$jobs"; }
bin="$build/bench/host_overhead"
iterations=20000
count() {  # instructions collected for one loop
  local out
  out=$(mktemp -d)
  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file="$out/cg" "$bin" --callgrind "$1" "$iterations" >/dev/null 2>"$out/log"
  awk '/^summary:/ {print $2}' "$out/cg"
  rm -rf "$out"
}
cgt_ir=$(count cgt)
raw_ir=$(count raw)
read -r _ _ cgt_ns _ raw_ns < <("$bin" 200000)
awk -v c="$cgt_ir" -v r="$raw_ir" -v n="$iterations" -v cn="$cgt_ns" -v rn="$raw_ns" 'BEGIN {
  printf "%-44s %14s %12s\n", "4 inputs, 4 outputs, per call", "instructions", "ns"
  printf "%-44s %14.0f %12.1f\n", "cgt: replay through the pool (call + drop)", c / n, cn
  printf "%-44s %14.0f %12.1f\n", "direct: 4 input copies + raw graph replay", r / n, rn
  printf "%-44s %14.0f %12.1f\n", "cgt bookkeeping (difference)", (c - r) / n, cn - rn
}'
