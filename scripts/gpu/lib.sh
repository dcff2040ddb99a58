# The prologue and the helpers that every subcommand of scripts/gpu.sh shares: where the logs go,
# the one configure of build-gpu, builds, steps (one command into one log, under a time limit, one
# row of the table), the exports that run beside the build, memcheck over a test binary, and the
# table printed last.
# shellcheck shell=bash

build="build-gpu"
sub=""      # the subcommand (gpu_prologue)
logs=""     # $OUT, else build-gpu/logs/<subcommand> (gpu_prologue)
gpu=""      # the first GPU's name, for the reports (gpu_prologue)
commit=""   # CGT_COMMIT, else git's (the copy on the GPU machine has no .git)
status=0    # 1 once a row failed (record)
running=""  # the step under way, for the row of a run stopped in the middle (step, measure)
running_since=0
rows=()     # the table printed last (record)
notes=()    # lines printed just above the table: a benchmark's rows, the training diffs
keep=()     # files of $OUT left beside the packed logs: the results that go to bench/results/
declare -gA background_pid background_log background_begun  # in_background, await

gpu_prologue() {  # gpu_prologue <subcommand>: the logs, the GPU, Torch; the table at exit
  sub="$1"
  cd "$root" || exit 1
  logs="${OUT:-$root/$build/logs/$sub}"
  mkdir -p "$logs"
  nvidia-smi --query-gpu=index,name,driver_version,compute_cap,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  commit="${CGT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
  # Torch: CMAKE_PREFIX_PATH (the caller's, read by CMake) first, then the python3 on the path.
  local torch_prefix
  if torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null); then
    export CMAKE_PREFIX_PATH="${CMAKE_PREFIX_PATH:+$CMAKE_PREFIX_PATH:}$torch_prefix"
    echo "the python3 on the path has Torch: $torch_prefix"
  fi
  # A run stopped at a time limit still prints the rows it has: the EXIT trap runs on TERM too, and
  # writes to the console kept here, not to the log of the step that was running.
  exec {console_out}>&1 {console_err}>&2
  trap gpu_epilogue EXIT
  trap 'exit 143' TERM INT
}

