// A call that fails changes nothing the caller holds, also when it would have begun a new step:
// the outputs of the last step stay valid until a call of the new step succeeds. (A forward's
// call begins a step by itself; `mark_step_begin()` begins one at the next call; both used to
// reclaim the last step before the call's checks and work, so a refused or throwing call left
// every held output `output_overwritten`.)
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.host;

#include "scenario/scenarios.hpp"
#include "host/harness.hpp"
#include "host/values.hpp"

using cgt::FunctionMode;
using cgt::host::Buffer;
using cgt::host::Context;
using cgt::host::Inputs;
using cgt::host::Values;
using host_test::output_values;
using host_test::poisoned_pool;
using host_test::repeat;
using scenario::must;

namespace {

/// y = 2x as a forward (or inference) function that throws while `*fail` is set.
cgt::host::Function doubling(cgt::host::Pool& pool, const std::string& name, const bool* fail,
                             FunctionMode mode = FunctionMode::forward, cgt::Buckets buckets = {}) {
  return must(pool.add_function(
      [fail](Context& ctx, Inputs in) {
        if (*fail) throw std::runtime_error("injected failure");
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = name, .buckets = std::move(buckets), .mode = mode}));
}

/// The lease still reads `value` everywhere, and the pool's memory matches its leases.
void check_still_valid(const cgt::host::Outputs& out, double value, cgt::host::Pool& pool) {
  CHECK(output_values(out, 0) == repeat(value));
  CHECK(pool.check_memory().has_value());
}

/// Runs a backward: the forward's step is done, so the next forward's call begins a new one.
void run_backward(const cgt::host::Function& backward) {
  (void)must(backward({filled({4}, 1)}));
}

void check_reclaimed(const cgt::host::Outputs& out) {
  auto stale = out.get(0);
  REQUIRE_FALSE(stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
}

}  // namespace

TEST_CASE("a forward that throws while warming up leaves the last step's outputs valid", "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  auto g = doubling(pool, "g", &fail);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  auto held = must(f({filled({4}, 1)}));  // step 1: a warm-up
  run_backward(b);
  fail = true;
  auto failed = g({filled({4}, 5)});  // would begin step 2, warming g up
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == cgt::Errc::function_failed);
  check_still_valid(held, 2, pool);
  CHECK(pool.stats().steps_begun_by_forward == 0);
  CHECK(pool.stats().leases_invalidated == 0);
  fail = false;
  auto next = must(g({filled({4}, 5)}));  // now step 2 begins
  check_reclaimed(held);
  CHECK(output_values(next, 0) == repeat(10));
  CHECK(pool.stats().steps_begun_by_forward == 1);
}

TEST_CASE("a forward that throws while recording after a replayed step leaves that step's outputs valid",
          "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  auto g = doubling(pool, "g", &fail);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  for (int step = 0; step < 3; ++step) {  // f and b: warm-up, recording, replay
    (void)must(f({filled({4}, 1)}));
    run_backward(b);
  }
  (void)must(g({filled({4}, 1)}));  // g warmed up (its own step)
  run_backward(b);
  auto held = must(f({filled({4}, 3)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  run_backward(b);
  fail = true;
  auto failed = g({filled({4}, 5)});  // a new step; g records as a root, over memory f's graph wrote
  REQUIRE_FALSE(failed);
  check_still_valid(held, 6, pool);
  fail = false;
  auto next = must(g({filled({4}, 5)}));
  CHECK(next.kind() == cgt::CallKind::recording);
  CHECK(output_values(next, 0) == repeat(10));
  check_reclaimed(held);
  // The tree is as it would be without the failure: f replays on.
  run_backward(b);
  auto again = must(f({filled({4}, 4)}));
  CHECK(again.kind() == cgt::CallKind::replay);
  CHECK(output_values(again, 0) == repeat(8));
}

TEST_CASE("a forward refused for its pad value leaves the last step's outputs valid", "[failures][host][buckets]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  cgt::Buckets buckets{.sizes = {8}, .pad = cgt::Pad::constant(std::numeric_limits<double>::quiet_NaN())};
  auto padded = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      {.name = "padded", .buckets = std::move(buckets), .mode = FunctionMode::forward}));
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  auto held = must(f({filled({4}, 1)}));
  run_backward(b);
  const Buffer ints = Buffer::make(cgt::ElementType::i32, {4}).value();
  auto refused = padded({ints});  // NaN is no i32: refused when padding, after the step began
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  check_still_valid(held, 2, pool);
  CHECK(pool.stats().steps_begun_by_forward == 0);
}

TEST_CASE("a held output passed to the forward that begins the next step is refused, and stays valid",
          "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  auto held = must(f({filled({4}, 1)}));
  run_backward(b);
  auto refused = f({must(held.get(0)).get()});  // its memory is what the new step reclaims
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::output_overwritten);
  CHECK(refused.error().input == 0);
  CHECK(refused.error().message.find("take()") != std::string::npos);
  check_still_valid(held, 2, pool);
}

TEST_CASE("after mark_step_begin, a call that throws leaves the last step's outputs valid", "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail, FunctionMode::inference);
  for (int step = 0; step < 2; ++step) {
    pool.mark_step_begin();
    (void)must(f({filled({4}, 1)}));
  }
  pool.mark_step_begin();
  auto held = must(f({filled({4}, 7)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  auto g = doubling(pool, "g", &fail, FunctionMode::inference);
  pool.mark_step_begin();
  fail = true;
  REQUIRE_FALSE(g({filled({4}, 5)}));  // g warms up over the memory f's graph wrote: it fails first
  check_still_valid(held, 14, pool);
  fail = false;
  auto next = must(g({filled({4}, 5)}));
  check_reclaimed(held);
  CHECK(output_values(next, 0) == repeat(10));
}
