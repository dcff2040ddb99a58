// Training as real code trains, all at once: a small transformer trained 200
// optimizer steps with a warm-up + cosine schedule, clipping at 1.0, 4 micro-batches a step (one
// per call), bf16 autocast or float32, and a checkpoint at step 100 from which fresh objects
// resume. Against eager libtorch doing the same (the rate set per step, autocast by hand,
// clip_grad_norm_, each micro-batch's loss divided by 4): float32 within 1e-5; bf16 within the
// tolerance of test_training_amp.cpp (relative loss 1e-2, parameters 2e-2), since the graph and
// libtorch run Adam's arithmetic differently (the fused kernel against the per-op formula).
#include <torch/torch.h>
#include <ATen/autocast_mode.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::Autocast;
using training_test::Block;
using training_test::BlockImpl;
using training_test::gpu;
using training_test::must;

constexpr std::int64_t steps = 200;
constexpr std::int64_t micro_batches = 4;
constexpr std::int64_t resume_at = 100;

struct Batch {
  torch::Tensor x, y;
};

// Micro-batch i of every run.
Batch micro_batch(std::int64_t i) {
  torch::manual_seed(1000 + i);
  return {torch::randn({4, 16, 64}, gpu), torch::randn({4, 16, 64}, gpu)};
}

torch::Tensor loss_of(Block& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(model->forward(x).to(torch::kFloat), y);
}

cgt::torch::LrSchedule schedule() {
  return cgt::torch::lr::warmup_cosine(3e-3, 20, steps, 3e-4);
}

struct Run {
  std::vector<double> losses;  // per micro-batch
  std::vector<torch::Tensor> params;
};

// The parameters on the host, but for the attention's key bias (zeroed): it adds q.b to every score
// of a row, which softmax ignores, so its true gradient is zero and the computed one rounding
// noise, which Adam divides by its own size into steps of about lr; two Adam implementations
// walk it apart (test_training_step.cpp compares against libtorch the same way).
std::vector<torch::Tensor> params_of(Block& model) {
  std::vector<torch::Tensor> out;
  for (const auto& item : model->named_parameters()) {
    torch::Tensor p = item.value().detach().cpu().clone();
    if (item.key() == "qkv.bias") p.index_put_({torch::indexing::Slice(BlockImpl::hidden, 2 * BlockImpl::hidden)}, 0);
    out.push_back(p);
  }
  return out;
}

// The eager reference: libtorch's AdamW, the rate of each step set from the schedule.
Run train_libtorch(std::optional<at::ScalarType> autocast) {
  torch::manual_seed(0);
  Block model;
  model->to(gpu);
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(1e-2));
  const auto rate = schedule();
  Run run;
  for (std::int64_t step = 0; step < steps; ++step) {
    adam.param_groups()[0].options().set_lr(rate(step));
    adam.zero_grad(true);
    for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
      const Batch b = micro_batch((step * micro_batches) + micro);
      torch::Tensor loss;
      {
        const Autocast scope(autocast);
        loss = loss_of(model, b.x, b.y);
      }
      (loss / micro_batches).backward();
      run.losses.push_back(loss.item<double>());
    }
    torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    adam.step();
  }
  run.params = params_of(model);
  return run;
}

// cgt, steps [from, to): fresh objects; from `resume_at`, loaded from the files `save_to` wrote.
Run train_cgt(std::int64_t from, std::int64_t to, std::optional<at::ScalarType> autocast, const std::string& files,
              cgt::Stats* stats = nullptr) {
  torch::manual_seed(from == 0 ? 0 : 7);  // a resumed run's own initial values must not matter
  Block model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(
      model->parameters(), {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0}));
  if (from > 0) {
    must(cgt::torch::load_parameters_in_place(*model, files + ".model"));
    must(adam.load(files + ".adam"));
    REQUIRE(adam.scheduled_steps() == from);
  }
  must(adam.set_schedule(schedule(), adam.scheduled_steps()));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, adam, [&model](cgt::torch::Inputs in) { return cgt::torch::Values{loss_of(model, in[0], in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = micro_batches, .autocast = autocast}));
  Run run;
  for (std::int64_t s = from; s < to; ++s) {
    for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
      const Batch b = micro_batch((s * micro_batches) + micro);
      pool.mark_step_begin();
      auto out = step({b.x, b.y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<double>());
    }
  }
  if (to == resume_at) {  // between optimizer steps
    torch::save(model, files + ".model");
    must(adam.save(files + ".adam"));
  }
  run.params = params_of(model);
  if (stats != nullptr) *stats = pool.stats();
  return run;
}

