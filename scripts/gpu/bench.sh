# scripts/gpu.sh's benchmark subcommands: bench, bench-training, bench-models, training,
# profile-training. Each writes its CSV lines to results.csv and its tables beside it, ready for
# bench/results/.
# shellcheck shell=bash

# bench [calls]: gpu_bench and PyTorch's Python trees on the same work (overhead, memory, scaling,
# capture), and the training benchmark (training_benchmark); writes overhead.md, memory.md,
# scaling.md, capture.md, scaling.png, training.md.
cmd_bench() {
  local calls="${1:-3000}" rounds=3 round what
  local package="$root/$build/training-step.pt2"
  keep+=(results.csv overhead.md memory.md scaling.md capture.md scaling.png overhead.png)
  # The benchmark transformer's training step as an AOTInductor package, exported beside the build.
  in_background "export training-step.pt2" export-training.log 400 python3 scripts/aoti_training.py "$package"
  configure
  build gpu_bench training_bench
  : >"$logs/results.csv"
  # The overhead table compares two processes (C++ and Python), and the machine's speed drifts over
  # tens of seconds: they take turns, in rounds, and the report keeps each cell's median round.
  for round in $(seq "$rounds"); do
    measure "gpu_bench overhead, round $round" cpp.log 0 "$build/bench/gpu_bench" overhead $((calls / rounds)) || exit 1
    measure "pytorch_trees overhead, round $round" pytorch.log 0 python3 bench/pytorch_trees.py overhead $((calls / rounds)) || exit 1
  done
  for what in memory scaling capture; do
    measure "gpu_bench $what" cpp.log 0 "$build/bench/gpu_bench" "$what" "$calls" || exit 1
  done
  measure "pytorch_trees memory" pytorch.log 0 python3 bench/pytorch_trees.py memory || exit 1
  measure "pytorch_trees capture" pytorch.log 0 python3 bench/pytorch_trees.py capture || exit 1
  await "export training-step.pt2"
  step "report" report.log 0 python3 bench/report.py "$logs/results.csv" "$logs" "$commit" "$gpu"
  cat "$logs/report.log"
  training_benchmark 200 "$package" 0
}

# training_benchmark <steps> <AOTInductor package> <PyTorch's limit per configuration, 0 for none>:
# training_bench and bench/training.py in each configuration (fp32, tf32, the modern loop), the
# modern loop's loss curves (training_bench curve), and the report: training.md, training.png,
# training-loss.png. The CSV lines go to results.csv. TRAINING_CONFIGURATIONS: the configurations
# (default "fp32 tf32 loop"; the curves come with loop).
training_benchmark() {
  local steps="$1" package="$2" limit="$3" configuration configurations
  read -ra configurations <<<"${TRAINING_CONFIGURATIONS:-fp32 tf32 loop}"
  keep+=(training.md training.png training-loss.png)
  if [ -f "$package" ]; then export CGT_TRAINING_PACKAGE="$package"; fi
  for configuration in "${configurations[@]}"; do
    measure "training_bench $configuration" training-cpp.log 0 "$build/bench/training_bench" "$steps" "$configuration"
    measure "bench/training.py $configuration" training-pytorch.log "$limit" python3 bench/training.py "$steps" "$configuration"
  done
  tail -n 5 "$logs/training-pytorch.log"
  # 600 lines: to a log, and from it to results.csv for the report.
  if [[ " ${configurations[*]} " == *" loop "* ]]; then
    step "training_bench curve" training-curve.log 0 "$build/bench/training_bench" 200 curve &&
      grep '^loss,' "$logs/training-curve.log" >>"$logs/results.csv"
  fi
  step "training report" training-report.log 0 python3 bench/training_report.py "$logs/results.csv" "$logs" "$commit" "$gpu"
  cat "$logs/training-report.log"
}

