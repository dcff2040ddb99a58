// Mixed precision: the loss function under CUDA autocast inside the whole-step
// graph (`TrainingStepOptions::autocast`), and dynamic loss scaling for float16 with its state on
// the device (`LossScaleOptions`): a step whose scaled gradients overflow is skipped, the scale
// backed off, the skip counted, all without the host reading a flag. Against eager libtorch doing
// the same (`torch.autocast` by hand, GradScaler's ops by hand around libtorch's AdamW) and
// against cgt's optimizer stepped eagerly (the same kernels: equal), over 200 steps.
//
// Tolerances against libtorch's AdamW: libtorch's Adam is another formula than the fused kernel
// (host bias corrections), and under bfloat16 a difference in the last float32 bit of a weight
// flips the rounding of some activations (bfloat16 keeps 8 bits), which Adam's normalised update
// turns into a whole step of difference for those weights. PyTorch's own fused and single-tensor
// AdamW in this run differ by 8e-4 (relative) in the losses and 5e-3 in the parameters (of ~0.27)
// after 200 steps, on an H100 under bf16 autocast, 9e-4 and 7e-3 in float16 with GradScaler; the
// tests allow 1e-2 and 2e-2.
#include <torch/torch.h>
#include <ATen/autocast_mode.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::Autocast;
using training_test::autocast_state;
using training_test::AutocastState;
using training_test::gpu;
using training_test::Mlp;
using training_test::must;

constexpr int steps = 200;

struct Batch {
  torch::Tensor x, y;
};

// `n` batches; the target of batch `overflow` (if any) 1e4 times too large: its loss stays finite
// in float32, but its gradient, times the scale 65536, overflows float16 on the way back through
// the autocast model's last layer.
std::vector<Batch> batches(int n, std::optional<int> overflow = std::nullopt) {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back({torch::randn({32, 16}, gpu), torch::randn({32, 8}, gpu)});
  if (overflow) out[*overflow].y = out[*overflow].y * 1e4;
  return out;
}

void set_autocast_state(const AutocastState& state) {
  at::autocast::set_autocast_enabled(at::kCUDA, state.enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, state.dtype);
  at::autocast::set_autocast_cache_enabled(state.cached);
}

struct Run {
  std::vector<double> losses;
  std::vector<double> scales;         // the loss scale after each step (with scaling)
  std::vector<std::int64_t> skipped;  // the skipped steps so far, after each step (with scaling)
  std::vector<torch::Tensor> params;
  cgt::Stats stats;
};

std::vector<torch::Tensor> params_of(Mlp& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

double max_param_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double most = 0;
  for (std::size_t i = 0; i < a.size(); ++i) most = std::max(most, (a[i] - b[i]).abs().max().item<double>());
  return most;
}

double max_loss_difference(const Run& a, const Run& b, bool relative) {
  REQUIRE(a.losses.size() == b.losses.size());
  double most = 0;
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    const double d = std::abs(a.losses[i] - b.losses[i]);
    most = std::max(most, relative ? d / std::abs(b.losses[i]) : d);
  }
  return most;
}

// The loss scaling of these tests: PyTorch's defaults but a growth every 20 steps, so that 200
// steps grow the scale until float16 overflows, and back off.
constexpr cgt::torch::LossScaleOptions scaling{.dynamic = true, .growth_interval = 20};

cgt::torch::AdamOptions adamw(cgt::torch::LossScaleOptions scale = {}) {
  return {.lr = 1e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .loss_scale = scale};
}

void record_scaling(Run& run, const cgt::torch::Optimizer& optimizer) {
  if (!optimizer.scales_loss()) return;
  run.scales.push_back(optimizer.loss_scale().item<double>());
  run.skipped.push_back(optimizer.skipped_steps().item<std::int64_t>());
}

// cgt's whole-step graph with the loss function under autocast to `dtype`.
Run train_graph(at::ScalarType dtype, cgt::torch::LossScaleOptions scale, const std::vector<Batch>& data) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), adamw(scale)));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
      cgt::torch::TrainingStepOptions{.autocast = dtype}));
  Run run;
  for (const Batch& b : data) {
    pool.mark_step_begin();
    auto out = step({b.x, b.y});
    if (!out) FAIL(out.error().describe());
    run.losses.push_back(must(out->take(0)).item<double>());
    record_scaling(run, adam);
  }
  run.params = params_of(model);
  run.stats = pool.stats();
  return run;
}

