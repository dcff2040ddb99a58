// Training handles in every state a program can leave them in: an optimizer or a training step
// made by default or moved from, moved mid-step while training, its last handle gone, and an
// optimizer over no parameters (its steps, eager, graphed and from given gradients, update nothing
// and clip nothing). Each test states the promise it tries to break (from modules/cgt.torch-optim.inc
// and docs/training.md) and checks what a user relies on: values, errors, and which state holds
// after. Tagged [training]; those that need a GPU [gpu] too (SKIPPED without one).
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "torch/training_checks.hpp"
#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::error_of;
using training_test::expect_error;
using training_test::gpu;
using training_test::must;
using training_test::TempFile;

}  // namespace

// ---- handles in every state (no device) ---------------------------------------------------------

// A handle made by default or moved from holds no state: every member of the training surface fails with
// invalid_argument naming itself, or answers an empty value (0, undefined, false), and nothing it
// is asked reaches the optimizer its state went to. An optimizer over no parameters needs no
// device, so this runs everywhere.
TEST_CASE("training/handles: optimizer handles without state refuse every new member", "[training]") {
  auto adam = must(cgt::torch::make_adam({}, {.lr = 0.25, .max_grad_norm = 1.0}));
  must(adam.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 3));
  cgt::torch::Adam moved = std::move(adam);
  auto sgd = must(cgt::torch::make_sgd({}, {.lr = 0.5, .momentum = 0.9}));
  cgt::torch::SGD sgd_moved = std::move(sgd);
  cgt::torch::Adam adam_default;
  cgt::torch::SGD sgd_default;

  const TempFile checkpoint("hostile_no_state_source");
  must(moved.save(checkpoint.path));  // a real checkpoint, which no handle below may read
  const TempFile never("hostile_no_state_target");
  for (cgt::torch::Optimizer* none :
       std::initializer_list<cgt::torch::Optimizer*>{&adam, &sgd, &adam_default, &sgd_default}) {
    CHECK_FALSE(none->has_state());
    expect_error(none->set_lr(0.1), cgt::Errc::invalid_argument, "Optimizer::set_lr");
    CHECK(none->lr() == 0);
    expect_error(none->set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10)), cgt::Errc::invalid_argument,
                 "Optimizer::set_schedule");
    expect_error(none->set_schedule({}), cgt::Errc::invalid_argument, "Optimizer::set_schedule");
    CHECK(none->scheduled_steps() == 0);
    CHECK_FALSE(none->grad_norm().defined());
    CHECK_FALSE(none->clips_gradients());
    CHECK_FALSE(none->loss_scale().defined());
    CHECK_FALSE(none->skipped_steps().defined());
    CHECK_FALSE(none->scales_loss());
    torch::serialize::OutputArchive out;
    expect_error(none->save(out), cgt::Errc::invalid_argument, "Optimizer::save");
    expect_error(none->save(never.path), cgt::Errc::invalid_argument, "Optimizer::save");
    CHECK_FALSE(std::filesystem::exists(never.path));  // nothing written
    torch::serialize::InputArchive in;
    in.load_from(checkpoint.path);
    expect_error(none->load(in), cgt::Errc::invalid_argument, "Optimizer::load");
    expect_error(none->load(checkpoint.path), cgt::Errc::invalid_argument, "Optimizer::load");
    CHECK(none->lr() == 0);  // the file reached nothing
    CHECK(none->scheduled_steps() == 0);
  }
  // The handles the states moved into are the optimizers, untouched by all of the above.
  CHECK(moved.lr() == 0.25);
  CHECK(moved.scheduled_steps() == 3);
  CHECK(moved.options().max_grad_norm == 1.0);
  CHECK_FALSE(moved.clips_gradients());  // over no parameters: nothing to clip
  CHECK(sgd_moved.lr() == 0.5);
  CHECK(sgd_moved.scheduled_steps() == 0);

  // An Adam handle given an SGD's state through its base: its own members read as without state
  // (cgt.torch-optim.inc), the base's reach the SGD, and a checkpoint says "sgd".
  cgt::torch::Adam sliced = must(cgt::torch::make_adam({}, {.lr = 0.125}));
  static_cast<cgt::torch::Optimizer&>(sliced) = std::move(sgd_moved);
  CHECK(sliced.has_state());
  CHECK(sliced.options().lr == cgt::torch::AdamOptions{}.lr);
  CHECK(sliced.exp_avgs().empty());
  CHECK(sliced.lr() == 0.5);
  const TempFile sliced_file("hostile_no_state_sliced");
  must(sliced.save(sliced_file.path));
  expect_error(moved.load(sliced_file.path), cgt::Errc::invalid_argument, "'sgd'");
  CHECK(moved.lr() == 0.25);
}

