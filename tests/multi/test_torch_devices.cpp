// cgt.torch with several pools: two pools on one device (runs on any GPU), and pools on two devices
// ([multi-gpu]: SKIPPED with fewer than two GPUs) — calls alternating, device 0's outputs moved to
// device 1's functions, an input on the wrong device, the replay's device switch, the shared
// scenario suite on device 1, and an optimizer clipping the gradients of a model split across
// the two devices.
#include <torch/torch.h>
#ifndef CATCH_TEST_MACROS_HPP_INCLUDED
#undef CHECK
#endif
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "scenario/register.hpp"
#include "torch/harness.hpp"

namespace {

using H0 = TorchHarnessOn<0>;
using H1 = TorchHarnessOn<1>;
using scenario::must;

// The scenario suite on device 1, named "torch/device1/<scenario>".
const bool registered = scenario::register_scenarios<H1>("torch/device1/", "[gpu][multi-gpu]");

void require_gpus(int count) {
  const int have = cgt::torch::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  if (have < count) SKIP("needs " << count << " GPUs, this machine has " << have);
}

int current_device() {
  int device = -1;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  return device;
}

cgt::torch::Callable plus_one() {
  return [](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] + 1}; };
}
cgt::torch::Callable twice() {
  return [](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; };
}

}  // namespace

TEST_CASE("multi/torch: two pools on one device alternate, feed each other, and keep their memory apart", "[gpu]") {
  scenario::skip_unless_available<H0>();
  auto first = must(H0::make_pool({}));
  auto second = must(H0::make_pool({}));
  auto f = must(first.add_function(plus_one(), {.name = "plus_one"}));
  auto g = must(second.add_function(twice(), {.name = "twice"}));
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const at::Tensor x = at::arange(64, H0::cuda());
    first.mark_step_begin();
    second.mark_step_begin();
    auto a = must(f({x}));
    auto b = must(g({must(a.get(0)).get()}));  // the first pool's output, copied into the second's graph
    auto c = must(f({must(b.get(0)).get()}));
    CHECK(at::equal(must(c.get(0)).get(), (x + 1) * 2 + 1));
    CHECK(b.kind() != cgt::CallKind::eager);
    CHECK(H0::is_pool_memory(first, must(a.get(0)).get()));
    CHECK_FALSE(H0::is_pool_memory(second, must(a.get(0)).get()));
    CHECK(H0::is_pool_memory(second, must(b.get(0)).get()));
    CHECK_FALSE(H0::is_pool_memory(first, must(b.get(0)).get()));
  }
  CHECK(first.stats().replays >= 3);
  CHECK(second.stats().replays >= 2);
  CHECK(first.stats().eager_calls + second.stats().eager_calls == 0);
}

TEST_CASE("multi/torch: pools on two devices alternate, and device 0's output moved to device 1 is read right",
          "[gpu][multi-gpu]") {
  require_gpus(2);
  auto pool0 = must(H0::make_pool({}));
  auto pool1 = must(H1::make_pool({}));
  auto f = must(pool0.add_function(plus_one(), {.name = "plus_one"}));
  auto g = must(pool1.add_function(twice(), {.name = "twice"}));
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const at::Tensor x = at::arange(256, H0::cuda()) + step;
    pool0.mark_step_begin();
    pool1.mark_step_begin();
    auto a = must(f({x}));
    const at::Tensor& a_out = must(a.get(0)).get();
    const at::Tensor moved = a_out.to(H1::cuda());
    CHECK(moved.data_ptr() != a_out.data_ptr());
    auto b = must(g({moved}));
    CHECK(b.kind() != cgt::CallKind::eager);
    const at::Tensor& b_out = must(b.get(0)).get();
    CHECK(b_out.device().index() == 1);
    CHECK(H1::is_pool_memory(pool1, b_out));
    CHECK(at::equal(b_out.cpu(), ((x + 1) * 2).cpu()));
  }
  CHECK(pool0.stats().replays >= 3);
  CHECK(pool1.stats().replays >= 3);
  CHECK(pool0.stats().eager_calls + pool1.stats().eager_calls == 0);
}