void combined_run_trains_as_libtorch(std::optional<at::ScalarType> autocast, double loss_tolerance,
                                     double param_tolerance) {
  const std::string files = "/tmp/cgt_combined_" + std::to_string(autocast ? static_cast<int>(*autocast) : -1);
  cgt::Stats first_half;
  cgt::Stats second_half;
  const Run before = train_cgt(0, resume_at, autocast, files, &first_half);
  const Run after = train_cgt(resume_at, steps, autocast, files, &second_half);
  const Run libtorch = train_libtorch(autocast);
  // Each half records its three kinds of call (first, middle, stepping micro-batch) once.
  CHECK(first_half.recordings == 3);
  CHECK(second_half.recordings == 3);
  CHECK(first_half.eager_calls + second_half.eager_calls == 0);
  std::vector<double> losses = before.losses;
  losses.insert(losses.end(), after.losses.begin(), after.losses.end());
  REQUIRE(losses.size() == libtorch.losses.size());
  double loss_diff = 0;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    const double scale = autocast ? std::max(std::abs(libtorch.losses[i]), 1e-3) : 1.0;
    loss_diff = std::max(loss_diff, std::abs(losses[i] - libtorch.losses[i]) / scale);
  }
  double param_diff = 0;
  for (std::size_t i = 0; i < after.params.size(); ++i) {
    param_diff = std::max(param_diff, (after.params[i] - libtorch.params[i]).abs().max().item<double>());
  }
  WARN((autocast ? "bf16" : "float32") << " vs libtorch, resumed: loss " << loss_diff << ", param " << param_diff);
  CHECK(losses.back() < losses.front());
  CHECK(loss_diff <= loss_tolerance);
  CHECK(param_diff <= param_tolerance);
}

}  // namespace

TEST_CASE("training/combined_float32_run_resumed_at_100_trains_as_libtorch", "[gpu][training][combined]") {
  REQUIRE_GPU();
  combined_run_trains_as_libtorch(std::nullopt, 1e-5, 1e-5);
}

TEST_CASE("training/combined_bf16_run_resumed_at_100_trains_as_libtorch", "[gpu][training][combined]") {
  REQUIRE_GPU();
  combined_run_trains_as_libtorch(at::kBFloat16, 1e-2, 2e-2);
}

// The same loop in float16 with dynamic loss scaling, and one micro-batch of step `k` whose target
// is 1e4 times too large: its scaled gradient overflows float16, so the accumulated gradient of
// step k is not finite. Exactly that step is skipped (no parameter changes, the step count stays,
// the skip count becomes 1, the scale halves), inside the recorded graphs; the steps after it train.
TEST_CASE("training/combined_fp16_run_skips_exactly_the_step_with_an_overflow", "[gpu][training][combined]") {
  REQUIRE_GPU();
  constexpr std::int64_t k = 60;
  constexpr std::int64_t overflowing = (k * micro_batches) + 2;  // the third micro-batch of step k
  torch::manual_seed(0);
  Block model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 3e-3,
                                                               .weight_decay = 1e-2,
                                                               .decoupled_weight_decay = true,
                                                               .max_grad_norm = 1.0,
                                                               .loss_scale = {.dynamic = true}}));
  must(adam.set_schedule(schedule(), 0));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, adam, [&model](cgt::torch::Inputs in) { return cgt::torch::Values{loss_of(model, in[0], in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = micro_batches, .autocast = at::kHalf}));
  std::vector<torch::Tensor> before_k;
  std::vector<torch::Tensor> after_k;
  constexpr std::int64_t fp16_steps = 80;
  for (std::int64_t s = 0; s < fp16_steps; ++s) {
    INFO("step " << s);
    if (s == k) before_k = params_of(model);
    for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
      Batch b = micro_batch((s * micro_batches) + micro);
      if ((s * micro_batches) + micro == overflowing) b.y = b.y * 1e4;
      pool.mark_step_begin();
      auto out = step({b.x, b.y});
      if (!out) FAIL(out.error().describe());
      CHECK(std::isfinite(must(out->take(0)).item<double>()));  // the loss is finite, its scaled gradient not
    }
    if (s == k) after_k = params_of(model);
    CHECK(adam.skipped_steps().item<std::int64_t>() == (s >= k ? 1 : 0));
    CHECK(adam.loss_scale().item<double>() == (s >= k ? 32768.0 : 65536.0));
    CHECK(adam.steps().front().item<float>() == static_cast<float>(s >= k ? s : s + 1));
  }
  double changed_at_k = 0;
  double changed_after_k = 0;
  const auto now = params_of(model);
  for (std::size_t i = 0; i < now.size(); ++i) {
    changed_at_k = std::max(changed_at_k, (after_k[i] - before_k[i]).abs().max().item<double>());
    changed_after_k = std::max(changed_after_k, (now[i] - after_k[i]).abs().max().item<double>());
  }
  CHECK(changed_at_k == 0);
  CHECK(changed_after_k > 0);
  CHECK(pool.stats().recordings == 3);
  CHECK(pool.stats().eager_calls == 0);
}
