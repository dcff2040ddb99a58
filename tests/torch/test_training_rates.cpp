// The learning rate as device state and its schedules at their edges: counts below 0 and up to
// 2^62, a start above it, schedules that return a bad rate (NaN, negative, infinite, beyond
// float32's range) or throw (a std::exception or anything else): the call fails before the pool is
// called and the previous rate holds, on the host and on the device. Each test states the promise
// it tries to break (from modules/cgt.torch-optim.inc and docs/training.md) and checks what a user
// relies on: values, errors, and which state holds after. Tagged [training]; those that
// need a GPU [gpu] too (SKIPPED without one).
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <optional>
#include <stdexcept>
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
using training_test::host_copies;
using training_test::infinity;
using training_test::most_scheduled_steps;
using training_test::must;
using training_test::not_a_number;
using training_test::same;

using Catch::Matchers::ContainsSubstring;

}  // namespace

// ---- schedules (no device) -----------------------------------------------------------------------

// cgt.torch-optim.inc, namespace lr: "Counts below 0 count as 0". A program that asks a schedule for
// the rate before its first step (`schedule(step - 1)` at step 0, as a resumed run's log does) must
// get the first rate, not a negative one, nor infinity, nor a rate above the peak. At any count the
// rates stay finite and >= 0 (set_lr would refuse anything else and fail the step).
TEST_CASE("training/rates: schedules count steps below 0 as 0 and stay finite at every count", "[training]") {
  constexpr std::int64_t lowest = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t highest = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::pair<const char*, cgt::torch::LrSchedule>> schedules{
      {"warmup_cosine", cgt::torch::lr::warmup_cosine(1.0, 10, 110, 0.1)},
      {"warmup_cosine without warm-up", cgt::torch::lr::warmup_cosine(1.0, 0, 100, 0.1)},
      {"step_decay", cgt::torch::lr::step_decay(1.0, 10, 0.5)},
      {"linear", cgt::torch::lr::linear(0.5, 1.0, 4)}};
  for (const auto& [name, schedule] : schedules) {
    INFO(name);
    const double first = schedule(0);
    for (const std::int64_t t : {std::int64_t{-1}, std::int64_t{-15}, std::int64_t{-1000}, lowest}) {
      INFO("step " << t);
      CHECK(schedule(t) == first);
    }
    for (const std::int64_t t : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, highest}) {
      INFO("step " << t);
      CHECK(std::isfinite(schedule(t)));
      CHECK(schedule(t) >= 0);
    }
  }
}

// A schedule counts steps from 0 to 2^62 (cgt.torch-optim.inc, Optimizer::set_schedule): a start
// above (INT64_MAX would overflow at the next step) fails with invalid_argument naming the
// function, and the schedule's count stays; 2^62 itself is taken.
TEST_CASE("training/rates: a schedule may not start above 2^62 steps", "[training]") {
  auto sgd = must(cgt::torch::make_sgd({}, {.lr = 0.5}));
  must(sgd.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 5));
  for (const std::int64_t start : {std::numeric_limits<std::int64_t>::max(), most_scheduled_steps + 1}) {
    INFO("start " << start);
    expect_error(sgd.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), start), cgt::Errc::invalid_argument,
                 "Optimizer::set_schedule");
    CHECK(sgd.scheduled_steps() == 5);
  }
  must(sgd.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), most_scheduled_steps));
  CHECK(sgd.scheduled_steps() == most_scheduled_steps);
}

// ---- schedules that fail (GPU) -------------------------------------------------------------------

// A schedule whose rate is NaN, negative or infinite, or that throws, fails the stepping call
// before the pool is called (invalid_argument, function_failed for the throw): the micro-batches
// taken, the schedule's count, the host's rate and the device's rate stay, and no parameter moves.
// The device's rate is read back by the update: the schedule taken away, the next step moves each
// weight by the rate before the failures. Then the schedule resumes at its count.
TEST_CASE("training/rates: schedules that return bad rates or throw keep the previous rate", "[gpu][training]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.5}));
  std::function<double(std::int64_t)> rate = [](std::int64_t t) { return 0.01 * static_cast<double>(t + 1); };
  const cgt::torch::LrSchedule good = rate;
  const auto through = [&rate](std::int64_t t) { return rate(t); };
  must(sgd.set_schedule(through));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; },
      cgt::torch::TrainingStepOptions{.micro_batches = 2}));
  const auto x = torch::ones({8}, gpu);
  const auto call = [&] {
    pool.mark_step_begin();
    return step({x});
  };
  const auto weights_are = [&w](double value) {
    CHECK(std::abs(w.detach().max().item<double>() - value) <= 1e-7);
    CHECK(std::abs(w.detach().min().item<double>() - value) <= 1e-7);
  };
  must(call());
  must(call());
  weights_are(-0.01);
  CHECK(sgd.scheduled_steps() == 1);
  must(call());  // the first micro-batch of step 1
  const auto grads = host_copies(sgd.grads());
  const std::uint64_t calls = pool.stats().calls;

  struct Bad {
    const char* what;
    std::function<double(std::int64_t)> rate;
    cgt::Errc code;
  };
  const std::vector<Bad> bads{
      {"NaN", [](std::int64_t) { return not_a_number; }, cgt::Errc::invalid_argument},
      {"negative", [](std::int64_t) { return -1e-3; }, cgt::Errc::invalid_argument},
      {"infinite", [](std::int64_t) { return infinity; }, cgt::Errc::invalid_argument},
      {"minus infinity", [](std::int64_t) { return -infinity; }, cgt::Errc::invalid_argument},
      {"throws", [](std::int64_t) -> double { throw std::runtime_error("no rate"); }, cgt::Errc::function_failed},
  };
  for (const Bad& bad : bads) {
    INFO(bad.what);
    rate = bad.rate;
    auto failed = call();
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == bad.code);
    CHECK_THAT(failed.error().message, ContainsSubstring("schedule"));
    CHECK(step.micro_batches_taken() == 1);
    CHECK(sgd.scheduled_steps() == 1);
    CHECK(sgd.lr() == 0.01);
    weights_are(-0.01);
    CHECK(same(grads, host_copies(sgd.grads())));
  }
  CHECK(pool.stats().calls == calls);  // none reached the pool

  must(sgd.set_schedule({}));  // the rate stays where the failures left it: 0.01, on the device too
  CHECK(sgd.lr() == 0.01);
  must(call());
  weights_are(-0.02);
  rate = good;
  must(sgd.set_schedule(through, 1));
  must(call());
  must(call());
  weights_are(-0.04);  // schedule(1) = 0.02
  CHECK(sgd.scheduled_steps() == 2);
  CHECK(pool.stats().eager_calls == 0);
}