# bench-training [steps]: the training benchmark alone (training_benchmark), built while the
# benchmark transformer's AOTInductor package exports.
cmd_bench_training() {
  local steps="${1:-200}" package="$root/$build/training-step.pt2"
  keep+=(results.csv)
  in_background "export training-step.pt2" export-training.log 400 python3 scripts/aoti_training.py "$package"
  configure
  build training_bench
  await "export training-step.pt2"
  : >"$logs/results.csv"
  training_benchmark "$steps" "$package" "${PY_TIMEOUT:-300}"
}

# overhead [calls]: only the CPU cost per call of bench's overhead table (gpu_bench and PyTorch's
# Python trees taking turns in rounds), for a change to the call path, then where a replay's time
# over a raw launch goes (gpu_bench diagnose); writes overhead.md and diagnose.md.
cmd_overhead() {
  local calls="${1:-3000}" rounds=3 round
  keep+=(results.csv overhead.md overhead.png diagnose.md)
  configure
  build gpu_bench
  : >"$logs/results.csv"
  for round in $(seq "$rounds"); do
    measure "gpu_bench overhead, round $round" cpp.log 0 "$build/bench/gpu_bench" overhead $((calls / rounds)) || exit 1
    measure "pytorch_trees overhead, round $round" pytorch.log 0 python3 bench/pytorch_trees.py overhead $((calls / rounds)) || exit 1
  done
  measure "gpu_bench diagnose" cpp.log 0 "$build/bench/gpu_bench" diagnose "$calls" || exit 1
  step "report" report.log 0 python3 bench/report.py "$logs/results.csv" "$logs" "$commit" "$gpu"
  sed -n '/^==> overhead.md/,/^==> memory.md/p' "$logs/report.log" | sed '$d'
}

# bench-loop [generations]: greedy decoding per token (bench/loop_bench: eager libtorch, a replay
# per token reading the stop condition or not, the device loop at 1, 4 and 8 tokens per
# iteration, one graph with every token unrolled; generations per row, default 20), the same
# decoding under PyTorch's reduce-overhead (bench/loop_decode.py; PY_TIMEOUT) and the GPU
# time of a WHILE, IF and SWITCH node (bench/conditional_nodes); writes loop.md.
cmd_bench_loop() {
  local generations="${1:-20}"
  keep+=(loop.md loop.png)
  configure
  build loop_bench conditional_nodes
  step "loop_bench" loop.log 0 "$build/bench/loop_bench" "$generations" || exit 1
  step "loop_decode.py (reduce-overhead)" python.log "${PY_TIMEOUT:-600}" python3 bench/loop_decode.py "$generations" || exit 1
  step "conditional_nodes" nodes.log 0 "$build/bench/conditional_nodes" 1000 20 || exit 1
  step "plot" plot.log 0 python3 bench/plot_loop.py "$logs/loop.png" "$logs/loop.log" "$logs/python.log"
  {
    echo "# Loops decided on the GPU: $gpu, commit $commit"
    echo
    grep -E '^(#|\|)' "$logs/loop.log"
    echo
    grep -E '^(#|\|)' "$logs/python.log"
    echo
    grep -E '^(#|\|)' "$logs/nodes.log"
    [ ! -f "$logs/loop.png" ] || printf '\n![Greedy decoding per token: wall and host CPU](loop.png)\n'
  } >"$logs/loop.md"
  cat "$logs/loop.md"
}

# bench-memory [calls]: the memory contract on cgt.cuda (bench/memory_bench: predicted against
# recorded growth, one pool against one per graph, a budget serving a mix of sizes with `calls`
# calls, default 300; sleep and wake); writes memory-contract.md and memory-contract.png.
cmd_bench_memory() {
  local calls="${1:-300}"
  keep+=(memory-contract.md memory-contract.png)
  configure
  build memory_bench
  step "memory_bench" memory.log 0 "$build/bench/memory_bench" "$calls" || exit 1
  step "plot" plot.log 0 python3 bench/plot_memory.py "$logs/memory-contract.png" "$logs/memory.log"
  {
    echo "# The memory contract (cgt.cuda): $gpu, commit $commit"
    echo
    grep -vE '^memory,' "$logs/memory.log"
    [ ! -f "$logs/memory-contract.png" ] || printf '\n![Predicted against recorded growth; pool layouts](memory-contract.png)\n'
  } >"$logs/memory-contract.md"
  cat "$logs/memory-contract.md"
}

