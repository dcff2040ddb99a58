// The decode step of a tensor-parallel transformer MLP stack, eager libtorch against cgt.torch,
// over the GPUs of this machine (one thread, one NCCL rank and one cgt pool per GPU; a single GPU
// is one rank). Each of `layers` layers is x = x + MLP(x), the MLP split Megatron-style
// (tests/multi/tp_mlp.hpp: column-parallel linear, GELU, row-parallel linear, NCCL all-reduce), so
// a step is `layers` all-reduces among small matrix products: launch-bound at decode batch sizes.
//
//   tp_bench [steps per batch size] [layers] [hidden] [max ranks]
//
// Prints a markdown table, one row per batch size 1..8: CPU (the calling thread's time to issue
// one step, before waiting for it) and wall (issue and wait, one step at a time) per step, for
// eager and cgt (replays), and the largest difference between their outputs. Rank 0's numbers;
// every rank runs the same steps at the same time (the all-reduces keep them in step).
#include <torch/torch.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "multi/nccl_ranks.hpp"
#include "multi/tp_mlp.hpp"

import cgt;
import cgt.torch;

namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::int64_t batch = 0;
  double eager_cpu_us = 0, eager_wall_us = 0, cgt_cpu_us = 0, cgt_wall_us = 0, max_difference = 0;
  std::uint64_t cgt_eager_calls = 0, cgt_replays = 0;
};

void drain() {
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("cudaDeviceSynchronize failed");
}

double micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// The step of one rank: the residual stack of MLP shards.
at::Tensor decode_step(const std::vector<cgt_test::MlpShard>& shards, at::Tensor x) {
  for (const cgt_test::MlpShard& shard : shards) x = x + shard.forward(x);
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 8;
  const std::int64_t hidden = argc > 3 ? std::atoll(argv[3]) : 1024;
  const int max_ranks = argc > 4 ? std::atoi(argv[4]) : 8;
  if (!cgt::torch::is_available()) {
    std::cout << "tp_bench: no CUDA device\n";
    return 0;
  }
  const int ranks = std::min(static_cast<int>(torch::cuda::device_count()), max_ranks);
  std::vector<cgt_test::MlpWeights> weights;
  for (int l = 0; l < layers; ++l) weights.push_back(cgt_test::MlpWeights::make(hidden, 1000 + l));
  const cgt_test::Communicators comms(ranks);  // before any capture
  std::vector<Row> rows;
  std::barrier together(ranks);
  try {
    cgt_test::run_ranks(ranks, [&](int rank) {
      std::vector<cgt_test::MlpShard> shards;
      for (int l = 0; l < layers; ++l) shards.emplace_back(weights[l], rank, ranks, comms[rank]);
      auto pool = cgt::torch::make_pool({.device = static_cast<std::int16_t>(rank)});
      if (!pool) throw std::runtime_error(pool.error().describe());
      auto step = pool->add_function(
          [&shards](cgt::torch::Inputs in) { return cgt::torch::Values{decode_step(shards, in[0])}; },
          {.name = "tp_decode_step"});
      if (!step) throw std::runtime_error(step.error().describe());
      for (std::int64_t batch = 1; batch <= 8; ++batch) {
        at::manual_seed(static_cast<std::uint64_t>(batch));  // every rank the same input
        const at::Tensor x = at::randn({batch, hidden}).to(at::TensorOptions().device(at::kCUDA, rank));
        Row row{.batch = batch};
        // Eager: libtorch and NCCL on the thread's current stream.
        at::Tensor eager_out;
        for (int i = 0; i < 10; ++i) eager_out = decode_step(shards, x);
        drain();
        together.arrive_and_wait();
        Clock::duration issue{}, wall{};
        for (int i = 0; i < steps; ++i) {
          const auto begin = Clock::now();
          eager_out = decode_step(shards, x);
          const auto issued = Clock::now();
          drain();
          issue += issued - begin;
          wall += Clock::now() - begin;
        }
        row.eager_cpu_us = micros(issue) / steps;
        row.eager_wall_us = micros(wall) / steps;
        // cgt: warm-up and recording, then replays.
        const cgt::Stats before = pool->stats();
        at::Tensor cgt_out;
        for (int i = 0; i < 5; ++i) {
          pool->mark_step_begin();
          auto out = (*step)({x});
          if (!out) throw std::runtime_error(out.error().describe());
          cgt_out = out->get(0)->get().clone();
        }
        drain();
        together.arrive_and_wait();
        issue = {};
        wall = {};
        for (int i = 0; i < steps; ++i) {
          const auto begin = Clock::now();
          pool->mark_step_begin();
          auto out = (*step)({x});
          const auto issued = Clock::now();
          if (!out) throw std::runtime_error(out.error().describe());
          drain();
          issue += issued - begin;
          wall += Clock::now() - begin;
        }
        row.cgt_cpu_us = micros(issue) / steps;
        row.cgt_wall_us = micros(wall) / steps;
        const cgt::Stats after = pool->stats();
        row.cgt_eager_calls = after.eager_calls - before.eager_calls;
        row.cgt_replays = after.replays - before.replays;
        row.max_difference = (cgt_out - eager_out).abs().max().item<double>();
        if (rank == 0) rows.push_back(row);
        together.arrive_and_wait();
      }
    });
  } catch (const std::exception& error) {
    std::cerr << "tp_bench: " << error.what() << '\n';
    return 1;
  }
  std::printf(
      "\nTensor-parallel MLP decode step: %d rank(s), %d layers, hidden %lld, %d steps per row "
      "(us per step, rank 0)\n\n",
      ranks, layers, static_cast<long long>(hidden), steps);
  std::printf(
      "| ranks | batch | eager CPU | eager wall | cgt CPU | cgt wall | wall speed-up | cgt replays | "
      "cgt eager calls | max abs diff |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& row : rows) {
    std::printf("| %d | %lld | %.1f | %.1f | %.1f | %.1f | %.2fx | %llu | %llu | %.2g |\n", ranks,
                static_cast<long long>(row.batch), row.eager_cpu_us, row.eager_wall_us, row.cgt_cpu_us, row.cgt_wall_us,
                row.eager_wall_us / row.cgt_wall_us, static_cast<unsigned long long>(row.cgt_replays),
                static_cast<unsigned long long>(row.cgt_eager_calls), row.max_difference);
  }
  return 0;
}
