// Training from two threads: set_lr while steps run, a step called from two threads at once, and
// every member of an optimizer called from another thread while a step runs: one step at a time,
// what is turned away fails with concurrent_use and changes nothing, and the training equals a
// single thread's. Each test states the promise it tries to break (from
// modules/cgt.torch-optim.inc and docs/training.md) and checks what a user relies on: values,
// errors, and which state holds after. Tagged [gpu][training] (SKIPPED without a GPU).
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "torch/training_checks.hpp"
#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::error_of;
using training_test::gpu;
using training_test::host_copies;
using training_test::max_difference;
using training_test::micro_batch_data;
using training_test::Mlp;
using training_test::mse;
using training_test::must;
using training_test::same;
using training_test::TempFile;

using Catch::Matchers::ContainsSubstring;

}  // namespace

// ---- threads (GPU) -------------------------------------------------------------------------------

// set_lr from another thread while one trains (warm-up, recording and replays included): a write
// of the rate lands before or after a step, never in between: a set_lr while a step's call runs
// fails with concurrent_use and writes nothing, and a step called while set_lr writes waits for it.
// Every step moves every weight by one of the two rates the other thread writes, exactly (SGD on
// (w * x).sum(), x = 1), no step fails, nothing falls back to eager, and once the threads are done
// the rate set last is the one the next step takes.
TEST_CASE("training/threads: set_lr from another thread while steps run takes effect between steps",
          "[gpu][training]") {
  REQUIRE_GPU();
  constexpr double slow = 1e-3;
  constexpr double fast = 3e-3;
  auto w = torch::zeros({64}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = slow}));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  const auto x = torch::ones({64}, gpu);

  std::atomic<bool> done{false};
  std::atomic<int> written{0};
  std::atomic<int> refused{0};
  std::atomic<int> other_errors{0};
  std::thread writer([&] {
    bool flip = false;
    while (!done.load()) {
      flip = !flip;
      const double before = sgd.lr();
      const auto set = sgd.set_lr(flip ? fast : slow);
      if (set) {
        ++written;
      } else if (set.error().code == cgt::Errc::concurrent_use && sgd.lr() == before) {
        ++refused;  // a step's call was running: nothing written
      } else {
        ++other_errors;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int failed_calls = 0;
  int other_moves = 0;
  int torn = 0;
  double before = 0;
  for (int t = 0; t < 200; ++t) {
    pool.mark_step_begin();
    if (!step({x})) ++failed_calls;
    const auto now = w.detach().to(torch::kDouble).cpu();
    const double moved = before - now[0].item<double>();
    if ((now - now[0]).abs().max().item<double>() != 0) ++torn;  // all weights moved alike
    if (std::abs(moved - static_cast<double>(static_cast<float>(slow))) > 1e-6 &&
        std::abs(moved - static_cast<double>(static_cast<float>(fast))) > 1e-6) {
      ++other_moves;
    }
    before = now[0].item<double>();
  }
  done = true;
  writer.join();
  CHECK(failed_calls == 0);
  CHECK(other_moves == 0);
  CHECK(torn == 0);
  CHECK(other_errors.load() == 0);
  CHECK(written.load() > 0);
  WARN(written.load() << " rates written, " << refused.load() << " refused while a step ran");
  CHECK((sgd.lr() == slow || sgd.lr() == fast));
  must(sgd.set_lr(5e-3));
  pool.mark_step_begin();
  must(step({x}));
  CHECK(std::abs(before - w.detach()[0].item<double>() - static_cast<double>(5e-3F)) <= 1e-6);
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
}

// Two threads calling the same training step (micro-batches one per call, a schedule): one thread's
// call is held inside the loss function (its warm-up, then its recording, of the first and of the
// stepping call) while the other calls the step. The second call fails with concurrent_use and
// changes nothing: the micro-batches taken and the schedule's count are the first call's alone,
// the recording is not disturbed, and the training equals a single thread's. A graphed update of
// the same optimizer (an OptimizerStep on another pool) is turned away too: one step at a time.
TEST_CASE("training/threads: a step called from two threads at once fails with concurrent_use and counts once",
          "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = micro_batch_data();
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 2, 10, 3e-4);
  const auto run = [&](bool intrude) {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 3e-3}));
    must(adam.set_schedule(schedule));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    std::mutex mutex;
    std::condition_variable changed;
    bool hold = false;
    bool inside = false;
    bool released = false;
    auto step = must(cgt::torch::make_training_step(
        pool, adam,
        [&](cgt::torch::Inputs in) {
          if (hold) {
            std::unique_lock lock(mutex);
            inside = true;
            changed.notify_all();
            changed.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
          }
          return mse(model, in);
        },
        cgt::torch::TrainingStepOptions{.micro_batches = 2}));
    auto update_pool = must(cgt::torch::make_pool({.device = 0}));
    const auto update = must(cgt::torch::make_optimizer_step(update_pool, adam));
    std::vector<double> losses;
    for (int i = 0; i < 12; ++i) {
      INFO("call " << i);
      const auto& [x, y] = data[static_cast<std::size_t>(i)];
      pool.mark_step_begin();
      if (!intrude || i >= 4) {  // calls 0..3: the warm-ups and recordings of both phases
        auto out = step({x, y});
        if (!out) FAIL(out.error().describe());
        losses.push_back(must(out->take(0)).item<double>());
        continue;
      }
      hold = true;
      inside = false;
      released = false;
      std::optional<cgt::Errc> first_error;
      double first_loss = 0;
      std::thread first([&] {  // no Catch2 assertion on this thread
        auto out = step({x, y});
        first_error = error_of(out);
        if (!out) return;
        auto loss = out->take(0);
        if (loss) first_loss = loss->item<double>();
      });
      {
        std::unique_lock lock(mutex);
        changed.wait_for(lock, std::chrono::seconds(20), [&] { return inside; });
      }
      CHECK(inside);
      auto second = step({x, y});
      // A graphed update of the same optimizer, through a pool of its own, is turned away alike.
      CHECK(error_of(update()) == cgt::Errc::concurrent_use);
      const std::int64_t taken_meanwhile = step.micro_batches_taken();
      const std::int64_t counted_meanwhile = adam.scheduled_steps();
      {
        const std::lock_guard lock(mutex);
        released = true;
      }
      changed.notify_all();
      first.join();
      hold = false;
      CHECK(error_of(second) == cgt::Errc::concurrent_use);
      CHECK(first_error == std::nullopt);
      CHECK(taken_meanwhile == i % 2);
      CHECK(counted_meanwhile == i / 2);
      CHECK(step.micro_batches_taken() == (i + 1) % 2);
      CHECK(adam.scheduled_steps() == (i + 1) / 2);
      losses.push_back(first_loss);
    }
    CHECK(adam.scheduled_steps() == 6);
    CHECK(pool.stats().recordings == 2);
    CHECK(pool.stats().eager_calls == 0);
    return std::make_pair(losses, host_copies(model->parameters()));
  };
  const auto [alone_losses, alone_params] = run(false);
  const auto [raced_losses, raced_params] = run(true);
  CHECK(max_difference(alone_losses, raced_losses) <= 1e-6);
  CHECK(max_difference(alone_params, raced_params) <= 1e-6);
}

