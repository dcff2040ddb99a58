// A training step whose loss function throws (a std::exception or anything else) or runs out of
// memory mid-step, under float32 and bf16 autocast: the call fails and changes nothing, and the
// training goes on as if nothing failed; restart_step drops the micro-batches taken. Each test
// states the promise it tries to break (from modules/cgt.torch-optim.inc and docs/training.md) and
// checks what a user relies on: values, errors, and which state holds after. Tagged
// [gpu][training] (SKIPPED without a GPU).
#include <torch/torch.h>
#include <ATen/autocast_mode.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "torch/training_checks.hpp"
#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::accumulation_micro;
using training_test::accumulation_steps;
using training_test::autocast_state;
using training_test::AutocastState;
using training_test::gpu;
using training_test::host_copies;
using training_test::max_difference;
using training_test::micro_batch_data;
using training_test::Mlp;
using training_test::must;
using training_test::same;

// ---- throws and out of memory inside a step (GPU) -------------------------------------------------

enum class Failure : std::uint8_t { none, std_exception, not_std, out_of_memory };

struct AccumulationRun {
  std::vector<double> losses;  // of the calls that succeeded, in order
  std::vector<torch::Tensor> params;
  cgt::Stats stats;
};

// Trains `accumulation_steps` steps of 4 micro-batches one per call (AdamW, clipping, warm-up +
// cosine). `plan`: the failure the loss function makes the first time micro-batch (step, micro) is
// tried; each failed call is checked to have changed nothing (the micro-batches taken, the
// schedule's count, the parameters, the accumulated gradients, the thread's autocast state), then
// the same micro-batch is tried again.
AccumulationRun train_accumulating(std::optional<at::ScalarType> autocast,
                                   const std::map<std::pair<int, int>, Failure>& plan) {
  const auto data = micro_batch_data();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 2, accumulation_steps, 3e-4);
  auto adam = must(cgt::torch::make_adam(
      model->parameters(), {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0}));
  must(adam.set_schedule(schedule));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  Failure inject = Failure::none;
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&](cgt::torch::Inputs in) {
        const Failure failure = std::exchange(inject, Failure::none);
        if (failure == Failure::out_of_memory) {
          (void)at::empty({std::int64_t{1} << 50}, in[0].options());  // 4 PiB: the allocator throws
        }
        const auto y = model->forward(in[0]);
        if (failure == Failure::std_exception) throw std::runtime_error("the loss function failed");
        if (failure == Failure::not_std) throw 7;  // NOLINT(hicpp-exception-baseclass): what a careless program throws
        return cgt::torch::Values{torch::mse_loss(y, in[1])};
      },
      cgt::torch::TrainingStepOptions{.micro_batches = accumulation_micro, .autocast = autocast}));
  const AutocastState outside = autocast_state();
  AccumulationRun run;
  for (int t = 0; t < accumulation_steps; ++t) {
    for (int m = 0; m < accumulation_micro; ++m) {
      INFO("step " << t << ", micro-batch " << m);
      const auto& [x, y] = data[static_cast<std::size_t>((t * accumulation_micro) + m)];
      CHECK(step.micro_batches_taken() == m);
      if (const auto planned = plan.find({t, m}); planned != plan.end()) {
        const auto params = host_copies(model->parameters());
        const auto grads = host_copies(adam.grads());
        inject = planned->second;
        pool.mark_step_begin();
        auto failed = step({x, y});
        CHECK(inject == Failure::none);  // the loss function ran: the plan is where it is called
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code ==
              (planned->second == Failure::out_of_memory ? cgt::Errc::out_of_memory : cgt::Errc::function_failed));
        CHECK(step.micro_batches_taken() == m);  // a failed call counts no micro-batch
        CHECK(adam.scheduled_steps() == t);
        if (m == accumulation_micro - 1) CHECK(adam.lr() == schedule(t));  // the same rate, again
        CHECK(same(params, host_copies(model->parameters())));
        CHECK(same(grads, host_copies(adam.grads())));
        CHECK(autocast_state() == outside);
      }
      pool.mark_step_begin();
      auto out = step({x, y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<double>());
    }
    CHECK(adam.scheduled_steps() == t + 1);
  }
  run.params = host_copies(model->parameters());
  run.stats = pool.stats();
  return run;
}

}  // namespace

// A loss function that throws (a std::exception, or anything else) or runs out of memory on a
// micro-batch, the 3rd of a step among them, under float32 and under bf16 autocast: each call fails
// with function_failed (out_of_memory for the allocation), counts no micro-batch and changes no
// parameter, no accumulated gradient and no autocast state; the micro-batch tried again, training
// goes on exactly as a run in which nothing failed, with the same graphs (a failure in an intact
// capture is passing: no shape falls back to eager). The failures are placed where the loss
// function runs: the warm-ups and the recordings of the first, middle and stepping calls.
TEST_CASE("training/failures: a loss function that throws or runs out of memory mid-step changes nothing",
          "[gpu][training][provokes-api-errors]") {
  REQUIRE_GPU();
  const std::map<std::pair<int, int>, Failure> plan{
      {{0, 1}, Failure::out_of_memory},  // the middle calls' warm-up
      {{0, 2}, Failure::std_exception},  // the 3rd micro-batch: the middle calls' recording
      {{0, 3}, Failure::not_std},        // the stepping call's warm-up
      {{1, 0}, Failure::std_exception},  // the first calls' recording
      {{1, 3}, Failure::std_exception},  // the stepping call's recording
  };
  for (const std::optional<at::ScalarType> autocast : {std::optional<at::ScalarType>(), std::optional(at::kBFloat16)}) {
    INFO((autocast ? "bf16 autocast" : "float32"));
    const AccumulationRun clean = train_accumulating(autocast, {});
    const AccumulationRun failing = train_accumulating(autocast, plan);
    CHECK(max_difference(clean.losses, failing.losses) <= 1e-6);
    CHECK(max_difference(clean.params, failing.params) <= 1e-6);
    CHECK(failing.stats.recordings == clean.stats.recordings);
    CHECK(failing.stats.recordings == 3);
    CHECK(failing.stats.eager_calls == 0);
    CHECK(failing.stats.replays == clean.stats.replays);
  }
}

// After a failed call the program may give up the step: restart_step drops the micro-batches it
// took, and the next call begins it again (its first micro-batch zeroes the gradients). Two
// micro-batches taken and dropped leave no trace in the training that follows.
TEST_CASE("training/failures: restart_step drops the micro-batches taken and begins the step again",
          "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = micro_batch_data();
  const auto run = [&data](bool abandon_a_step) {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto sgd = must(cgt::torch::make_sgd(model->parameters(), {.lr = 0.1}));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = must(cgt::torch::make_training_step(
        pool, sgd,
        [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
        cgt::torch::TrainingStepOptions{.micro_batches = 3}));
    if (abandon_a_step) {
      for (std::size_t i = 6; i < 8; ++i) {
        pool.mark_step_begin();
        must(step({data[i].first, data[i].second}));
      }
      CHECK(step.micro_batches_taken() == 2);
      must(step.restart_step());
      CHECK(step.micro_batches_taken() == 0);
    }
    for (std::size_t i = 0; i < 6; ++i) {
      pool.mark_step_begin();
      must(step({data[i].first, data[i].second}));
    }
    CHECK(step.micro_batches_taken() == 0);
    return host_copies(model->parameters());
  };
  CHECK(max_difference(run(false), run(true)) <= 1e-6);
}
