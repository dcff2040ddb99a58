#!/usr/bin/env bash
# Shows that scripts/lint/tidy_scope.cpp (the plugin that keeps clang-tidy's checks out of system
# headers) hides no finding: runs clang-tidy on each file with every check on, with and without
# the plugin, and compares the findings. Slow (minutes a file without the plugin); for a new
# clang-tidy or a change to the plugin, not for CI.
#   scripts/lint/compare-scope.sh [build-dir] [file...]   (default: four units of the library)
set -euo pipefail
source "$(dirname "$0")/../common.sh"
cd "$root"
build="${1:-build}"
shift || true
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(src/core/engine_call.cpp modules/cgt.cppm src/host/device.cpp src/torch/optim.cpp)
plugin=$(bash scripts/lint/plugin.sh "$build")
checks='*,-llvmlibc-*,-fuchsia-*,-altera-*,-llvm-header-guard'
findings() {  # file [--load=plugin]
  clang-tidy-19 ${2:+"$2"} -p "$build" --quiet --checks="$checks" --warnings-as-errors='' "$1" 2>/dev/null |
    grep -E "(warning|error):" | sort -u || true
}
status=0
for f in "${files[@]}"; do
  without=$(findings "$f")
  with=$(findings "$f" --load="$plugin")
  if [ "$without" == "$with" ]; then
    echo "$f: $(grep -c . <<<"$with") findings with every check on, the same with the plugin"
  else
    echo "$f: the findings differ (< without the plugin, > with it):"
    diff <(echo "$without") <(echo "$with") || true
    status=1
  fi
done
exit "$status"
