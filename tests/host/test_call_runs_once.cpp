// A call runs its function's work once, on every path: a warm-up, a recording (its graph's first
// run), a replay, every eager fallback, a recording given up before or after its graph ran, a
// call of another pool from inside the function, on its thread or a helper's. Each function here
// counts its runs twice: `bodies` (the C++ body: it runs under capture too, where the kernels only
// get recorded) and `kernels` (a kernel: the work a replay repeats). A call must add exactly one
// to `kernels`, and one to `bodies` unless it replays (none) or is a recording given up before its
// graph ran (the body ran under a capture that ran nothing, then runs once more eagerly).
#include "host/host_test.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

struct Runs {
  std::atomic<int> bodies{0};
  std::atomic<int> kernels{0};
};

// y = x + 1 in a kernel that counts itself.
cgt::host::Function counted_plus_one(cgt::host::Pool& pool, Runs& runs, cgt::FunctionOptions options) {
  return must(pool.add_function(
      [&runs](Context& ctx, Inputs in) {
        ++runs.bodies;
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, &runs] {
          ++runs.kernels;
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      std::move(options)));
}

// y = 2 * what `inner_value(x)` gives, in a kernel that counts itself: a function whose work
// depends on another pool's call.
cgt::host::Function doubling_inner(cgt::host::Pool& pool, Runs& runs,
                                   std::function<Buffer(const Buffer&)> inner_value) {
  return must(pool.add_function(
      [&runs, inner_value = std::move(inner_value)](Context& ctx, Inputs in) {
        ++runs.bodies;
        const Buffer code = inner_value(in[0]);
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([code, y, &runs] {
          ++runs.kernels;
          for (std::size_t i = 0; i < code.numel(); ++i) y.set(i, code.get(i) * 2);
        });
        return Values{y};
      },
      {.name = "outer"}));
}

}  // namespace

TEST_CASE("a write to a copied input seen after the graph's first run: every effect of the call happens once",
          "[host][runs-once][writes]") {
  // The host sees writes by comparing bytes, so only after the graph ran. Its kernel writes a
  // caller's buffer (read through a slot), a static buffer in place, and a counter: before the
  // fix, the recording was given up, only the caller's buffer put back, and the call run again
  // eagerly, so the static buffer and the counter moved twice.
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  Runs runs;
  auto f = must(pool.add_function(
      [&runs](Context& ctx, Inputs in) {
        ++runs.bodies;
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], total = in[1], y, &runs] {
          ++runs.kernels;
          for (std::size_t i = 0; i < x.numel(); ++i) {
            x.set(i, x.get(i) + 1);          // the caller's buffer: a slot in the graph
            total.set(i, total.get(i) + 1);  // static: written in place
            y.set(i, x.get(i) * 10);
          }
        });
        return Values{y};
      },
      {.name = "bump", .static_inputs = {1}}));
  const Buffer x = filled({4}, 1);
  const Buffer total = filled({4}, 0);
  {
    auto out = must(f({x, total}));
    CHECK(out.kind() == K::warmup);  // the graph ran once for this call and is not kept
    CHECK(runs.kernels == 1);
    CHECK(runs.bodies == 1);
    CHECK(values_of(x) == repeat(2));
    CHECK(values_of(total) == repeat(1));
    CHECK(output_values(out, 0) == repeat(20));
  }
  CHECK(pool.stats().recordings_not_kept == 1);
  CHECK(pool.stats().eager_calls == 0);
  // Input 0 now counts as mutated, and is a caller's buffer: the next calls run eagerly, once each.
  for (int call = 2; call <= 3; ++call) {
    auto out = must(f({x, total}));
    CHECK(out.kind() == K::eager);
    CHECK(runs.kernels == call);
    CHECK(values_of(x) == repeat(1 + call));
    CHECK(values_of(total) == repeat(call));
  }
  CHECK(pool.check_memory());
}

TEST_CASE("every eager fallback runs the function once", "[host][runs-once]") {
  std::vector<cgt::Reason> logged;
  cgt::Options options{.shape_key_limit = 2};
  options.log_sink = [&logged](const cgt::Event& event) { logged.push_back(event.reason); };
  auto pool = poisoned_pool(std::move(options));
  Runs runs;
  auto sized = counted_plus_one(pool, runs, {.name = "sized", .graph_sizes = {4}});
  auto bucketed =
      counted_plus_one(pool, runs, {.name = "bucketed", .buckets = {.sizes = {4}, .pad = cgt::Pad::constant(0)}});
  auto keyed = counted_plus_one(pool, runs, {.name = "keyed"});
  int expected = 0;
  const auto once = [&](const cgt::host::Function& f, const Buffer& x, K kind) {
    auto out = must(f({x}));
    ++expected;
    CHECK(out.kind() == kind);
    CHECK(runs.kernels == expected);
    std::vector<double> plus_one = values_of(x);
    for (double& v : plus_one) v += 1;
    CHECK(output_values(out, 0) == plus_one);
  };
  once(sized, filled({3}, 1), K::eager);     // size_not_graphed
  once(bucketed, filled({0}, 1), K::eager);  // size 0: no bucket
  once(bucketed, filled({5}, 1), K::eager);  // size_above_buckets
  once(keyed, filled({1}, 1), K::warmup);    // key 1
  once(keyed, filled({2}, 1), K::warmup);    // key 2 (warm_up_each_shape)
  once(keyed, filled({3}, 1), K::eager);     // a third key past shape_key_limit
  once(sized, filled({4}, 1), K::warmup);    // a graphed size: warm-up, recording, replay
  once(sized, filled({4}, 2), K::recording);
  once(sized, filled({4}, 3), K::replay);
  CHECK(runs.bodies == expected - 1);  // the replay ran no body
}

