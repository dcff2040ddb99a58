// The learning rate as device state: set between steps with `set_lr`, or by a
// schedule, it reaches a recorded update without re-recording and without a host synchronisation.
// Whole-step graphs and a per-function graphed update trained with warm-up + cosine, step and
// linear schedules give the parameters of eager libtorch given the same rates step by step. The
// schedules' values, and libtorch's StepLR against `lr::step_decay`, need no device ([training]).
#include <torch/torch.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAStream.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <expected>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::gpu;
using training_test::Mlp;
using training_test::must;

constexpr int steps = 100;

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches() {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back({torch::randn({32, 16}, gpu), torch::randn({32, 8}, gpu)});
  return out;
}

struct Run {
  std::vector<float> losses;
  std::vector<torch::Tensor> params;
  cgt::Stats stats;
};

double max_param_difference(const Run& a, const Run& b) {
  REQUIRE(a.params.size() == b.params.size());
  double most = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    most = std::max(most, (a.params[i] - b.params[i]).abs().max().item<double>());
  }
  return most;
}

double max_loss_difference(const Run& a, const Run& b) {
  REQUIRE(a.losses.size() == b.losses.size());
  double most = 0;
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    most = std::max(most, static_cast<double>(std::abs(a.losses[i] - b.losses[i])));
  }
  return most;
}

Run finish(Mlp& model, const std::vector<torch::Tensor>& losses) {
  Run run;
  for (const auto& loss : losses) run.losses.push_back(loss.item<float>());
  for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu());
  return run;
}

// The optimizer under test, as cgt and as libtorch make it.
struct Optimizers {
  std::function<cgt::Result<std::unique_ptr<cgt::torch::Optimizer>>(std::vector<torch::Tensor>)> cgt;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)> libtorch;
};

Optimizers adamw(double lr) {
  return {[lr](std::vector<torch::Tensor> params) -> cgt::Result<std::unique_ptr<cgt::torch::Optimizer>> {
            auto adam = cgt::torch::make_adam(std::move(params),
                                              {.lr = lr, .weight_decay = 1e-2, .decoupled_weight_decay = true});
            if (!adam) return std::unexpected(adam.error());
            return std::make_unique<cgt::torch::Adam>(std::move(*adam));
          },
          [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
            return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr).weight_decay(1e-2));
          }};
}

Optimizers sgd_momentum(double lr) {
  return {[lr](std::vector<torch::Tensor> params) -> cgt::Result<std::unique_ptr<cgt::torch::Optimizer>> {
            auto sgd = cgt::torch::make_sgd(std::move(params), {.lr = lr, .momentum = 0.9, .weight_decay = 1e-3});
            if (!sgd) return std::unexpected(sgd.error());
            return std::make_unique<cgt::torch::SGD>(std::move(*sgd));
          },
          [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
            return std::make_unique<torch::optim::SGD>(params,
                                                       torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(1e-3));
          }};
}

// Eager libtorch, the rate of step t set from `schedule` before it (empty: the optimizer's own).
Run train_libtorch(const Optimizers& make, const cgt::torch::LrSchedule& schedule, const std::vector<Batch>& data) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto optimizer = make.libtorch(model->parameters());
  std::vector<torch::Tensor> losses;
  for (std::size_t t = 0; t < data.size(); ++t) {
    if (schedule) optimizer->param_groups()[0].options().set_lr(schedule(static_cast<std::int64_t>(t)));
    optimizer->zero_grad(true);
    auto loss = torch::mse_loss(model->forward(data[t].x), data[t].y);
    loss.backward();
    optimizer->step();
    losses.push_back(loss.detach());
  }
  return finish(model, losses);
}

