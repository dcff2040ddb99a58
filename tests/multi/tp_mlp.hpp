// A tensor-parallel transformer MLP block for the NCCL tests and bench/tp_bench.cpp:
//   y = gelu(x W1 + b1) W2 + b2,   W1: [hidden, 4 hidden], W2: [4 hidden, hidden]
// split over `ranks` GPUs Megatron-style: rank r holds a column block of W1 (and of b1) and the
// matching row block of W2, computes its partial product, and an NCCL all-reduce (sum) of the
// partials gives every rank the whole product; b2 is added after the reduction. The all-reduce
// runs on the current stream, which inside a cgt.torch pool function is the pool's stream (the one
// captured): the collective is captured with the matrix products into the pool's graph.
#pragma once

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <nccl.h>

#include <cstdint>
#include <vector>

#include "multi/nccl_ranks.hpp"

namespace cgt_test {

/// The unsplit block's weights, made on the CPU from a fixed seed (every rank and the reference
/// see the same numbers).
struct MlpWeights {
  at::Tensor w1, b1, w2, b2;

  static MlpWeights make(std::int64_t hidden, std::uint64_t seed = 1234) {
    at::manual_seed(seed);
    const std::int64_t inner = 4 * hidden;
    const double scale = 1.0 / static_cast<double>(hidden);
    return {at::randn({hidden, inner}) * scale, at::randn({inner}) * 0.1, at::randn({inner, hidden}) * scale,
            at::randn({hidden}) * 0.1};
  }
};

/// The single-GPU unsplit computation on `x`'s device: the reference.
inline at::Tensor mlp_reference(const MlpWeights& weights, const at::Tensor& x) {
  const auto on = [&](const at::Tensor& t) { return t.to(x.device()); };
  return at::addmm(on(weights.b2), at::gelu(at::addmm(on(weights.b1), x, on(weights.w1))), on(weights.w2));
}

/// Rank `rank`'s shard of the block, on device `rank`.
struct MlpShard {
  at::Tensor w1, b1, w2, b2;
  ncclComm_t comm = nullptr;

  MlpShard(const MlpWeights& weights, int rank, int ranks, ncclComm_t communicator) : comm(communicator) {
    const std::int64_t inner = weights.w1.size(1);
    const std::int64_t part = inner / ranks;
    const at::TensorOptions device = at::TensorOptions().device(at::kCUDA, rank);
    w1 = weights.w1.narrow(1, rank * part, part).contiguous().to(device);
    b1 = weights.b1.narrow(0, rank * part, part).contiguous().to(device);
    w2 = weights.w2.narrow(0, rank * part, part).contiguous().to(device);
    b2 = weights.b2.to(device);
  }

  /// The block's step on this rank (x: [batch, hidden] on the rank's device), all-reduce included.
  [[nodiscard]] at::Tensor forward(const at::Tensor& x) const {
    const at::Tensor h = at::gelu(at::addmm(b1, x, w1));  // column-parallel linear, GELU
    at::Tensor partial = at::mm(h, w2);                   // row-parallel linear: a partial sum
    nccl_check(ncclAllReduce(partial.data_ptr(), partial.data_ptr(), static_cast<std::size_t>(partial.numel()),
                             ncclFloat, ncclSum, comm, at::cuda::getCurrentCUDAStream().stream()),
               "all-reducing the row-parallel partial sums");
    return partial + b2;
  }
};

}  // namespace cgt_test
