// Harness of docs/libtorch.md's fragment on reading outputs on another stream: what it uses but
// does not show, and a function around its statements. After the fragment's own #include lines
// it imports cgt and cgt.torch, as the page's first lines say.
//   report(error)       prints the error; returns 1
//   pool                what cgt::torch::make_pool returns (a Result: `*pool` is the pool)
//   decode              a function of the pool over (tokens, cache), as add_function returns it (a Result)
//   tokens, cache       its inputs
//   side_stream         another CUDA stream of the pool's device
//   host_copy           a pinned host tensor of the output's size
#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <iostream>

// @imports@
import cgt;
import cgt.torch;

namespace {
[[maybe_unused]] int report(const cgt::Error& error) {
  std::cerr << error.describe() << '\n';
  return 1;
}
}  // namespace

[[maybe_unused]] int readme_fragment() {
  const auto on_gpu = at::TensorOptions().device(at::kCUDA);
  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  auto decode = pool->add_function(
      [](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] + in[1].sum()}; },
      {.name = "decode", .static_inputs = {1}});
  if (!decode) return report(decode.error());
  [[maybe_unused]] at::Tensor tokens = at::zeros({1, 8}, on_gpu);
  [[maybe_unused]] at::Tensor cache = at::zeros({1, 8, 64}, on_gpu);
  [[maybe_unused]] at::cuda::CUDAStream side_stream = at::cuda::getStreamFromPool(false, 0);
  [[maybe_unused]] at::Tensor host_copy = at::empty({1, 8}, at::TensorOptions().pinned_memory(true));
  // @fragment@
  return 0;
}
