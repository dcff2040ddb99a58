// cgt.torch autograd functions on a GPU, against eager libtorch on the same inputs, weights and
// seed: input and parameter gradients over warm-up, recording and replays; chained functions as
// one path of the tree (forward 1, forward 2, backward 2, backward 1); accumulation,
// retain_graph, a second backward without it; inference under NoGradGuard / InferenceMode;
// dropout; a backward never called; both zero_grad forms; a small MLP trained 100 steps; a kept
// .grad; an input modified in place (refused); create_graph (first-order gradients, .grad
// accumulated out of place, a second derivative refused, a graphed optimizer step after it);
// torch::autograd::grad and backward(inputs=...); a capturable optimizer's static gradients after
// zero_grad(set_to_none).
// Every test is tagged [gpu][autograd] and reports SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

using cgt::torch::AutogradFunction;
using cgt::torch::Inputs;
using cgt::torch::Values;

cgt::torch::Pool new_pool(cgt::Options options = {}) {
  return must(H::make_pool(std::move(options)));
}

/// `dst`'s parameters become copies of `src`'s: the eager twin of a model.
void copy_parameters(torch::nn::Module& dst, const torch::nn::Module& src) {
  const torch::NoGradGuard no_grad;
  const auto from = src.parameters();
  auto to = dst.parameters();
  REQUIRE(from.size() == to.size());
  for (std::size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
}

/// A Linear on the GPU and its eager twin with the same parameters.
struct TwinLinears {
  torch::nn::Linear graphed;
  torch::nn::Linear eager;
};
TwinLinears twin_linears(std::int64_t in, std::int64_t out) {
  TwinLinears twins{torch::nn::Linear(in, out), torch::nn::Linear(in, out)};
  twins.graphed->to(torch::kCUDA);
  twins.eager->to(torch::kCUDA);
  copy_parameters(*twins.eager, *twins.graphed);
  return twins;
}

/// The module's forward on input 0, as an autograd function of `pool`.
template <class Module>
AutogradFunction wrap(cgt::torch::Pool& pool, Module module, const std::string& name) {
  return must(cgt::torch::make_autograd_function(pool,
                                                 [module](Inputs in) mutable { return Values{module->forward(in[0])}; },
                                                 {.name = name, .parameters = module->parameters()}));
}

bool close(const at::Tensor& a, const at::Tensor& b, double tolerance = 1e-5) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || at::allclose(a, b, tolerance, tolerance);
}

/// Every parameter's gradient of `a` is `b`'s (undefined where `b`'s is).
void check_same_grads(const torch::nn::Module& a, const torch::nn::Module& b, double tolerance = 1e-5) {
  const auto pa = a.parameters();
  const auto pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO("parameter " << i);
    CHECK(close(pa[i].grad(), pb[i].grad(), tolerance));
  }
}

void set_grads_to_none(const torch::nn::Module& module) {
  for (auto parameter : module.parameters()) parameter.mutable_grad() = at::Tensor();
}

std::vector<std::string> path_functions(const cgt::torch::Pool& pool) {
  std::vector<std::string> names;
  for (const auto& node : pool.current_path()) names.push_back(node.function());
  return names;
}

}  // namespace

TEST_CASE("torch/autograd: input and parameter gradients equal eager's over warm-up, recording and replays",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(16, 8);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "linear");
  std::vector<cgt::CallKind> kinds;
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const at::Tensor data = at::randn({4, 16}, H::cuda());
    set_grads_to_none(*graphed);
    set_grads_to_none(*eager);
    pool.mark_step_begin();
    const at::Tensor x = data.clone().requires_grad_(true);
    {
      auto out = must(layer({x}));
      kinds.push_back(out.kind());
      REQUIRE(out.has_backward());
      REQUIRE(out[0].grad_fn() != nullptr);
      at::Tensor loss = (out[0] * out[0]).sum();
      loss.backward();
      const at::Tensor x_eager = data.clone().requires_grad_(true);
      const at::Tensor expected = eager->forward(x_eager);
      (expected * expected).sum().backward();
      CHECK(close(out[0].detach(), expected.detach()));
      CHECK(close(x.grad(), x_eager.grad()));
      check_same_grads(*graphed, *eager);
    }
    // No gradient lives in the pool.
    auto& device = must(pool.device()).get();
    CHECK(!device.contains(reinterpret_cast<std::uintptr_t>(x.grad().data_ptr())));
    for (const auto& parameter : graphed->parameters()) {
      CHECK(!device.contains(reinterpret_cast<std::uintptr_t>(parameter.grad().data_ptr())));
    }
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay});
  CHECK(pool.stats().replays >= 6);  // forward and backward, steps 2 to 4
  must(pool.check_memory());
}

