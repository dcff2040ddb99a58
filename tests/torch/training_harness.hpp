// What the training tests of cgt.torch share: a result's value or the test's failure, the GPU they
// train on, the models they train, eager autocast, temporary files, and comparisons of results.
#pragma once

#include <torch/torch.h>
#include <ATen/autocast_mode.h>
// libtorch's logging defines CHECK; the tests mean Catch2's, included below unless already there.
#ifndef CATCH_TEST_MACROS_HPP_INCLUDED
#undef CHECK
#endif
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

// Skips the test (SKIPPED, not passed) on a machine without a CUDA device.
#define REQUIRE_GPU() \
  if (!cgt::torch::is_available()) SKIP("no CUDA device")

namespace training_test {

/// The value of `result`; the test fails with its error otherwise.
template <class T>
T must(cgt::Result<T> result) {
  if (!result) FAIL(result.error().describe());
  return std::move(*result);
}

inline void must(const cgt::Result<void>& result) {
  if (!result) FAIL(result.error().describe());
}

inline const torch::Device gpu(torch::kCUDA, 0);

/// Eager CUDA autocast while it lives, as `with torch.autocast("cuda", dtype):` (the cast cache
/// on, eager's default); none: nothing. The thread's state before it is put back.
class Autocast {
 public:
  explicit Autocast(std::optional<at::ScalarType> dtype) : on_(dtype.has_value()) {
    if (!on_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, *dtype);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;
  Autocast(Autocast&&) = delete;
  Autocast& operator=(Autocast&&) = delete;

 private:
  bool on_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kFloat;
};

/// The thread's CUDA autocast state: whether on, to which dtype, and whether casts are cached.
struct AutocastState {
  bool enabled;
  at::ScalarType dtype;
  bool cached;
  bool operator==(const AutocastState&) const = default;
};

inline AutocastState autocast_state() {
  return {at::autocast::is_autocast_enabled(at::kCUDA), at::autocast::get_autocast_dtype(at::kCUDA),
          at::autocast::is_autocast_cache_enabled()};
}

/// A file in the temporary directory, cgt_<name>.pt, removed when the test ends. Test files
/// prefix their names with their own (tests of several files run at once).
struct TempFile {
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() / ("cgt_" + name + ".pt")).string()) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  TempFile(TempFile&&) = delete;
  TempFile& operator=(TempFile&&) = delete;
  ~TempFile() {
    std::error_code ignored;
    std::filesystem::remove(path, ignored);
  }
  std::string path;
};

/// Detached copies on the host: values to compare after the device changed the originals.
inline std::vector<torch::Tensor> host_copies(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.detach().cpu().clone());
  return out;
}

/// The largest absolute difference of two lists of tensors, element for element, in float64.
inline double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double most = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    most = std::max(
        most,
        (a[i].detach().cpu().to(torch::kDouble) - b[i].detach().cpu().to(torch::kDouble)).abs().max().item<double>());
  }
  return most;
}

/// The largest absolute difference of two lists of numbers (losses, norms).
template <class T>
  requires std::is_arithmetic_v<T>
double max_difference(const std::vector<T>& a, const std::vector<T>& b) {
  REQUIRE(a.size() == b.size());
  double most = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    most = std::max(most, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return most;
}

/// 16 -> hidden -> hidden -> 8, tanh then relu.
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(std::int64_t hidden = 64)
      : fc1(register_module("fc1", torch::nn::Linear(16, hidden))),
        fc2(register_module("fc2", torch::nn::Linear(hidden, hidden))),
        fc3(register_module("fc3", torch::nn::Linear(hidden, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3->forward(torch::relu(fc2->forward(torch::tanh(fc1->forward(x)))));
  }
  torch::nn::Linear fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

/// A pre-norm transformer block (hidden 64, 4 heads): self-attention written out (matmul, softmax:
/// deterministic kernels), LayerNorm, a GELU MLP, residuals.
struct BlockImpl : torch::nn::Module {
  static constexpr std::int64_t hidden = 64;
  static constexpr std::int64_t heads = 4;
  BlockImpl()
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        qkv(register_module("qkv", torch::nn::Linear(hidden, 3 * hidden))),
        proj(register_module("proj", torch::nn::Linear(hidden, hidden))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        up(register_module("up", torch::nn::Linear(hidden, 4 * hidden))),
        down(register_module("down", torch::nn::Linear(4 * hidden, hidden))) {}
  torch::Tensor forward(const torch::Tensor& x) {  // [batch, seq, hidden]
    const std::int64_t b = x.size(0), s = x.size(1), d = hidden / heads;
    auto parts = qkv->forward(norm1->forward(x)).view({b, s, 3, heads, d}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    auto attended = torch::matmul(torch::softmax(scores, -1), parts[2]).transpose(1, 2).reshape({b, s, hidden});
    auto h = x + proj->forward(attended);
    return h + down->forward(torch::gelu(up->forward(norm2->forward(h))));
  }
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

}  // namespace training_test
