#!/usr/bin/env bash
# The one entry point for a GPU machine: a machine with a GPU, the CUDA toolkit, clang-19, CMake,
# Ninja, Catch2 3 and a CUDA-enabled PyTorch or libtorch. Installs nothing (GPU machines often have
# no package registry). From the project root:
#   scripts/gpu.sh <subcommand> [arguments]            # `scripts/gpu.sh` alone lists them
#   bash .carry/on-device.sh scripts/gpu.sh test       # on the lent GPU machine, whose toolchain is
#                                                      # carried: on-device.sh puts it on the paths
# Every subcommand configures build-gpu alike (RelWithDebInfo, Torch + CUDA, benchmarks on; Torch
# from CMAKE_PREFIX_PATH, then the python3 on the path; the GPU architecture from
# TORCH_CUDA_ARCH_LIST / CMAKE_CUDA_ARCHITECTURES, else the first GPU's compute capability), builds
# what it needs, runs it with each step's output in a log under $OUT (or build-gpu/logs/<subcommand>)
# and prints a table of the steps last; it exits 1 if a step failed. The subcommands live in
# scripts/gpu/ (tests.sh, bench.sh), the prologue and the steps' helpers in scripts/gpu/lib.sh.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/common.sh"
source "$here/gpu/lib.sh"
source "$here/gpu/tests.sh"
source "$here/gpu/bench.sh"

usage() {
  cat <<'EOF'
usage: scripts/gpu.sh <subcommand> [arguments]
  test                    build everything; every test (ctest, the [gpu] ones included); the torch examples
  memcheck                build everything; the GPU tests under compute-sanitizer memcheck (leak check
                          full where it can be; scripts/memcheck-report.py fails on any record)
  check                   test and memcheck on one build (CGT_CTEST=0 or CGT_MEMCHECK=0 leaves one out)
  tests SPEC [BINARY...]  the tests a Catch2 spec picks ("" for all) in each test binary (default
                          cgt_torch_tests), e.g. tests "[buckets]" or tests "[training]" cgt_torch_training_tests
  models                  the [models] tests and examples/serve_model on the exported test models
  multi                   tests/multi ([multi-gpu]: skipped with one GPU; two pools on one device; [nccl])
                          and bench/tp_bench (TP_STEPS steps, default 200)
  launch                  the [launch] tests, bench/launch_bench (launch.csv), the [launch] tests under memcheck
  training [STEPS]        the [training] and [autograd] tests, three under memcheck, examples/torch_training,
                          the training benchmark against PyTorch (STEPS, default 200; PY_TIMEOUT)
  bench [CALLS]           bench/results' tables: gpu_bench and training_bench against PyTorch (default 3000)
  bench-training [STEPS]  the training benchmark alone: fp32, TF32 and the modern loop against PyTorch
                          (STEPS, default 200; PY_TIMEOUT; TRAINING_CONFIGURATIONS), the loop's loss
                          curves; training.md and plots
  overhead [CALLS]        bench's CPU-per-call table alone (gpu_bench overhead against PyTorch's trees),
                          then where a replay's time over a raw launch goes (gpu_bench diagnose)
  bench-loop [GENERATIONS] greedy decoding per token: eager, a replay per token, the device loop (1, 4, 8
                          tokens per iteration), one unrolled graph; a WHILE, IF and SWITCH node's GPU time
  bench-memory [CALLS]    the memory contract on cgt.cuda: predicted against recorded growth at six sizes,
                          one pool against one per graph, a budget serving a mix (CALLS, default 300),
                          sleep and wake; writes memory-contract.md and its plot
  bench-models [CALLS] [MODEL...]
                          BERT-base and ResNet-18 (bert resnet) served from C++ against PyTorch
                          (default 150 calls per cell; PHASES picks phases)
  profile-training [fp32|tf32]
                          the whole-step training graph's GPU time per kernel, under Nsight Compute
Logs go to $OUT (or build-gpu/logs/<subcommand>); past 8 files in $OUT, all but the results are
packed into <subcommand>-logs.tgz. EXPORT_TIMEOUT: the test models' export limit (default 300 s);
CGT_COMMIT: the commit the reports name (default git's).
On the lent GPU machine: bash .carry/on-device.sh scripts/gpu.sh <subcommand> [arguments]
EOF
}
bad_usage() {  # bad_usage [why]: the usage list on stderr, exit 2
  [ $# -eq 0 ] || echo "scripts/gpu.sh: $1" >&2
  usage >&2
  exit 2
}
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

subcommand="${1:-}"
[ $# -eq 0 ] || shift
case "$subcommand" in
  test | memcheck | check | models | multi | launch)
    [ $# -eq 0 ] || bad_usage "$subcommand takes no arguments" ;;
  tests)
    [ $# -ge 1 ] || bad_usage "tests needs a Catch2 test spec (\"\" for every test)"
    for binary in "${@:2}"; do
      [[ $binary =~ ^[A-Za-z0-9_]+$ ]] || bad_usage "'$binary' is not a test binary's name (e.g. cgt_cuda_tests)"
    done ;;
  training | bench | bench-training | overhead | bench-loop | bench-memory)
    if [ $# -gt 1 ] || { [ $# -eq 1 ] && ! is_count "$1"; }; then bad_usage "$subcommand takes one count at most"; fi ;;
  bench-models)
    [ $# -eq 0 ] || is_count "$1" || bad_usage "bench-models: the first argument is the calls per cell (a count)"
    for model in "${@:2}"; do
      [[ $model == bert || $model == resnet ]] || bad_usage "bench-models: '$model' is neither bert nor resnet"
    done ;;
  profile-training)
    if [ $# -gt 1 ] || [[ ${1:-fp32} != fp32 && ${1:-fp32} != tf32 ]]; then bad_usage "profile-training takes fp32 or tf32"; fi ;;
  -h | --help | help)
    usage
    exit 0 ;;
  "") bad_usage ;;
  *) bad_usage "unknown subcommand '$subcommand'" ;;
esac

gpu_prologue "$subcommand"
"cmd_${subcommand//-/_}" "$@"
exit "$status"  # through gpu_epilogue, which prints the table
