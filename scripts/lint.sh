#!/usr/bin/env bash
# clang-format and clang-tidy over modules/ and src/ (the library); fails on any finding.
#   scripts/lint.sh [build-dir]   (a configured build directory: clang-tidy needs its module files)
set -euo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
build="${1:-build}"
mapfile -t sources < <(git ls-files 'modules/*.cppm' 'src/*.cppm' 'src/*.cpp' 'src/**/*.cpp' 'src/**/*.cppm' | sort -u)
clang-format-19 --dry-run --Werror "${sources[@]}"
echo "clang-format: ${#sources[@]} files clean"