// The same optimizer stepped eagerly, with no pool: the loop a program writes by hand.
Run train_eager(at::ScalarType dtype, cgt::torch::LossScaleOptions scale, const std::vector<Batch>& data) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), adamw(scale)));
  Run run;
  for (const Batch& b : data) {
    adam.zero_grad(false);
    torch::Tensor loss;
    {
      const Autocast autocast(dtype);
      loss = torch::mse_loss(model->forward(b.x), b.y);
    }
    (adam.scales_loss() ? loss * adam.loss_scale() : loss).backward();
    adam.step();
    run.losses.push_back(loss.item<double>());
    record_scaling(run, adam);
  }
  run.params = params_of(model);
  return run;
}

// Eager libtorch: AdamW, and with scaling GradScaler's ops by hand (libtorch has no GradScaler):
// scale the loss, unscale and check the gradients, step unless one is not finite (a host read,
// as GradScaler's path for optimizers that are not fused), update the scale.
Run train_libtorch(at::ScalarType dtype, std::optional<cgt::torch::LossScaleOptions> scale,
                   const std::vector<Batch>& data) {
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  torch::optim::AdamW adam(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  const auto on_gpu = torch::TensorOptions(gpu);
  torch::Tensor loss_scale;
  torch::Tensor growth_tracker;
  if (scale) {
    loss_scale = torch::full({}, scale->init_scale, on_gpu.dtype(torch::kFloat));
    growth_tracker = torch::zeros({}, on_gpu.dtype(torch::kInt));
  }
  Run run;
  std::int64_t skipped = 0;
  for (const Batch& b : data) {
    adam.zero_grad(true);
    torch::Tensor loss;
    {
      const Autocast autocast(dtype);
      loss = torch::mse_loss(model->forward(b.x), b.y);
    }
    if (!scale) {
      loss.backward();
      adam.step();
    } else {
      (loss * loss_scale).backward();
      auto found_inf = torch::zeros({}, on_gpu.dtype(torch::kFloat));
      auto inv_scale = loss_scale.to(torch::kDouble).reciprocal().to(torch::kFloat);
      std::vector<torch::Tensor> grads;
      for (const auto& p : model->parameters()) grads.push_back(p.grad());
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
      if (found_inf.item<float>() == 0) {
        adam.step();
      } else {
        ++skipped;
      }
      at::_amp_update_scale_(loss_scale, growth_tracker, found_inf, scale->growth_factor, scale->backoff_factor,
                             scale->growth_interval);
      run.scales.push_back(loss_scale.item<double>());
      run.skipped.push_back(skipped);
    }
    run.losses.push_back(loss.item<double>());
  }
  run.params = params_of(model);
  return run;
}

// The graph against the eager loop on the same optimizer (equal: the same kernels) and against
// libtorch (within the tolerances of the file's header).
void graph_trains_as_eager(at::ScalarType dtype, std::optional<cgt::torch::LossScaleOptions> scale) {
  const auto data = batches(steps);
  const Run graph = train_graph(dtype, scale.value_or(cgt::torch::LossScaleOptions{}), data);
  const Run eager = train_eager(dtype, scale.value_or(cgt::torch::LossScaleOptions{}), data);
  const Run libtorch = train_libtorch(dtype, scale, data);
  CHECK(graph.losses.back() < graph.losses.front());
  CHECK(graph.stats.warmups == 1);
  CHECK(graph.stats.recordings == 1);
  CHECK(graph.stats.replays == steps - 2);

  const double eager_losses = max_loss_difference(graph, eager, false);
  const double eager_params = max_param_difference(graph.params, eager.params);
  const double libtorch_losses = max_loss_difference(graph, libtorch, true);
  const double libtorch_params = max_param_difference(graph.params, libtorch.params);
  WARN("against cgt's optimizer stepped eagerly: loss " << eager_losses << ", param " << eager_params
                                                        << "; against libtorch: loss (relative) " << libtorch_losses
                                                        << ", param " << libtorch_params);
  CHECK(eager_losses <= 1e-6);
  CHECK(eager_params <= 1e-6);
  CHECK(libtorch_losses <= 1e-2);
  CHECK(libtorch_params <= 2e-2);
  if (scale) {
    // The scale's trajectory, step by step: grown every 20 steps, backed off on each overflow.
    CHECK(graph.scales == eager.scales);
    CHECK(graph.scales == libtorch.scales);
    CHECK(graph.skipped == libtorch.skipped);
    REQUIRE_FALSE(graph.skipped.empty());
    CHECK(graph.skipped.back() >= 1);  // the growth reached an overflow, which was skipped
    CHECK(graph.scales.front() == scale->init_scale);
    WARN("skipped " << graph.skipped.back() << " of " << steps << " steps; last scale " << graph.scales.back());
  }
}

}  // namespace