// cgt's whole-step graph with `schedule` on the optimizer.
Run train_graph(const Optimizers& make, const cgt::torch::LrSchedule& schedule, const std::vector<Batch>& data) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto optimizer = must(make.cgt(model->parameters()));
  must(optimizer->set_schedule(schedule));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(pool, *optimizer, [&model](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  }));
  std::vector<torch::Tensor> losses;
  for (std::size_t t = 0; t < data.size(); ++t) {
    pool.mark_step_begin();
    auto out = step({data[t].x, data[t].y});
    if (!out) FAIL(out.error().describe());
    losses.push_back(must(out->take(0)));
    CHECK(optimizer->scheduled_steps() == static_cast<std::int64_t>(t + 1));
    CHECK(optimizer->lr() == schedule(static_cast<std::int64_t>(t)));
  }
  Run run = finish(model, losses);
  run.stats = pool.stats();
  return run;
}

// The graph against libtorch at the same rates, and against libtorch at the first rate throughout
// (which must differ: the schedule changed the training).
void scheduled_graph_trains_as_libtorch(const char* name, const Optimizers& make,
                                        const cgt::torch::LrSchedule& schedule) {
  INFO(name);
  const auto data = batches();
  const Run graph = train_graph(make, schedule, data);
  const Run libtorch = train_libtorch(make, schedule, data);
  const Run constant = train_libtorch(make, {}, data);
  CHECK(graph.losses.back() < graph.losses.front());
  // One warm-up, one recording, replays after: the rate never re-records.
  CHECK(graph.stats.warmups == 1);
  CHECK(graph.stats.recordings == 1);
  CHECK(graph.stats.replays == steps - 2);
  const double params = max_param_difference(graph, libtorch);
  const double losses = max_loss_difference(graph, libtorch);
  WARN(name << ": against libtorch at the same rates: loss " << losses << ", param " << params
            << "; against a constant rate: param " << max_param_difference(graph, constant));
  CHECK(losses <= 1e-5);
  CHECK(params <= 1e-5);
  CHECK(max_param_difference(graph, constant) > 1e-4);
}

}  // namespace

TEST_CASE("training/lr_schedules_give_the_rates_they_promise", "[training]") {
  const auto cosine = cgt::torch::lr::warmup_cosine(1.0, 10, 110, 0.1);
  CHECK(cosine(0) == 0.0);
  CHECK(cosine(5) == Catch::Approx(0.5));
  CHECK(cosine(10) == Catch::Approx(1.0));
  CHECK(cosine(60) == Catch::Approx(0.1 + (0.9 * 0.5 * (1 + std::cos(std::numbers::pi / 2)))));
  CHECK(cosine(109) == Catch::Approx(0.1 + (0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 99 / 100)))));
  CHECK(cosine(110) == 0.1);
  CHECK(cosine(1000) == 0.1);
  CHECK(cgt::torch::lr::warmup_cosine(2.0, 0, 10)(0) == Catch::Approx(2.0));  // no warm-up
  CHECK(cgt::torch::lr::warmup_cosine(2.0, 5, 3, 0.5)(5) == 0.5);             // total before the warm-up's end

  const auto decay = cgt::torch::lr::step_decay(1.0, 30, 0.1);
  CHECK(decay(0) == 1.0);
  CHECK(decay(29) == 1.0);
  CHECK(decay(30) == Catch::Approx(0.1));
  CHECK(decay(65) == Catch::Approx(0.01));
  CHECK(cgt::torch::lr::step_decay(1.0, 0, 0.1)(100) == 1.0);

  const auto ramp = cgt::torch::lr::linear(0.5, 1.0, 4);
  CHECK(ramp(0) == 0.5);
  CHECK(ramp(2) == Catch::Approx(0.75));
  CHECK(ramp(4) == 1.0);
  CHECK(ramp(9) == 1.0);
  CHECK(cgt::torch::lr::linear(0.5, 1.0, 0)(0) == 1.0);
}

