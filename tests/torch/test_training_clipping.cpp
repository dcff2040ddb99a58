// Gradient clipping by global norm inside the graph: `max_grad_norm` on the optimizer clips as
// PyTorch's `clip_grad_norm_` does, on the device, in the whole-step graph, in a graphed update of
// its own and in a step from given gradients; the norm before clipping comes back as the training
// step's last output (and as `Optimizer::grad_norm`). Against eager libtorch with
// `torch::nn::utils::clip_grad_norm_` (which reads the norm on the host) over 100 steps, and at the
// edges: gradients all zero, holding a NaN or an infinity.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "torch/training_checks.hpp"
#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::gpu;
using training_test::host_copies;
using training_test::infinity;
using training_test::max_difference;
using training_test::Mlp;
using training_test::must;
using training_test::nan_close;
using training_test::not_a_number;
using training_test::same;

constexpr int steps = 100;

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches() {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back({torch::randn({32, 16}, gpu), 3 * torch::randn({32, 8}, gpu)});
  return out;
}

struct Run {
  std::vector<double> losses;
  std::vector<double> norms;  // the gradients' norm before clipping, per step
  std::vector<torch::Tensor> params;
};

double max_param_difference(const Run& a, const Run& b) {
  REQUIRE(a.params.size() == b.params.size());
  double most = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    most = std::max(most, (a.params[i] - b.params[i]).abs().max().item<double>());
  }
  return most;
}

std::vector<torch::Tensor> params_of(Mlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().cpu());
  return out;
}

// Eager libtorch AdamW, the gradients clipped by libtorch's clip_grad_norm_ (max 0: not clipped).
Run train_libtorch(const std::vector<Batch>& data, double max_norm, double norm_type) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(1e-2));
  Run run;
  for (const Batch& b : data) {
    adam.zero_grad(true);
    auto loss = torch::mse_loss(model->forward(b.x), b.y);
    loss.backward();
    if (max_norm > 0) run.norms.push_back(torch::nn::utils::clip_grad_norm_(model->parameters(), max_norm, norm_type));
    adam.step();
    run.losses.push_back(loss.item<double>());
  }
  run.params = params_of(model);
  return run;
}

cgt::torch::AdamOptions clipped(double max_norm, double norm_type) {
  return {.lr = 3e-3,
          .weight_decay = 1e-2,
          .decoupled_weight_decay = true,
          .max_grad_norm = max_norm,
          .grad_norm_type = norm_type};
}

// cgt's whole-step graph; the norm is the step's last output.
Run train_graph(const std::vector<Batch>& data, double max_norm, double norm_type, cgt::Stats& stats) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), clipped(max_norm, norm_type)));
  CHECK(adam.clips_gradients());
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(pool, adam, [&model](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  }));
  Run run;
  for (const Batch& b : data) {
    pool.mark_step_begin();
    auto out = step({b.x, b.y});
    if (!out) FAIL(out.error().describe());
    REQUIRE(out->size() == 2);  // the loss, then the norm
    run.losses.push_back(must(out->take(0)).item<double>());
    run.norms.push_back(must(out->take(1)).item<double>());
  }
  run.params = params_of(model);
  stats = pool.stats();
  return run;
}

void clipped_graph_trains_as_libtorch(double max_norm, double norm_type) {
  INFO("max norm " << max_norm << ", norm type " << norm_type);
  const auto data = batches();
  cgt::Stats stats;
  const Run graph = train_graph(data, max_norm, norm_type, stats);
  const Run libtorch = train_libtorch(data, max_norm, norm_type);
  const Run unclipped = train_libtorch(data, 0, 2);
  CHECK(stats.recordings == 1);
  CHECK(stats.replays == steps - 2);
  // Clipping was at work: many steps' norms were above the maximum (35 of 100 at 1.0 on an H100),
  // and training differs without it.
  const auto clipped_steps = std::ranges::count_if(libtorch.norms, [&](double n) { return n > max_norm; });
  CHECK(clipped_steps >= 10);
  CHECK(max_param_difference(libtorch, unclipped) > 1e-3);
  const double norms = max_difference(graph.norms, libtorch.norms);
  const double losses = max_difference(graph.losses, libtorch.losses);
  const double params = max_param_difference(graph, libtorch);
  WARN("clipped at " << max_norm << " (order " << norm_type << ") on " << clipped_steps << " of " << steps
                     << " steps; graph against libtorch: norm " << norms << ", loss " << losses << ", param "
                     << params);
  CHECK(norms <= 1e-4 * *std::ranges::max_element(libtorch.norms));
  CHECK(losses <= 1e-5);
  CHECK(params <= 1e-5);
}

}  // namespace

