// The memory contract on one card (cgt.cuda), in one run (bench/results/memory-contract.md):
//  1. what each recording was predicted to add to the pool (from its warm-up) against what it
//     added, at six batch sizes;
//  2. the graphs of six sizes in one shared pool (recorded smallest first, and largest first)
//     against one pool per graph: segments plus executables;
//  3. a budget of 60% of what the six graphs take, serving a mix of sizes: evicting the coldest
//     graphs against running eagerly, against no budget (calls recorded, evicted, eager; wall time);
//  4. sleep and wake of a sleepable pool: bytes given back, the device's free memory, the time of
//     sleep() and of the first call after it (wake and replay) against a replay.
// The work: a stack of 8 layers whose activations stay alive to the end of the call, as a forward
// pass's do, and a scratch block per layer; `width` floats per row, batch rows.
//
//   memory_bench [calls per mix]   prints the tables, then "memory,<section>,<key>,<value>" lines
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels.hpp"

import cgt;
import cgt.cuda;

namespace {

constexpr std::int64_t kWidth = std::int64_t{1} << 14;  // floats per row: 64 KiB
constexpr int kLayers = 8;
const std::vector<std::int64_t> kBatches{1, 8, 32, 64, 128, 256};

template <class T>
T must(cgt::Result<T> result) {
  if (!result) {
    std::cerr << "memory_bench: " << result.error().describe() << "\n";
    std::exit(1);
  }
  return std::move(*result);
}
void must(cgt::Result<void> result) {
  if (!result) {
    std::cerr << "memory_bench: " << result.error().describe() << "\n";
    std::exit(1);
  }
}

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// The layer stack: each layer's activation is pool memory alive until the call returns; a
// scratch block per layer is freed when the call ends.
cgt::cuda::Values stack(cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
  const std::int64_t n = static_cast<std::int64_t>(in[0].numel());
  std::vector<cgt::cuda::Buffer> activations;
  const float* previous = in[0].as<float>();
  for (int layer = 0; layer < kLayers; ++layer) {
    cgt::cuda::Buffer scratch = ctx.allocate(cgt::ElementType::f32, {n});
    (void)cgt_test::sum_inputs(previous, nullptr, nullptr, nullptr, scratch.as<float>(), n, ctx.stream());
    cgt::cuda::Buffer activation = ctx.allocate(cgt::ElementType::f32, {n});
    (void)cgt_test::sum_inputs(scratch.as<float>(), previous, nullptr, nullptr, activation.as<float>(), n,
                               ctx.stream());
    previous = activation.as<float>();
    activations.push_back(std::move(activation));
  }
  return cgt::cuda::Values{activations.back()};
}

cgt::cuda::Buffer input(std::int64_t batch) {
  cgt::cuda::Buffer x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {batch * kWidth}));
  must(x.write(std::vector<double>(static_cast<std::size_t>(batch * kWidth), 1.0)));
  return x;
}

struct Made {
  cgt::cuda::Pool pool;
  cgt::cuda::Function f;
};

Made make(const cgt::Options& tree, bool sleepable = false, std::size_t segment_bytes = std::size_t{64} << 20) {
  cgt::cuda::PoolOptions options;
  options.tree = tree;
  options.sleepable = sleepable;
  options.arena.segment_bytes = segment_bytes;
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  auto f = must(pool.add_function(stack, {.name = "stack"}));
  return {std::move(pool), std::move(f)};
}

// A call in a new step, on the pool's stream, waited for; its kind.
cgt::CallKind call(Made& made, const cgt::cuda::Buffer& x) {
  made.pool.mark_step_begin();
  auto out = must(made.f({x}));
  must(must(made.pool.device()).get().synchronize());
  return out.kind();
}

// Warm-up and recording of each batch in `order`.
void record_all(Made& made, const std::vector<std::int64_t>& order, const std::vector<cgt::cuda::Buffer>& inputs) {
  for (const std::int64_t batch : order) {
    const auto at = std::ranges::find(kBatches, batch) - kBatches.begin();
    (void)call(made, inputs[static_cast<std::size_t>(at)]);
    (void)call(made, inputs[static_cast<std::size_t>(at)]);
  }
}

