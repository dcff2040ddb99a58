// Parameters and inputs in odd layouts (transposed views, strided views with gaps, the same tensor
// twice, a parameter whose elements overlap): they train as contiguous ones, keep their addresses
// and strides, and the gaps are never written; what cannot be trained is refused. Each test states
// the promise it tries to break (from modules/cgt.torch-optim.inc and docs/training.md) and checks
// what a user relies on: values, errors, and which state holds after. Tagged
// [gpu][training] (SKIPPED without a GPU).
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "torch/training_checks.hpp"
#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::error_of;
using training_test::gpu;
using training_test::host_copies;
using training_test::max_difference;
using training_test::must;
using training_test::same;

}  // namespace

// ---- odd layouts (GPU) ----------------------------------------------------------------------------

namespace {

// A two-layer network over parameters in odd layouts: w1 [16, 32] a transposed view of a [32, 16]
// buffer; with `gaps`, b1 [32] every other element of a [64] buffer and w2 [32, 8] the first 8
// columns of a [32, 16] buffer (neither dense: Adam's multi-tensor formula), without, both dense
// (the fused kernel, w1 transposed). The values are the same either way.
struct OddModel {
  torch::Tensor w1_buffer, b1_buffer, w2_buffer;  // what the parameters view (their gaps included)
  std::vector<torch::Tensor> params;              // w1, b1, w2, b2
};

OddModel odd_model(bool gaps) {
  torch::manual_seed(3);
  OddModel m;
  m.w1_buffer = torch::randn({32, 16}, gpu) * 0.25;
  m.b1_buffer = torch::randn({64}, gpu) * 0.1;
  m.w2_buffer = torch::randn({32, 16}, gpu) * 0.25;
  const auto b2 = torch::randn({8}, gpu) * 0.1;
  const auto b1 = m.b1_buffer.slice(0, 0, 64, 2);
  const auto w2 = m.w2_buffer.slice(1, 0, 8);
  m.params = {m.w1_buffer.t().detach().requires_grad_(), (gaps ? b1 : b1.contiguous()).detach().requires_grad_(),
              (gaps ? w2 : w2.contiguous()).detach().requires_grad_(), b2.detach().requires_grad_()};
  return m;
}

torch::Tensor odd_forward(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
  return torch::tanh(x.matmul(p[0]) + p[1]).matmul(p[2]) + p[3];
}

struct OddBatch {
  torch::Tensor x, y;  // x [64, 16] transposed, y [64, 8] with gaps
};

std::vector<OddBatch> odd_batches(int n) {
  torch::manual_seed(4);
  std::vector<OddBatch> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({torch::randn({16, 64}, gpu).t(), torch::randn({64, 16}, gpu).slice(1, 0, 8)});
  }
  return out;
}

struct OddRun {
  std::vector<double> losses;  // per micro-batch, or per step (the mean)
  std::vector<torch::Tensor> params;
};

// Eager libtorch on contiguous copies: AdamW, loss / k per micro-batch, clip_grad_norm_, a step.
OddRun odd_libtorch(const std::vector<OddBatch>& data, int k, bool per_call) {
  std::vector<torch::Tensor> params;
  for (const auto& p : odd_model(false).params) params.push_back(p.detach().clone().contiguous().requires_grad_());
  torch::optim::AdamW adam(params, torch::optim::AdamWOptions(3e-3).weight_decay(1e-2));
  OddRun run;
  for (const OddBatch& b : data) {
    adam.zero_grad(true);
    double sum = 0;
    const auto xs = b.x.contiguous().chunk(k);
    const auto ys = b.y.contiguous().chunk(k);
    for (int j = 0; j < k; ++j) {
      const auto loss =
          torch::mse_loss(odd_forward(params, xs[static_cast<std::size_t>(j)]), ys[static_cast<std::size_t>(j)]);
      (loss / k).backward();
      if (per_call) run.losses.push_back(loss.item<double>());
      sum += loss.item<double>();
    }
    if (!per_call) run.losses.push_back(sum / k);
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    adam.step();
  }
  run.params = host_copies(params);
  return run;
}

}  // namespace