TEST_CASE("training/bf16_autocast_graph_trains_as_eager_autocast", "[gpu][training]") {
  REQUIRE_GPU();
  graph_trains_as_eager(at::kBFloat16, std::nullopt);
}

TEST_CASE("training/fp16_autocast_with_dynamic_loss_scaling_trains_as_eager_grad_scaler", "[gpu][training]") {
  REQUIRE_GPU();
  graph_trains_as_eager(at::kHalf, scaling);
}

// An overflow at step k, with PyTorch's default growth interval (no growth, no other overflow in
// these steps): that step changes no parameter and counts no step, the skip count goes to 1 and
// the scale halves, all inside the same recorded graph; the steps after it train on.
TEST_CASE("training/fp16_with_an_injected_overflow_skips_exactly_that_step", "[gpu][training]") {
  REQUIRE_GPU();
  constexpr int n = 80;
  constexpr int k = 37;
  const auto data = batches(n, k);
  const cgt::torch::LossScaleOptions defaults{.dynamic = true};
  for (const bool sgd : {false, true}) {
    INFO((sgd ? "SGD with momentum (the skip as a select)" : "fused Adam (the skip inside the kernel)"));
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    std::unique_ptr<cgt::torch::Optimizer> optimizer;
    if (sgd) {
      optimizer = std::make_unique<cgt::torch::SGD>(
          must(cgt::torch::make_sgd(model->parameters(), {.lr = 1e-2, .momentum = 0.9, .loss_scale = defaults})));
    } else {
      optimizer = std::make_unique<cgt::torch::Adam>(must(cgt::torch::make_adam(model->parameters(), adamw(defaults))));
    }
    REQUIRE(optimizer->scales_loss());
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = must(cgt::torch::make_training_step(
        pool, *optimizer,
        [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
        cgt::torch::TrainingStepOptions{.autocast = at::kHalf}));
    std::vector<torch::Tensor> before_k;
    std::vector<torch::Tensor> after_k;
    for (int t = 0; t < n; ++t) {
      INFO("step " << t);
      if (t == k) before_k = params_of(model);
      pool.mark_step_begin();
      auto out = step({data[t].x, data[t].y});
      if (!out) FAIL(out.error().describe());
      const double loss = must(out->take(0)).item<double>();
      CHECK(std::isfinite(loss));  // the loss itself is finite; its scaled gradient is not
      if (t == k) after_k = params_of(model);
      CHECK(optimizer->skipped_steps().item<std::int64_t>() == (t >= k ? 1 : 0));
      CHECK(optimizer->loss_scale().item<double>() == (t >= k ? 32768.0 : 65536.0));
      CHECK(optimizer->steps().front().item<float>() == static_cast<float>(t >= k ? t : t + 1));
    }
    CHECK(max_param_difference(before_k, after_k) == 0);         // step k changed nothing
    CHECK(max_param_difference(after_k, params_of(model)) > 0);  // the steps after it trained
    CHECK(pool.stats().recordings == 1);
    CHECK(pool.stats().replays == n - 2);
  }
}

// Parameters of two dtypes take Adam's multi-tensor formula, which cannot take the flag: what it
// writes is put back where the flag is set. A NaN in step k's input skips that step.
TEST_CASE("training/multi_tensor_adam_skips_a_step_with_a_nan_gradient", "[gpu][training]") {
  REQUIRE_GPU();
  constexpr int n = 20;
  constexpr int k = 9;
  torch::manual_seed(0);
  auto single = torch::randn({64}, gpu).requires_grad_();
  auto twice = torch::randn({64}, torch::TensorOptions(gpu).dtype(torch::kDouble)).requires_grad_();
  const auto target = torch::linspace(-1, 1, 64, gpu);
  auto adam = must(cgt::torch::make_adam({single, twice}, {.lr = 1e-2, .loss_scale = {.dynamic = true}}));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(pool, adam, [&](cgt::torch::Inputs in) {
    return cgt::torch::Values{((single - target) * in[0]).pow(2).sum() +
                              (twice - target.to(torch::kDouble)).pow(2).sum().to(torch::kFloat)};
  }));
  const auto one = torch::ones({}, gpu);
  const auto nan = torch::full({}, std::numeric_limits<float>::quiet_NaN(), gpu);
  std::vector<torch::Tensor> before;
  for (int t = 0; t < n; ++t) {
    INFO("step " << t);
    if (t == k) {
      before = {single.detach().clone(), twice.detach().clone(), adam.exp_avgs()[0].clone(),
                adam.exp_avg_sqs()[1].clone()};
    }
    pool.mark_step_begin();
    if (auto out = step({t == k ? nan : one}); !out) FAIL(out.error().describe());
    if (t == k) {
      CHECK(torch::equal(single.detach(), before[0]));
      CHECK(torch::equal(twice.detach(), before[1]));
      CHECK(torch::equal(adam.exp_avgs()[0], before[2]));
      CHECK(torch::equal(adam.exp_avg_sqs()[1], before[3]));
    }
    CHECK(adam.steps()[1].item<float>() == static_cast<float>(t >= k ? t : t + 1));
    CHECK(adam.skipped_steps().item<std::int64_t>() == (t >= k ? 1 : 0));
  }
  CHECK(single.detach().isfinite().all().item<bool>());
  CHECK(pool.stats().recordings == 1);
}

