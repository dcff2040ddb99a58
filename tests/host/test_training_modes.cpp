// Training modes (forward, backward) used out of order, and warm_up_each_shape = false, on the
// host backend: backwards called twice, after their saved values were dropped, on another pool's
// outputs, or throwing; forwards of two functions interleaved; first calls that throw;
// re-recordings and pending backwards with shapes that record at their first call.
//
// The model is the one of test_training.cpp: forward(x, w) -> (y = x * w, saved = x),
// backward(gy, saved, w) -> (gx = gy * w, gw = gy * saved), w static.
#include "host/host_test.hpp"
#include <catch2/generators/catch_generators.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using cgt::FunctionMode;
namespace {

cgt::host::Pool make_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  return host_test::poisoned_pool(std::move(options));
}

// Set `*fail` to throw from the function's body at its next run.
struct Switch {
  bool body = false;
  bool kernel = false;
};

cgt::host::Function forward(cgt::host::Pool& pool, const std::string& name, cgt::FunctionOptions extra = {},
                            const Switch* fail = nullptr) {
  extra.name = name;
  extra.static_inputs = {1};
  extra.mode = FunctionMode::forward;
  return must(pool.add_function(
      [fail](Context& ctx, Inputs in) {
        if (fail != nullptr && fail->body) throw std::runtime_error("forward body");
        const Buffer y = ctx.allocate_like(in[0]);
        const Buffer saved = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], w = in[1], y, saved, fail] {
          if (fail != nullptr && fail->kernel) throw std::runtime_error("forward kernel");
          for (std::size_t i = 0; i < x.numel(); ++i) {
            y.set(i, x.get(i) * w.get(i % w.numel()));
            saved.set(i, x.get(i));
          }
        });
        return Values{y, saved};
      },
      std::move(extra)));
}

cgt::host::Function backward(cgt::host::Pool& pool, const std::string& name, const Switch* fail = nullptr) {
  return must(pool.add_function(
      [fail](Context& ctx, Inputs in) {
        if (fail != nullptr && fail->body) throw std::runtime_error("backward body");
        const Buffer gx = ctx.allocate_like(in[0]);
        const Buffer gw = ctx.allocate_like(in[0]);
        ctx.launch([gy = in[0], saved = in[1], w = in[2], gx, gw, fail] {
          if (fail != nullptr && fail->kernel) throw std::runtime_error("backward kernel");
          for (std::size_t i = 0; i < gy.numel(); ++i) {
            gx.set(i, gy.get(i) * w.get(i % w.numel()));
            gw.set(i, gy.get(i) * saved.get(i));
          }
        });
        return Values{gx, gw};
      },
      {.name = name, .static_inputs = {2}, .mode = FunctionMode::backward}));
}

}  // namespace

TEST_CASE("a backward called twice with the same moved lease fails the second time, and training goes on",
          "[training][host]") {
  auto pool = make_pool();
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer w = filled({4}, 2);
  for (int step = 0; step < 4; ++step) {
    auto out = must(layer({filled({4}, step), w}));
    auto saved = must(out.release(1));
    auto grads = must(grad({filled({4}, 1), std::move(saved), w}));
    CHECK(output_values(grads, 1) == repeat(step));
    // NOLINTNEXTLINE(bugprone-use-after-move): what this test is about
    auto again = grad({filled({4}, 1), std::move(saved), w});
    REQUIRE_FALSE(again.has_value());
    CHECK(again.error().code == cgt::Errc::invalid_argument);
    CHECK(again.error().input == 1);
    CHECK(output_values(out, 0) == repeat(2.0 * step));
    CHECK_FALSE(pool.has_pending_backward());
    if (step == 3) {
      CHECK(out.kind() == K::replay);
      CHECK(grads.kind() == K::replay);
    }
  }
  must(pool.check_memory());
}

TEST_CASE("a backward given a copy of a saved value whose lease was dropped fails with output_overwritten",
          "[training][host]") {
  auto pool = make_pool();
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer w = filled({4}, 2);
  for (int step = 0; step < 3; ++step) {  // warm up, record, replay
    Buffer escaped;
    {
      auto out = must(layer({filled({4}, 3), w}));
      escaped = must(out.get(1)).get();  // a view of pool memory, outliving its lease
    }
    auto grads = grad({filled({4}, 1), escaped, w});
    REQUIRE_FALSE(grads.has_value());
    CHECK(grads.error().code == cgt::Errc::output_overwritten);
    CHECK(grads.error().input == 1);
  }
  // The failed backwards ran nothing: a forward and a backward done right still train, and replay.
  for (int step = 0; step < 3; ++step) {
    auto out = must(layer({filled({4}, step), w}));
    auto grads = must(grad({filled({4}, 1), must(out.release(1)), w}));
    CHECK(output_values(grads, 1) == repeat(step));
    CHECK(output_values(grads, 0) == repeat(2));
  }
  must(pool.check_memory());
}