# bench-models [calls] [model...]: BERT-base and ResNet-18 (bert, resnet; default both) with random
# weights, exported here from the machine's transformers / torchvision (nothing downloaded), served
# by eager PyTorch, reduce-overhead, eager libtorch and cgt.torch (TorchScript and AOTInductor);
# calls: timed calls per cell (default 150). PHASES (default "export build python cpp python2 cpp2
# report") picks phases: python2 and cpp2 serve again (Python and C++ take turns, so that a drift
# of the machine reaches both; the report averages the passes). The exported models
# (build-gpu/bench-models) and the build are reused when present, so a second run can skip them.
cmd_bench_models() {
  local calls="${1:-150}"
  shift || true
  local models=("$@") dir="$root/$build/bench-models" model
  [ ${#models[@]} -gt 0 ] || models=(bert resnet)
  phases=" ${PHASES:-export build python cpp python2 cpp2 report} "
  keep+=(results.csv models.md models.png)
  mkdir -p "$dir"
  if has_phase export; then  # AOTInductor compiles C++ and Triton: minutes; one process per model
    for model in "${models[@]}"; do
      in_background "export $model" "export-$model.log" 0 python3 bench/models/models.py export "$dir" "$model"
    done
  fi
  if has_phase build; then
    configure
    build model_bench
  fi
  if has_phase export; then
    for model in "${models[@]}"; do
      await "export $model"
      grep -E "^export|Error|error" "$logs/export-$model.log" | tail -n 10
    done
  fi
  ls -la "$dir" >"$logs/models.txt"
  touch "$logs/results.csv"
  if has_phase python; then
    measure "Python: eager, trees, reduce-overhead" python.log 0 \
      env CALLS="$calls" python3 bench/models/models.py measure "$dir" "${models[@]}"
  fi
  if has_phase cpp; then serve_models_cpp "$calls" 0 "${models[@]}"; fi
  if has_phase python2; then
    measure "Python, second pass" python.log 0 \
      env SECOND_PASS=1 CALLS="$calls" python3 bench/models/models.py measure "$dir" "${models[@]}"
  fi
  if has_phase cpp2; then serve_models_cpp "$calls" 1 "${models[@]}"; fi
  if has_phase report; then
    step "report" report.log 0 python3 bench/models/report.py "$logs/results.csv" "$logs" "$commit" "$gpu"
    echo "bench/models/report.py wrote $logs/models.md:"
    grep -E "^## |^\| [0-9]+ \| [0-9.]+x|^\| [0-9]+ \| (AOTI|TorchScript)|^\| (cgt|PyTorch).*\| [0-9.]+ \| [0-9. ]+ \|$" \
      "$logs/models.md"
  fi
}
has_phase() { [[ $phases == *" $1 "* ]]; }  # has_phase <phase>: PHASES names it (cmd_bench_models)
serve_models_cpp() {  # serve_models_cpp <calls> <second pass: 0|1> <model...>: model_bench, one model at a time
  local calls="$1" second="$2" model
  shift 2
  for model in "$@"; do
    if [ "$second" = 1 ]; then
      measure "C++: $model, second pass" cpp.log 0 env CGT_BENCH_SECOND_PASS=1 \
        "$build/bench/model_bench" "$root/$build/bench-models" "$model" "$calls"
    else
      measure "C++: $model" cpp.log 0 "$build/bench/model_bench" "$root/$build/bench-models" "$model" "$calls"
    fi
  done
}

# training [steps]: training with graphs, focused. Builds the training tests, the training
# benchmark and examples/torch_training while the AOTInductor training steps export (the test's
# small MLP and the benchmark's transformer: scripts/aoti_training.py); runs the [training] and
# [autograd] tests, three training tests under memcheck, the example, and the benchmark (C++ and
# PyTorch, `steps` steps, default 200); writes results.csv, training.md and diffs.txt (each
# graph's difference from eager, also printed above the table).
cmd_training() {
  local steps="${1:-200}" packages="$root/$build/training-models"
  keep+=(results.csv diffs.txt)
  mkdir -p "$packages"
  in_background "export train_mlp.pt2" export-test.log 400 python3 scripts/export-test-models.py "$packages" --training-only
  in_background "export training-step.pt2" export-bench.log 400 python3 scripts/aoti_training.py "$packages/training-step.pt2"
  configure
  build cgt_torch_training_tests cgt_torch_tests training_bench torch_training
  await "export train_mlp.pt2"
  export CGT_TEST_MODELS="$packages"
  step "[training] tests" tests.log 180 "$build/tests/cgt_torch_training_tests" "[training]"
  grep -E "graph vs eager|per-function:|vs libtorch|vs eager, 100|FAILED|failed|with expansion|REQUIRE|CHECK" \
    "$logs/tests.log" | head -n 60
  grep -E "graph vs eager|per-function:|vs libtorch|vs eager, 100" -A1 "$logs/tests.log" | grep -v "^--" |
    sed 's/^/  /' >"$logs/diffs.txt"
  mapfile -t notes <"$logs/diffs.txt"
  # The autograd functions (their gradient buffers adopt an optimizer's `.grad`).
  step "[autograd] tests" autograd.log 120 "$build/tests/cgt_torch_tests" "[autograd]"
  grep -E "FAILED|with expansion" -A3 "$logs/autograd.log" | head -n 30
  # Leaks are not checked: the backward runs on autograd's device thread, whose cuBLAS handle
  # libtorch never destroys (as in memcheck_suites, scripts/gpu/tests.sh).
  sanitize "memcheck grad_replaced, optimizer_step" training-errors cgt_torch_training_tests \
    "training/grad_replaced_by_another_tensor_is_an_error,training/optimizer_step_refuses_what_a_graph_cannot_follow" no 60
  sanitize "memcheck per_step_grads (200 steps)" training-per-step cgt_torch_training_tests \
    "training/per_step_grads_whole_step_graph_trains_as_eager" no 60
  example torch_training example.log 0
  await "export training-step.pt2"
  : >"$logs/results.csv"
  training_benchmark "$steps" "$packages/training-step.pt2" "${PY_TIMEOUT:-300}"
}

# profile-training [fp32|tf32]: where the whole-step training graph's GPU time goes. Times the
# whole-step graph (per-step gradients), then runs it under Nsight Compute (ncu) for a few steps
# and writes GPU time per kernel name per step to kernels-<precision>.md (bench/kernel_summary.py).
cmd_profile_training() {
  local precision="${1:-fp32}" method="whole-step graph (per-step"
  keep+=("kernels-$precision.md" "ncu-$precision.csv")
  configure
  build training_bench
  step "training_bench $precision" "timed-$precision.log" 300 \
    env CGT_BENCH_METHOD="$method" "$build/bench/training_bench" 200 "$precision"
  cat "$logs/timed-$precision.log"
  step "ncu, 3 steps" "ncu-$precision.err" 0 ncu_training "$method" "$precision" ||
    { tail -n 5 "$logs/ncu-$precision.err"; exit 1; }
  step "kernel summary" "kernels-$precision.md" 0 python3 bench/kernel_summary.py "$logs/ncu-$precision.csv"
  cat "$logs/kernels-$precision.md"
}
ncu_training() {  # ncu_training <method> <precision>: ncu's CSV to ncu-<precision>.csv, its messages to stderr
  timeout 300 env CGT_BENCH_METHOD="$1" "$(tool ncu)" --metrics gpu__time_duration.sum --print-summary per-kernel \
    --csv "$build/bench/training_bench" 3 "$2" >"$logs/ncu-$2.csv"
}
