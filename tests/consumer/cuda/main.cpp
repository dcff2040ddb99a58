// Uses the installed cgt.cuda: one function (a memset on the pool's stream), warmed up, recorded
// and replayed. The consumer test builds it everywhere and runs it only where a GPU is present.
#include <cuda_runtime_api.h>

#include <cstdio>

import cgt;
import cgt.cuda;

int main() {
  auto pool = cgt::cuda::make_pool({.device = 0});
  if (!pool) return std::printf("%s\n", pool.error().describe().c_str()), 1;
  auto zeros = pool->add_function([](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
    cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
    cudaMemsetAsync(y.data(), 0, y.numel() * sizeof(float), ctx.stream());
    return cgt::cuda::Values{y};
  });
  auto x = cgt::cuda::Buffer::make(cgt::ElementType::f32, {256});
  if (!zeros || !x) return 2;
  for (int step = 0; step < 3; ++step) {
    pool->mark_step_begin();
    auto out = (*zeros)({*x});
    if (!out) return std::printf("%s\n", out.error().describe().c_str()), 3;
    std::printf("%s ", cgt::to_string(out->kind()).data());
  }
  std::printf("\n");
  return pool->stats().replays == 1 ? 0 : 4;
}