TEST_CASE("torch/autograd: chained functions form one path: forward 1, forward 2, backward 2, backward 1",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Sequential first(torch::nn::Linear(8, 16), torch::nn::ReLU());
  torch::nn::Linear second(16, 4);
  torch::nn::Sequential first_eager(torch::nn::Linear(8, 16), torch::nn::ReLU());
  torch::nn::Linear second_eager(16, 4);
  for (torch::nn::Module* module : {first.ptr().get(), first_eager.ptr().get()}) module->to(torch::kCUDA);
  second->to(torch::kCUDA);
  second_eager->to(torch::kCUDA);
  copy_parameters(*first_eager, *first);
  copy_parameters(*second_eager, *second);
  auto pool = new_pool({.debug_checks = true});
  auto layer1 = wrap(pool, first, "layer1");
  auto layer2 = wrap(pool, second, "layer2");
  std::uint64_t replays_before = 0;
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    const at::Tensor data = at::randn({6, 8}, H::cuda());
    set_grads_to_none(*first);
    set_grads_to_none(*second);
    set_grads_to_none(*first_eager);
    set_grads_to_none(*second_eager);
    pool.mark_step_begin();
    replays_before = pool.stats().replays;
    const at::Tensor x = data.clone().requires_grad_(true);
    auto hidden = must(layer1({x}));
    auto out = must(layer2({hidden[0]}));
    CHECK(pool.has_pending_backward());
    out[0].sum().backward();  // sum's backward hands an expanded gradient to layer 2
    CHECK(!pool.has_pending_backward());

    const at::Tensor x_eager = data.clone().requires_grad_(true);
    const at::Tensor expected = second_eager->forward(first_eager->forward(x_eager));
    expected.sum().backward();
    CHECK(close(out[0].detach(), expected.detach()));
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*first, *first_eager);
    check_same_grads(*second, *second_eager);
    if (step >= 1) {  // recorded: the path is the four graphs
      CHECK(path_functions(pool) ==
            std::vector<std::string>{"layer1.forward", "layer2.forward", "layer2.backward", "layer1.backward"});
    }
    if (step >= 2) CHECK(pool.stats().replays - replays_before == 4);
  }
  CHECK(pool.roots().size() == 1);
  must(pool.check_memory());
}

TEST_CASE("torch/autograd: gradients accumulate over backwards without zero_grad, as eager's do", "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(12, 6);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "accumulating");
  const at::Tensor x = at::randn({3, 12}, H::cuda()).requires_grad_(true);
  const at::Tensor x_eager = x.detach().clone().requires_grad_(true);
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    const at::Tensor target = at::randn({3, 6}, H::cuda());
    pool.mark_step_begin();
    auto out = must(layer({x}));
    torch::mse_loss(out[0], target).backward();
    torch::mse_loss(eager->forward(x_eager), target).backward();
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*graphed, *eager);
  }
}

TEST_CASE("torch/autograd: retain_graph lets a backward run twice, giving eager's twice the gradient",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(10, 5);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "retained");
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    set_grads_to_none(*graphed);
    set_grads_to_none(*eager);
    const at::Tensor data = at::randn({2, 10}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    auto out = must(layer({x}));
    const at::Tensor loss = out[0].tanh().sum();
    loss.backward({}, /*retain_graph=*/true);
    loss.backward();
    const at::Tensor loss_eager = eager->forward(x_eager).tanh().sum();
    loss_eager.backward({}, /*retain_graph=*/true);
    loss_eager.backward();
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*graphed, *eager);
  }
}

TEST_CASE("torch/autograd: a second backward without retain_graph fails as eager's does", "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Linear linear(4, 4);
  linear->to(torch::kCUDA);
  auto pool = new_pool();
  auto layer = wrap(pool, linear, "once");
  const at::Tensor x = at::randn({2, 4}, H::cuda()).requires_grad_(true);
  for (int step = 0; step < 3; ++step) {  // warm-up, recording, replay
    INFO("step " << step);
    pool.mark_step_begin();
    auto out = must(layer({x}));
    const at::Tensor loss = out[0].sum();  // sum's backward saves nothing: the second reaches our node
    loss.backward();
    try {
      loss.backward();
      FAIL("a second backward without retain_graph succeeded");
    } catch (const c10::Error& error) {
      const std::string what = error.what_without_backtrace();
      INFO(what);
      CHECK(what.find("backward through the graph a second time") != std::string::npos);
      CHECK(what.find("once") != std::string::npos);
    }
  }
  // The eager reference fails the same way.
  const at::Tensor eager_loss = linear->forward(x).tanh().sum();
  eager_loss.backward();
  CHECK_THROWS_AS(eager_loss.backward(), c10::Error);
}

TEST_CASE("torch/autograd: under NoGradGuard and InferenceMode the inference function runs, with no backward",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Linear linear(8, 3);
  linear->to(torch::kCUDA);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, linear, "served");
  const at::Tensor x = at::randn({5, 8}, H::cuda()).requires_grad_(true);
  at::Tensor expected;
  {
    const torch::NoGradGuard no_grad;
    expected = linear->forward(x);
  }
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    pool.mark_step_begin();
    if (step % 2 == 0) {
      const torch::NoGradGuard no_grad;
      auto out = must(layer({x}));
      CHECK(!out.has_backward());
      CHECK(out[0].grad_fn() == nullptr);
      CHECK(!out[0].requires_grad());
      CHECK(close(out[0], expected));
    } else {
      const c10::InferenceMode inference;
      auto out = must(layer({x}));
      CHECK(!out.has_backward());
      CHECK(out[0].grad_fn() == nullptr);
      CHECK(close(out[0], expected));
    }
    CHECK(!pool.has_pending_backward());
  }
  CHECK(path_functions(pool) == std::vector<std::string>{"served.inference"});
  CHECK(pool.stats().replays >= 2);
  for (const auto& parameter : linear->parameters()) CHECK(!parameter.grad().defined());
}