gpu_epilogue() {  # the EXIT trap: packs the logs, prints the notes and the table; fails if a row did
  local rc=$? pid
  trap - EXIT
  exec 1>&"$console_out" 2>&"$console_err"
  [ -z "$running" ] || record "$running" stopped $((SECONDS - running_since)) "(the run was stopped)"
  for pid in "${background_pid[@]}"; do kill "$pid" 2>/dev/null; done  # an export not awaited (a failed build)
  [ "$rc" -ne 0 ] || rc=$status
  local where="$logs"
  pack_logs && where="$logs/$sub-logs.tgz"
  echo
  echo "== scripts/gpu.sh $sub on ${gpu:-no GPU found}, commit $commit; logs: $where"
  [ ${#notes[@]} -eq 0 ] || printf '%s\n' "${notes[@]}"
  printf '%-40s %-16s %7s  %s\n' "step" "result" "time" "outcome"
  [ ${#rows[@]} -eq 0 ] || printf '%s\n' "${rows[@]}"
  exit "$rc"
}

# $OUT comes back from the lent GPU machine as 8 files at most: past 8, every file but those in
# `keep` goes into one archive, <subcommand>-logs.tgz. Returns 1 when it packed nothing.
pack_logs() {
  [ -n "${OUT:-}" ] && [ "$logs" = "$OUT" ] || return 1
  local files=() packed=() file
  mapfile -t files < <(find "$OUT" -maxdepth 1 -type f -printf '%f\n' | sort)
  [ ${#files[@]} -gt 8 ] || return 1
  for file in "${files[@]}"; do
    [[ " ${keep[*]} " == *" $file "* || $file == *-logs.tgz ]] || packed+=("$file")
  done
  [ ${#packed[@]} -gt 0 ] || return 1
  tar -czf "$OUT/$sub-logs.tgz" -C "$OUT" -- "${packed[@]}" && (cd "$OUT" && rm -f -- "${packed[@]}")
}

record() {  # record <name> <rc, or "skipped"> <seconds> <outcome>: one row of the table
  local verdict
  case "$2" in
    0) verdict=ok ;;
    skipped) verdict=skipped ;;
    stopped) verdict=STOPPED; status=1 ;;
    124) verdict="TIMED OUT"; status=1 ;;
    *) verdict="FAILED (rc $2)"; status=1 ;;
  esac
  rows+=("$(printf '%-40s %-16s %6ss  %s' "$1" "$verdict" "$3" "$4")")
}

outcome() {  # outcome <log>: memcheck's verdict, else Catch2's or ctest's count, else the last line
  local line
  line=$(grep -E '^memcheck records|^test cases|^All tests passed|^No tests ran|tests passed, ' "$1" 2>/dev/null | tail -n 1)
  [ -n "$line" ] || line=$(grep -vE '^\s*$' "$1" 2>/dev/null | tail -n 1)
  printf '%s' "${line:0:80}"
}

limited() {  # limited <seconds, 0 for none> <command...>: only a command without a limit may be a function
  local limit="$1"
  shift
  if [ "$limit" = 0 ]; then "$@"; else timeout "$limit" "$@"; fi
}

# step [--may-skip] <name> <log> <limit s, 0 for none> <command...>: runs the command into
# $logs/<log> and records its row; returns its status. --may-skip: Catch2's 4 (every test skipped,
# as the two-GPU tests do on one GPU) is a row "skipped", not a failure.
step() {
  local may_skip=0
  if [ "$1" = --may-skip ]; then may_skip=1; shift; fi
  local name="$1" log="$logs/$2" limit="$3" begun=$SECONDS rc
  shift 3
  echo "==> $name"
  running="$name" running_since=$SECONDS
  limited "$limit" "$@" >"$log" 2>&1
  rc=$?
  running=""
  if [ $may_skip = 1 ] && [ $rc = 4 ]; then
    record "$name" skipped $((SECONDS - begun)) "$(outcome "$log")"
  else
    record "$name" $rc $((SECONDS - begun)) "$(outcome "$log")"
  fi
  return $rc
}

# measure <name> <stderr log> <limit s, 0 for none> <command...>: a benchmark's step, its lines
# (CSV) to the screen and to $logs/results.csv, its errors to $logs/<stderr log>.
measure() {
  local name="$1" log="$logs/$2" limit="$3" begun=$SECONDS rc lines last=""
  shift 3
  echo "==> $name"
  lines=$(wc -l <"$logs/results.csv" 2>/dev/null || echo 0)
  running="$name" running_since=$SECONDS
  limited "$limit" env PYTHONUNBUFFERED=1 "$@" 2>>"$log" | tee -a "$logs/results.csv"
  rc=$?
  running=""
  [ "$(wc -l <"$logs/results.csv")" -eq "$lines" ] || last=$(tail -n 1 "$logs/results.csv")
  record "$name" $rc $((SECONDS - begun)) "${last:0:80}"
  [ $rc -eq 0 ] || tail -n 20 "$log"
  return $rc
}

# configure [cmake args...]: build-gpu, RelWithDebInfo, Torch + CUDA, the benchmarks too (every
# subcommand configures alike, so that one build serves them all); ends the run if it fails. The
# GPU architecture: TORCH_CUDA_ARCH_LIST and CMAKE_CUDA_ARCHITECTURES, else the first GPU's
# compute capability.
configure() {
  local arch_args=() capability
  capability=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
  if [ -n "$capability" ]; then
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$capability}"
    arch_args+=(-DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES:-${capability/./}}")
  fi
  step "configure (torch + cuda)" configure.log 0 cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCGT_WITH_TORCH=ON -DCGT_WITH_CUDA=ON -DCGT_BUILD_BENCHMARKS=ON "${arch_args[@]}" "$@" ||
    { tail -n 30 "$logs/configure.log"; exit 1; }
}

build() {  # build [target...]: every target when none is named; ends the run if it fails
  local targets=() name="build (every target)"
  [ $# -eq 0 ] || { targets=(--target "$@"); name="build (targets: $#)"; }
  echo "build targets: ${*:-all}"
  step "$name" build.log 0 cmake --build "$build" -j "$jobs" "${targets[@]}" && return 0
  if grep -qE "error|FAILED:" "$logs/build.log"; then
    grep -E "error|FAILED:" -A5 "$logs/build.log" | head -n 80
  else
    tail -n 40 "$logs/build.log"
  fi
  exit 1
}

# in_background <name> <log> <limit s, 0 for none> <command...>: starts an export (Python) beside
# the build; await <name> waits for it and records its row.
in_background() {
  local name="$1" log="$2" limit="$3"
  shift 3
  timeout "$limit" env PYTHONUNBUFFERED=1 "$@" >"$logs/$log" 2>&1 &
  background_pid[$name]=$!
  background_log[$name]=$log
  background_begun[$name]=$SECONDS
}
await() {
  local name="$1" rc
  wait "${background_pid[$name]}"
  rc=$?
  unset "background_pid[$name]"
  record "$name" $rc $((SECONDS - ${background_begun[$name]})) "$(outcome "$logs/${background_log[$name]}")"
  return $rc
}

tool() {  # tool <name>: a CUDA toolkit program, from the path or /usr/local/cuda/bin
  command -v "$1" || echo "/usr/local/cuda/bin/$1"
}

# sanitize <row> <name> <test binary> <Catch2 spec> <leak check: full|no> <limit s> [options...]:
# compute-sanitizer memcheck over the tests the spec picks. Every error, and with full every leak,
# fails the row: scripts/memcheck-report.py lists them from the XML report. Writes
# memcheck-<name>.{log,xml,txt}; prints the .txt (the records, then their count and the tests' count).
sanitize() {
  local row="$1" name="$2"
  shift 2
  step "$row" "memcheck-$name.txt" 0 memcheck_tests "$name" "$@"
  local rc=$?
  cat "$logs/memcheck-$name.txt"
  return $rc
}
memcheck_tests() {  # the body of sanitize, same arguments less the row
  local name="$1" binary="$2" spec="$3" leaks="$4" limit="$5" tests report found count
  shift 5
  timeout "$limit" "$(tool compute-sanitizer)" --tool memcheck --leak-check "$leaks" "$@" \
    --xml --save "$logs/memcheck-$name.xml" "$build/tests/$binary" "$spec" >"$logs/memcheck-$name.log" 2>&1
  tests=$?
  [ $tests -ne 124 ] || { echo "memcheck stopped at its limit of $limit s"; return 124; }
  report=$(python3 scripts/memcheck-report.py "$logs/memcheck-$name.xml")
  found=$?
  sed '$d' <<<"$report"  # each record; its last line, the count of records, ends the row's outcome below
  [ $tests -eq 0 ] || echo "the tests under memcheck exited with $tests"
  count=$(grep -E '^test cases|^All tests passed|^No tests ran' "$logs/memcheck-$name.log" | tail -n 1)
  echo "$(tail -n 1 <<<"$report"); ${count:-no test count}"
  [ $found -eq 0 ] || return 1
  return $tests
}

# example <name> <log> <lines to print, 0 for all> [arguments...]: runs examples/<name> in the
# logs folder (an example writes its files where it runs).
example() {
  local name="$1" log="$2" lines="$3"
  shift 3
  # shellcheck disable=SC2016 # the inner bash expands them
  step "example $name" "$log" 300 bash -c 'cd "$1" && shift && exec "$@"' _ "$logs" "$root/$build/examples/$name" "$@"
  if [ "$lines" = 0 ]; then cat "$logs/$log"; else tail -n "$lines" "$logs/$log"; fi
}