TEST_CASE("training/whole_step_graph_clips_gradients_as_libtorch", "[gpu][training]") {
  REQUIRE_GPU();
  clipped_graph_trains_as_libtorch(1.0, 2);
}

TEST_CASE("training/whole_step_graph_clips_by_the_infinity_norm_as_libtorch", "[gpu][training]") {
  REQUIRE_GPU();
  clipped_graph_trains_as_libtorch(0.05, std::numeric_limits<double>::infinity());
}

// The per-function path: the update is a graph of its own; the norm is read from the optimizer.
TEST_CASE("training/graphed_optimizer_step_clips_gradients_as_libtorch", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), clipped(1.0, 2)));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto update = must(cgt::torch::make_optimizer_step(pool, adam));
  Run graph;
  for (const Batch& b : data) {
    adam.zero_grad(false);
    auto loss = torch::mse_loss(model->forward(b.x), b.y);
    loss.backward();
    must(update());
    graph.losses.push_back(loss.item<double>());
    graph.norms.push_back(adam.grad_norm().item<double>());
  }
  graph.params = params_of(model);
  CHECK(pool.stats().recordings == 1);
  const Run libtorch = train_libtorch(data, 1.0, 2);
  CHECK(max_difference(graph.norms, libtorch.norms) <= 1e-4 * *std::ranges::max_element(libtorch.norms));
  CHECK(max_difference(graph.losses, libtorch.losses) <= 1e-5);
  CHECK(max_param_difference(graph, libtorch) <= 1e-5);
}

// A step from given gradients (no autograd) clips them too: w <- w - lr * clip(2 (w - target)).
TEST_CASE("training/step_from_given_gradients_clips_them", "[gpu][training]") {
  REQUIRE_GPU();
  const auto target = torch::linspace(-4, 4, 256, gpu);
  auto run = [&](bool graph) {
    auto w = torch::zeros({256}, gpu).requires_grad_();
    std::vector<double> norms;
    if (graph) {
      auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.1, .max_grad_norm = 2.0}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto step = must(cgt::torch::make_training_step_from_gradients(pool, sgd, [&](cgt::torch::Inputs) {
        const auto diff = w.detach() - target;
        return cgt::torch::Values{diff.pow(2).sum(), 2 * diff};
      }));
      for (int t = 0; t < 30; ++t) {
        pool.mark_step_begin();
        auto out = step({});
        if (!out) FAIL(out.error().describe());
        REQUIRE(out->size() == 2);  // the loss, then the norm (the gradient is not returned)
        norms.push_back(must(out->take(1)).item<double>());
      }
    } else {
      torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.1));
      for (int t = 0; t < 30; ++t) {
        sgd.zero_grad();
        (w - target).pow(2).sum().backward();
        norms.push_back(torch::nn::utils::clip_grad_norm_({w}, 2.0));
        sgd.step();
      }
    }
    return std::make_pair(w.detach().cpu(), norms);
  };
  const auto [graph_w, graph_norms] = run(true);
  const auto [eager_w, eager_norms] = run(false);
  CHECK(graph_norms.front() > 2.0);  // clipped
  CHECK(max_difference(graph_norms, eager_norms) <= 1e-4 * graph_norms.front());
  CHECK((graph_w - eager_w).abs().max().item<double>() <= 1e-5);
}

TEST_CASE("training/clipping_options_that_cannot_work_are_errors", "[gpu][training]") {
  REQUIRE_GPU();
  auto w = torch::zeros({4}, gpu).requires_grad_();
  for (const auto& [max_norm, type] :
       std::vector<std::pair<double, double>>{{-1, 2},
                                              {std::nan(""), 2},
                                              {std::numeric_limits<double>::infinity(), 2},
                                              {1, 0},
                                              {1, -2},
                                              {1, std::nan("")}}) {
    INFO(max_norm << ", " << type);
    auto adam = cgt::torch::make_adam({w}, {.max_grad_norm = max_norm, .grad_norm_type = type});
    REQUIRE_FALSE(adam);
    CHECK(adam.error().code == cgt::Errc::invalid_argument);
    auto sgd = cgt::torch::make_sgd({w}, {.lr = 0.1, .max_grad_norm = max_norm, .grad_norm_type = type});
    REQUIRE_FALSE(sgd);
  }
  auto plain = must(cgt::torch::make_adam({w}, {}));
  CHECK_FALSE(plain.clips_gradients());
  CHECK_FALSE(plain.grad_norm().defined());
}

// ---- clipping at the edges (GPU) ------------------------------------------------------------------