TEST_CASE("torch/autograd: dropout's forward and gradients equal eager's with the same seed", "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Sequential graphed(torch::nn::Linear(16, 32), torch::nn::Dropout(0.5), torch::nn::Linear(32, 4));
  torch::nn::Sequential eager(torch::nn::Linear(16, 32), torch::nn::Dropout(0.5), torch::nn::Linear(32, 4));
  graphed->to(torch::kCUDA);
  eager->to(torch::kCUDA);
  copy_parameters(*eager, *graphed);
  graphed->train();
  eager->train();
  auto pool = new_pool({.debug_checks = true});
  auto model = wrap(pool, graphed, "dropout");
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    set_grads_to_none(*graphed);
    set_grads_to_none(*eager);
    const at::Tensor data = at::randn({8, 16}, H::cuda());
    const at::Tensor target = at::randn({8, 4}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    at::manual_seed(100 + step);
    auto out = must(model({x}));
    // A draw between forward and backward: the backward must still see the forward's numbers.
    const at::Tensor between = at::rand({64}, H::cuda());
    torch::mse_loss(out[0], target).backward();
    const at::Tensor after = at::rand({64}, H::cuda());

    at::manual_seed(100 + step);
    const at::Tensor expected = eager->forward(x_eager);
    const at::Tensor between_eager = at::rand({64}, H::cuda());
    torch::mse_loss(expected, target).backward();
    const at::Tensor after_eager = at::rand({64}, H::cuda());
    CHECK(close(out[0].detach(), expected.detach()));
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*graphed, *eager);
    // The program's own draws are where eager's are: the backward put the generator back.
    CHECK(at::equal(between, between_eager));
    CHECK(at::equal(after, after_eager));
  }
  CHECK(pool.stats().replays >= 4);
}

TEST_CASE("torch/autograd: a backward never called frees what its node held once outputs and node are dropped",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Linear first(8, 8);
  torch::nn::Linear second(8, 2);
  first->to(torch::kCUDA);
  second->to(torch::kCUDA);
  auto pool = new_pool({.debug_checks = true});
  auto layer1 = wrap(pool, first, "unused1");
  auto layer2 = wrap(pool, second, "unused2");
  const at::Tensor x = at::randn({4, 8}, H::cuda());
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    pool.mark_step_begin();
    auto hidden = must(layer1({x}));
    std::optional<cgt::torch::AutogradOutputs> out = must(layer2({hidden[0]}));
    std::optional<at::Tensor> loss = (*out)[0].sum();
    // The hidden activation's memory is held by layer 2's node (a lease) after its bundle goes.
    // (A replay's outputs are not blocks of the caching allocator: counted as live outputs.)
    auto live_outputs = [&pool] {
      std::size_t live = 0;
      for (const auto& node : pool.current_path()) live += node.live_outputs();
      return live;
    };
    const std::size_t blocks = H::live_blocks(pool);
    if (step == 0) CHECK(blocks == 2);  // the warm-up's two outputs
    if (step >= 1) CHECK(live_outputs() == 2);
    hidden = cgt::torch::AutogradOutputs();
    CHECK(H::live_blocks(pool) == blocks);
    if (step >= 1) CHECK(live_outputs() == 2);
    must(pool.check_memory());
    // Dropping the outputs and the graph above them (the node goes with it) frees everything.
    loss.reset();
    out.reset();
    CHECK(H::live_blocks(pool) == 0);
    if (step >= 1) CHECK(live_outputs() == 0);
    must(pool.check_memory());
  }
}

TEST_CASE("torch/autograd: zero_grad with and without set_to_none both work", "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(6, 3);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "zeroed");
  torch::optim::SGD optimizer(graphed->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD optimizer_eager(eager->parameters(), torch::optim::SGDOptions(0.1));
  const void* grad_address = nullptr;
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    const bool set_to_none = step % 3 == 0;
    optimizer.zero_grad(set_to_none);
    optimizer_eager.zero_grad(set_to_none);
    const at::Tensor x = at::randn({4, 6}, H::cuda());
    pool.mark_step_begin();
    auto out = must(layer({x}));
    out[0].pow(2).mean().backward();
    eager->forward(x).pow(2).mean().backward();
    check_same_grads(*graphed, *eager);
    // Without set_to_none the same .grad() tensor is zeroed and filled again.
    if (!set_to_none) CHECK(graphed->weight.grad().data_ptr() == grad_address);
    grad_address = graphed->weight.grad().data_ptr();
    optimizer.step();
    optimizer_eager.step();
  }
  CHECK(close(graphed->weight, eager->weight));
  CHECK(close(graphed->bias, eager->bias));
}

