#!/usr/bin/env bash
# The GPU check by its old name, kept because tooling outside this repository runs it:
# `scripts/gpu.sh check` (build, every test, compute-sanitizer, the examples). See scripts/gpu.sh.
exec bash "$(dirname "$0")/gpu.sh" check "$@"