// libtorch's own StepLR, stepped after each optimizer step as its documentation says, can drive
// cgt's optimizer: a libtorch optimizer it steps (never stepped itself) holds the rate, which
// `set_lr` copies before each step (docs/training.md). Its rates are `lr::step_decay`'s one step
// late: libtorch's scheduler decays when its count, which starts at 0, is a multiple of the period.
TEST_CASE("training/libtorch_step_lr_gives_the_rates_of_step_decay_one_step_late", "[training]") {
  auto weight = torch::zeros({4}, torch::requires_grad());
  torch::optim::SGD shadow({weight}, torch::optim::SGDOptions(0.5));
  torch::optim::StepLR scheduler(shadow, 7, 0.3);
  const auto decay = cgt::torch::lr::step_decay(0.5, 7, 0.3);
  for (std::int64_t t = 0; t < 40; ++t) {
    INFO("step " << t);
    CHECK(shadow.param_groups()[0].options().get_lr() == Catch::Approx(decay(std::max<std::int64_t>(t - 1, 0))));
    scheduler.step();
  }
}

TEST_CASE("training/adamw_with_warmup_cosine_trains_as_libtorch_at_the_same_rates", "[gpu][training]") {
  REQUIRE_GPU();
  scheduled_graph_trains_as_libtorch("AdamW, warm-up + cosine", adamw(3e-3),
                                     cgt::torch::lr::warmup_cosine(3e-3, 10, steps, 3e-4));
}

TEST_CASE("training/sgd_momentum_with_step_decay_trains_as_libtorch_at_the_same_rates", "[gpu][training]") {
  REQUIRE_GPU();
  scheduled_graph_trains_as_libtorch("SGD momentum, step decay", sgd_momentum(5e-2),
                                     cgt::torch::lr::step_decay(5e-2, 25, 0.5));
}

TEST_CASE("training/adamw_with_linear_decay_trains_as_libtorch_at_the_same_rates", "[gpu][training]") {
  REQUIRE_GPU();
  scheduled_graph_trains_as_libtorch("AdamW, linear", adamw(3e-3), cgt::torch::lr::linear(3e-3, 1e-4, steps));
}