TEST_CASE("a backward of another pool reads a forward's saved value, and moves its lease", "[training][host]") {
  auto forwards = make_pool();
  auto backwards = make_pool();
  auto layer = forward(forwards, "forward");
  auto grad = backward(backwards, "backward");
  const Buffer w = filled({4}, 2);
  for (int step = 0; step < 4; ++step) {
    auto out = must(layer({filled({4}, step), w}));
    auto saved = must(out.release(1));
    auto grads = must(grad({filled({4}, 1), std::move(saved), w}));
    INFO("step " << step);
    CHECK(output_values(grads, 1) == repeat(step));
    CHECK(output_values(out, 0) == repeat(2.0 * step));
    // The other pool's backward clears nothing here: the forwards' pool still waits for one.
    CHECK(forwards.has_pending_backward());
    CHECK_FALSE(backwards.has_pending_backward());
  }
  // The saved value was moved into the other pool's call, which dropped it: its memory is free.
  CHECK(forwards.live_blocks().empty());
  must(forwards.check_memory());
  must(backwards.check_memory());
}

TEST_CASE("forwards of two functions interleaved with their backwards in any order train and replay",
          "[training][host]") {
  auto pool = make_pool();
  auto layer1 = forward(pool, "forward1");
  auto layer2 = forward(pool, "forward2");
  auto grad1 = backward(pool, "backward1");
  auto grad2 = backward(pool, "backward2");
  const Buffer w1 = filled({4}, 2);
  const Buffer w2 = filled({4}, 3);
  std::vector<K> last;
  for (int step = 0; step < 5; ++step) {
    auto out1 = must(layer1({filled({4}, step), w1}));
    auto out2 = must(layer2({must(out1.get(0)).get(), w2}));
    // Backward 1 before backward 2: not the order autograd would use, but one the pool must take.
    auto grads1 = must(grad1({filled({4}, 1), must(out1.release(1)), w1}));
    auto grads2 = must(grad2({filled({4}, 1), must(out2.release(1)), w2}));
    INFO("step " << step);
    CHECK(output_values(out2, 0) == repeat(6.0 * step));
    CHECK(output_values(grads1, 1) == repeat(step));
    CHECK(output_values(grads2, 1) == repeat(2.0 * step));
    last = {out1.kind(), out2.kind(), grads1.kind(), grads2.kind()};
  }
  CHECK(last == std::vector{K::replay, K::replay, K::replay, K::replay});
  must(pool.check_memory());
}

TEST_CASE("a backward that throws fails its call; the next steps train and replay again", "[training][host]") {
  for (const bool in_kernel : {false, true}) {
    for (int throw_at = 0; throw_at < 4; ++throw_at) {
      auto pool = make_pool();
      Switch fail;
      auto layer = forward(pool, "forward");
      auto grad = backward(pool, "backward", &fail);
      const Buffer w = filled({4}, 2);
      std::vector<K> kinds;
      for (int step = 0; step < 8; ++step) {
        INFO("in_kernel " << in_kernel << ", throw_at " << throw_at << ", step " << step);
        auto out = must(layer({filled({4}, step), w}));
        CHECK(output_values(out, 0) == repeat(2.0 * step));
        (in_kernel ? fail.kernel : fail.body) = step == throw_at;
        auto grads = grad({filled({4}, 1), must(out.release(1)), w});
        fail = {};
        if (step == throw_at) {
          // A body runs at warm-up and recording only: a replay runs the kernels alone.
          if (grads.has_value()) {
            CHECK_FALSE(in_kernel);
            CHECK(grads->kind() == K::replay);
          } else {
            CHECK(grads.error().code == cgt::Errc::function_failed);
            CHECK(grads.error().function == "backward");
          }
          continue;
        }
        REQUIRE(grads.has_value());
        CHECK(output_values(*grads, 1) == repeat(step));
        CHECK(output_values(*grads, 0) == repeat(2));
        kinds = {out.kind(), grads->kind()};
      }
      CHECK(kinds == std::vector{K::replay, K::replay});
      must(pool.check_memory());
    }
  }
}

TEST_CASE("warm_up_each_shape = false: a first call that throws leaves the next call to warm up", "[options][host]") {
  const bool in_kernel = GENERATE(false, true);
  INFO("in_kernel " << in_kernel);
  auto pool = make_pool();
  Switch fail{.body = !in_kernel, .kernel = in_kernel};
  auto layer = forward(pool, "forward", {.mode = FunctionMode::inference, .warm_up_each_shape = false}, &fail);
  const Buffer w = filled({1}, 2);
  auto thrown = layer({filled({4}, 1), w});
  REQUIRE_FALSE(thrown.has_value());
  CHECK(thrown.error().code == cgt::Errc::function_failed);
  CHECK(pool.live_blocks().empty());  // what the failed warm-up allocated went back
  fail = {};
  std::vector<K> kinds;
  for (const std::int64_t size : {4, 4, 4, 8, 8}) {
    pool.mark_step_begin();
    auto out = must(layer({filled({size}, 1), w}));
    kinds.push_back(out.kind());
    CHECK(output_values(out, 0) == repeat(2, static_cast<std::size_t>(size)));
  }
  // The failed call warmed nothing up: the first call that succeeds warms up, later shapes record.
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::recording, K::replay});
  CHECK(pool.stats().warmups == 1);
}

