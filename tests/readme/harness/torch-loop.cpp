// Harness of docs/control-flow.md's libtorch fragment: the state a device loop decodes over (as
// examples/device_decode.hpp has it: `s` with its tensors and cache, a `model` with a step), the
// loop's bounds, and a pool function around the fragment.
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

// @imports@

namespace {
struct Model {
  torch::Tensor step(const torch::Tensor& tokens, const torch::Tensor& /*position*/,
                     const std::vector<torch::Tensor>& /*cache*/) {
    return torch::zeros({tokens.size(0), 16}, tokens.options().dtype(torch::kFloat));
  }
};
struct State {
  torch::Tensor tokens, position, generated, out, done, go_on;
  std::vector<torch::Tensor> cache;
};
}  // namespace

[[maybe_unused]] cgt::torch::Values readme_fragment(cgt::torch::Inputs in) {
  auto model = std::make_shared<Model>();
  State s{in[0], in[1], in[2], in[3], in[4], in[5], {in[6], in[7]}};
  [[maybe_unused]] const std::uint64_t iterations = 16;
  [[maybe_unused]] const std::int64_t steps_per_iteration = 4;
  [[maybe_unused]] const std::int64_t end_token = 2;
  [[maybe_unused]] const std::int64_t max_new = 64;
  // @fragment@
  return {};
}
