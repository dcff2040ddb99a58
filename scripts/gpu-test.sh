#!/usr/bin/env bash
# The GPU test command, for any machine with a GPU, the CUDA toolkit, clang-19, CMake, Ninja,
# Catch2 3 and a CUDA-enabled PyTorch or libtorch. Installs nothing (GPU machines often have no
# package registry). From the project root:
#   CMAKE_PREFIX_PATH=/path/to/libtorch scripts/gpu-test.sh   # or with Torch found through python3
# Torch: CMAKE_PREFIX_PATH (the environment variable, read by CMake), then the python3 on the path
# (torch.utils.cmake_prefix_path). The GPU architecture: TORCH_CUDA_ARCH_LIST and
# CMAKE_CUDA_ARCHITECTURES, else the first GPU's compute capability (nvidia-smi). (A toolchain
# carried to a machine without one, as this project's lent GPU machine is, goes on the PATH and
# CMAKE_PREFIX_PATH first: `bash .carry/on-device.sh scripts/gpu-test.sh` does that there.)
# Configures with Torch and CUDA, builds, runs every test including the [gpu] ones, runs the GPU
# tests under compute-sanitizer (memcheck with a full leak check), runs the torch example, and
# prints a table last. Logs go to $OUT (or build-gpu/logs). The exported-model tests get their
# models from scripts/export-test-models.py, run beside the build (the AOTInductor export
# compiles for about a minute). CGT_MEMCHECK=0 leaves out the compute-sanitizer phases (a quick
# run); CGT_CTEST=0 leaves out ctest (the compute-sanitizer phases alone).
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-$root/build-gpu/logs}"
mkdir -p "$logs"
build=build-gpu
rows=()
status=0
record() {  # record <name> <rc> <seconds> <detail>
  local verdict=ok
  [ "$2" -eq 0 ] || { verdict="FAILED (rc $2)"; status=1; }
  rows+=("$(printf '%-34s %-16s %6ss  %s' "$1" "$verdict" "$3" "$4")")
}
timed() {  # timed <name> <log> <command...>: runs, logs, records
  local name="$1" log="$2"
  shift 2
  local start=$SECONDS
  "$@" >"$logs/$log" 2>&1
  local rc=$?
  record "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$logs/$log" | cut -c1-90)"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader | tee "$logs/gpu.txt"
if torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
  export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$torch_prefix"  # after the caller's
  echo "the python3 on the path has Torch: $torch_prefix"
fi
capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
arch_args=()
if [ -n "$capability" ]; then
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$capability}"
  arch_args+=(-DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-${capability/./}}")
fi
# The test models, exported while cgt builds (scripts/export-test-models.py; no downloads).
models="$root/$build/models"
mkdir -p "$models"
(timeout "${EXPORT_TIMEOUT:-300}" env PYTHONUNBUFFERED=1 python3 scripts/export-test-models.py "$models" \
  >"$logs/export.log" 2>&1; echo "export exit status $?" >>"$logs/export.log") &
exporter=$!
timed "configure (torch + cuda)" configure.log \
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON "${arch_args[@]}" ||
  { tail -20 "$logs/configure.log"; printf '%s\n' "${rows[@]}"; exit 1; }
timed "build" build.log cmake --build "$build" -j "$jobs" || { tail -40 "$logs/build.log"; printf '%s\n' "${rows[@]}"; exit 1; }
wait "$exporter"
record "export test models" "$(grep -q 'export exit status 0' "$logs/export.log"; echo $?)" 0 "$(ls "$models" | tr '\n' ' ')"
export CGT_TEST_MODELS="$models"
if [ "${CGT_CTEST:-1}" = 0 ]; then  # a run of the compute-sanitizer phases alone
  echo "ctest left out (CGT_CTEST=0)"
else
  timed "ctest (host + gpu)" ctest.log ctest --test-dir "$build" --output-on-failure -j 8 --timeout 300
  grep -E "tests passed|tests failed|Not Run|Failed|\*\*\*" "$logs/ctest.log" | tail -20
  skipped=$(grep -c "Skipped" "$logs/ctest.log" || true)
  rows+=("$(printf '%-34s %s' "  gpu tests skipped" "$skipped")")
fi

sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# memcheck with a full leak check over the GPU tests: every error and every leak fails the phase
# (scripts/memcheck-report.py lists them from the XML report). The property tests are left out
# (10,000 steps under memcheck are slow); the tests that provoke CUDA API errors on purpose
# (tagged [provokes-api-errors]) run apart with API error reports off, memory still checked.
leak_check=full
memcheck() {  # memcheck <name> <binary> <test spec> [sanitizer options...]
  local name="$1" binary="$2" spec="$3"
  shift 3
  if [ "${CGT_MEMCHECK:-1}" = 0 ]; then
    echo "compute-sanitizer left out (CGT_MEMCHECK=0)"
    return 0
  fi
  timeout "${memcheck_timeout:-400}" "$sanitizer" --tool memcheck --leak-check "$leak_check" "$@" --xml --save "$logs/memcheck-$name.xml" \
    "$build/tests/$binary" "$spec" >"$logs/memcheck-$name.log" 2>&1
  local tests=$?
  grep -E "test cases|assertions|No tests ran" "$logs/memcheck-$name.log" | tail -2
  python3 scripts/memcheck-report.py "$logs/memcheck-$name.xml" || return 1
  [ $tests -eq 0 ] || echo "the tests under memcheck exited with $tests"
  return $tests
}
timed "compute-sanitizer cgt.torch tests" memcheck-torch.txt \
  memcheck torch cgt_torch_tests "~[property]~[provokes-api-errors]~[threads]~[autograd]"
cat "$logs/memcheck-torch.txt"
# Failed captures (a .item() inside a capture) make the runtime report the API error on purpose.
timed "  ... provoking API errors" memcheck-torch-api.txt \
  memcheck torch-api cgt_torch_tests "[provokes-api-errors]" --report-api-errors no
cat "$logs/memcheck-torch-api.txt"
# libtorch keeps a cuBLAS handle (and its workspace) per thread for reuse and never frees those of
# threads that ended: memory is checked, leaks are not.
leak_check=no
timed "  ... pools on several threads" memcheck-torch-threads.txt memcheck torch-threads cgt_torch_tests "[threads]"
leak_check=full
cat "$logs/memcheck-torch-threads.txt"
# Training: the backward runs on autograd's device thread, whose cuBLAS handle libtorch never
# destroys (as for the pools on several threads above): memory is checked, leaks are not. The
# autograd functions' backwards run there too.
leak_check=no
timed "  ... autograd functions" memcheck-torch-autograd.txt memcheck torch-autograd cgt_torch_tests "[autograd]"
cat "$logs/memcheck-torch-autograd.txt"
timed "compute-sanitizer training tests" memcheck-training.txt memcheck training cgt_torch_training_tests "[training]"
leak_check=full
cat "$logs/memcheck-training.txt"
timed "compute-sanitizer decode tests" memcheck-decode.txt memcheck decode cgt_torch_decode_tests "[decode]"
cat "$logs/memcheck-decode.txt"
# Several pools on one device, and NCCL collectives inside graphs with one rank per GPU present
# (the two-device tests skip with one GPU). NCCL keeps its communicators' memory for the process
# (leaks are not checked), and its initialisation asks cudaFuncGetAttributes about kernels it
# carries for other architectures, an API error it expects (API errors are not reported).
if [ -x "$build/tests/cgt_multi_gpu_tests" ]; then
  leak_check=no
  memcheck_timeout=240 timed "compute-sanitizer multi-GPU tests" memcheck-multi.txt \
    memcheck multi cgt_multi_gpu_tests "*" --report-api-errors no
  leak_check=full
  cat "$logs/memcheck-multi.txt"
fi
if [ -x "$build/tests/cgt_cuda_tests" ]; then
  timed "compute-sanitizer cgt.cuda tests" memcheck-cuda.txt \
    memcheck cuda cgt_cuda_tests "~[property]~[provokes-api-errors]"
  cat "$logs/memcheck-cuda.txt"
  timed "  ... provoking API errors" memcheck-cuda-api.txt \
    memcheck cuda-api cgt_cuda_tests "[provokes-api-errors]" --report-api-errors no
  cat "$logs/memcheck-cuda-api.txt"
fi

if [ -x "$build/examples/torch_decoder" ]; then
  timed "example torch_decoder" decoder.log bash -c "cd '$logs' && '$root/$build/examples/torch_decoder'"
  cat "$logs/decoder.log"
fi

if [ -x "$build/examples/torch_training" ]; then
  timed "example torch_training" training.log bash -c "cd '$logs' && '$root/$build/examples/torch_training'"
  tail -3 "$logs/training.log"
fi

if [ -x "$build/examples/torch_kv_decode" ]; then
  timed "example torch_kv_decode" kv_decode.log bash -c "cd '$logs' && '$root/$build/examples/torch_kv_decode'"
  tail -4 "$logs/kv_decode.log"
fi

echo
printf '%-34s %-16s %7s  %s\n' "phase" "result" "time" "last line"
printf '%s\n' "${rows[@]}"
exit $status