TEST_CASE("warm_up_each_shape = false with a moved static input, shape_key_limit and pending backwards",
          "[options][host]") {
  SECTION("a static input at a new address re-records the shape, without a warm-up") {
    auto pool = make_pool();
    auto layer = forward(pool, "forward", {.mode = FunctionMode::inference, .warm_up_each_shape = false});
    const Buffer w1 = filled({1}, 2);
    const Buffer w2 = filled({1}, 5);
    std::vector<K> kinds;
    for (const bool second : {false, false, false, true, true, false}) {
      pool.mark_step_begin();
      auto out = must(layer({filled({4}, 1), second ? w2 : w1}));
      kinds.push_back(out.kind());
      CHECK(output_values(out, 0) == repeat(second ? 5 : 2));
    }
    CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::recording, K::replay, K::replay});
    CHECK(pool.stats().warmups == 1);
  }
  SECTION("shapes past shape_key_limit run eagerly, and do not count as warmed up") {
    auto pool = make_pool({.shape_key_limit = 1});
    auto layer = forward(pool, "forward", {.mode = FunctionMode::inference, .warm_up_each_shape = false});
    const Buffer w = filled({1}, 2);
    std::vector<K> kinds;
    for (const std::int64_t size : {4, 8, 4, 8, 4}) {
      pool.mark_step_begin();
      auto out = must(layer({filled({size}, 1), w}));
      kinds.push_back(out.kind());
      CHECK(output_values(out, 0) == repeat(2, static_cast<std::size_t>(size)));
    }
    CHECK(kinds == std::vector{K::warmup, K::eager, K::recording, K::eager, K::replay});
    CHECK(pool.stats().count(cgt::Reason::shape_key_limit) == 2);
  }
  SECTION("a forward's new shape records under a pending backward, and replays on later steps") {
    auto pool = make_pool();
    auto layer = forward(pool, "forward", {.warm_up_each_shape = false});
    auto grad = backward(pool, "backward");
    const Buffer w = filled({1}, 2);
    std::vector<K> last;
    for (int step = 0; step < 4; ++step) {
      for (const std::int64_t size : {4, 8}) {
        auto out = must(layer({filled({size}, step), w}));
        const auto count = static_cast<std::size_t>(size);
        auto grads = must(grad({filled({size}, 1), must(out.release(1)), w}));
        INFO("step " << step << ", size " << size);
        CHECK(output_values(out, 0) == repeat(2.0 * step, count));
        CHECK(output_values(grads, 1) == repeat(step, count));
        if (step == 3) last.push_back(out.kind());
      }
    }
    CHECK(last == std::vector{K::replay, K::replay});
    must(pool.check_memory());
  }
}

TEST_CASE("a forward call refused for its arguments begins no step: held outputs stay valid", "[training][host]") {
  auto pool = make_pool();
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer w = filled({4}, 2);
  for (int step = 0; step < 3; ++step) {
    auto out = must(layer({filled({4}, step), w}));
    auto grads = must(grad({filled({4}, 1), must(out.release(1)), w}));
    // No backward is pending: a forward would begin a new step. These calls are refused instead.
    const auto steps = pool.stats().steps_begun_by_forward;
    CHECK(layer({filled({4}, 1)}).error().code == cgt::Errc::wrong_input_count);
    CHECK(layer({filled({4, 1}, 1), w}).error().code == cgt::Errc::wrong_shape);
    cgt::host::OutputLease empty;
    CHECK(layer({empty, w}).error().code == cgt::Errc::invalid_argument);
    INFO("step " << step);
    CHECK(pool.stats().steps_begun_by_forward == steps);
    CHECK(output_values(out, 0) == repeat(2.0 * step));
    CHECK(output_values(grads, 1) == repeat(step));
    // A call that is not refused begins the step, and the error names what began it.
    auto next = must(layer({filled({4}, 1), w}));
    auto stale = out.get(0);
    REQUIRE_FALSE(stale.has_value());
    CHECK(stale.error().code == cgt::Errc::output_overwritten);
    CHECK(stale.error().message.find("a forward function was called") != std::string::npos);
    CHECK(stale.error().message.find("mark_step_begin was called") == std::string::npos);
  }
  must(pool.check_memory());
}