// cgt.cppm: "nothing throws, asserts or aborts on a caller's mistake", and a pool function that
// throws anything (std::exception or not) fails with function_failed. A schedule is the program's
// code too: one that throws something other than a std::exception must fail the training step's
// and the graphed update's call the same way, not escape from it.
TEST_CASE("training/rates: a schedule that throws a non-std exception fails the call, never escapes",
          "[gpu][training]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.5}));
  must(sgd.set_schedule(
      [](std::int64_t) -> double { throw 42; }));  // NOLINT(hicpp-exception-baseclass): a careless program's
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  auto update = must(cgt::torch::make_optimizer_step(pool, sgd));
  const auto x = torch::ones({8}, gpu);

  std::optional<cgt::Errc> step_error;
  bool step_escaped = false;
  try {
    auto out = step({x});
    step_error = error_of(out);
  } catch (...) {
    step_escaped = true;
  }
  CHECK_FALSE(step_escaped);
  CHECK(step_error == cgt::Errc::function_failed);

  std::optional<cgt::Errc> update_error;
  bool update_escaped = false;
  try {
    update_error = error_of(update());
  } catch (...) {
    update_escaped = true;
  }
  CHECK_FALSE(update_escaped);
  CHECK(update_error == cgt::Errc::function_failed);
  CHECK(sgd.scheduled_steps() == 0);
  CHECK(sgd.lr() == 0.5);
  CHECK(w.detach().abs().max().item<double>() == 0);
}

// The schedule's count stops at 2^62 (cgt.torch-optim.inc, Optimizer::scheduled_steps), so that it
// never overflows: a schedule resumed there is asked for the rate of step 2^62 at every step, each
// step trains at that rate, and the count stays.
TEST_CASE("training/rates: the schedule's count stops at 2^62", "[gpu][training]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.5}));
  std::vector<std::int64_t> asked;
  must(sgd.set_schedule(
      [&asked](std::int64_t t) {
        asked.push_back(t);
        return 0.25;
      },
      most_scheduled_steps));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  const auto x = torch::ones({8}, gpu);
  for (int t = 0; t < 3; ++t) {
    pool.mark_step_begin();
    must(step({x}));
    CHECK(sgd.scheduled_steps() == most_scheduled_steps);
  }
  CHECK(asked == std::vector<std::int64_t>(3, most_scheduled_steps));
  CHECK(w.detach().max().item<double>() == -0.75);  // three steps at 0.25 (exact in float32)
  CHECK(w.detach().min().item<double>() == -0.75);
}

// The rate lives on the device as a float32: a rate that is finite as a double but beyond float32's
// range (1e300) cannot be written there. It is a bad argument like a negative rate: set_lr, a
// schedule and make_adam refuse it with invalid_argument, and the rate before stays (host and
// device).
TEST_CASE("training/rates: a rate beyond float32's range is refused as a bad argument", "[gpu][training]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.01}));
  for (const double huge : {1e300, 2.0 * static_cast<double>(std::numeric_limits<float>::max())}) {
    INFO("rate " << huge);
    auto set = sgd.set_lr(huge);
    REQUIRE_FALSE(set);
    CHECK(set.error().code == cgt::Errc::invalid_argument);
    CHECK(sgd.lr() == 0.01);
  }
  sgd.grads()[0].fill_(1);  // a step at the device's rate: every weight moves by -0.01
  sgd.step();
  CHECK(std::abs(w.detach().max().item<double>() + 0.01) <= 1e-7);
  CHECK(std::abs(w.detach().min().item<double>() + 0.01) <= 1e-7);

  must(sgd.set_schedule([](std::int64_t) { return 1e300; }));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  auto out = step({torch::ones({8}, gpu)});
  REQUIRE_FALSE(out);
  CHECK(out.error().code == cgt::Errc::invalid_argument);
  CHECK(sgd.lr() == 0.01);

  auto made = cgt::torch::make_adam({torch::zeros({4}, gpu).requires_grad_()}, {.lr = 1e300});
  REQUIRE_FALSE(made);
  CHECK(made.error().code == cgt::Errc::invalid_argument);
}
