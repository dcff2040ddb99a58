// Harness of the libtorch fragments of docs/libtorch.md, docs/serving.md and docs/training.md:
// what they use but do not show, and a function around their statements. After the fragment's own
// #include lines it imports cgt and cgt.torch, as the pages' first lines say.
//   report(error)               prints the error; returns 1
//   pool                        what cgt::torch::make_pool returns (a Result: `*pool` is the pool)
//   model                       a std::shared_ptr to a torch::nn::Module with one parameter and
//                               forward(x), forward(ids, mask), shift(tokens, n),
//                               decode(token, k_cache, v_cache, position)
//   x, tokens, token            an input [2, 8], token ids [1, 8], the last token [1]
//   k_cache, v_cache, position  caches [1, 4, max_len, 16] and an int64 position [1]
//   prompt_length, max_len      integers
//   ids, mask, pad_token        token ids [n], a mask [n, len], the pad token's id
//   input_ids, attention_mask   a model's two inputs
//   batches                     (input, target) pairs
#include <torch/torch.h>

#include <cstdint>
#include <iostream>
#include <memory>
#include <utility>
#include <vector>

// @imports@
import cgt;
import cgt.torch;

namespace {
[[maybe_unused]] int report(const cgt::Error& error) {
  std::cerr << error.describe() << '\n';
  return 1;
}
struct Model : torch::nn::Module {
  Model() : weight(register_parameter("weight", torch::ones({8}))) {}
  at::Tensor forward(const at::Tensor& x) { return x * weight; }
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask) { return mask * ids.unsqueeze(1); }
  at::Tensor shift(const at::Tensor& tokens, std::int64_t n) { return tokens + n; }
  at::Tensor decode(const at::Tensor& token, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& position) {
    k_cache.index_fill_(2, position, 1);
    v_cache.index_fill_(2, position, 1);
    return token + k_cache.sum() + v_cache.sum();
  }
  at::Tensor weight;
};
}  // namespace

[[maybe_unused]] int readme_fragment() {
  const auto on_gpu = at::TensorOptions().device(at::kCUDA);
  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  auto model = std::make_shared<Model>();
  [[maybe_unused]] at::Tensor x = at::zeros({2, 8}, on_gpu);
  [[maybe_unused]] at::Tensor tokens = at::zeros({1, 8}, on_gpu.dtype(at::kLong));
  [[maybe_unused]] at::Tensor token = at::zeros({1}, on_gpu.dtype(at::kLong));
  [[maybe_unused]] const std::int64_t prompt_length = 4, max_len = 64;
  [[maybe_unused]] at::Tensor k_cache = at::zeros({1, 4, max_len, 16}, on_gpu);
  [[maybe_unused]] at::Tensor v_cache = at::zeros({1, 4, max_len, 16}, on_gpu);
  [[maybe_unused]] at::Tensor position = at::zeros({1}, on_gpu.dtype(at::kLong));
  [[maybe_unused]] at::Tensor ids = at::zeros({3}, on_gpu.dtype(at::kLong));
  [[maybe_unused]] at::Tensor mask = at::ones({3, 8}, on_gpu);
  [[maybe_unused]] const std::int64_t pad_token = 0;
  [[maybe_unused]] at::Tensor input_ids = at::zeros({1, 128}, on_gpu.dtype(at::kLong));
  [[maybe_unused]] at::Tensor attention_mask = at::ones({1, 128}, on_gpu.dtype(at::kLong));
  [[maybe_unused]] std::vector<std::pair<at::Tensor, at::Tensor>> batches{{at::zeros({2, 8}, on_gpu), at::zeros({2, 8}, on_gpu)}};
  // @fragment@
  return 0;
}