TEST_CASE("multi/torch: an input on another device runs eagerly, input_on_other_device", "[gpu][multi-gpu]") {
  require_gpus(2);
  auto pool1 = must(H1::make_pool({}));
  auto g = must(pool1.add_function(twice(), {.name = "twice"}));
  const at::Tensor on_device0 = at::arange(32, H0::cuda());
  for (int call = 0; call < 3; ++call) {
    pool1.mark_step_begin();
    auto out = must(g({on_device0}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(at::equal(must(out.get(0)).get(), on_device0 * 2));
  }
  CHECK(pool1.stats().count(cgt::Reason::input_on_other_device) == 3);
  CHECK(pool1.stats().recordings == 0);
}

TEST_CASE("multi/torch: a replay from a thread on the other device launches on the pool's and restores the caller's",
          "[gpu][multi-gpu]") {
  require_gpus(2);
  auto pool1 = must(H1::make_pool({}));
  auto f = must(pool1.add_function(plus_one(), {.name = "plus_one"}));
  const at::Tensor x = at::arange(128, H1::cuda());
  for (int call = 0; call < 4; ++call) {
    INFO("call " << call);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    pool1.mark_step_begin();
    auto out = must(f({x}));
    CHECK(current_device() == 0);
    const at::Tensor& y = must(out.get(0)).get();
    CHECK(y.device().index() == 1);
    cudaPointerAttributes attributes{};
    REQUIRE(cudaPointerGetAttributes(&attributes, y.data_ptr()) == cudaSuccess);
    CHECK(attributes.device == 1);
    CHECK(y[7].item<float>() == 8);
    if (call >= 2) CHECK(out.kind() == cgt::CallKind::replay);
  }
}

// A model split across two devices (fc1 on device 0, fc2 on device 1), trained by cgt's SGD with
// momentum and clipping (`max_grad_norm`), stepped eagerly, against libtorch's SGD after PyTorch's
// clip_grad_norm_ (torch/nn/utils/clip_grad.py), which takes the gradients a device at a time: the
// norms moved to the first device for the total, the coefficient moved to each device. (libtorch's
// C++ clip_grad_norm_ stacks the norms of both devices and throws here: the reference writes the
// Python one out.) Every step clips (the norm is far above 0.1), the norms agree, and so do the
// parameters on both devices.
TEST_CASE("multi/torch: clipping the gradients of parameters on two devices scales each device's as clip_grad_norm_",
          "[gpu][multi-gpu]") {
  require_gpus(2);
  const at::Device d0(at::kCUDA, 0);
  const at::Device d1(at::kCUDA, 1);
  constexpr double max_norm = 0.1;
  constexpr double rate = 0.1;
  constexpr int steps = 5;
  torch::manual_seed(0);
  const std::vector<at::Tensor> initial{torch::randn({32, 16}, d0) * 0.3, torch::randn({32}, d0) * 0.1,
                                        torch::randn({8, 32}, d1) * 0.3, torch::randn({8}, d1) * 0.1};
  std::vector<std::pair<at::Tensor, at::Tensor>> batches;
  for (int t = 0; t < steps; ++t) batches.emplace_back(torch::randn({16, 16}, d0), 3 * torch::randn({16, 8}, d1));
  const auto fresh = [&initial] {
    std::vector<at::Tensor> params;
    for (const at::Tensor& t : initial) params.push_back(t.clone().requires_grad_());
    return params;
  };
  const auto loss_of = [](const std::vector<at::Tensor>& p, const at::Tensor& x, const at::Tensor& y) {
    const at::Tensor hidden = torch::tanh(torch::nn::functional::linear(x, p[0], p[1])).to(p[2].device());
    return torch::mse_loss(torch::nn::functional::linear(hidden, p[2], p[3]), y);
  };

  const std::vector<at::Tensor> params = fresh();
  auto sgd = must(cgt::torch::make_sgd(params, {.lr = rate, .momentum = 0.9, .max_grad_norm = max_norm}));
  REQUIRE(sgd.clips_gradients());
  const std::vector<at::Tensor> reference = fresh();
  torch::optim::SGD eager(reference, torch::optim::SGDOptions(rate).momentum(0.9));
  for (int t = 0; t < steps; ++t) {
    INFO("step " << t);
    const auto& [x, y] = batches[static_cast<std::size_t>(t)];
    sgd.zero_grad();
    loss_of(params, x, y).backward();
    REQUIRE_NOTHROW(sgd.step());
    const double norm = sgd.grad_norm().item<double>();

    eager.zero_grad();
    loss_of(reference, x, y).backward();
    std::vector<at::Tensor> norms;
    for (const at::Tensor& p : reference) norms.push_back(at::linalg_vector_norm(p.grad(), 2).to(d0));
    const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
    const at::Tensor coefficient = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
    for (const at::Tensor& p : reference) p.grad().mul_(coefficient.to(p.device()));
    eager.step();
    const double eager_norm = total.item<double>();

    INFO("norm " << norm << ", clip_grad_norm_'s " << eager_norm);
    CHECK(eager_norm > 2 * max_norm);
    // Both sum the same squares per tensor, in other kernels (a foreach reduction against one
    // tensor's): they round apart by a few float32 ulps.
    CHECK(std::abs(norm - eager_norm) <= 1e-5 * eager_norm);
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << i);
      CHECK(params[i].device() == reference[i].device());
      CHECK(sgd.grads()[i].device() == params[i].device());
      // The same SGD in other kernels (p - lr * buf against p + (-lr) * buf), the coefficient as
      // above: a few float32 ulps of values below 1 a step.
      CHECK((params[i].detach() - reference[i].detach()).abs().max().item<double>() <= 1e-6);
    }
  }
}