TEST_CASE("torch/autograd: a small MLP trained 100 steps with SGD equals eager training", "[gpu][autograd]") {
  REQUIRE_GPU();
  auto make = [] {
    return std::pair{torch::nn::Sequential(torch::nn::Linear(8, 32), torch::nn::ReLU()),
                     torch::nn::Sequential(torch::nn::Linear(32, 32), torch::nn::ReLU(), torch::nn::Linear(32, 4))};
  };
  auto [first, second] = make();
  auto [first_eager, second_eager] = make();
  for (torch::nn::Sequential* module : {&first, &second, &first_eager, &second_eager}) (*module)->to(torch::kCUDA);
  copy_parameters(*first_eager, *first);
  copy_parameters(*second_eager, *second);
  auto pool = new_pool();
  auto layer1 = wrap(pool, first, "mlp1");
  auto layer2 = wrap(pool, second, "mlp2");
  auto loss_fn = must(cgt::torch::make_autograd_function(
      pool, [](Inputs in) { return Values{torch::mse_loss(in[0], in[1])}; }, {.name = "mse"}));
  auto parameters = first->parameters();
  for (const auto& p : second->parameters()) parameters.push_back(p);
  auto parameters_eager = first_eager->parameters();
  for (const auto& p : second_eager->parameters()) parameters_eager.push_back(p);
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9);
  torch::optim::SGD optimizer(parameters, options);
  torch::optim::SGD optimizer_eager(parameters_eager, options);
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> targets;
  for (int i = 0; i < 4; ++i) {
    inputs.push_back(at::randn({16, 8}, H::cuda()));
    targets.push_back(at::randn({16, 4}, H::cuda()));
  }
  double worst = 0;
  for (int step = 0; step < 100; ++step) {
    const at::Tensor& x = inputs[static_cast<std::size_t>(step % 4)];
    const at::Tensor& y = targets[static_cast<std::size_t>(step % 4)];
    pool.mark_step_begin();
    optimizer.zero_grad();
    at::Tensor loss_value;
    {
      auto hidden = must(layer1({x}));
      auto out = must(layer2({hidden[0]}));
      auto loss = must(loss_fn({out[0], y}));
      loss[0].backward();
      loss_value = must(loss.take(0));
    }
    optimizer.step();

    optimizer_eager.zero_grad();
    const at::Tensor loss_eager = torch::mse_loss(second_eager->forward(first_eager->forward(x)), y);
    loss_eager.backward();
    optimizer_eager.step();
    worst = std::max(worst, (loss_value - loss_eager.detach()).abs().item<double>());
  }
  INFO("largest loss difference " << worst);
  CHECK(worst <= 1e-5);
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    INFO("parameter " << i);
    CHECK(close(parameters[i], parameters_eager[i]));
  }
  CHECK(pool.stats().replays >= 6 * 97);
  CHECK(path_functions(pool) == std::vector<std::string>{"mlp1.forward", "mlp2.forward", "mse.forward", "mse.backward",
                                                         "mlp2.backward", "mlp1.backward"});
}

TEST_CASE("torch/autograd: input shapes that change get a forward and a backward graph per shape", "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(6, 3);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "dynamic");
  for (int step = 0; step < 6; ++step) {
    const std::int64_t batch = step % 2 == 0 ? 4 : 7;
    INFO("step " << step << ", batch " << batch);
    set_grads_to_none(*graphed);
    set_grads_to_none(*eager);
    const at::Tensor data = at::randn({batch, 6}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    auto out = must(layer({x}));
    out[0].exp().sum().backward();
    eager->forward(x_eager).exp().sum().backward();
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*graphed, *eager);
  }
  CHECK(pool.stats().replays >= 4);  // steps 4 and 5: forward and backward
}

TEST_CASE("torch/autograd: with copy_out_on_new_step, a backward after a new step reads its saved inputs' copies",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Sequential first(torch::nn::Linear(5, 9), torch::nn::Tanh());
  torch::nn::Linear second(9, 2);
  torch::nn::Sequential first_eager(torch::nn::Linear(5, 9), torch::nn::Tanh());
  torch::nn::Linear second_eager(9, 2);
  first->to(torch::kCUDA);
  second->to(torch::kCUDA);
  first_eager->to(torch::kCUDA);
  second_eager->to(torch::kCUDA);
  copy_parameters(*first_eager, *first);
  copy_parameters(*second_eager, *second);
  auto pool = new_pool({.debug_checks = true, .copy_out_on_new_step = true});
  auto layer1 = wrap(pool, first, "kept1");
  auto layer2 = wrap(pool, second, "kept2");
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    set_grads_to_none(*first);
    set_grads_to_none(*second);
    set_grads_to_none(*first_eager);
    set_grads_to_none(*second_eager);
    const at::Tensor data = at::randn({3, 5}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    at::Tensor loss;
    {
      auto hidden = must(layer1({x}));
      auto out = must(layer2({hidden[0]}));
      loss = out[0].sum();
    }
    // The hidden activation, held by layer 2's node, is copied out when the new step begins.
    pool.mark_step_begin();
    loss.backward();
    second_eager->forward(first_eager->forward(x_eager)).sum().backward();
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*first, *first_eager);
    check_same_grads(*second, *second_eager);
  }
}

TEST_CASE("torch/autograd: a .grad kept across zero_grad(set_to_none) keeps its values, as eager's does",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(8, 4);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "kept_grad");
  torch::optim::SGD optimizer(graphed->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD optimizer_eager(eager->parameters(), torch::optim::SGDOptions(0.1));
  at::Tensor kept;  // the previous step's weight gradient, as a program logging it keeps it
  at::Tensor kept_eager;
  const void* grad_address = nullptr;
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    optimizer.zero_grad(/*set_to_none=*/true);
    optimizer_eager.zero_grad(/*set_to_none=*/true);
    const at::Tensor x = at::randn({3, 8}, H::cuda());
    pool.mark_step_begin();
    {
      auto out = must(layer({x}));
      out[0].pow(2).sum().backward();
    }
    eager->forward(x).pow(2).sum().backward();
    check_same_grads(*graphed, *eager);
    if (kept.defined()) {
      CHECK(close(kept, kept_eager));  // still the previous step's gradient
      CHECK(!kept.is_same(graphed->weight.grad()));
      CHECK(kept.data_ptr() != graphed->weight.grad().data_ptr());
    }
    // The new .grad() is the function's buffer every step: only the kept tensor was copied.
    if (step > 0) CHECK(graphed->weight.grad().data_ptr() == grad_address);
    grad_address = graphed->weight.grad().data_ptr();
    kept = graphed->weight.grad();
    kept_eager = eager->weight.grad();
    optimizer.step();
    optimizer_eager.step();
  }
  CHECK(close(graphed->weight, eager->weight));
  // The same within one step: .grad() set to none by hand between two backwards.
  set_grads_to_none(*graphed);
  const at::Tensor x = at::randn({3, 8}, H::cuda());
  pool.mark_step_begin();
  auto first = must(layer({x}));
  first[0].sum().backward();
  const at::Tensor g1 = graphed->bias.grad();
  const at::Tensor g1_values = g1.clone();
  graphed->bias.mutable_grad() = at::Tensor();
  auto second = must(layer({x}));
  (3 * second[0]).sum().backward();
  CHECK(at::equal(g1, g1_values));
  CHECK(close(graphed->bias.grad(), 3 * g1_values));
}