// Parameters of two dtypes take the multi-tensor update, which reads the rate per parameter from
// its device's tensor: set_lr between steps of the recorded graph changes the update.
TEST_CASE("training/set_lr_reaches_the_multi_tensor_update_of_a_recorded_step", "[gpu][training]") {
  REQUIRE_GPU();
  const auto rate = [](int t) { return t < 50 ? 1e-2 : 2e-3; };
  auto run = [&](bool graph) {
    torch::manual_seed(0);
    auto single = torch::randn({64}, gpu).requires_grad_();
    auto twice = torch::randn({64}, torch::TensorOptions(gpu).dtype(torch::kDouble)).requires_grad_();
    const auto target = torch::linspace(-1, 1, 64, gpu);
    auto loss_of = [&] {
      return (single - target).pow(2).sum() + (twice - target.to(torch::kDouble)).pow(2).sum().to(torch::kFloat);
    };
    std::vector<float> losses;
    if (graph) {
      auto adam = must(
          cgt::torch::make_adam({single, twice}, {.lr = 1e-2, .weight_decay = 1e-2, .decoupled_weight_decay = true}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto step = must(cgt::torch::make_training_step(
          pool, adam, [&](cgt::torch::Inputs) { return cgt::torch::Values{loss_of()}; }));
      for (int t = 0; t < steps; ++t) {
        must(adam.set_lr(rate(t)));
        pool.mark_step_begin();
        losses.push_back(must(step({})->take(0)).item<float>());
      }
      CHECK(pool.stats().recordings == 1);
      CHECK(pool.stats().replays == steps - 2);
    } else {
      torch::optim::AdamW adam({single, twice}, torch::optim::AdamWOptions(1e-2).weight_decay(1e-2));
      for (int t = 0; t < steps; ++t) {
        adam.param_groups()[0].options().set_lr(rate(t));
        adam.zero_grad();
        auto loss = loss_of();
        loss.backward();
        adam.step();
        losses.push_back(loss.item<float>());
      }
    }
    return Run{losses, {single.detach().cpu(), twice.detach().cpu().to(torch::kFloat)}, {}};
  };
  const Run graph = run(true);
  const Run libtorch = run(false);
  const double d = max_param_difference(graph, libtorch);
  INFO("param diff " << d);
  CHECK(d <= 1e-4);  // float32 bias corrections on the device, as the constant-rate test
}

// The per-function path: the update is a graph of its own (make_optimizer_step), scheduled too.
TEST_CASE("training/graphed_optimizer_step_takes_the_schedule", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 10, steps, 3e-4);
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(
      cgt::torch::make_adam(model->parameters(), {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true}));
  must(adam.set_schedule(schedule));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto update = must(cgt::torch::make_optimizer_step(pool, adam));
  std::vector<torch::Tensor> losses;
  for (const Batch& b : data) {
    adam.zero_grad(false);
    auto loss = torch::mse_loss(model->forward(b.x), b.y);
    loss.backward();
    must(update());
    losses.push_back(loss.detach());
  }
  CHECK(pool.stats().recordings == 1);
  CHECK(adam.scheduled_steps() == steps);
  const Run graph = finish(model, losses);
  const Run libtorch = train_libtorch(adamw(3e-3), schedule, data);
  CHECK(max_loss_difference(graph, libtorch) <= 1e-5);
  CHECK(max_param_difference(graph, libtorch) <= 1e-5);
}

TEST_CASE("training/set_lr_refuses_bad_rates_and_writes_inside_a_capture", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
  for (const double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    auto set = adam.set_lr(bad);
    REQUIRE_FALSE(set);
    CHECK(set.error().code == cgt::Errc::invalid_argument);
  }
  CHECK(adam.lr() == 1e-3);  // unchanged
  CHECK(cgt::torch::Adam().set_lr(1e-3).error().code == cgt::Errc::invalid_argument);
  CHECK(cgt::torch::Adam().set_schedule(cgt::torch::lr::linear(1, 0, 1)).error().code == cgt::Errc::invalid_argument);
  CHECK(adam.set_schedule({}, -1).error().code == cgt::Errc::invalid_argument);

  // Inside a function, a warm-up may set it (nothing is recorded); a recording may not.
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  std::vector<std::optional<cgt::Errc>> seen;
  auto f = must(pool.add_function([&](cgt::torch::Inputs in) {
    auto set = adam.set_lr(5e-4);
    seen.push_back(set ? std::nullopt : std::optional(set.error().code));
    return cgt::torch::Values{in[0] * 2};
  }));
  const auto x = torch::ones({4}, gpu);
  for (int i = 0; i < 2; ++i) must(f({x}));
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::nullopt);                 // the warm-up
  CHECK(seen[1] == cgt::Errc::invalid_argument);  // the recording
  CHECK(adam.lr() == 5e-4);

  // A schedule whose rate is bad fails the step before it runs, and counts nothing.
  auto step = must(cgt::torch::make_training_step(
      pool, adam, [&model](cgt::torch::Inputs in) { return cgt::torch::Values{model->forward(in[0]).pow(2).mean()}; }));
  must(adam.set_schedule([](std::int64_t) { return -1.0; }));
  auto out = step({torch::randn({2, 16}, gpu)});
  REQUIRE_FALSE(out);
  CHECK(out.error().code == cgt::Errc::invalid_argument);
  CHECK(adam.scheduled_steps() == 0);
  CHECK(pool.stats().calls == 2);  // the step's function was not called
}

// set_lr queues a fill on the current stream and returns: it does not wait for the GPU.
TEST_CASE("training/set_lr_does_not_wait_for_the_gpu", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
  const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(0);
  stream.synchronize();
  at::cuda::sleep(1'000'000'000);  // about half a second of a spinning kernel
  must(adam.set_lr(2e-3));
  CHECK_FALSE(stream.query());  // the kernel still runs: set_lr did not synchronise
  stream.synchronize();
  CHECK(adam.lr() == 2e-3);
}