// While a graphed step runs on one thread (held inside its loss function, at the stepping call's
// warm-up and its recording, with a micro-batch's gradients accumulated), another thread calls
// every member of the optimizer that changes or copies its state (cgt.torch-optim.inc, Optimizer,
// Threads): those that return Result fail with concurrent_use, step() and zero_grad() throw
// c10::Error naming the other thread's step, a save writes no file, and a second training step and
// a graphed update of the same optimizer are turned away. Nothing changed: the rate, the
// schedule's count, the micro-batches taken and `.grad` are as they were, and the training equals
// a run in which no other thread called anything (a load of the step-0 checkpoint, a rate of 1, a
// schedule from step 0, a zero_grad or a step would each have changed it). On the step's own
// thread (inside its loss function, at the first call's warm-up) the same members work.
TEST_CASE("training/threads: optimizer members called from another thread while a step runs change nothing",
          "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = micro_batch_data();
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 2, 10, 3e-4);
  const auto run = [&](bool intrude) {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 3e-3}));
    must(adam.set_schedule(schedule));
    const TempFile start_file(intrude ? "hostile_threads_start_intruded" : "hostile_threads_start");
    must(adam.save(start_file.path));  // the state of step 0, which a load would put back
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    std::mutex mutex;
    std::condition_variable changed;
    bool hold = false;
    bool inside = false;
    bool released = false;
    bool call_from_inside = true;
    std::vector<std::optional<cgt::Errc>> from_inside;  // the members called inside the loss function
    const auto loss = [&](cgt::torch::Inputs in) {
      if (std::exchange(call_from_inside, false)) {
        from_inside.push_back(error_of(adam.attach_grads()));
        from_inside.push_back(error_of(adam.set_lr(adam.lr())));
        from_inside.push_back(error_of(adam.set_schedule(schedule, adam.scheduled_steps())));
        torch::serialize::OutputArchive archive;
        from_inside.push_back(error_of(adam.save(archive)));
      }
      if (hold) {
        std::unique_lock lock(mutex);
        inside = true;
        changed.notify_all();
        changed.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
      }
      return mse(model, in);
    };
    auto step =
        must(cgt::torch::make_training_step(pool, adam, loss, cgt::torch::TrainingStepOptions{.micro_batches = 2}));
    auto other_pool = must(cgt::torch::make_pool({.device = 0}));
    const auto other_step = must(cgt::torch::make_training_step(other_pool, adam, loss));
    const auto update = must(cgt::torch::make_optimizer_step(other_pool, adam));
    const TempFile never(intrude ? "hostile_threads_never_intruded" : "hostile_threads_never");
    const auto thrown = [](const std::function<void()>& call) {
      try {
        call();
      } catch (const c10::Error& e) {
        return std::string(e.what_without_backtrace());
      }
      return std::string("(nothing thrown)");
    };
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i) {
      INFO("call " << i);
      const auto& [x, y] = data[static_cast<std::size_t>(i)];
      pool.mark_step_begin();
      if (!intrude || (i != 1 && i != 3)) {  // calls 1 and 3: the stepping call's warm-up and recording
        auto out = step({x, y});
        if (!out) FAIL(out.error().describe());
        losses.push_back(must(out->take(0)).item<double>());
        continue;
      }
      // Made before the other thread records: nothing below calls CUDA while it captures.
      torch::serialize::OutputArchive out_archive;
      torch::serialize::InputArchive in_archive;
      in_archive.load_from(start_file.path);
      const std::vector<torch::Tensor> gradients = adam.grads();
      hold = true;
      inside = false;
      released = false;
      std::optional<cgt::Errc> first_error;
      double first_loss = 0;
      std::thread first([&] {  // no Catch2 assertion on this thread
        auto out = step({x, y});
        first_error = error_of(out);
        if (!out) return;
        auto taken = out->take(0);
        if (taken) first_loss = taken->item<double>();
      });
      {
        std::unique_lock lock(mutex);
        changed.wait_for(lock, std::chrono::seconds(20), [&] { return inside; });
      }
      CHECK(inside);
      const double rate = adam.lr();
      const std::int64_t counted = adam.scheduled_steps();
      CHECK(counted == i / 2);
      CHECK(step.micro_batches_taken() == 1);
      // CHECK, not REQUIRE: the other thread must be released whatever fails here.
      const auto refused = [](const cgt::Result<void>& result, const char* member) {
        INFO(member);
        CHECK(error_of(result) == cgt::Errc::concurrent_use);
        if (result) return;
        CHECK_THAT(result.error().message, ContainsSubstring(member));
        CHECK_THAT(result.error().message, ContainsSubstring("another thread"));
      };
      refused(adam.set_lr(1.0), "Optimizer::set_lr");
      refused(adam.set_schedule(cgt::torch::lr::linear(1.0, 1.0, 1)), "Optimizer::set_schedule");
      refused(adam.attach_grads(), "Optimizer::attach_grads");
      refused(adam.save(never.path), "Optimizer::save");
      CHECK_FALSE(std::filesystem::exists(never.path));
      refused(adam.save(out_archive), "Optimizer::save");
      refused(adam.load(start_file.path), "Optimizer::load");
      refused(adam.load(in_archive), "Optimizer::load");
      for (const auto& [what, call] : std::vector<std::pair<const char*, std::function<void()>>>{
               {"Optimizer::step", [&] { adam.step(); }},
               {"Optimizer::step", [&] { adam.step(std::span<const torch::Tensor>(gradients)); }},
               {"Optimizer::zero_grad", [&] { adam.zero_grad(); }},
               {"Optimizer::zero_grad", [&] { adam.zero_grad(true); }}}) {
        INFO(what);
        const std::string message = thrown(call);
        CHECK_THAT(message, ContainsSubstring(what));
        CHECK_THAT(message, ContainsSubstring("another thread's graphed step"));
      }
      CHECK(error_of(other_step({x, y})) == cgt::Errc::concurrent_use);
      CHECK(error_of(update()) == cgt::Errc::concurrent_use);
      CHECK(adam.lr() == rate);
      CHECK(adam.scheduled_steps() == counted);
      CHECK(step.micro_batches_taken() == 1);
      for (std::size_t p = 0; p < adam.params().size(); ++p) {
        CHECK(adam.params()[p].grad().is_same(adam.grads()[p]));  // zero_grad(true) undid nothing
      }
      {
        const std::lock_guard lock(mutex);
        released = true;
      }
      changed.notify_all();
      first.join();
      hold = false;
      CHECK(first_error == std::nullopt);
      losses.push_back(first_loss);
    }
    REQUIRE(from_inside.size() == 4);
    for (const std::optional<cgt::Errc>& error : from_inside) CHECK(error == std::nullopt);
    CHECK(adam.scheduled_steps() == 4);
    CHECK(pool.stats().recordings == 2);
    CHECK(pool.stats().eager_calls == 0);
    return std::make_pair(losses, host_copies(model->parameters()));
  };
  const auto [alone_losses, alone_params] = run(false);
  const auto [raced_losses, raced_params] = run(true);
  CHECK(max_difference(alone_losses, raced_losses) <= 1e-6);
  CHECK(max_difference(alone_params, raced_params) <= 1e-6);
}
