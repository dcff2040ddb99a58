// Uses the installed cgt.torch: one function, warmed up, recorded and replayed. The consumer test
// builds it everywhere and runs it only where a GPU is present.
// ATen is all it uses (it parses in half the time of torch/torch.h); included before the imports.
#include <ATen/ATen.h>

#include <cstdio>

import cgt;
import cgt.torch;

int main() {
  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return std::printf("%s\n", pool.error().describe().c_str()), 1;
  auto twice = pool->add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; });
  if (!twice) return 2;
  const at::Tensor x = at::ones({256}, at::TensorOptions().device(at::kCUDA));
  for (int step = 0; step < 3; ++step) {
    pool->mark_step_begin();
    auto out = (*twice)({x});
    if (!out) return std::printf("%s\n", out.error().describe().c_str()), 3;
    const at::Tensor& y = *out->get(0);
    if (y.sum().item<double>() != 512) return 4;
    std::printf("%s ", cgt::to_string(out->kind()).data());
  }
  std::printf("\n");
  return pool->stats().replays == 1 ? 0 : 5;
}
