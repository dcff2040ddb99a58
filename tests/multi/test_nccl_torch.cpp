// NCCL inside cgt.torch graphs: a tensor-parallel MLP block (column-parallel linear, GELU,
// row-parallel linear, NCCL all-reduce) whose whole step is recorded and replayed, one thread and
// one pool per GPU (one rank on a single GPU), over several steps and two batch sizes, against the
// unsplit single-GPU computation. cgt.torch needs nothing new for it: the communicator is made
// before any capture and the all-reduce goes on the current stream, the pool's.
#include <torch/torch.h>
#ifndef CATCH_TEST_MACROS_HPP_INCLUDED
#undef CHECK
#endif
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "multi/nccl_ranks.hpp"
#include "multi/tp_mlp.hpp"

import cgt;
import cgt.torch;

namespace {

struct RankRun {
  std::vector<at::Tensor> outputs;  // each step's output, copied to the CPU
  std::vector<cgt::CallKind> kinds;
  cgt::Stats stats;
};

}  // namespace

TEST_CASE("nccl/torch: a tensor-parallel MLP step, all-reduce included, replays and equals the unsplit block",
          "[gpu][nccl]") {
  if (!cgt::torch::is_available()) SKIP("no CUDA device");
  const int ranks = std::min(static_cast<int>(torch::cuda::device_count()), 2);
  constexpr std::int64_t hidden = 256;
  const std::vector<std::int64_t> batches = {4, 4, 4, 8, 8, 8, 4, 8, 4, 8};
  const cgt_test::MlpWeights weights = cgt_test::MlpWeights::make(hidden);
  std::vector<at::Tensor> inputs;  // on the CPU: each rank moves them to its device
  for (const std::int64_t batch : batches) inputs.push_back(at::randn({batch, hidden}));

  const cgt_test::Communicators comms(ranks);  // before any capture
  std::vector<RankRun> runs(static_cast<std::size_t>(ranks));
  cgt_test::run_ranks(ranks, [&](int rank) {
    auto pool = cgt::torch::make_pool({.device = static_cast<std::int16_t>(rank)});
    if (!pool) throw std::runtime_error(pool.error().message);
    const auto shard = std::make_shared<cgt_test::MlpShard>(weights, rank, ranks, comms[rank]);
    auto step = pool->add_function([shard](cgt::torch::Inputs in) { return cgt::torch::Values{shard->forward(in[0])}; },
                                   {.name = "tp_mlp"});
    if (!step) throw std::runtime_error(step.error().message);
    RankRun& run = runs[static_cast<std::size_t>(rank)];
    for (const at::Tensor& input : inputs) {
      const at::Tensor x = input.to(at::TensorOptions().device(at::kCUDA, rank));
      pool->mark_step_begin();
      auto out = (*step)({x});
      if (!out) throw std::runtime_error(out.error().message);
      run.kinds.push_back(out->kind());
      auto y = out->get(0);
      if (!y) throw std::runtime_error(y.error().message);
      run.outputs.push_back(y->get().cpu());
    }
    run.stats = pool->stats();
  });

  std::vector<at::Tensor> expected;
  for (const at::Tensor& input : inputs) expected.push_back(cgt_test::mlp_reference(weights, input.cuda()).cpu());
  for (int rank = 0; rank < ranks; ++rank) {
    INFO("rank " << rank << " of " << ranks);
    const RankRun& run = runs[static_cast<std::size_t>(rank)];
    CHECK(run.stats.eager_calls == 0);
    CHECK(run.stats.recordings >= 2);  // one per batch size
    CHECK(run.stats.replays >= 4);
    CHECK(run.kinds.back() == cgt::CallKind::replay);
    for (std::size_t s = 0; s < inputs.size(); ++s) {
      INFO("step " << s << ", batch " << batches[s] << " (" << cgt::to_string(run.kinds[s]) << ")");
      CHECK(run.outputs[s].sizes() == expected[s].sizes());
      CHECK(at::allclose(run.outputs[s], expected[s], 1e-4, 1e-4));
    }
  }
}
