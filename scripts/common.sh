# Shared by the scripts: the compiler, the generator, and timing of phases.
# shellcheck shell=bash
export CXX="${CXX:-clang++-19}"
export CMAKE_GENERATOR="${CMAKE_GENERATOR:-Ninja}"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
jobs=$(nproc 2>/dev/null || echo 2)

phase_start=0
phase_name=""
phases_report=""
phase() {  # phase "name": ends the previous phase (printing its time) and starts a new one
  phase_end
  phase_name="$1"
  phase_start=$(date +%s)
  echo "==> $phase_name"
}
phase_end() {
  if [ -n "$phase_name" ]; then
    local took=$(( $(date +%s) - phase_start ))
    echo "<== $phase_name: ${took}s"
    phases_report="${phases_report}$(printf '  %-44s %5ss' "$phase_name" "$took")"$'\n'
    phase_name=""
  fi
}
print_phases() {
  phase_end
  echo "phase times:"
  printf '%s' "$phases_report"
}