// An optimizer over no parameters is valid (cgt.torch-optim.inc, Optimizer): its steps update
// nothing, eager or from given gradients (an empty list: the foreach kernels would refuse it), and
// with `max_grad_norm` it clips nothing: `clips_gradients()` is false and `grad_norm()` undefined,
// so no training step hands out a norm that no step writes. Needs no device.
TEST_CASE("training/handles: an optimizer over no parameters steps and clips nothing", "[training]") {
  auto adam = must(cgt::torch::make_adam({}, {.lr = 0.25, .max_grad_norm = 1.0, .loss_scale = {.dynamic = true}}));
  auto sgd = must(cgt::torch::make_sgd({}, {.lr = 0.5, .momentum = 0.9, .max_grad_norm = 1.0}));
  for (cgt::torch::Optimizer* none : std::initializer_list<cgt::torch::Optimizer*>{&adam, &sgd}) {
    CHECK(none->has_state());
    CHECK(none->params().empty());
    CHECK_FALSE(none->clips_gradients());
    CHECK_FALSE(none->grad_norm().defined());
    CHECK_FALSE(none->scales_loss());
    CHECK_NOTHROW(none->step());
    CHECK_NOTHROW(none->step(std::span<const torch::Tensor>{}));
    CHECK_NOTHROW(none->zero_grad());
    CHECK_NOTHROW(none->zero_grad(true));
    must(none->attach_grads());
    // A gradient for a parameter it does not have is still a mistake.
    const std::vector<torch::Tensor> one{torch::zeros({2})};
    CHECK_THROWS_AS(none->step(std::span<const torch::Tensor>(one)), c10::Error);
  }
  CHECK(adam.lr() == 0.25);
  CHECK(sgd.lr() == 0.5);
}

// ---- handles that move while training (GPU) -------------------------------------------------------

// A training step (micro-batches one per call) and its optimizer both move mid-step, and then the
// optimizer's last handle goes: the step keeps its place in the step (micro_batches_taken), the
// moved-from step fails with invalid_argument, the schedule set through the handle the optimizer
// moved into drives the step made from the old one, the norm and the loss scale are read through
// it, and with every handle gone the step trains on at the rate last set. SGD on (w * x).sum()
// with x = 1: each step moves every weight by exactly minus the rate.
TEST_CASE("training/handles: steps and optimizers moved mid-step keep the rate, the schedule, the norm and the scale",
          "[gpu][training]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  std::optional<cgt::torch::SGD> sgd(must(cgt::torch::make_sgd(
      {w}, {.lr = 0.5, .max_grad_norm = 100.0, .loss_scale = {.dynamic = true, .init_scale = 1024}})));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, *sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; },
      cgt::torch::TrainingStepOptions{.micro_batches = 2}));
  auto update = must(cgt::torch::make_optimizer_step(pool, *sgd));
  const auto x = torch::ones({8}, gpu);

  std::optional<cgt::torch::SGD> kept(std::move(*sgd));
  cgt::torch::SGD& moved_from = *sgd;
  expect_error(moved_from.set_lr(0.3), cgt::Errc::invalid_argument, "Optimizer::set_lr");
  must(kept->set_schedule([](std::int64_t t) { return 0.01 * static_cast<double>(t + 1); }));

  pool.mark_step_begin();
  must(step({x}));
  CHECK(step.micro_batches_taken() == 1);
  cgt::torch::TrainingStep moved_step = std::move(step);
  CHECK(moved_step.micro_batches_taken() == 1);
  CHECK(moved_step.micro_batches() == 2);
  cgt::torch::TrainingStep& old_step = step;
  auto refused = old_step({x});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  cgt::torch::OptimizerStep moved_update = std::move(update);
  cgt::torch::OptimizerStep& old_update = update;
  CHECK(error_of(old_update()) == cgt::Errc::invalid_argument);
  CHECK(moved_update.function().name() == "optimizer_step");

  double expected = 0;
  for (std::int64_t t = 0; t < 4; ++t) {  // warm-ups, recordings, replays
    INFO("step " << t);
    if (t > 0) {
      pool.mark_step_begin();
      must(moved_step({x}));
    }
    pool.mark_step_begin();
    auto out = moved_step({x});
    if (!out) FAIL(out.error().describe());
    REQUIRE(out->size() == 2);  // the loss, then the norm
    const double norm = must(out->take(1)).item<double>();
    CHECK(std::abs(norm - std::sqrt(8.0)) <= 1e-6);  // the unscaled gradient: 1 everywhere
    CHECK(kept->grad_norm().item<double>() == norm);
    CHECK(kept->loss_scale().item<double>() == 1024);
    CHECK(kept->skipped_steps().item<std::int64_t>() == 0);
    CHECK(kept->scheduled_steps() == t + 1);
    CHECK(moved_step.micro_batches_taken() == 0);
    expected -= static_cast<double>(static_cast<float>(0.01 * static_cast<double>(t + 1)));
    CHECK(std::abs(w.detach().max().item<double>() - expected) <= 1e-6);
    CHECK(std::abs(w.detach().min().item<double>() - expected) <= 1e-6);
  }
  // The schedule taken away, a rate set through the moved-into handle; then that handle goes too.
  must(kept->set_schedule({}));
  must(kept->set_lr(0.25));
  kept.reset();
  for (int t = 0; t < 2; ++t) {
    pool.mark_step_begin();
    must(moved_step({x}));
    pool.mark_step_begin();
    auto out = moved_step({x});
    if (!out) FAIL(out.error().describe());
    CHECK(out->size() == 2);
    expected -= static_cast<double>(0.25F);
  }
  CHECK(std::abs(w.detach().max().item<double>() - expected) <= 1e-6);
  CHECK(std::abs(w.detach().min().item<double>() - expected) <= 1e-6);
  CHECK(pool.stats().eager_calls == 0);
}

