// Training from gradients a program computes itself (make_training_step_from_gradients), above
// all an AOTInductor package of the joint forward and backward (load_aoti_gradients): the step
// replays the program and the optimizer's update as one graph. A gradient function written with
// torch::autograd::grad trains exactly as eager training does; gradients in another layout are
// put in the parameter's; what does not match fails the call; the package made by
// scripts/export-test-models.py (train_mlp.pt2) trains as eager within rounding. [gpu][training].
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

namespace {

template <class T>
T must(cgt::Result<T> result) {
  if (!result) FAIL(result.error().describe());
  return std::move(*result);
}

#define REQUIRE_GPU() \
  if (!cgt::torch::is_available()) SKIP("no CUDA device")

constexpr int steps = 100;
const torch::Device gpu(torch::kCUDA, 0);

// scripts/export-test-models.py's TrainMlp: 32 -> 64, GELU, 64 -> 16; MSE loss.
struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))),
        fc2(register_module("fc2", torch::nn::Linear(64, 16))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::gelu(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches() {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back({torch::randn({16, 32}, gpu), torch::randn({16, 16}, gpu)});
  return out;
}

struct Run {
  std::vector<float> losses;
  std::vector<torch::Tensor> params;
  cgt::Stats stats;
};

// Eager training with cgt's Adam: the reference.
Run train_eagerly(const std::vector<Batch>& data) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
  Run run;
  for (const Batch& b : data) {
    adam.zero_grad(false);
    auto loss = torch::mse_loss(model->forward(b.x), b.y);
    loss.backward();
    adam.step();
    run.losses.push_back(loss.item<float>());
  }
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu());
  return run;
}

// A gradient function over the model's parameters (the loss, then the gradients), with the
// parameters it differentiates, which the step checks against the optimizer's.
using GradientsOf = std::function<cgt::torch::GradientFunction(Mlp& model)>;

// The gradients by autograd (torch::autograd::grad), reshaped by `layout` (identity by default).
GradientsOf autograd_gradients(std::function<torch::Tensor(const torch::Tensor&)> layout = nullptr) {
  return [layout](Mlp& model) -> cgt::torch::GradientFunction {
    return {.params = model->parameters(), .loss_and_gradients = [model, layout](cgt::torch::Inputs in) mutable {
              const c10::AutoGradMode grad_on(true);  // the step runs its function with grad mode off
              auto loss = torch::mse_loss(model->forward(in[0]), in[1]);
              cgt::torch::Values out{loss.detach()};
              for (auto& g : torch::autograd::grad({loss}, model->parameters())) {
                out.push_back(layout ? layout(g) : g);
              }
              return out;
            }};
  };
}

// Trains through make_training_step_from_gradients; checks `.grad` after every step.
Run train_from_gradients(const std::vector<Batch>& data, const GradientsOf& gradients_of, bool static_grads) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3, .static_grads = static_grads}));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step_from_gradients(pool, adam, gradients_of(model)));
  Run run;
  for (const Batch& b : data) {
    pool.mark_step_begin();
    auto out = step({b.x, b.y});
    if (!out) FAIL(out.error().describe());
    REQUIRE(out->size() == 1);  // the loss; the gradients are not returned
    run.losses.push_back(must(out->take(0)).item<float>());
    for (std::size_t i = 0; i < adam.params().size(); ++i) {
      // Static gradients hold this step's gradients, readable; per-step ones died in the step.
      if (static_grads) {
        REQUIRE(adam.params()[i].grad().is_same(adam.grads()[i]));
      } else {
        REQUIRE_FALSE(adam.params()[i].grad().defined());
      }
    }
  }
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu());
  run.stats = pool.stats();
  return run;
}

struct Difference {
  double loss = 0, param = 0;
};

Difference difference(const Run& a, const Run& b) {
  Difference d;
  REQUIRE(a.losses.size() == b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    d.loss = std::max(d.loss, static_cast<double>(std::abs(a.losses[i] - b.losses[i])));
  }
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    d.param = std::max(d.param, (a.params[i] - b.params[i]).abs().max().item<double>());
  }
  return d;
}

void check_replayed(const cgt::Stats& stats) {
  CHECK(stats.warmups == 1);
  CHECK(stats.recordings == 1);
  CHECK(stats.replays == steps - 2);
  CHECK(stats.eager_calls == 0);
}

// With static and with per-step gradients: every step replayed, and the same kernels in the same
// order as eager, so the same losses and parameters, exactly.
void check_trains_as_eager(const std::vector<Batch>& data, const Run& eager, const GradientsOf& gradients_of) {
  for (const bool static_grads : {true, false}) {
    INFO("static_grads " << static_grads);
    const Run graph = train_from_gradients(data, gradients_of, static_grads);
    check_replayed(graph.stats);
    const Difference d = difference(graph, eager);
    CHECK(d.loss == 0);
    CHECK(d.param == 0);
  }
}

}  // namespace

