# scripts/gpu.sh's test subcommands: test, memcheck, check, tests, models, launch, multi.
# shellcheck shell=bash

cmd_test() { gpu_check 1 0 1; }
cmd_memcheck() { gpu_check 0 1 0; }
cmd_check() {  # CGT_CTEST=0 leaves out ctest, CGT_MEMCHECK=0 the compute-sanitizer phases
  local ctest=1 memcheck=1
  if [ "${CGT_CTEST:-1}" = 0 ]; then ctest=0; echo "ctest left out (CGT_CTEST=0)"; fi
  if [ "${CGT_MEMCHECK:-1}" = 0 ]; then memcheck=0; echo "compute-sanitizer left out (CGT_MEMCHECK=0)"; fi
  gpu_check "$ctest" "$memcheck" 1
}

# gpu_check <ctest: 0|1> <memcheck: 0|1> <examples: 0|1>: builds everything, with the test models
# exported beside the build (scripts/export-test-models.py: the AOTInductor export compiles for
# about a minute; nothing downloaded), then runs the parts asked for.
gpu_check() {
  local models="$root/$build/models"
  mkdir -p "$models"
  in_background "export test models" export.log "${EXPORT_TIMEOUT:-300}" python3 scripts/export-test-models.py "$models"
  configure
  build
  await "export test models"
  echo "test models: $(ls "$models" | tr '\n' ' ')"
  export CGT_TEST_MODELS="$models"
  if [ "$1" = 1 ]; then
    step "ctest (host + gpu)" ctest.log 0 ctest --test-dir "$build" --output-on-failure -j 8 --timeout 300
    grep -E "tests passed|tests failed|Not Run|Failed|\*\*\*" "$logs/ctest.log" | tail -n 20
    rows+=("$(printf '%-40s %s' "  gpu tests skipped" "$(grep -cE "Test +#[0-9]+: .*Skipped" "$logs/ctest.log")")")
  fi
  if [ "$2" = 1 ]; then memcheck_suites; fi
  if [ "$3" = 1 ]; then
    example torch_decoder decoder.log 0
    example torch_training training.log 3
    example torch_training_loop training-loop.log 0 "$logs"
    example torch_kv_decode kv_decode.log 4
  fi
}

# memcheck with a full leak check over the GPU tests: every error and every leak fails the row. The
# property tests are left out (10,000 steps under memcheck are slow); the tests that provoke CUDA
# API errors on purpose (tagged [provokes-api-errors]: a failed capture, a .item() inside one) run
# apart with API error reports off, memory still checked.
memcheck_suites() {
  sanitize "compute-sanitizer cgt.torch tests" torch cgt_torch_tests \
    "~[property]~[provokes-api-errors]~[threads]~[autograd]" full 400
  sanitize "  ... provoking API errors" torch-api cgt_torch_tests "[provokes-api-errors]" full 400 \
    --report-api-errors no
  # libtorch keeps a cuBLAS handle (and its workspace) per thread for reuse and never frees those
  # of threads that ended: memory is checked, leaks are not. The same holds for the backward, which
  # runs on autograd's device thread: the autograd functions and the training tests.
  sanitize "  ... pools on several threads" torch-threads cgt_torch_tests "[threads]" no 400
  sanitize "  ... autograd functions" torch-autograd cgt_torch_tests "[autograd]" no 400
  # The [combined] tests (200-step runs of a transformer) take more than memcheck's limit alone;
  # what they use, the other training tests cover. The rest take about 400 s under memcheck on an H100.
  sanitize "compute-sanitizer training tests" training cgt_torch_training_tests \
    "[training]~[combined]~[provokes-api-errors]" no 540
  sanitize "  ... provoking API errors" training-api cgt_torch_training_tests "[training][provokes-api-errors]" no 120 \
    --report-api-errors no
  sanitize "compute-sanitizer decode tests" decode cgt_torch_decode_tests "[decode]" full 400
  # Several pools on one device, and NCCL collectives inside graphs with one rank per GPU present
  # (the two-device tests skip with one GPU). NCCL keeps its communicators' memory for the process
  # (leaks are not checked), and its initialisation asks cudaFuncGetAttributes about kernels it
  # carries for other architectures, an API error it expects (API errors are not reported).
  if [ -x "$build/tests/cgt_multi_gpu_tests" ]; then
    sanitize "compute-sanitizer multi-GPU tests" multi cgt_multi_gpu_tests "*" no 240 --report-api-errors no
  fi
  if [ -x "$build/tests/cgt_cuda_tests" ]; then
    sanitize "compute-sanitizer cgt.cuda tests" cuda cgt_cuda_tests "~[property]~[provokes-api-errors]" full 400
    sanitize "  ... provoking API errors" cuda-api cgt_cuda_tests "[provokes-api-errors]" full 400 \
      --report-api-errors no
  fi
}

