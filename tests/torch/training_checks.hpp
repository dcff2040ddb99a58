// What the training tests that try to break a promise share: the error a result holds and the
// check of an expected one, comparisons that hold NaN equal to NaN, the loss of the model they
// train, the micro-batches a step accumulates, and the counts and values at the edges.
#pragma once

#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's, included below unless already there.
#ifndef CATCH_TEST_MACROS_HPP_INCLUDED
#undef CHECK
#endif
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace training_test {

inline constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
inline constexpr double infinity = std::numeric_limits<double>::infinity();
// The most steps a schedule counts (cgt.torch-optim.inc, Optimizer::scheduled_steps).
inline constexpr std::int64_t most_scheduled_steps = std::int64_t{1} << 62;

/// Equal element for element, NaN equal to NaN.
inline bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].detach().cpu();
    const auto y = b[i].detach().cpu();
    if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) return false;
    if (!torch::equal(x.isnan(), y.isnan())) return false;
    if (!torch::equal(torch::nan_to_num(x, 0.0), torch::nan_to_num(y, 0.0))) return false;
  }
  return true;
}

/// NaN where the other is NaN, and within `tolerance` elsewhere.
inline bool nan_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tolerance) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].detach().cpu().to(torch::kDouble);
    const auto y = b[i].detach().cpu().to(torch::kDouble);
    if (x.sizes() != y.sizes() || !torch::equal(x.isnan(), y.isnan())) return false;
    if ((torch::nan_to_num(x, 0.0) - torch::nan_to_num(y, 0.0)).abs().max().item<double>() > tolerance) return false;
  }
  return true;
}

/// The error code a result holds, if any.
template <class T>
std::optional<cgt::Errc> error_of(const cgt::Result<T>& result) {
  if (result) return std::nullopt;
  return result.error().code;
}

/// A failure with `code` whose message names `says`.
inline void expect_error(const cgt::Result<void>& result, cgt::Errc code, const std::string& says) {
  REQUIRE_FALSE(result.has_value());
  CHECK(result.error().code == code);
  CHECK_THAT(result.error().message, Catch::Matchers::ContainsSubstring(says));
}

/// The loss of `model` on the batch (x, y) of `in`.
inline cgt::torch::Values mse(Mlp& model, const cgt::torch::Inputs& in) {
  return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
}

/// The steps and micro-batches per step of the accumulating runs, and their data: (x, y) batches
/// of the same seed every time.
inline constexpr int accumulation_steps = 6;
inline constexpr int accumulation_micro = 4;
inline std::vector<std::pair<torch::Tensor, torch::Tensor>> micro_batch_data() {
  torch::manual_seed(11);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int i = 0; i < accumulation_steps * accumulation_micro; ++i) {
    out.emplace_back(torch::randn({16, 16}, gpu), torch::randn({16, 8}, gpu));
  }
  return out;
}

}  // namespace training_test