std::size_t free_device_bytes() {
  std::size_t free = 0;
  std::size_t total = 0;
  (void)cudaMemGetInfo(&free, &total);
  return free;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 300;
  if (cgt::cuda::device_count() == 0) {
    std::cerr << "memory_bench: no CUDA device\n";
    return 2;
  }
  std::vector<cgt::cuda::Buffer> inputs;
  for (const std::int64_t batch : kBatches) inputs.push_back(input(batch));
  std::vector<std::string> lines;  // the machine-readable lines, printed last

  // 1. Prediction against what each recording added, sizes recorded smallest first.
  std::cout << "## What a recording adds to the pool: predicted from its warm-up, and measured (2 MiB segments)\n\n"
            << "| batch | activations + scratch per call | predicted | added | error |\n|---|---|---|---|---|\n";
  std::size_t shared_smallest_first = 0;
  {
    Made made = make({}, false, std::size_t{2} << 20);  // small segments: each size adds some
    for (std::size_t i = 0; i < kBatches.size(); ++i) {
      (void)call(made, inputs[i]);
      (void)call(made, inputs[i]);
      std::vector<cgt::Node> path = made.pool.current_path();
      const cgt::NodeMemory memory = path.back().memory();
      const std::size_t predicted = memory.predicted_pool_bytes.value_or(0);
      const double error = memory.pool_bytes == 0
                               ? (predicted == 0 ? 0.0 : 100.0)
                               : 100.0 * (static_cast<double>(predicted) - static_cast<double>(memory.pool_bytes)) /
                                     static_cast<double>(memory.pool_bytes);
      const std::size_t per_call = static_cast<std::size_t>(kBatches[i] * kWidth) * 4 * 2 * kLayers;
      std::printf("| %lld | %.1f MiB | %.1f MiB | %.1f MiB | %+.2f%% |\n", static_cast<long long>(kBatches[i]),
                  mib(per_call), mib(predicted), mib(memory.pool_bytes), error);
      lines.push_back("memory,prediction," + std::to_string(kBatches[i]) + "," + std::to_string(predicted) + "," +
                      std::to_string(memory.pool_bytes));
    }
  }
  {
    Made made = make({});
    record_all(made, kBatches, inputs);
    shared_smallest_first = made.pool.memory_report().budgeted_bytes();
  }

  // 2. One shared pool against one pool per graph.
  std::size_t shared_largest_first = 0;
  std::size_t largest_alone = 0;
  std::size_t executables = 0;
  {
    std::vector<std::int64_t> descending(kBatches.rbegin(), kBatches.rend());
    Made made = make({});
    record_all(made, descending, inputs);
    const cgt::MemoryReport report = made.pool.memory_report();
    shared_largest_first = report.budgeted_bytes();
    executables = report.executable_bytes;
  }
  std::size_t per_graph_pools = 0;
  for (std::size_t i = 0; i < kBatches.size(); ++i) {
    Made made = make({});
    record_all(made, {kBatches[i]}, inputs);
    per_graph_pools += made.pool.memory_report().budgeted_bytes();
    if (i + 1 == kBatches.size()) largest_alone = made.pool.memory_report().budgeted_bytes();
  }
  std::cout << "\n## Six graphs (batch 1 to 256) in one pool against one pool per graph (segments + executables)\n\n"
            << "| layout | MiB | against the largest graph alone |\n|---|---|---|\n";
  auto row = [&](const char* name, std::size_t bytes) {
    std::printf("| %s | %.1f | %.2fx |\n", name, mib(bytes),
                static_cast<double>(bytes) / static_cast<double>(largest_alone));
    lines.push_back(std::string("memory,layout,") + name + "," + std::to_string(bytes));
  };
  row("largest graph alone (batch 256)", largest_alone);
  row("one pool (recorded largest first)", shared_largest_first);
  row("one pool (recorded smallest first)", shared_smallest_first);
  row("one pool per graph", per_graph_pools);
  std::printf("\nExecutables of the six graphs: %.2f MiB in all (measured at instantiation).\n", mib(executables));

  // 3. A budget of 60% of the six graphs, serving a mix of sizes (each call a size drawn in turn,
  // the small ones more often, as a server's batches are).
  const std::size_t budget = shared_smallest_first * 6 / 10;
  std::cout << "\n## A budget of " << static_cast<long long>(mib(budget)) << " MiB (60% of the six graphs), " << calls
            << " calls of a mix of sizes\n\n"
            << "| policy | recordings | evictions | eager calls | replays | peak MiB | wall us per call |\n"
            << "|---|---|---|---|---|---|---|\n";
  const std::vector<std::size_t> mix{0, 1, 0, 2, 1, 3, 0, 4, 1, 5, 2, 0};
  struct Policy {
    const char* name;
    std::size_t budget;
    cgt::OverBudget over;
  };
  for (const Policy& policy : {Policy{"no budget", 0, cgt::OverBudget::run_eagerly},
                               Policy{"evict_coldest", budget, cgt::OverBudget::evict_coldest},
                               Policy{"run_eagerly", budget, cgt::OverBudget::run_eagerly}}) {
    cgt::Options tree;
    tree.memory_budget_bytes = policy.budget;
    tree.over_budget = policy.over;
    tree.log_sink = [](const cgt::Event&) {};
    Made made = make(tree);
    std::size_t peak = 0;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      (void)call(made, inputs[mix[static_cast<std::size_t>(i) % mix.size()]]);
      peak = std::max(peak, made.pool.memory_report().budgeted_bytes());
    }
    const double us = 1e6 * seconds_since(start) / calls;
    const cgt::Stats stats = made.pool.stats();
    std::printf("| %s | %llu | %llu | %llu | %llu | %.1f | %.1f |\n", policy.name,
                static_cast<unsigned long long>(stats.recordings), static_cast<unsigned long long>(stats.evictions),
                static_cast<unsigned long long>(stats.eager_calls), static_cast<unsigned long long>(stats.replays),
                mib(peak), us);
    lines.push_back(std::string("memory,budget,") + policy.name + "," + std::to_string(stats.recordings) + "," +
                    std::to_string(stats.evictions) + "," + std::to_string(stats.eager_calls) + "," +
                    std::to_string(peak) + "," + std::to_string(us));
  }

  // 4. Sleep and wake.
  {
    Made made = make({}, true);
    record_all(made, {256, 128, 64, 32, 8, 1}, inputs);
    const std::size_t reserved = made.pool.memory().reserved_bytes;
    auto replay_us = [&](std::size_t which) {
      const auto start = std::chrono::steady_clock::now();
      (void)call(made, inputs[which]);
      return 1e6 * seconds_since(start);
    };
    double steady = 0;
    for (int i = 0; i < 20; ++i) steady = replay_us(5);
    const std::size_t free_awake = free_device_bytes();
    const auto start = std::chrono::steady_clock::now();
    const std::size_t released = must(made.pool.sleep());
    const double sleep_ms = 1e3 * seconds_since(start);
    const std::size_t free_asleep = free_device_bytes();
    const double first_us = replay_us(5);
    std::cout << "\n## Sleep and wake (a sleepable pool holding the six graphs)\n\n"
              << "| pool reserved | given back | device free memory gained | sleep() | first call after (wake + "
                 "replay, batch 256) | a replay |\n|---|---|---|---|---|---|\n";
    std::printf("| %.1f MiB | %.1f MiB (%.1f%%) | %.1f MiB | %.2f ms | %.0f us | %.0f us |\n", mib(reserved),
                mib(released), 100.0 * static_cast<double>(released) / static_cast<double>(reserved),
                mib(free_asleep > free_awake ? free_asleep - free_awake : 0), sleep_ms, first_us, steady);
    lines.push_back("memory,sleep," + std::to_string(reserved) + "," + std::to_string(released) + "," +
                    std::to_string(sleep_ms) + "," + std::to_string(first_us) + "," + std::to_string(steady));
    if (made.pool.stats().recordings != kBatches.size()) {
      std::cerr << "memory_bench: a graph was recorded again after wake\n";
      return 1;
    }
  }
  std::cout << "\n";
  for (const std::string& line : lines) std::cout << line << "\n";
  return 0;
}
