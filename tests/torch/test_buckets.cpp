// Batch buckets in cgt.torch on a GPU: a small model over the batch dimension for every batch size
// from 1 to the largest bucket, against eager libtorch, with one recording per bucket; integer
// inputs padded with a pad token; sliced outputs and the pool's overwrite protection.
// Every test is tagged [gpu][buckets] and reports SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

using cgt::torch::Inputs;
using cgt::torch::Values;

constexpr std::int64_t kIn = 64;
constexpr std::int64_t kOut = 96;

at::Tensor pad_rows(const at::Tensor& x, std::int64_t rows) {
  return at::cat({x, at::zeros({rows - x.size(0), x.size(1)}, x.options())});
}

}  // namespace

TEST_CASE("Linear+GELU with batch buckets equals eager for every batch size, one recording per bucket",
          "[gpu][buckets]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  torch::nn::Linear linear(kIn, kOut);
  linear->to(torch::kCUDA);
  const auto model = [&linear](const at::Tensor& x) { return at::gelu(linear->forward(x)); };
  const std::vector<std::int64_t> buckets{1, 2, 4, 8, 16, 32};
  auto pool = must(H::make_pool({.debug_checks = true}));
  auto f = must(pool.add_function(
      [&model](Inputs in) {
        const torch::NoGradGuard guard;
        return Values{model(in[0])};
      },
      {.name = "linear_gelu", .buckets = {.sizes = buckets, .pad = cgt::Pad::constant(0), .per_input = {}}}));
  std::uint64_t padded = 0;
  std::size_t bit_identical_to_unpadded = 0;
  for (int round = 0; round < 3; ++round) {  // warm-up, recording, replay of each bucket
    for (std::int64_t n = 1; n <= buckets.back(); ++n) {
      pool.mark_step_begin();
      const at::Tensor x = at::randn({n, kIn}, H::cuda());
      auto out = must(f({x}));
      const at::Tensor& y = must(out.get(0)).get();
      INFO("batch " << n << ", round " << round);
      REQUIRE(y.sizes() == c10::IntArrayRef({n, kOut}));
      std::int64_t bucket = 1;
      while (bucket < n) bucket *= 2;
      if (bucket != n) ++padded;
      // Rows are independent: the graph's rows are bit for bit those of eager on the padded batch
      // (the same kernels at the same size). cuBLAS may pick another kernel for another batch
      // size, so eager on the unpadded batch is equal up to rounding.
      CHECK(torch::equal(y, model(pad_rows(x, bucket)).narrow(0, 0, n)));
      const at::Tensor eager = model(x);
      CHECK(torch::allclose(y, eager, 1e-5, 1e-5));
      if (round == 2) {
        CHECK(out.kind() == cgt::CallKind::replay);
        bit_identical_to_unpadded += torch::equal(y, eager) ? 1 : 0;
      }
    }
  }
  WARN("replays bit-identical to eager on the unpadded batch: " << bit_identical_to_unpadded << " of "
                                                                << buckets.back());
  const cgt::Stats stats = pool.stats();
  CHECK(stats.recordings == buckets.size());
  CHECK(pool.roots().size() == buckets.size());
  CHECK(stats.padded_calls == padded);
  CHECK(stats.eager_calls == 0);
}