// ---- an optimizer over no parameters (GPU) --------------------------------------------------------

// A training step over an optimizer of no parameters with clipping on, whose loss is of constant
// tensors: every kind of step (whole, micro-batches one per call and all in one call, from given
// gradients) runs the loss function and no backward (a constant has none), updates nothing and
// hands out the loss alone (no norm: the optimizer clips nothing), at warm-up, recording and
// replays; the schedule counts its steps.
TEST_CASE("training/handles: a training step over no parameters runs its loss function and updates nothing",
          "[gpu][training]") {
  REQUIRE_GPU();
  const auto constant_loss = [](cgt::torch::Inputs in) { return cgt::torch::Values{(in[0] * 2).sum()}; };
  const auto x = torch::arange(8, torch::TensorOptions(gpu).dtype(torch::kFloat));
  const double expected = 2.0 * 28.0;  // 2 * (0 + 1 + ... + 7)
  struct Kind {
    const char* what;
    std::int64_t micro_batches;
    bool all_in_one;
    bool from_gradients;
  };
  for (const Kind kind :
       {Kind{"whole step", 1, false, false}, Kind{"2 micro-batches one per call", 2, false, false},
        Kind{"2 micro-batches in one call", 2, true, false}, Kind{"from gradients", 1, false, true}}) {
    INFO(kind.what);
    auto adam = must(cgt::torch::make_adam({}, {.lr = 1e-3, .max_grad_norm = 1.0}));
    must(adam.set_schedule([](std::int64_t) { return 1e-3; }));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step =
        kind.from_gradients
            ? must(cgt::torch::make_training_step_from_gradients(pool, adam, constant_loss))
            : must(cgt::torch::make_training_step(pool, adam, constant_loss,
                                                  cgt::torch::TrainingStepOptions{.micro_batches = kind.micro_batches,
                                                                                  .all_in_one_call = kind.all_in_one}));
    for (int call = 0; call < 6; ++call) {
      INFO("call " << call);
      pool.mark_step_begin();
      auto out = step({x});
      if (!out) FAIL(out.error().describe());
      REQUIRE(out->size() == 1);  // the loss alone: no norm
      // In one call the loss is the mean of the micro-batches': each sums half of x, doubled.
      CHECK(must(out->take(0)).item<double>() == (kind.all_in_one ? expected / 2 : expected));
    }
    const std::int64_t per_step = kind.all_in_one ? 1 : kind.micro_batches;
    CHECK(adam.scheduled_steps() == 6 / per_step);
    CHECK(step.micro_batches_taken() == 0);
    CHECK(pool.stats().eager_calls == 0);
  }
}