TEST_CASE("torch/autograd: an input modified in place before the backward is refused, as eager refuses it",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Linear linear(6, 3);
  linear->to(torch::kCUDA);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, linear, "modified");
  for (int step = 0; step < 3; ++step) {  // warm-up, recording, replay
    INFO("step " << step);
    for (const auto& parameter : linear->parameters()) parameter.mutable_grad() = at::Tensor();
    const at::Tensor x = at::randn({4, 6}, H::cuda());  // the weight's gradient needs it
    pool.mark_step_begin();
    auto out = must(layer({x}));
    const at::Tensor loss = out[0].sum();
    const std::int64_t version = x._version();
    x.mul_(10);
    try {
      loss.backward();
      FAIL("a backward after its input was modified in place succeeded");
    } catch (const c10::Error& error) {
      const std::string what = error.what_without_backtrace();
      INFO(what);
      CHECK(what.find("modified by an inplace operation") != std::string::npos);
      CHECK(what.find("modified\"") != std::string::npos);  // the function's name
      CHECK(what.find("is at version " + std::to_string(version + 1) + "; expected version " +
                      std::to_string(version)) != std::string::npos);
    }
    for (const auto& parameter : linear->parameters()) CHECK(!parameter.grad().defined());
  }
  // Eager libtorch refuses the same program.
  const at::Tensor x = at::randn({4, 6}, H::cuda());
  const at::Tensor loss = linear->forward(x).sum();
  x.mul_(10);
  try {
    loss.backward();
    FAIL("eager's backward after its input was modified in place succeeded");
  } catch (const c10::Error& error) {
    CHECK(std::string(error.what_without_backtrace()).find("modified by an inplace operation") != std::string::npos);
  }
  // An unmodified input still trains after the refusals.
  const at::Tensor y = at::randn({4, 6}, H::cuda());
  for (const auto& parameter : linear->parameters()) parameter.mutable_grad() = at::Tensor();
  pool.mark_step_begin();
  {
    auto out = must(layer({y}));
    out[0].sum().backward();
  }
  CHECK(close(linear->weight.grad(), at::ones({3, 4}, H::cuda()).mm(y)));
}

TEST_CASE(
    "torch/autograd: accumulate_grad: .grad accumulates in place, and out of place under create_graph, as eager's",
    "[gpu][autograd]") {
  REQUIRE_GPU();
  // PyTorch's test_accumulate_grad, with y = x * w + 2 as a cgt autograd function: x is an input
  // leaf (autograd's AccumulateGrad fills its .grad), w a parameter (the backward graph fills its
  // .grad). Two backwards of y: the second adds to the first's .grad in place, or, under
  // create_graph, sets .grad to a new tensor and leaves the first one as it was.
  const at::Tensor w = at::randn({5, 5}, H::cuda()).requires_grad_(true);
  const at::Tensor w_eager = w.detach().clone().requires_grad_(true);
  auto pool = new_pool({.debug_checks = true});
  auto affine = must(cgt::torch::make_autograd_function(pool, [w](Inputs in) { return Values{in[0] * w + 2}; },
                                                        {.name = "affine", .parameters = {w}}));
  const at::Tensor grad_output = at::ones({5, 5}, H::cuda());
  // What one leaf's .grad did in the second backward.
  auto check_accumulated = [](const char* leaf, const at::Tensor& before, const at::Tensor& before_values,
                              const at::Tensor& after, bool create_graph) {
    INFO(leaf);
    REQUIRE(before.defined());
    if (create_graph) {
      CHECK(!after.is_same(before));            // a new tensor
      CHECK(at::equal(before, before_values));  // the old one left as it was
    } else {
      CHECK(after.is_same(before));  // the same tensor, added to in place
      CHECK(close(before, before_values * 2));
    }
    CHECK(close(after, before_values * 2));
  };
  std::vector<cgt::CallKind> kinds;
  // Warm-up, recording, then the same graphs replayed with create_graph off and on.
  const std::vector<bool> rounds{false, true, false, true};
  for (std::size_t round = 0; round < rounds.size(); ++round) {
    const bool create_graph = rounds[round];
    INFO("round " << round << ", create_graph " << create_graph);
    w.mutable_grad() = at::Tensor();
    w_eager.mutable_grad() = at::Tensor();
    const at::Tensor data = at::randn({5, 5}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    const std::uint64_t replays_before = pool.stats().replays;
    {
      auto out = must(affine({x}));
      kinds.push_back(out.kind());
      const at::Tensor& y = out[0];
      const at::Tensor y_eager = x_eager * w_eager + 2;
      y.backward(grad_output, /*retain_graph=*/true);
      y_eager.backward(grad_output, /*retain_graph=*/true);
      const at::Tensor x_grad = x.grad();
      const at::Tensor x_grad_values = x_grad.clone();
      const at::Tensor w_grad = w.grad();
      const at::Tensor w_grad_values = w_grad.clone();
      const at::Tensor x_eager_grad = x_eager.grad();
      const at::Tensor x_eager_grad_values = x_eager_grad.clone();
      const at::Tensor w_eager_grad = w_eager.grad();
      const at::Tensor w_eager_grad_values = w_eager_grad.clone();
      y.backward(grad_output, /*retain_graph=*/std::nullopt, create_graph);
      y_eager.backward(grad_output, /*retain_graph=*/std::nullopt, create_graph);

      check_accumulated("x (eager)", x_eager_grad, x_eager_grad_values, x_eager.grad(), create_graph);
      check_accumulated("w (eager)", w_eager_grad, w_eager_grad_values, w_eager.grad(), create_graph);
      check_accumulated("x", x_grad, x_grad_values, x.grad(), create_graph);
      check_accumulated("w", w_grad, w_grad_values, w.grad(), create_graph);
      CHECK(close(x.grad(), x_eager.grad()));
      CHECK(close(w.grad(), w_eager.grad()));
      // Eager's new .grad has history (x's gradient depends on w, w's on x): so has cgt's.
      CHECK(x.grad().requires_grad() == x_eager.grad().requires_grad());
      CHECK(w.grad().requires_grad() == w_eager.grad().requires_grad());
      // No gradient lives in the pool.
      auto& device = must(pool.device()).get();
      CHECK(!device.contains(reinterpret_cast<std::uintptr_t>(x.grad().data_ptr())));
      CHECK(!device.contains(reinterpret_cast<std::uintptr_t>(w.grad().data_ptr())));
    }
    if (round >= 2) CHECK(pool.stats().replays - replays_before == 3);  // the forward and both backwards
    // A create_graph .grad refers back to its leaf (eager's reference cycle): set it to none.
    x.mutable_grad() = at::Tensor();
    x_eager.mutable_grad() = at::Tensor();
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay});
  w.mutable_grad() = at::Tensor();
  w_eager.mutable_grad() = at::Tensor();
  must(pool.check_memory());
}