TEST_CASE("training/gradients_given_by_the_program_train_as_eager", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  const Run eager = train_eagerly(data);
  CHECK(eager.losses.back() < eager.losses.front());  // it learns something
  check_trains_as_eager(data, eager, autograd_gradients());
}

// Gradients in another layout than their parameters (a joint graph's transposed weight
// gradients): the fused update reads element for element, so they are put in the parameter's
// layout first. Without that, the weights train on transposed gradients.
TEST_CASE("training/gradients_in_another_layout_are_put_in_the_parameters", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  const Run eager = train_eagerly(data);
  const auto transposed = [](const torch::Tensor& g) { return g.dim() == 2 ? g.t().contiguous().t() : g; };
  check_trains_as_eager(data, eager, autograd_gradients(transposed));
}

TEST_CASE("training/gradients_that_do_not_match_fail_the_call", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters()));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  const auto x = torch::randn({16, 32}, gpu), y = torch::randn({16, 16}, gpu);
  const auto before = model->fc1->weight.detach().clone();
  struct Case {
    const char* what;
    std::function<cgt::torch::Values(const std::vector<torch::Tensor>&)> returns;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"no gradients", [](const std::vector<torch::Tensor>& g) { return cgt::torch::Values{g[0]}; },
       "one gradient per parameter"},
      {"a gradient missing",
       [](const std::vector<torch::Tensor>& g) { return cgt::torch::Values{g[0], g[1], g[2], g[3]}; },
       "one gradient per parameter"},
      {"a gradient of another shape",
       [](const std::vector<torch::Tensor>& g) { return cgt::torch::Values{g[0], g[1].t(), g[2], g[3], g[4]}; },
       "does not match parameter 0"},
      {"a gradient of another dtype",
       [](const std::vector<torch::Tensor>& g) {
         return cgt::torch::Values{g[0], g[1], g[2].to(torch::kDouble), g[3], g[4]};
       },
       "does not match parameter 1"},
      {"an undefined gradient",
       [](const std::vector<torch::Tensor>& g) { return cgt::torch::Values{g[0], g[1], g[2], torch::Tensor(), g[4]}; },
       "gradient 2 is undefined"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    auto step = must(cgt::torch::make_training_step_from_gradients(
        pool, adam,
        [&model, returns = c.returns](cgt::torch::Inputs in) {
          const c10::AutoGradMode grad_on(true);
          auto loss = torch::mse_loss(model->forward(in[0]), in[1]);
          std::vector<torch::Tensor> values{loss.detach()};
          for (auto& g : torch::autograd::grad({loss}, model->parameters())) values.push_back(g);
          return returns(values);
        },
        {.name = c.what}));
    auto refused = step({x, y});
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == cgt::Errc::function_failed);
    CHECK(refused.error().message.find(c.message) != std::string::npos);
    // Nothing was updated.
    CHECK(torch::equal(model->fc1->weight.detach(), before));
  }
}

// Two parameters of one shape, and a gradient function made with them in the other order than
// the optimizer's: every per-call check (count, shapes, dtypes) would pass, and each parameter
// would train on the other's gradient. The step is refused when it is made, naming the index; so
// are another tensor of the same shape and a list of another length. The same parameters in the
// optimizer's order (or at the same address: `detach()`) train as eager steps from the same
// gradients do.
TEST_CASE("training/gradient_function_parameters_in_another_order_are_refused", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  auto a = torch::randn({8, 8}, gpu).requires_grad_();
  auto b = torch::randn({8, 8}, gpu).requires_grad_();
  const auto initial_a = a.detach().clone(), initial_b = b.detach().clone();
  // loss = |x a - y|^2 + 3 |x b|^2: a's and b's gradients differ, so a swap would show.
  const auto loss_and_gradients = [](torch::Tensor p, torch::Tensor q) {
    return [p, q](cgt::torch::Inputs in) {
      const c10::AutoGradMode grad_on(true);
      auto loss = (torch::matmul(in[0], p) - in[1]).pow(2).mean() + 3 * torch::matmul(in[0], q).pow(2).mean();
      cgt::torch::Values out{loss.detach()};
      for (auto& g : torch::autograd::grad({loss}, {p, q})) out.push_back(g);
      return out;
    };
  };
  auto adam = must(cgt::torch::make_adam({a, b}, {.lr = 1e-2}));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  struct Case {
    const char* what;
    std::vector<torch::Tensor> params;
    const char* message;
  };
  const std::vector<Case> refused_cases = {
      {"swapped", {b, a}, "parameter 0 of the gradient function is not the optimizer's parameter 0"},
      {"another tensor", {a, b.detach().clone().requires_grad_()}, "parameter 1 of the gradient function"},
      {"one missing", {a}, "first differing index 1"},
  };
  for (const Case& c : refused_cases) {
    INFO(c.what);
    auto refused = cgt::torch::make_training_step_from_gradients(
        pool, adam, {.params = c.params, .loss_and_gradients = loss_and_gradients(a, b)}, {.name = c.what});
    REQUIRE_FALSE(refused.has_value());
    CHECK(refused.error().code == cgt::Errc::invalid_argument);
    CHECK(refused.error().message.find("make_training_step_from_gradients") != std::string::npos);
    CHECK(refused.error().message.find(c.message) != std::string::npos);
  }
  // The optimizer's order; the second parameter passed as a view of the same memory.
  auto step = must(cgt::torch::make_training_step_from_gradients(
      pool, adam, {.params = {a, b.detach()}, .loss_and_gradients = loss_and_gradients(a, b)}));
  torch::manual_seed(1);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> data;
  for (int i = 0; i < 10; ++i) data.emplace_back(torch::randn({16, 8}, gpu), torch::randn({16, 8}, gpu));
  for (const auto& [x, y] : data) {
    pool.mark_step_begin();
    REQUIRE(step({x, y}).has_value());
  }
  CHECK(pool.stats().replays == data.size() - 2);
  // The same steps eagerly, from the same start.
  auto eager_a = initial_a.clone().requires_grad_(), eager_b = initial_b.clone().requires_grad_();
  auto eager = must(cgt::torch::make_adam({eager_a, eager_b}, {.lr = 1e-2}));
  auto eager_gradients = loss_and_gradients(eager_a, eager_b);
  for (const auto& [x, y] : data) {
    const std::vector<torch::Tensor> in{x, y};
    const std::vector<std::int64_t> no_scalars(in.size(), 0);
    const auto out = eager_gradients(cgt::torch::Inputs(in, no_scalars));
    eager.step(std::span<const torch::Tensor>(out).subspan(1, 2));
  }
  CHECK_FALSE(torch::equal(a.detach(), initial_a));
  CHECK(torch::equal(a.detach(), eager_a.detach()));
  CHECK(torch::equal(b.detach(), eager_b.detach()));
}

