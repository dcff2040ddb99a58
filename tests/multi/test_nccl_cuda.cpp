// NCCL inside cgt.cuda graphs: a pool function whose body is kernel, ncclAllReduce, kernel on its
// context's stream is warmed up, recorded (the all-reduce captured with the kernels) and replayed,
// one thread and one pool per GPU (one rank on a single GPU, where the sum is the identity).
// Nothing in cgt.cuda is special for collectives: the communicator is made before any capture,
// the collective goes on `ctx.stream()` (the pool's stream, the one captured), and the body never
// waits on the host.
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/kernels.hpp"
#include "multi/nccl_ranks.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

#include "cuda/harness.hpp"

namespace {

using scenario::must;

// What one rank saw: each step's output and call kind, and its pool's counts.
struct RankRun {
  std::vector<std::vector<double>> outputs;
  std::vector<cgt::CallKind> kinds;
  cgt::Stats stats;
};

// The input of `rank` at `step`: element i is step + i / 4 + 10 * rank.
std::vector<double> input_of(int rank, int step, std::int64_t n) {
  std::vector<double> values(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = step + static_cast<double>(i) / 4 + 10.0 * rank;
  return values;
}

}  // namespace

TEST_CASE("nccl/cuda: kernel, all-reduce, kernel are recorded into one graph and replayed on every rank",
          "[gpu][nccl]") {
  const int gpus = cgt::cuda::device_count();
  if (gpus == 0) SKIP("no CUDA device");
  const int ranks = std::min(gpus, 2);
  constexpr std::int64_t n = 4096;
  constexpr int steps = 6;
  const cgt_test::Communicators comms(ranks);  // before any capture
  std::vector<RankRun> runs(static_cast<std::size_t>(ranks));
  cgt_test::run_ranks(ranks, [&](int rank) {
    cgt::cuda::PoolOptions options;
    options.device = rank;
    auto pool = must(cgt::cuda::make_pool(std::move(options)));
    const ncclComm_t comm = comms[rank];
    const double scale = rank + 1;
    auto step = must(pool.add_function(
        [comm, scale](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
          // y = x * (rank + 1) + 1; y = sum over ranks of y (in place); z = y * 2
          cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
          CudaHarnessOn<0>::launch(scenario::in(0) * scale + 1, {in[0]}, {}, y, ctx.stream());
          cgt_test::nccl_check(ncclAllReduce(y.data(), y.data(), y.numel(), ncclFloat, ncclSum, comm, ctx.stream()),
                               "all-reducing");
          cgt::cuda::Buffer z = ctx.allocate_like(y);
          CudaHarnessOn<0>::launch(scenario::in(0) * 2, {y}, {}, z, ctx.stream());
          return cgt::cuda::Values{z};
        },
        {.name = "allreduce_step"}));
    RankRun& run = runs[static_cast<std::size_t>(rank)];
    for (int s = 0; s < steps; ++s) {
      cgt::cuda::Buffer x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {n}, rank));
      must(x.write(input_of(rank, s, n)));
      pool.mark_step_begin();
      auto out = must(step({x}));
      run.kinds.push_back(out.kind());
      run.outputs.push_back(must(must(out.get(0)).get().read()));
    }
    run.stats = pool.stats();
  });
  for (int rank = 0; rank < ranks; ++rank) {
    INFO("rank " << rank << " of " << ranks);
    const RankRun& run = runs[static_cast<std::size_t>(rank)];
    CHECK(run.stats.eager_calls == 0);
    CHECK(run.stats.recordings >= 1);
    CHECK(run.stats.replays >= 3);
    CHECK(run.kinds.back() == cgt::CallKind::replay);
    for (int s = 0; s < steps; ++s) {
      INFO("step " << s << " (" << cgt::to_string(run.kinds[static_cast<std::size_t>(s)]) << ")");
      for (std::size_t i = 0; i < static_cast<std::size_t>(n); i += 97) {
        double expected = 0;
        for (int r = 0; r < ranks; ++r) expected += input_of(r, s, n)[i] * (r + 1) + 1;
        REQUIRE(run.outputs[static_cast<std::size_t>(s)][i] == expected * 2);
      }
    }
  }
}

