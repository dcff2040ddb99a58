// Harness of the README's training fragments: what they use but do not show (a `pool` as
// make_pool returns it, the parameters `params`, a batch `x` and target `y`, a `report` for
// errors), and a function around their statements.
#include <torch/torch.h>

#include <iostream>
#include <utility>
#include <vector>

// @imports@

namespace {
[[maybe_unused]] int report(const cgt::Error& error) {
  std::cerr << error.describe() << '\n';
  return 1;
}
}  // namespace

[[maybe_unused]] int readme_fragment() {
  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  std::vector<at::Tensor> params{at::zeros({4, 4}, at::TensorOptions().device(at::kCUDA).requires_grad(true))};
  [[maybe_unused]] at::Tensor x = at::zeros({2, 4}), y = at::zeros({2, 4});
  // @fragment@
  return 0;
}
