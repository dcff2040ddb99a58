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

# The GPU scripts' configure step: Torch from CMAKE_PREFIX_PATH, then the python3 on the path;
# the GPU architecture from TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES, else the first GPU's
# compute capability (nvidia-smi).
gpu_configure() {  # gpu_configure <build dir> <log file> [cmake args...]: RelWithDebInfo, Torch + CUDA
  local build="$1" log="$2" torch_prefix capability
  shift 2
  if torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
    export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$torch_prefix"
  fi
  local arch_args=()
  capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
  if [ -n "$capability" ]; then
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$capability}"
    arch_args+=(-DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-${capability/./}}")
  fi
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON \
    "${arch_args[@]}" "$@" >"$log" 2>&1 || { tail -30 "$log"; return 1; }
}