TEST_CASE("torch/autograd: differentiating a create_graph gradient again raises, naming the function",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Sequential graphed(torch::nn::Linear(6, 4), torch::nn::Tanh());
  torch::nn::Sequential eager(torch::nn::Linear(6, 4), torch::nn::Tanh());
  graphed->to(torch::kCUDA);
  eager->to(torch::kCUDA);
  copy_parameters(*eager, *graphed);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "twice");
  const at::Tensor weight = graphed->parameters()[0];
  auto expect_refused = [](const auto& second_order) {
    try {
      second_order();
      FAIL("a second derivative through a cgt autograd function succeeded");
    } catch (const c10::Error& error) {
      const std::string what = error.what_without_backtrace();
      INFO(what);
      CHECK(what.find("cgt autograd function \"twice\" gives first-order gradients only") != std::string::npos);
      CHECK(what.find("(a second derivative) is not supported") != std::string::npos);
    }
  };
  for (int step = 0; step < 3; ++step) {  // warm-up, recording, replay
    INFO("step " << step);
    set_grads_to_none(*graphed);
    set_grads_to_none(*eager);
    const at::Tensor data = at::randn({3, 6}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    {
      auto out = must(layer({x}));
      // A sum: the gradient reaching the function has no history, but eager's gradient of x does
      // (it depends on x and the weight), so a second derivative needs the function's terms.
      const at::Tensor loss = out[0].sum();
      const at::Tensor loss_eager = eager->forward(x_eager).sum();
      const at::Tensor gx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
      const at::Tensor gx_eager =
          torch::autograd::grad({loss_eager}, {x_eager}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
      CHECK(close(gx, gx_eager));
      CHECK(gx.requires_grad());
      CHECK(gx_eager.requires_grad());
      check_same_grads(*graphed, *eager);  // grad() leaves .grad alone (undefined)

      // With respect to the input, to a parameter, and a loss plus a gradient penalty (where a
      // gradient without history would silently leave the penalty's terms out).
      expect_refused([&] { (void)torch::autograd::grad({gx.sum()}, {x}, {}, /*retain_graph=*/true); });
      expect_refused([&] { (void)torch::autograd::grad({gx.pow(2).sum()}, {weight}, {}, /*retain_graph=*/true); });
      expect_refused([&] { (loss + gx.pow(2).sum()).backward({}, /*retain_graph=*/true); });
      // Eager differentiates the same penalty.
      const auto penalty_eager = torch::autograd::grad({gx_eager.pow(2).sum()}, {x_eager}, {}, /*retain_graph=*/true);
      CHECK(penalty_eager[0].defined());

      // Through .grad after backward(create_graph=true): an input's and a parameter's. (The refused
      // backward may have filled some .grad before it reached the function's guard.)
      set_grads_to_none(*graphed);
      set_grads_to_none(*eager);
      x.mutable_grad() = at::Tensor();
      loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      loss_eager.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      CHECK(close(x.grad(), x_eager.grad()));
      check_same_grads(*graphed, *eager);
      expect_refused([&] { x.grad().sum().backward(); });
      expect_refused([&] { weight.grad().sum().backward(); });

      // The function's backward still gives eager's first-order gradients.
      set_grads_to_none(*graphed);
      set_grads_to_none(*eager);
      x.mutable_grad() = at::Tensor();
      x_eager.mutable_grad() = at::Tensor();
      loss.backward();
      loss_eager.backward();
      CHECK(close(x.grad(), x_eager.grad()));
      check_same_grads(*graphed, *eager);
      CHECK(!x.grad().requires_grad());
    }
    x.mutable_grad() = at::Tensor();
    x_eager.mutable_grad() = at::Tensor();
  }
  CHECK(pool.stats().replays >= 3);
  set_grads_to_none(*graphed);
  must(pool.check_memory());
}

TEST_CASE("torch/autograd: a create_graph backward through a small MLP gives eager's first-order gradients",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  torch::nn::Sequential first(torch::nn::Linear(8, 16), torch::nn::ReLU());
  torch::nn::Sequential second(torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  torch::nn::Sequential first_eager(torch::nn::Linear(8, 16), torch::nn::ReLU());
  torch::nn::Sequential second_eager(torch::nn::Linear(16, 16), torch::nn::Tanh(), torch::nn::Linear(16, 4));
  for (torch::nn::Sequential* module : {&first, &second, &first_eager, &second_eager}) (*module)->to(torch::kCUDA);
  copy_parameters(*first_eager, *first);
  copy_parameters(*second_eager, *second);
  auto pool = new_pool({.debug_checks = true});
  auto layer1 = wrap(pool, first, "mlp_a");
  auto layer2 = wrap(pool, second, "mlp_b");
  auto same_history = [](const torch::nn::Module& a, const torch::nn::Module& b) {
    const auto pa = a.parameters();
    const auto pb = b.parameters();
    for (std::size_t i = 0; i < pa.size(); ++i) {
      INFO("parameter " << i);
      CHECK(pa[i].grad().requires_grad() == pb[i].grad().requires_grad());
    }
  };
  for (int step = 0; step < 4; ++step) {
    INFO("step " << step);
    set_grads_to_none(*first);
    set_grads_to_none(*second);
    set_grads_to_none(*first_eager);
    set_grads_to_none(*second_eager);
    const at::Tensor data = at::randn({6, 8}, H::cuda());
    const at::Tensor target = at::randn({6, 4}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    const std::uint64_t replays_before = pool.stats().replays;
    {
      auto hidden = must(layer1({x}));
      auto out = must(layer2({hidden[0]}));
      const at::Tensor loss = torch::mse_loss(out[0], target);
      const at::Tensor loss_eager = torch::mse_loss(second_eager->forward(first_eager->forward(x_eager)), target);
      loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      loss_eager.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      CHECK(close(x.grad(), x_eager.grad()));
      check_same_grads(*first, *first_eager);
      check_same_grads(*second, *second_eager);
      CHECK(x.grad().requires_grad() == x_eager.grad().requires_grad());
      same_history(*first, *first_eager);
      same_history(*second, *second_eager);
      // A second create_graph backward accumulates (out of place) to eager's twice.
      loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      loss_eager.backward({}, /*retain_graph=*/true, /*create_graph=*/true);
      CHECK(close(x.grad(), x_eager.grad()));
      check_same_grads(*first, *first_eager);
      check_same_grads(*second, *second_eager);
      // torch::autograd::grad with create_graph: eager's gradient; the .grad stay as they were.
      const at::Tensor gx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
      const at::Tensor gx_eager =
          torch::autograd::grad({loss_eager}, {x_eager}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
      CHECK(close(gx, gx_eager));
      check_same_grads(*first, *first_eager);
      check_same_grads(*second, *second_eager);
    }
    // forward 1, forward 2, then backward 2 and backward 1 three times.
    if (step >= 2) CHECK(pool.stats().replays - replays_before == 8);
    // A create_graph .grad refers back to its leaf (eager's reference cycle): set it to none.
    x.mutable_grad() = at::Tensor();
    x_eager.mutable_grad() = at::Tensor();
  }
  set_grads_to_none(*first);
  set_grads_to_none(*second);
  CHECK(!pool.has_pending_backward());
  must(pool.check_memory());
}

TEST_CASE(
    "torch/autograd: after a create_graph backward .grad is a new tensor, which a graphed optimizer step refuses "
    "until zero_grad(true)",
    "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(6, 2);
  // The optimizer first: the autograd function adopts its gradients.
  auto sgd = must(cgt::torch::make_sgd(graphed->parameters(), {.lr = 0.1}));
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "second_order_sgd");
  auto update = must(cgt::torch::make_optimizer_step(pool, sgd));
  torch::optim::SGD optimizer_eager(eager->parameters(), torch::optim::SGDOptions(0.1));
  const auto params = graphed->parameters();
  for (int step = 0; step < 3; ++step) {  // warm-up, recording, replay
    INFO("step " << step);
    sgd.zero_grad(/*set_to_none=*/false);
    optimizer_eager.zero_grad(/*set_to_none=*/false);
    const at::Tensor x = at::randn({4, 6}, H::cuda());
    pool.mark_step_begin();
    {
      auto out = must(layer({x}));
      out[0].pow(2).mean().backward({}, /*retain_graph=*/std::nullopt, /*create_graph=*/true);
    }
    eager->forward(x).pow(2).mean().backward({}, /*retain_graph=*/std::nullopt, /*create_graph=*/true);
    check_same_grads(*graphed, *eager);
    // As eager's: .grad is a new tensor, and the old one (the optimizer's, zeroed) is unchanged.
    for (std::size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << i);
      CHECK(!params[i].grad().is_same(sgd.grads()[i]));
      CHECK(at::equal(sgd.grads()[i], at::zeros_like(sgd.grads()[i])));
    }
    // The update graph reads the optimizer's tensors: it refuses a .grad that is another one.
    const auto refused = update();
    REQUIRE(!refused);
    CHECK(refused.error().code == cgt::Errc::invalid_argument);

    // zero_grad(true), and the next backward puts the optimizer's tensors back.
    sgd.zero_grad(/*set_to_none=*/true);
    optimizer_eager.zero_grad(/*set_to_none=*/true);
    {
      auto out = must(layer({x}));
      out[0].pow(2).mean().backward();
    }
    eager->forward(x).pow(2).mean().backward();
    check_same_grads(*graphed, *eager);
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(params[i].grad().is_same(sgd.grads()[i]));
    auto updated = update();
    if (!updated) FAIL(updated.error().describe());
    optimizer_eager.step();
    CHECK(close(graphed->weight, eager->weight));
    CHECK(close(graphed->bias, eager->bias));
  }
}

TEST_CASE("torch/autograd: torch::autograd::grad leaves the parameters' .grad alone, as eager's does",
          "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(7, 5);
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "grad_only");
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    // Odd steps keep the previous step's .grad(): grad() must leave it as it is.
    if (step % 2 == 0) {
      set_grads_to_none(*graphed);
      set_grads_to_none(*eager);
    }
    const at::Tensor data = at::randn({3, 7}, H::cuda());
    const at::Tensor x = data.clone().requires_grad_(true);
    const at::Tensor x_eager = data.clone().requires_grad_(true);
    pool.mark_step_begin();
    auto out = must(layer({x}));
    const at::Tensor loss = out[0].tanh().sum();
    const at::Tensor loss_eager = eager->forward(x_eager).tanh().sum();
    const auto gx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true);
    const auto gx_eager = torch::autograd::grad({loss_eager}, {x_eager}, {}, /*retain_graph=*/true);
    CHECK(close(gx[0], gx_eager[0]));
    CHECK(!x.grad().defined());
    check_same_grads(*graphed, *eager);  // undefined, or the previous step's
    // backward(inputs = {x}) fills x.grad() only.
    loss.backward({}, /*retain_graph=*/true, /*create_graph=*/false, std::vector<at::Tensor>{x});
    loss_eager.backward({}, /*retain_graph=*/true, /*create_graph=*/false, std::vector<at::Tensor>{x_eager});
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*graphed, *eager);
    // A plain backward then fills the parameters' .grad() as eager's.
    loss.backward();
    loss_eager.backward();
    CHECK(close(x.grad(), x_eager.grad()));
    check_same_grads(*graphed, *eager);
  }
  CHECK(pool.stats().replays >= 4);
  // The graph gives all parameters' gradients or none: grad() for one, or backward naming some of
  // them, is refused rather than answered without this function's part.
  // (libtorch may refuse first: a parameter the function reads is no edge of its node, so grad()
  // with respect to it alone finds it "not used in the graph".)
  auto expect_refused = [](const auto& backward, const char* message) {
    try {
      backward();
      FAIL("a backward the graph cannot answer succeeded");
    } catch (const c10::Error& error) {
      const std::string what = error.what_without_backtrace();
      INFO(what);
      const bool by_cgt = (what.find(message) != std::string::npos || what.find("cannot reach") != std::string::npos) &&
                          what.find("grad_only") != std::string::npos;
      const bool by_libtorch = what.find("not have been used in the graph") != std::string::npos;
      CHECK((by_cgt || by_libtorch));
    }
  };
  set_grads_to_none(*graphed);
  const at::Tensor x = at::randn({3, 7}, H::cuda()).requires_grad_(true);
  pool.mark_step_begin();
  auto out = must(layer({x}));
  const at::Tensor loss = out[0].sum();
  expect_refused([&] { (void)torch::autograd::grad({loss}, {x, graphed->weight}, {}, /*retain_graph=*/true); },
                 "with respect to a parameter");
  expect_refused(
      [&] {
        loss.backward({}, /*retain_graph=*/true, /*create_graph=*/false, std::vector<at::Tensor>{x, graphed->weight});
      },
      "names 1 of the 2 parameters");
  for (const auto& parameter : graphed->parameters()) CHECK(!parameter.grad().defined());
}

