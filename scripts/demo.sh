#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo: the libtorch decoder when a GPU and libtorch
# are present, the host demo otherwise. The demo writes its tree as Graphviz DOT; this draws it as
# SVG beside it (build-demo/*.svg), to open in a browser.
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
bash scripts/bootstrap.sh
build=build-demo
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_BUILD_TESTS=OFF -DCGT_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j "$jobs"
if [ -x "$build/examples/torch_decoder" ] && nvidia-smi -L >/dev/null 2>&1; then
  (cd "$build" && ./examples/torch_decoder)
else
  (cd "$build" && ./examples/host_demo)
fi
for dot in "$build"/*.dot; do
  [ -e "$dot" ] || continue
  dot -Tsvg "$dot" -o "${dot%.dot}.svg"
  echo "the tree, drawn: ${dot%.dot}.svg"
done