// Clipping on the device does what libtorch's clip_grad_norm_ does, without loss scaling, where the
// gradients are all zero (the norm is 0, not NaN: the coefficient is capped at 1), hold a NaN (the
// norm is NaN and every gradient, finite or not, becomes NaN, and so does every parameter), or an
// infinity (the norm is infinite: every finite gradient becomes 0, the infinite one NaN). Orders 2
// and infinity; the edge comes at a replay, after a warm-up and a recording on finite gradients.
// SGD on (w1 * a).sum() + (w2 * b).sum(): the gradients are a and b.
TEST_CASE("training/clipping: clipping zero, NaN and infinite gradients as clip_grad_norm_ does", "[gpu][training]") {
  REQUIRE_GPU();
  enum class Edge : std::uint8_t { zero, nan, inf };
  for (const double order : {2.0, infinity}) {
    for (const Edge edge : {Edge::zero, Edge::nan, Edge::inf}) {
      INFO("order " << order << ", " << (edge == Edge::zero ? "zero" : edge == Edge::nan ? "NaN" : "infinity"));
      torch::manual_seed(9);
      std::vector<std::pair<torch::Tensor, torch::Tensor>> inputs;
      for (int i = 0; i < 2; ++i) inputs.emplace_back(torch::randn({64}, gpu) * 3, torch::randn({32}, gpu) * 3);
      auto a = torch::randn({64}, gpu);
      auto b = torch::randn({32}, gpu);
      if (edge == Edge::zero) {
        a.zero_();
        b.zero_();
      }
      if (edge == Edge::nan) a[5] = not_a_number;
      if (edge == Edge::inf) a[5] = infinity;
      inputs.emplace_back(a, b);
      const auto w1_init = torch::randn({64}, gpu);
      const auto w2_init = torch::randn({32}, gpu);

      // cgt: the whole-step graph.
      auto w1 = w1_init.clone().requires_grad_();
      auto w2 = w2_init.clone().requires_grad_();
      auto sgd = must(cgt::torch::make_sgd({w1, w2}, {.lr = 0.1, .max_grad_norm = 1.0, .grad_norm_type = order}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto step = must(cgt::torch::make_training_step(pool, sgd, [&](cgt::torch::Inputs in) {
        return cgt::torch::Values{(w1 * in[0]).sum() + (w2 * in[1]).sum()};
      }));
      // libtorch: clip_grad_norm_ and SGD, eagerly.
      auto e1 = w1_init.clone().requires_grad_();
      auto e2 = w2_init.clone().requires_grad_();
      torch::optim::SGD eager({e1, e2}, torch::optim::SGDOptions(0.1));

      std::vector<torch::Tensor> params_before;
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        INFO("call " << i);
        params_before = host_copies({w1, w2});
        pool.mark_step_begin();
        auto out = step({inputs[i].first, inputs[i].second});
        if (!out) FAIL(out.error().describe());
        REQUIRE(out->size() == 2);
        const double norm = must(out->take(1)).item<double>();
        eager.zero_grad();
        ((e1 * inputs[i].first).sum() + (e2 * inputs[i].second).sum()).backward();
        const double eager_norm = torch::nn::utils::clip_grad_norm_({e1, e2}, 1.0, order);
        const auto eager_grads = host_copies({e1.grad(), e2.grad()});
        eager.step();
        INFO("norm " << norm << ", clip_grad_norm_'s " << eager_norm);
        CHECK(((std::isnan(norm) && std::isnan(eager_norm)) || norm == eager_norm ||
               std::abs(norm - eager_norm) <= 1e-5 * std::abs(eager_norm)));
        CHECK(nan_close(host_copies(sgd.grads()), eager_grads, 1e-6));
        CHECK(nan_close(host_copies({w1, w2}), host_copies({e1, e2}), 1e-6));
      }
      // What the edge did, spelled out.
      const auto grads = host_copies(sgd.grads());
      if (edge == Edge::zero) {
        CHECK(sgd.grad_norm().item<double>() == 0);
        CHECK(grads[0].abs().max().item<double>() == 0);
        CHECK(same(params_before, host_copies({w1, w2})));
      } else if (edge == Edge::nan) {
        CHECK(std::isnan(sgd.grad_norm().item<double>()));
        CHECK(grads[0].isnan().all().item<bool>());
        CHECK(grads[1].isnan().all().item<bool>());
        CHECK(w2.detach().isnan().all().item<bool>());
      } else {
        CHECK(std::isinf(sgd.grad_norm().item<double>()));
        CHECK(grads[0].isnan().sum().item<std::int64_t>() == 1);
        CHECK(grads[0].isnan()[5].item<bool>());
        CHECK(torch::nan_to_num(grads[0], 0).abs().max().item<double>() == 0);
        CHECK(grads[1].abs().max().item<double>() == 0);
        CHECK(same({params_before[1]}, host_copies({w2})));
      }
      CHECK(pool.stats().replays == 1);
    }
  }
}