TEST_CASE("token ids are padded with a pad token; batches above the largest bucket run eagerly", "[gpu][buckets]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  torch::manual_seed(1);
  torch::nn::Embedding embedding(100, 16);
  embedding->to(torch::kCUDA);
  auto pool = must(H::make_pool());
  // ids (padded with token 99) and a mask (padded with 0): the sum over the batch of the masked
  // embeddings mixes rows, so it sees the padding, and the mask makes it harmless.
  auto f = must(pool.add_function(
      [&embedding](Inputs in) {
        const torch::NoGradGuard guard;
        const at::Tensor rows = embedding->forward(in[0]);
        const at::Tensor total = (rows * in[1].unsqueeze(1)).sum(0, /*keepdim=*/true);
        return Values{rows, total};
      },
      {.name = "embed",
       .buckets = {.sizes = {4, 8}, .pad = cgt::Pad::constant(0), .per_input = {{0, cgt::Pad::constant(99)}}}}));
  const auto opts = at::TensorOptions().dtype(at::kLong).device(at::kCUDA, 0);
  for (int round = 0; round < 3; ++round) {
    for (std::int64_t n = 1; n <= 9; ++n) {
      pool.mark_step_begin();
      const at::Tensor ids = at::randint(0, 99, {n}, opts);
      const at::Tensor mask = at::ones({n}, H::cuda());
      auto out = must(f({ids, mask}));
      INFO("batch " << n << ", round " << round);
      const at::Tensor eager_rows = embedding->forward(ids);
      CHECK(torch::equal(must(out.get(0)).get(), eager_rows));  // a gather: bit for bit
      CHECK(torch::allclose(must(out.get(1)).get(), eager_rows.sum(0, true), 1e-5, 1e-5));
      CHECK(must(out.get(1)).get().size(0) == 1);  // no batch dimension of a bucket's size: whole
      if (n == 9) CHECK(out.kind() == cgt::CallKind::eager);
      if (round == 2 && n < 9) CHECK(out.kind() == cgt::CallKind::replay);
    }
  }
  CHECK(pool.stats().recordings == 2);
  CHECK(pool.stats().count(cgt::Reason::size_above_buckets) == 3);
}

TEST_CASE("a sliced output keeps its bucket live; a new step reclaims it and poisons escaped copies",
          "[gpu][buckets]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  auto f = must(pool.add_function([](Inputs in) { return Values{in[0] * 2}; },
                                  {.name = "twice", .buckets = {.sizes = {8}, .pad = {}, .per_input = {}}}));
  for (int round = 0; round < 2; ++round) {
    pool.mark_step_begin();
    (void)must(f({at::ones({5, 4}, H::cuda())}));
  }
  pool.mark_step_begin();
  const at::Tensor x = at::full({5, 4}, 3.0, H::cuda());
  auto held = must(f({x}));
  CHECK(held.kind() == cgt::CallKind::replay);
  auto next = must(f({at::full({3, 4}, 7.0, H::cuda())}));  // records beside the held bucket
  CHECK(next.kind() == cgt::CallKind::recording);
  CHECK(torch::equal(must(held.get(0)).get(), x * 2));
  CHECK(torch::equal(must(held.take(0)), x * 2));
  const at::Tensor escaped = must(held.get(0)).get();  // a copy of the sliced tensor, kept past its step
  pool.mark_step_begin();
  (void)must(f({at::ones({2, 4}, H::cuda())}));
  CHECK(held.get(0).error().code == cgt::Errc::output_overwritten);
  CHECK_THROWS_AS(escaped.sum().item<float>(), c10::Error);
}

TEST_CASE("a constant pad an integer input cannot hold fails the call instead of being converted", "[gpu][buckets]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  auto pool = must(H::make_pool());
  const auto sum_of = [](Inputs in) { return Values{in[0].to(at::kDouble).sum().reshape({1})}; };
  struct Case {
    at::ScalarType type;
    double pad;
    bool fits;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<Case> cases{{at::kLong, nan, false},
                                {at::kLong, 0.5, false},
                                {at::kLong, 1e300, false},
                                {at::kByte, 300, false},
                                {at::kByte, 255, true},
                                {at::kLong, -3, true},
                                {at::kFloat, -std::numeric_limits<double>::infinity(), true}};
  int index = 0;
  for (const Case& c : cases) {
    auto f = must(pool.add_function(sum_of, {.name = "pad" + std::to_string(index++),
                                             .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(c.pad)}}));
    const at::Tensor x = at::arange(1, 4, at::TensorOptions().dtype(c.type).device(at::kCUDA, 0));  // 1 2 3
    INFO("type " << c10::toString(c.type) << ", pad " << c.pad);
    pool.mark_step_begin();
    auto out = f({x});
    if (!c.fits) {
      REQUIRE_FALSE(out.has_value());
      if (c.type == at::kLong) CHECK(out.error().code == cgt::Errc::invalid_argument);  // refused before libtorch
      CHECK(out.error().input == 0);
      continue;
    }
    REQUIRE(out.has_value());
    CHECK(must(out->get(0)).get().item<double>() == 6 + c.pad);
  }
}
