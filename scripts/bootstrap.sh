#!/usr/bin/env bash
# Installs what building and testing cgt needs on Debian 12, and nothing when all of it is there.
#   clang-19 + clang-tools-19 (clang-scan-deps for C++20 modules), libclang-rt-19-dev (sanitizers)
#   and llvm-19 (llvm-symbolizer, for readable sanitizer reports),
#   clang-format-19 / clang-tidy-19, libclang-19-dev + llvm-19-dev (headers for scripts/lint/tidy_scope.cpp,
#   the plugin that keeps clang-tidy out of system headers), ninja, Microsoft GSL, python3 (the README
#   test), graphviz (the demo's picture of its tree), and CMake >= 3.28 + Catch2 3 from
#   bookworm-backports (added as an apt source when absent).
set -euo pipefail

have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
cmake_is_new_enough() {
  command -v cmake >/dev/null || return 1
  local v; v=$(cmake --version | awk 'NR==1{print $3}')
  [ "$(printf '%s\n3.28\n' "$v" | sort -V | head -1)" = "3.28" ]
}
catch2_is_v3() { [ -f /usr/lib/cmake/Catch2/Catch2Config.cmake ] || [ -f /usr/lib/x86_64-linux-gnu/cmake/Catch2/Catch2Config.cmake ]; }

plain=()
for p in clang-19 clang-tools-19 libclang-rt-19-dev llvm-19 clang-format-19 clang-tidy-19 libclang-19-dev llvm-19-dev ninja-build libmsgsl-dev valgrind unzip python3 graphviz; do
  have_pkg "$p" || plain+=("$p")
done
backports=()
cmake_is_new_enough || backports+=(cmake)
catch2_is_v3 || backports+=(catch2)

if [ ${#plain[@]} -eq 0 ] && [ ${#backports[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
if [ ${#backports[@]} -gt 0 ] && ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "bootstrap: adding bookworm-backports to apt sources"
  echo "deb http://deb.debian.org/debian bookworm-backports main" | $sudo tee /etc/apt/sources.list.d/bookworm-backports.list >/dev/null
fi
echo "bootstrap: installing ${plain[*]} ${backports[*]}"
$sudo apt-get update -qq
[ ${#plain[@]} -eq 0 ] || $sudo apt-get install -y -qq --no-install-recommends "${plain[@]}" >/dev/null
[ ${#backports[@]} -eq 0 ] || $sudo apt-get install -y -qq --no-install-recommends -t bookworm-backports "${backports[@]}" >/dev/null