TEST_CASE(
    "nccl/cuda: an all-reduce in a loop body, which no conditional node holds, runs its call eagerly and then replays "
    "host-decided, with the sums of every iteration",
    "[gpu][nccl][control_flow]") {
  const int gpus = cgt::cuda::device_count();
  if (gpus == 0) SKIP("no CUDA device");
  const int ranks = std::min(gpus, 2);
  constexpr std::int64_t n = 1024;
  const cgt_test::Communicators comms(ranks);           // before any capture
  const std::vector<double> targets{2, 3, 1, 4, 0, 3};  // iterations per call, the same on every rank
  std::vector<RankRun> runs(static_cast<std::size_t>(ranks));
  std::vector<std::string> said(static_cast<std::size_t>(ranks));
  cgt_test::run_ranks(ranks, [&](int rank) {
    cgt::cuda::PoolOptions options;
    options.device = rank;
    options.tree.debug_checks = true;
    options.tree.log_sink = [&said, rank](const cgt::Event& event) {
      said[static_cast<std::size_t>(rank)] += std::string(cgt::to_string(event.reason)) + "; ";
    };
    auto pool = must(cgt::cuda::make_pool(std::move(options)));
    const ncclComm_t comm = comms[rank];
    const double scale = rank + 1;
    // y = x * (rank + 1) + 1; while count < target: y = (sum over ranks of y) + 1; returns y.
    auto loop = must(pool.add_function(
        [comm, scale](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
          cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
          CudaHarnessOn<0>::launch(scenario::in(0) * scale + 1, {in[0]}, {}, y, ctx.stream());
          auto* count = in[1].as<float>();
          auto* go_on = in[2].as<std::int32_t>();
          const auto* target = in[3].as<float>();
          (void)cgt_test::count_decide(count, go_on, target, ctx.stream());
          ctx.loop_while(in[2], 8, [&](cgt::cuda::Context& body) {
            cgt_test::nccl_check(ncclAllReduce(y.data(), y.data(), y.numel(), ncclFloat, ncclSum, comm, body.stream()),
                                 "all-reducing");
            CudaHarnessOn<0>::launch(scenario::in(0) + 1, {y}, {}, y, body.stream());
            (void)cgt_test::count_step(count, go_on, target, body.stream());
          });
          return cgt::cuda::Values{y};
        },
        {.name = "allreduce_loop", .static_inputs = {1, 2}, .mutated_inputs = {1, 2}}));
    const cgt::cuda::Buffer count = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {1}, rank));
    const cgt::cuda::Buffer go_on = must(cgt::cuda::Buffer::make(cgt::ElementType::i32, {1}, rank));
    RankRun& run = runs[static_cast<std::size_t>(rank)];
    for (std::size_t s = 0; s < targets.size(); ++s) {
      cgt::cuda::Buffer x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {n}, rank));
      must(x.write(input_of(rank, static_cast<int>(s), n)));
      const cgt::cuda::Buffer target = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {1}, rank));
      must(target.write(std::vector<double>{targets[s]}));
      must(count.write(std::vector<double>{0}));
      pool.mark_step_begin();
      auto out = must(loop({x, count, go_on, target}));
      run.kinds.push_back(out.kind());
      run.outputs.push_back(must(must(out.get(0)).get().read()));
    }
    run.stats = pool.stats();
    auto roots = pool.roots();
    if (!roots.empty() && !roots.front().control_flow_on_host())
      said[static_cast<std::size_t>(rank)] += "(a WHILE node)";
  });
  for (int rank = 0; rank < ranks; ++rank) {
    const RankRun& run = runs[static_cast<std::size_t>(rank)];
    INFO("rank " << rank << " of " << ranks << "; the pool said: " << said[static_cast<std::size_t>(rank)]
                 << to_string(run.stats));
    // Either way, nothing fails to instantiate, at most one call runs eagerly, and the graph replays.
    CHECK(run.stats.eager_calls <= 1);
    CHECK(run.stats.recordings == 1);
    CHECK(run.kinds.back() == cgt::CallKind::replay);
    CHECK(run.stats.count(cgt::Reason::control_flow_on_host) == run.stats.eager_calls);
    for (std::size_t s = 0; s < targets.size(); ++s) {
      INFO("call " << s << " (" << cgt::to_string(run.kinds[s]) << "), " << targets[s] << " iterations");
      for (std::size_t i = 0; i < static_cast<std::size_t>(n); i += 101) {
        std::vector<double> ys(static_cast<std::size_t>(ranks));
        for (int r = 0; r < ranks; ++r) {
          ys[static_cast<std::size_t>(r)] = input_of(r, static_cast<int>(s), n)[i] * (r + 1) + 1;
        }
        for (int k = 0; k < static_cast<int>(targets[s]); ++k) {
          double sum = 0;
          for (const double y : ys) sum += y;
          std::ranges::fill(ys, sum + 1);
        }
        REQUIRE(run.outputs[s][i] == ys[static_cast<std::size_t>(rank)]);
      }
    }
  }
}
