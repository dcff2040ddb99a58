// Harness of the README's libtorch fragments: what they use but do not show (a `model` with a
// forward(tokens, cache), inputs `tokens` and `cache`, a step count, a `report` for errors), and a
// function around their statements.
#include <torch/torch.h>

#include <iostream>
#include <memory>

// @imports@

namespace {
[[maybe_unused]] int report(const cgt::Error& error) {
  std::cerr << error.describe() << '\n';
  return 1;
}
struct Decoder {
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& cache) { return tokens + cache.sum(); }
};
}  // namespace

[[maybe_unused]] int readme_fragment() {
  auto model = std::make_shared<Decoder>();
  [[maybe_unused]] at::Tensor tokens = at::zeros({1, 8}, at::kLong);
  [[maybe_unused]] at::Tensor cache = at::zeros({1, 8, 64});
  [[maybe_unused]] const int steps = 4;
  // @fragment@
  return 0;
}
