#!/usr/bin/env bash
# Focused GPU run for several GPUs and NCCL inside graphs (issue 13), on 1 GPU or more: configures
# RelWithDebInfo with Torch + CUDA, builds cgt_multi_gpu_tests and bench/tp_bench, runs the
# [multi-gpu] tests (SKIPPED with fewer than two GPUs) and the other tests of tests/multi (two pools
# on one device, the [nccl] ones: one rank per GPU), then the tensor-parallel decode benchmark, and
# prints a summary table last. Logs in $OUT (default build-gpu/logs).
#   bash .carry/on-device.sh scripts/gpu-multi.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
cd "$root"
logs="${OUT:-build-gpu/logs}"
mkdir -p "$logs"
start=$SECONDS
# NVLink multicast stays off (the lent machines ask it; NCCL's default would try it on NVSwitch).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | tee "$logs/gpus.txt"
nvidia-smi topo -m >>"$logs/gpus.txt" 2>&1 || true

gpu_configure build-gpu "$logs/configure.log" -DCGT_BUILD_BENCHMARKS=ON || exit 1
grep -i "nccl" "$logs/configure.log"
targets=(cgt_multi_gpu_tests)
grep -q "NCCL for the multi-GPU" "$logs/configure.log" && targets+=(tp_bench)
cmake --build build-gpu -j 16 --target "${targets[@]}" >"$logs/build.log" 2>&1 ||
  { grep -E "error" -A5 "$logs/build.log" | head -80; exit 1; }
echo "configure + build: $((SECONDS - start)) s"

tests=build-gpu/tests/cgt_multi_gpu_tests
summary() {  # summary <log>: Catch2's last count line ("test cases: N | P passed | S skipped")
  grep -E "test cases" "$1" | tail -n 1 | tr -s ' '
}
# Each group in its own process, under a time limit: a rank that fails while the others wait in an
# all-reduce would hang the process.
echo "---- [multi-gpu] tests ($gpus GPUs)"
timeout 300 "$tests" "[multi-gpu]" --durations yes >"$logs/multi-gpu.log" 2>&1
multi_rc=$?
grep -E "FAILED|with message|test cases" "$logs/multi-gpu.log" | sort | uniq -c | sort -rn | head -12
echo "---- the other tests of tests/multi: two pools on one device, [nccl]"
timeout 200 "$tests" "~[multi-gpu]" --durations yes >"$logs/single.log" 2>&1
single_rc=$?
grep -vE "^\s*$" "$logs/single.log" | tail -40
bench_rc=skipped
if [ -x build-gpu/bench/tp_bench ]; then
  echo "---- tp_bench"
  timeout 240 build-gpu/bench/tp_bench "${TP_STEPS:-200}" >"$logs/tp_bench.md" 2>&1
  bench_rc=$?
  cat "$logs/tp_bench.md"
fi

echo "==== summary ($((SECONDS - start)) s)"
printf '%-28s %s\n' "GPUs" "$gpus"
printf '%-28s %s\n' "[multi-gpu] tests (rc $multi_rc)" "$(summary "$logs/multi-gpu.log")"
printf '%-28s %s\n' "two pools + [nccl] (rc $single_rc)" "$(summary "$logs/single.log")"
printf '%-28s %s\n' "tp_bench (rc $bench_rc)" "$(grep -c '^| [0-9]' "$logs/tp_bench.md" 2>/dev/null || echo 0) rows"
grep '^| [0-9]' "$logs/tp_bench.md" 2>/dev/null | awk -F'|' '{printf "  batch %s: eager wall %s us, cgt wall %s us,%s\n", $3, $5, $7, $8}'
[ "$multi_rc" -eq 0 ] || [ "$multi_rc" -eq 4 ] || exit 1  # 4: every test skipped (one GPU)
[ "$single_rc" -eq 0 ] && { [ "$bench_rc" = skipped ] || [ "$bench_rc" -eq 0 ]; }
