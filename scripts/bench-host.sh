#!/usr/bin/env bash
# The engine's bookkeeping cost per replay on the host backend (a 4-input, 4-output function):
# instructions counted by callgrind (stable on a noisy machine) and nanoseconds, for a call through
# a pool against the same work done directly. Prints a table, then the functions a replay and the
# drop of its outputs run (calls, not inlined code: scripts/replay-hops.py) and their files.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
# Its own build by default: RelWithDebInfo (the list of functions below needs debug information),
# the host backend alone. A build directory given must have debug information for that list.
build="${1:-build-bench}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=OFF -DCGT_WITH_CUDA=OFF \
    -DCGT_BUILD_EXAMPLES=OFF >/dev/null
fi
cmake --build "$build" --target host_overhead -j "$jobs" >/dev/null
bin="$build/bench/host_overhead"
iterations=20000
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
count() {  # instructions collected for one loop; the profile stays in $profile/$1
  valgrind --tool=callgrind --collect-atstart=no --compress-strings=no --compress-pos=no \
    --callgrind-out-file="$profile/$1" "$bin" --callgrind "$1" "$iterations" >/dev/null 2>"$profile/$1.log"
  awk '/^summary:/ {print $2}' "$profile/$1"
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
python3 scripts/replay-hops.py "$profile/cgt" "$root/"
