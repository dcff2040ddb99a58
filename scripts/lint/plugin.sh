#!/usr/bin/env bash
# Builds the clang-tidy plugin scripts/lint/tidy_scope.cpp into BUILD-DIR when missing or older
# than its source, and prints its path (scripts/lint.sh and scripts/lint/compare-scope.sh load it).
#   scripts/lint/plugin.sh [build-dir]
set -euo pipefail
source "$(dirname "$0")/../common.sh"
cd "$root"
plugin="${1:-build}/tidy_scope.so"
if [ ! -f "$plugin" ] || [ scripts/lint/tidy_scope.cpp -nt "$plugin" ]; then
  if [ ! -f /usr/lib/llvm-19/include/clang/Frontend/FrontendPluginRegistry.h ]; then
    echo "lint: the clang-tidy plugin needs clang's headers (libclang-19-dev, llvm-19-dev): run scripts/bootstrap.sh" >&2
    exit 1
  fi
  read -ra llvm_flags <<<"$(llvm-config-19 --cxxflags)"
  clang++-19 "${llvm_flags[@]}" -O2 -fPIC -shared -fno-rtti scripts/lint/tidy_scope.cpp -o "$plugin"
fi
echo "$(cd "$(dirname "$plugin")" && pwd)/$(basename "$plugin")"