TEST_CASE("a capture that breaks after the warm-up: the call runs once eagerly, its kernels once",
          "[host][runs-once]") {
  auto pool = poisoned_pool({.log_sink = [](const cgt::Event&) {}});
  Runs runs;
  auto f = must(pool.add_function(
      [&runs](Context& ctx, Inputs in) {
        ++runs.bodies;
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, &runs] {
          ++runs.kernels;
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        ctx.synchronize();  // breaks a capture (after the kernel was recorded)
        return Values{y};
      },
      {.name = "syncing"}));
  CHECK(must(f({filled({4}, 1)})).kind() == K::warmup);
  CHECK(runs.kernels == 1);
  auto out = must(f({filled({4}, 2)}));
  CHECK(out.kind() == K::eager);
  CHECK(output_values(out, 0) == repeat(3));
  CHECK(runs.kernels == 2);  // the broken capture ran nothing; the eager run ran it once
  CHECK(runs.bodies == 3);   // the body ran under the capture, and again eagerly
  CHECK(must(f({filled({4}, 3)})).kind() == K::eager);
  CHECK(runs.kernels == 3);
  CHECK(runs.bodies == 4);
}

TEST_CASE("a call of another pool refused on the recording's thread: each pool's work once per call",
          "[host][runs-once][nested]") {
  auto inner_pool = poisoned_pool({});
  auto outer_pool = poisoned_pool({.log_sink = [](const cgt::Event&) {}});
  Runs inner_runs;
  Runs outer_runs;
  auto inner = counted_plus_one(inner_pool, inner_runs, {.name = "inner"});
  auto outer = doubling_inner(outer_pool, outer_runs, [&](const Buffer& x) {
    auto got = inner({x});
    return got ? must(got->take(0)) : x;  // swallows a refusal: its own kernel still runs
  });
  for (int call = 1; call <= 4; ++call) {
    auto out = must(outer({filled({4}, call)}));
    CHECK(output_values(out, 0) == repeat(2.0 * (call + 1)));
    CHECK(outer_runs.kernels == call);  // the refused recording was given up before its graph ran
    CHECK(inner_runs.kernels == call);  // refused while recording, then run in the eager call
  }
  CHECK(outer_pool.stats().count(cgt::Reason::nested_pool) == 3);
}

TEST_CASE("a call of another pool on a helper thread during a recording: the graph runs once and is not kept",
          "[host][runs-once][nested][threads]") {
  // The capture cannot see the helper thread's call. Before the fix, the outer graph was kept with
  // the inner call's one result baked in, and every replay returned the recording's values.
  auto inner_pool = poisoned_pool({.wait_for_other_captures = std::chrono::milliseconds(50)});
  auto outer_pool = poisoned_pool({.debug_checks = true, .log_sink = [](const cgt::Event&) {}});
  Runs inner_runs;
  Runs outer_runs;
  auto inner = counted_plus_one(inner_pool, inner_runs, {.name = "inner"});
  auto outer = doubling_inner(outer_pool, outer_runs, [&](const Buffer& x) {
    Buffer code;
    std::thread helper([&] { code = must(must(inner({x})).take(0)); });  // waits at the gate, then runs
    helper.join();
    return code;
  });
  std::vector<K> kinds;
  for (int call = 1; call <= 4; ++call) {
    auto out = must(outer({filled({4}, call)}));
    kinds.push_back(out.kind());
    CHECK(output_values(out, 0) == repeat(2.0 * (call + 1)));  // the recording's values only at call 2
    CHECK(outer_runs.kernels == call);
    CHECK(inner_runs.kernels == call);
  }
  // Warm-up; the recording the helper's call overlapped runs once, as a warm-up; eager from then on.
  CHECK(kinds == std::vector{K::warmup, K::warmup, K::eager, K::eager});
  CHECK(outer_pool.stats().recordings_not_kept == 1);
  CHECK(outer_pool.stats().recordings == 0);
  CHECK(outer_pool.stats().count(cgt::Reason::nested_pool) == 2);
}

TEST_CASE("another thread's pool, called while a pool records, waits for the capture; both keep their graphs",
          "[host][runs-once][threads]") {
  auto recording_pool = poisoned_pool({});
  auto busy_pool = poisoned_pool({});
  Runs busy_runs;
  auto busy = counted_plus_one(busy_pool, busy_runs, {.name = "busy"});
  std::atomic<bool> capturing{false};
  std::atomic<bool> busy_called{false};
  auto slow = must(recording_pool.add_function(
      [&](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * 3);
        });
        if (ctx.is_capturing()) {
          capturing = true;
          // The other thread's call starts now and must wait for this capture to end.
          std::this_thread::sleep_for(std::chrono::milliseconds(30));
          CHECK_FALSE(busy_called.load());
        }
        return Values{y};
      },
      {.name = "slow"}));
  (void)must(slow({filled({4}, 1)}));  // warm-up
  std::thread other([&] {
    while (!capturing) std::this_thread::yield();
    auto out = must(busy({filled({4}, 1)}));
    busy_called = true;
    CHECK(output_values(out, 0) == repeat(2));
  });
  CHECK(must(slow({filled({4}, 2)})).kind() == K::recording);
  other.join();
  CHECK(busy_called);
  auto again = must(slow({filled({4}, 5)}));
  CHECK(again.kind() == K::replay);  // independent: the recording was kept
  CHECK(output_values(again, 0) == repeat(15));
  CHECK(recording_pool.stats().recordings_not_kept == 0);
}