// The loss function runs under autocast with the cache off; the thread's own autocast state comes
// back after it, also when it throws, whatever that state was.
TEST_CASE("training/autocast_state_is_restored_after_a_loss_function_that_throws", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), adamw()));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  bool throws = true;
  std::optional<AutocastState> inside;
  at::ScalarType forward_dtype = at::kFloat;
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&](cgt::torch::Inputs in) {
        inside = autocast_state();
        const auto y = model->forward(in[0]);
        forward_dtype = y.scalar_type();
        if (throws) throw std::runtime_error("the loss function failed");
        return cgt::torch::Values{torch::mse_loss(y, in[1])};
      },
      cgt::torch::TrainingStepOptions{.autocast = at::kBFloat16}));
  const Batch b = batches(1).front();
  const AutocastState outside = autocast_state();
  CHECK_FALSE(outside.enabled);

  auto failed = step({b.x, b.y});
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == cgt::Errc::function_failed);
  REQUIRE(inside.has_value());
  CHECK(*inside == AutocastState{true, at::kBFloat16, false});
  CHECK(forward_dtype == at::kBFloat16);
  CHECK(autocast_state() == outside);

  // A caller's own autocast (float16, cache on) is what comes back.
  const AutocastState caller{true, at::kHalf, true};
  set_autocast_state(caller);
  inside.reset();
  failed = step({b.x, b.y});
  REQUIRE_FALSE(failed);
  CHECK(*inside == AutocastState{true, at::kBFloat16, false});
  CHECK(autocast_state() == caller);
  set_autocast_state(outside);

  throws = false;
  if (auto out = step({b.x, b.y}); !out) FAIL(out.error().describe());
  CHECK(forward_dtype == at::kBFloat16);
  CHECK(autocast_state() == outside);
}

TEST_CASE("training/mixed_precision_refuses_what_it_cannot_do", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto loss = [&model](cgt::torch::Inputs in) { return cgt::torch::Values{model->forward(in[0]).pow(2).mean()}; };

  auto adam = must(cgt::torch::make_adam(model->parameters(), adamw()));
  CHECK_FALSE(adam.scales_loss());
  CHECK_FALSE(adam.loss_scale().defined());
  CHECK_FALSE(adam.skipped_steps().defined());
  auto float32 =
      cgt::torch::make_training_step(pool, adam, loss, cgt::torch::TrainingStepOptions{.autocast = at::kFloat});
  REQUIRE_FALSE(float32);
  CHECK(float32.error().code == cgt::Errc::invalid_argument);

  for (const cgt::torch::LossScaleOptions bad : {cgt::torch::LossScaleOptions{.dynamic = true, .init_scale = 0},
                                                 cgt::torch::LossScaleOptions{.dynamic = true, .growth_factor = 1},
                                                 cgt::torch::LossScaleOptions{.dynamic = true, .backoff_factor = 1},
                                                 cgt::torch::LossScaleOptions{.dynamic = true, .growth_interval = 0}}) {
    auto made = cgt::torch::make_adam(model->parameters(), adamw(bad));
    REQUIRE_FALSE(made);
    CHECK(made.error().code == cgt::Errc::invalid_argument);
  }

  // A gradient function's gradients are of the unscaled loss.
  auto scaled = must(cgt::torch::make_adam(model->parameters(), adamw({.dynamic = true})));
  CHECK(scaled.loss_scale().item<float>() == 65536.0F);
  auto from_gradients = cgt::torch::make_training_step_from_gradients(
      pool, scaled, [](cgt::torch::Inputs) { return cgt::torch::Values{}; });
  REQUIRE_FALSE(from_gradients);
  CHECK(from_gradients.error().code == cgt::Errc::invalid_argument);
}
