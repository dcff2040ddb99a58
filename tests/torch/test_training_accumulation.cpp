// Gradient accumulation: the optimizer steps once per k micro-batches on the
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
#include <expected>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::gpu;
using training_test::host_copies;
using training_test::max_difference;
using training_test::must;
using training_test::TempFile;

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

// One optimizer step of eager libtorch: the micro-batches it took, each loss divided by `parts`
// (the training step's factor, also for a step the program ended early).
struct EagerStep {
  std::vector<int> micro_batches;
  int parts;
};

// Eager libtorch AdamW (`plain_adam`'s options) over `steps`, from the same initial model.
std::vector<torch::Tensor> libtorch_steps(const std::vector<Batch>& data, const std::vector<EagerStep>& steps) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(1e-2));
  for (const EagerStep& step : steps) {
    adam.zero_grad(true);
    for (const int i : step.micro_batches) {
      const Batch& b = data[static_cast<std::size_t>(i)];
      (torch::mse_loss(model->forward(b.x), b.y) / step.parts).backward();
    }
    adam.step();
  }
  return params_of(model);
}

cgt::torch::AdamOptions plain_adam() {
  return {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true};
}

template <class T>
std::optional<cgt::Errc> error_of(const cgt::Result<T>& result) {
  if (result) return std::nullopt;
  return result.error().code;
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

// The step in progress belongs to the optimizer (cgt.torch-optim.inc, TrainingStep): while training
// step `a` is in the middle of its step, another training step of the same optimizer (with
// micro-batches or without), its graphed update and `load` fail with invalid_argument naming the
// remedy, and change nothing: not the gradients a accumulated, the parameters, the rate's count or
// a's place in its step. `b` reads 0 micro-batches taken of a's step. Once a finishes, b trains;
// a's restart_step gives its step up, and so does a training step dropped in the middle of its
// step. The training is eager libtorch's over the steps that were taken.
TEST_CASE("training/another_training_step_in_the_middle_of_a_step_is_refused", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = micro_batches(12);
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), plain_adam()));
  must(adam.set_schedule([](std::int64_t) { return 3e-3; }));
  const TempFile checkpoint("accumulation_owner");
  must(adam.save(checkpoint.path));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  const auto loss = [&model](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  };
  const auto per_call = [&](const char* name) {
    return must(cgt::torch::make_training_step(
        pool, adam, loss, cgt::torch::TrainingStepOptions{.function = {.name = name}, .micro_batches = 2}));
  };
  auto a = per_call("a");
  auto b = per_call("b");
  auto whole = must(cgt::torch::make_training_step(pool, adam, loss, cgt::FunctionOptions{.name = "whole"}));
  auto update = must(cgt::torch::make_optimizer_step(pool, adam));
  const auto call = [&](const cgt::torch::TrainingStep& step, int i) {
    pool.mark_step_begin();
    const Batch& batch = data[static_cast<std::size_t>(i)];
    return step({batch.x, batch.y});
  };

  must(call(a, 0));
  CHECK(a.micro_batches_taken() == 1);
  CHECK(b.micro_batches_taken() == 0);
  const auto grads = host_copies(adam.grads());
  const auto params = host_copies(model->parameters());
  const auto refused = [&](const cgt::Result<void>& result, const std::string& says) {
    INFO(says);
    REQUIRE_FALSE(result.has_value());
    CHECK(result.error().code == cgt::Errc::invalid_argument);
    CHECK(result.error().message.find(says) != std::string::npos);
    CHECK(result.error().message.find("restart_step()") != std::string::npos);
    CHECK(max_difference(grads, host_copies(adam.grads())) == 0);
    CHECK(max_difference(params, host_copies(model->parameters())) == 0);
    CHECK(a.micro_batches_taken() == 1);
    CHECK(adam.scheduled_steps() == 0);
  };
  const auto refused_call = [&](const cgt::torch::TrainingStep& step) {
    auto out = call(step, 1);
    if (out) return cgt::Result<void>();
    return cgt::Result<void>(std::unexpected(out.error()));
  };
  refused(refused_call(b), "TrainingStep");
  refused(refused_call(whole), "TrainingStep");
  refused(update(), "OptimizerStep");
  refused(adam.load(checkpoint.path), "Optimizer::load");

  must(call(a, 1));  // a's step: micro-batches 0 and 1
  CHECK(a.micro_batches_taken() == 0);
  must(call(b, 2));
  must(call(b, 3));  // b's step: 2 and 3
  must(call(a, 4));
  must(a.restart_step());  // 4 is dropped
  CHECK(a.micro_batches_taken() == 0);
  must(call(b, 5));
  CHECK(b.micro_batches_taken() == 1);
  CHECK(a.micro_batches_taken() == 0);
  must(a.restart_step());  // a owns nothing: b's step goes on
  CHECK(b.micro_batches_taken() == 1);
  must(call(b, 6));  // 5 and 6
  {
    auto dropped = per_call("dropped");
    must(call(dropped, 7));
    CHECK(dropped.micro_batches_taken() == 1);
    CHECK(error_of(call(b, 8)) == cgt::Errc::invalid_argument);
  }  // 7 is given up with the step that took it
  must(call(b, 8));
  must(call(b, 9));  // 8 and 9
  must(call(whole, 10));
  CHECK(adam.scheduled_steps() == 5);
  CHECK(pool.stats().eager_calls == 0);

  const auto eager = libtorch_steps(data, {{{0, 1}, 2}, {{2, 3}, 2}, {{5, 6}, 2}, {{8, 9}, 2}, {{10}, 1}});
  CHECK(max_difference(params_of(model), eager) <= 1e-5);  // AdamW's fused kernel against libtorch's, 5 steps
}

// The program's step() and zero_grad() between micro-batches take or drop the gradients accumulated
// so far (cgt.torch-optim.inc, Optimizer::step, zero_grad): the step in progress ends, and the next
// call of the training step begins a new one, zeroing the gradients. A program step after one of
// three micro-batches updates from that micro-batch's gradient (its loss divided by 3, as the step
// divides it); zero_grad(false) and zero_grad(true) after one drop it. The training is eager
// libtorch's doing the same.
TEST_CASE("training/the_program's_step_and_zero_grad_between_micro_batches_end_the_step", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = micro_batches(16);
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), plain_adam()));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = 3}));
  const auto call = [&](int i) {
    pool.mark_step_begin();
    const Batch& batch = data[static_cast<std::size_t>(i)];
    must(step({batch.x, batch.y}));
  };
  call(0);
  adam.zero_grad();  // drops micro-batch 0
  CHECK(step.micro_batches_taken() == 0);
  for (int i = 1; i <= 3; ++i) call(i);  // 1, 2, 3
  call(4);
  CHECK(step.micro_batches_taken() == 1);
  adam.step();  // steps on micro-batch 4 alone
  CHECK(step.micro_batches_taken() == 0);
  for (int i = 5; i <= 7; ++i) call(i);  // 5, 6, 7
  call(8);
  call(9);
  adam.zero_grad(true);  // drops 8 and 9
  CHECK(step.micro_batches_taken() == 0);
  for (int i = 10; i <= 12; ++i) call(i);  // 10, 11, 12
  CHECK(step.micro_batches_taken() == 0);
  CHECK(pool.stats().eager_calls == 0);

  const auto eager = libtorch_steps(data, {{{1, 2, 3}, 3}, {{4}, 3}, {{5, 6, 7}, 3}, {{10, 11, 12}, 3}});
  CHECK(max_difference(params_of(model), eager) <= 1e-5);  // AdamW's fused kernel against libtorch's, 4 steps
}
