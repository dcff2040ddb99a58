// Gradient accumulation (issue 29, item 4): the optimizer steps once per k micro-batches on the
// mean of their gradients, with the micro-batches one per call (one graph per micro-batch: the
// first, the middle and the stepping one) or all in one call (one graph per step). Against eager
// libtorch doing the usual loop: each micro-batch's loss divided by k before its backward, one
// step per k.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::gpu;
using training_test::max_difference;
using training_test::must;

constexpr std::int64_t micro_rows = 16;

struct MlpImpl : torch::nn::Module {
  MlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> micro_batches(int count) {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < count; ++i)
    out.push_back({torch::randn({micro_rows, 16}, gpu), torch::randn({micro_rows, 8}, gpu)});
  return out;
}

struct Run {
  std::vector<double> losses;  // per micro-batch (one per call), or per step (all in one call)
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

std::vector<torch::Tensor> params_of(Mlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().cpu());
  return out;
}

cgt::torch::AdamOptions adam_options() {
  return {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0};
}

// The usual loop: loss / k, backward, a step (with clip_grad_norm_) every k micro-batches.
Run train_libtorch(const std::vector<Batch>& data, int k) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(1e-2));
  Run run;
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (i % k == 0) adam.zero_grad(true);
    auto loss = torch::mse_loss(model->forward(data[i].x), data[i].y);
    (loss / k).backward();
    run.losses.push_back(loss.item<double>());
    if (i % k == k - 1) {
      torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
      adam.step();
    }
  }
  run.params = params_of(model);
  return run;
}

Run train_per_call(const std::vector<Batch>& data, int k) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), adam_options()));
  must(adam.set_schedule([](std::int64_t) { return 3e-3; }));  // counts optimizer steps
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = k}));
  CHECK(step.micro_batches() == k);
  Run run;
  for (std::size_t i = 0; i < data.size(); ++i) {
    CHECK(step.micro_batches_taken() == static_cast<std::int64_t>(i % k));
    pool.mark_step_begin();
    auto out = step({data[i].x, data[i].y});
    if (!out) FAIL(out.error().describe());
    CHECK(out->size() == (i % k == static_cast<std::size_t>(k - 1) ? 2U : 1U));  // the stepping call adds the norm
    run.losses.push_back(must(out->take(0)).item<double>());
  }
  CHECK(adam.scheduled_steps() == static_cast<std::int64_t>(data.size()) / k);
  run.params = params_of(model);
  run.stats = pool.stats();
  return run;
}

Run train_in_one_call(const std::vector<Batch>& data, int k) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), adam_options()));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = k, .all_in_one_call = true}));
  Run run;
  for (std::size_t i = 0; i + k <= data.size(); i += k) {
    std::vector<torch::Tensor> xs, ys;
    for (int j = 0; j < k; ++j) {
      xs.push_back(data[i + j].x);
      ys.push_back(data[i + j].y);
    }
    pool.mark_step_begin();
    auto out = step({torch::cat(xs), torch::cat(ys)});
    if (!out) FAIL(out.error().describe());
    run.losses.push_back(must(out->take(0)).item<double>());  // the mean of the micro-batches' losses
  }
  run.params = params_of(model);
  run.stats = pool.stats();
  return run;
}

// The eager losses per step: the mean over each k micro-batches.
std::vector<double> step_means(const std::vector<double>& per_micro, int k) {
  std::vector<double> out;
  for (std::size_t i = 0; i + k <= per_micro.size(); i += k) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += per_micro[i + j];
    out.push_back(sum / k);
  }
  return out;
}

}  // namespace

TEST_CASE("training/micro_batches_one_per_call_train_as_libtorch_accumulating", "[gpu][training]") {
  REQUIRE_GPU();
  for (const int k : {2, 4}) {
    INFO(k << " micro-batches a step");
    const auto data = micro_batches(100);
    const Run graph = train_per_call(data, k);
    const Run libtorch = train_libtorch(data, k);
    const Run unaccumulated = train_libtorch(data, 1);
    // Each phase (first, middle where k > 2, the stepping one) warmed up and recorded once.
    const std::uint64_t phases = k > 2 ? 3 : 2;
    CHECK(graph.stats.recordings == phases);
    CHECK(graph.stats.replays == 100 - (2 * phases));
    CHECK(graph.stats.eager_calls == 0);
    CHECK(max_difference(graph.losses, libtorch.losses) <= 1e-5);
    CHECK(max_param_difference(graph, libtorch) <= 1e-5);
    CHECK(max_param_difference(libtorch, unaccumulated) > 1e-3);  // accumulation changed the training
  }
}

TEST_CASE("training/micro_batches_in_one_call_train_as_libtorch_accumulating", "[gpu][training]") {
  REQUIRE_GPU();
  const int k = 4;
  const auto data = micro_batches(100);
  const Run graph = train_in_one_call(data, k);
  const Run libtorch = train_libtorch(data, k);
  CHECK(graph.stats.recordings == 1);
  CHECK(graph.stats.replays == (100 / k) - 2);
  CHECK(max_difference(graph.losses, step_means(libtorch.losses, k)) <= 1e-5);
  CHECK(max_param_difference(graph, libtorch) <= 1e-5);
}

TEST_CASE("training/accumulation_that_cannot_work_is_an_error", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  const auto loss = [&model](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  };
  auto adam = must(cgt::torch::make_adam(model->parameters(), {}));
  auto none = cgt::torch::make_training_step(pool, adam, loss, cgt::torch::TrainingStepOptions{.micro_batches = 0});
  REQUIRE_FALSE(none);
  CHECK(none.error().code == cgt::Errc::invalid_argument);

  // Gradients made per step cannot accumulate across calls; in one call they can.
  auto per_step = must(cgt::torch::make_adam(model->parameters(), {.static_grads = false}));
  auto across =
      cgt::torch::make_training_step(pool, per_step, loss, cgt::torch::TrainingStepOptions{.micro_batches = 2});
  REQUIRE_FALSE(across);
  CHECK(across.error().code == cgt::Errc::invalid_argument);
  CHECK(cgt::torch::make_training_step(pool, per_step, loss,
                                       cgt::torch::TrainingStepOptions{.micro_batches = 2, .all_in_one_call = true})
            .has_value());

  // Rows that the micro-batches cannot share equally fail the call, and nothing is counted.
  auto step = must(cgt::torch::make_training_step(
      pool, adam, loss, cgt::torch::TrainingStepOptions{.micro_batches = 4, .all_in_one_call = true}));
  auto odd = step({torch::randn({30, 16}, gpu), torch::randn({30, 8}, gpu)});
  REQUIRE_FALSE(odd);
  CHECK(odd.error().code == cgt::Errc::function_failed);
}