TEST_CASE(
    "torch/autograd: a capturable optimizer's static gradients keep receiving the backward after "
    "zero_grad(set_to_none)",
    "[gpu][autograd]") {
  REQUIRE_GPU();
  auto [graphed, eager] = twin_linears(6, 2);
  // The optimizer first: the autograd function adopts its gradients.
  auto sgd = must(cgt::torch::make_sgd(graphed->parameters(), {.lr = 0.1}));
  auto pool = new_pool({.debug_checks = true});
  auto layer = wrap(pool, graphed, "static_grads");
  auto update = must(cgt::torch::make_optimizer_step(pool, sgd));
  torch::optim::SGD optimizer_eager(eager->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 5; ++step) {
    INFO("step " << step);
    sgd.zero_grad(/*set_to_none=*/true);
    optimizer_eager.zero_grad(/*set_to_none=*/true);
    const at::Tensor x = at::randn({4, 6}, H::cuda());
    pool.mark_step_begin();
    {
      auto out = must(layer({x}));
      out[0].pow(2).mean().backward();
    }
    eager->forward(x).pow(2).mean().backward();
    check_same_grads(*graphed, *eager);
    // The backward put the optimizer's own tensors back: the update graph reads them.
    const auto params = graphed->parameters();
    for (std::size_t i = 0; i < params.size(); ++i) CHECK(params[i].grad().is_same(sgd.grads()[i]));
    auto updated = update();
    if (!updated) FAIL(updated.error().describe());
    optimizer_eager.step();
    CHECK(close(graphed->weight, eager->weight));
    CHECK(close(graphed->bias, eager->bias));
  }
}