// The package scripts/export-test-models.py exports (train_mlp.pt2): the forward, the MSE loss
// and the backward as Inductor's kernels, called with the parameters. Its first gradients are
// autograd's within rounding, and 100 steps train as eager training does within rounding (other
// kernels, another order of the sums), every call after the first two a replay.
TEST_CASE("training/aoti_package_of_the_forward_and_backward_trains_as_eager", "[gpu][training][models]") {
  REQUIRE_GPU();
  const char* dir = std::getenv("CGT_TEST_MODELS");
  if (dir == nullptr || *dir == '\0') SKIP("CGT_TEST_MODELS is not set (scripts/export-test-models.py DIR)");
  const std::string path = std::string(dir) + "/train_mlp.pt2";
  if (!std::filesystem::exists(path)) SKIP(path + " does not exist (scripts/export-test-models.py makes it)");
  const auto data = batches();
  {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto package = must(cgt::torch::load_aoti_gradients(path, model->parameters()));
    auto autograd = autograd_gradients()(model);
    const std::vector<torch::Tensor> in{data[0].x, data[0].y};
    const std::vector<std::int64_t> no_scalars(in.size(), 0);
    const cgt::torch::Inputs inputs(in, no_scalars);
    const auto got = package.loss_and_gradients(inputs);
    const auto expected = autograd.loss_and_gradients(inputs);
    REQUIRE(got.size() == expected.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      INFO("value " << i);
      CHECK(got[i].sizes() == expected[i].sizes());
      CHECK(got[i].is_contiguous());
      CHECK((got[i] - expected[i]).abs().max().item<double>() <= 1e-5);
    }
  }
  const Run eager = train_eagerly(data);
  for (const bool static_grads : {true, false}) {
    INFO("static_grads " << static_grads);
    const Run graph = train_from_gradients(
        data, [&path](Mlp& model) { return must(cgt::torch::load_aoti_gradients(path, model->parameters())); },
        static_grads);
    check_replayed(graph.stats);
    const Difference d = difference(graph, eager);
    WARN("AOTInductor training step vs eager, 100 steps: max loss diff " << d.loss << ", max param diff " << d.param);
    CHECK(d.loss <= 1e-4);
    CHECK(d.param <= 1e-4);
  }
}

TEST_CASE("training/aoti_gradients_that_cannot_load_are_errors", "[gpu][training]") {
  REQUIRE_GPU();
  auto missing = cgt::torch::load_aoti_gradients("/nonexistent/train.pt2", {});
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.error().code == cgt::Errc::invalid_argument);
  CHECK(missing.error().message.find("/nonexistent/train.pt2") != std::string::npos);
  auto on_cpu = cgt::torch::load_aoti_gradients("/nonexistent/train.pt2", {torch::zeros({2})});
  REQUIRE_FALSE(on_cpu.has_value());
  CHECK(on_cpu.error().code == cgt::Errc::invalid_argument);
  CHECK(on_cpu.error().message.find("parameter 0") != std::string::npos);
}