// Parameters that are a transposed view, a strided view with gaps, and inputs that are transposed
// and have gaps, through micro-batches one per call and all in one call: the training is eager
// libtorch's on contiguous copies, each parameter keeps its address and strides, and the elements
// between a strided parameter's (its buffer's gaps) are never written. Rows that the micro-batches
// cannot share fail the call and change nothing; the same tensor twice is not two parameters.
TEST_CASE("training/layouts: parameters and inputs in odd layouts train as contiguous ones", "[gpu][training]") {
  REQUIRE_GPU();
  constexpr int steps = 8;
  const auto data = odd_batches(steps);
  for (const bool gaps : {false, true}) {
    for (const bool all_in_one : {false, true}) {
      INFO((gaps ? "parameters with gaps (multi-tensor Adam)" : "dense parameters, one transposed (fused Adam)")
           << (all_in_one ? ", 4 micro-batches in one call" : ", 2 micro-batches one per call"));
      const int k = all_in_one ? 4 : 2;
      OddModel m = odd_model(gaps);
      const auto w2_gaps = m.w2_buffer.slice(1, 8, 16).clone();
      const auto b1_gaps = m.b1_buffer.slice(0, 1, 64, 2).clone();
      std::vector<std::vector<std::int64_t>> strides;
      std::vector<const void*> addresses;
      for (const auto& p : m.params) {
        strides.push_back(p.strides().vec());
        addresses.push_back(p.data_ptr());
      }
      auto adam = must(cgt::torch::make_adam(
          m.params, {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      const auto params = m.params;
      auto step = must(cgt::torch::make_training_step(
          pool, adam,
          [params](cgt::torch::Inputs in) {
            return cgt::torch::Values{torch::mse_loss(odd_forward(params, in[0]), in[1])};
          },
          cgt::torch::TrainingStepOptions{.micro_batches = k, .all_in_one_call = all_in_one}));
      OddRun graph;
      for (const OddBatch& b : data) {
        if (all_in_one) {
          pool.mark_step_begin();
          auto out = step({b.x, b.y});
          if (!out) FAIL(out.error().describe());
          graph.losses.push_back(must(out->take(0)).item<double>());
        } else {
          const auto xs = b.x.chunk(k);
          const auto ys = b.y.chunk(k);
          for (int j = 0; j < k; ++j) {
            pool.mark_step_begin();
            auto out = step({xs[static_cast<std::size_t>(j)], ys[static_cast<std::size_t>(j)]});
            if (!out) FAIL(out.error().describe());
            graph.losses.push_back(must(out->take(0)).item<double>());
          }
        }
      }
      graph.params = host_copies(m.params);
      const OddRun libtorch = odd_libtorch(data, k, !all_in_one);
      const double losses = max_difference(graph.losses, libtorch.losses);
      const double differs = max_difference(graph.params, libtorch.params);
      WARN("against libtorch on contiguous copies: loss " << losses << ", param " << differs);
      CHECK(losses <= 1e-5);
      CHECK(differs <= 1e-5);
      for (std::size_t i = 0; i < m.params.size(); ++i) {
        CHECK(m.params[i].strides().vec() == strides[i]);
        CHECK(m.params[i].data_ptr() == addresses[i]);
      }
      CHECK(torch::equal(m.w2_buffer.slice(1, 8, 16), w2_gaps));
      CHECK(torch::equal(m.b1_buffer.slice(0, 1, 64, 2), b1_gaps));
      CHECK(pool.stats().recordings == (all_in_one ? 1U : 2U));
      CHECK(pool.stats().eager_calls == 0);

      if (all_in_one) {  // 2 rows for 4 micro-batches; 64 rows of x with 62 of y
        const auto before = host_copies(m.params);
        pool.mark_step_begin();
        CHECK(error_of(step({torch::randn({16, 2}, gpu).t(), torch::randn({2, 8}, gpu)})) ==
              cgt::Errc::function_failed);
        pool.mark_step_begin();
        CHECK_FALSE(step({data[0].x, data[0].y.slice(0, 0, 62)}).has_value());
        CHECK(same(before, host_copies(m.params)));
      }
    }
  }
  auto w = torch::zeros({4}, gpu).requires_grad_();
  auto twice = cgt::torch::make_adam({w, w});
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code == cgt::Errc::invalid_argument);
}

// A parameter whose elements share memory (an expanded leaf: eight elements, one address) cannot
// be updated in place (libtorch refuses writes to overlapping memory), so every step would fail
// after counting its steps and moments. make_adam and make_sgd "fail with invalid_argument for an
// unusable parameter": this one is.
TEST_CASE("training/layouts: a parameter whose elements overlap is refused when the optimizer is made",
          "[gpu][training]") {
  REQUIRE_GPU();
  auto expanded = torch::zeros({1}, gpu).expand({8}).detach().requires_grad_();
  REQUIRE(expanded.stride(0) == 0);
  auto adam = cgt::torch::make_adam({expanded});
  REQUIRE_FALSE(adam);
  CHECK(adam.error().code == cgt::Errc::invalid_argument);
  auto sgd = cgt::torch::make_sgd({expanded}, {.lr = 0.1});
  REQUIRE_FALSE(sgd);
  CHECK(sgd.error().code == cgt::Errc::invalid_argument);
}