# tests <Catch2 spec> [test binary...]: builds those binaries (default cgt_torch_tests) and runs
# the tests the spec picks in each ("" picks every test). The test models of an earlier run of
# test, memcheck, check or models (build-gpu/models) are used when present.
cmd_tests() {
  local spec="$1" binary
  shift
  local binaries=("$@") args=()
  [ ${#binaries[@]} -gt 0 ] || binaries=(cgt_torch_tests)
  [ -z "$spec" ] || args=("$spec")
  configure
  build "${binaries[@]}"
  if [ -z "${CGT_TEST_MODELS:-}" ] && [ -d "$root/$build/models" ]; then
    export CGT_TEST_MODELS="$root/$build/models"
  fi
  for binary in "${binaries[@]}"; do
    step "$binary ${spec:-(every test)}" "tests-$binary.log" 0 "$build/tests/$binary" "${args[@]}" --durations yes
    grep -vE "^\s*$" "$logs/tests-$binary.log" | tail -n 150
  done
}

# models: the model adapters (cgt::torch::add_jit_module, add_aoti_package). Exports the test
# models (TorchScript and AOTInductor, random weights) beside the build of cgt_torch_tests and
# examples/serve_model, then runs the [models] tests and the example on each model.
cmd_models() {
  local models="$root/$build/models" run file shape
  mkdir -p "$models"
  in_background "export test models" export.log "${EXPORT_TIMEOUT:-300}" python3 scripts/export-test-models.py "$models"
  configure
  build cgt_torch_tests serve_model
  await "export test models"
  grep -vE "^\s*$" "$logs/export.log" | tail -n 25
  ls -la "$models" | tee "$logs/models.txt"
  step "[models] tests" models.log 0 env CGT_TEST_MODELS="$models" "$build/tests/cgt_torch_tests" "[models]" --durations yes
  grep -vE "^\s*$" "$logs/models.log" | tail -n 60
  for run in "mlp.pt 256" "block.pt 16x64" "block.pt2 16x64"; do
    read -r file shape <<<"$run"
    if [ ! -f "$models/$file" ]; then
      record "serve_model $file" skipped 0 "not exported"
      continue
    fi
    step "serve_model $file $shape" "serve-$file.log" 60 "$build/examples/serve_model" "$models/$file" "$shape" 200
    grep -vE "^\s*$" "$logs/serve-$file.log" | head -n 9
    echo "  lines of output (with the DOT): $(grep -c "^" "$logs/serve-$file.log")"
  done
}

# launch: launch cost against node types (bench/results/launch.md): the [launch] tests of both
# backends, bench/launch_bench (its CSV lines: launch.csv), and the [launch] tests under memcheck
# (libtorch's cuBLAS handle and workspaces live as long as the process: memory is checked, not leaks).
cmd_launch() {
  configure
  build cgt_cuda_tests cgt_torch_tests launch_bench
  step "cgt.cuda [launch] tests" cuda-launch.log 60 "$build/tests/cgt_cuda_tests" "[launch]"
  step "cgt.torch [launch] tests" torch-launch.log 60 "$build/tests/cgt_torch_tests" "[launch]"
  grep -B2 -A12 -E "FAILED|failed" "$logs/cuda-launch.log" "$logs/torch-launch.log" | head -n 60
  step "launch_bench" launch.csv 100 "$build/bench/launch_bench"
  cat "$logs/launch.csv"
  keep+=(launch.csv)
  sanitize "memcheck cgt.cuda [launch]" cuda-launch cgt_cuda_tests "[launch]" no 60
  sanitize "memcheck cgt.torch [launch]" torch-launch cgt_torch_tests "[launch]" no 60
}

# multi: several GPUs and NCCL inside graphs, on one GPU or more. The [multi-gpu] tests (skipped
# with fewer than two GPUs), the other tests of tests/multi (two pools on one device, the [nccl]
# ones: one rank per GPU), then bench/tp_bench (TP_STEPS steps, default 200) when NCCL was found.
cmd_multi() {
  # NVLink multicast stays off (the lent machines ask it; NCCL's default would try it on NVSwitch).
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local gpus tests="$build/tests/cgt_multi_gpu_tests" targets=(cgt_multi_gpu_tests)
  gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
  nvidia-smi topo -m >>"$logs/gpu.txt" 2>&1 || true
  configure
  grep -i "nccl" "$logs/configure.log"
  grep -q "NCCL for the multi-GPU" "$logs/configure.log" && targets+=(tp_bench)
  build "${targets[@]}"
  # Each group in its own process, under a time limit: a rank that fails while the others wait in
  # an all-reduce would hang the process.
  step --may-skip "[multi-gpu] tests ($gpus GPUs)" multi-gpu.log 300 "$tests" "[multi-gpu]" --durations yes
  grep -E "FAILED|with message|test cases" "$logs/multi-gpu.log" | sort | uniq -c | sort -rn | head -n 12
  step "two pools on one device + [nccl]" single.log 200 "$tests" "~[multi-gpu]" --durations yes
  grep -vE "^\s*$" "$logs/single.log" | tail -n 40
  if [ -x "$build/bench/tp_bench" ]; then
    step "tp_bench" tp_bench.md 240 "$build/bench/tp_bench" "${TP_STEPS:-200}"
    cat "$logs/tp_bench.md"
    keep+=(tp_bench.md)
    mapfile -t notes < <(grep '^| [0-9]' "$logs/tp_bench.md" |
      awk -F'|' '{printf "tp_bench, batch %s: eager wall %s us, cgt wall %s us,%s\n", $3, $5, $7, $8}')
  else
    record "tp_bench" skipped 0 "not built (no NCCL)"
  fi
}
