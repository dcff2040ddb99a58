// The replay path's shortcuts (docs/performance.md, "The engine's bookkeeping"), attacked: the
// lease arrays a call's outputs live in, kept per thread, across threads and thread exits; and the
// child search's shortcut for a node that nothing can keep from replaying, which must not skip the
// checks of a node that has any. ASan and TSan run these in CI (`scripts/test.sh`).
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.host;

#include "scenario/scenarios.hpp"
#include "host/harness.hpp"
#include "host/values.hpp"

using cgt::CallKind;
using cgt::host::Buffer;
using cgt::host::Context;
using cgt::host::Inputs;
using cgt::host::Values;
using host_test::output_values;
using host_test::poisoned_pool;
using host_test::repeat;
using host_test::scaling;
using scenario::must;

TEST_CASE(
    "a replay's outputs dropped on another thread, or held by a thread_local past its thread's exit, "
    "keep their values and free their memory once",
    "[replay-path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = scaling(pool, "f", 2);
  const Buffer x = filled({4}, 1.5);
  for (int i = 0; i < 3; ++i) (void)must(f({x}));  // warmed up and recorded: every later call replays

  std::vector<cgt::host::Outputs> handed_over;
  std::vector<double> read_at_exit;
  std::thread caller([&] {
    // Made before this thread drops any lease array: destroyed after the thread's kept lease
    // blocks are freed, so its array is freed at once rather than kept.
    thread_local std::optional<cgt::host::Outputs> held;
    held.emplace(must(f({x})));
    read_at_exit = output_values(*held, 0);
    for (int i = 0; i < 6; ++i) {  // with outputs held, the calls go down the path: they record, then replay
      auto out = must(f({x}));
      CHECK(output_values(out, 0) == repeat(3.0));
      if (i % 2 == 0) handed_over.push_back(std::move(out));  // dropped by the main thread below
    }  // the others drop here: their arrays are kept for this thread's next call, freed at its exit
    held.reset();
    held.emplace(must(f({x})));  // still live when the thread exits
  });
  caller.join();
  CHECK(read_at_exit == repeat(3.0));
  for (const auto& out : handed_over) CHECK(output_values(out, 0) == repeat(3.0));
  handed_over.clear();  // arrays allocated on the other thread, freed (or kept) on this one
  auto again = must(f({x}));
  CHECK(again.kind() == CallKind::replay);
  CHECK(output_values(again, 0) == repeat(3.0));
  CHECK(pool.check_memory().has_value());
}

TEST_CASE(
    "the child search's shortcut leaves a node with a static input to the full check: a moved static "
    "input is still refused",
    "[replay-path][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .on_static_input_moved = cgt::OnStaticInputMoved::error});
  auto f = scaling(pool, "f", 2, {.static_inputs = {0}});
  const Buffer x = filled({4}, 1.5);
  const Buffer moved = filled({4}, 1.5);
  CHECK(must(f({x})).kind() == CallKind::recording);
  CHECK(must(f({x})).kind() == CallKind::replay);
  auto refused = f({moved});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == cgt::Errc::static_input_moved);
  CHECK(must(f({x})).kind() == CallKind::replay);  // the pool is as it was
}

TEST_CASE(
    "the child search's shortcut leaves a node that reads an earlier graph's output to the full check: "
    "that output at a new address records a new node",
    "[replay-path][host]") {
  auto pool = poisoned_pool({.skip_warmup = true});
  auto f = scaling(pool, "f", 2);
  auto g = scaling(pool, "g", 3);
  const Buffer x = filled({4}, 1);
  {
    auto a = must(f({x}));
    auto b = must(g({*a.get(0)}));  // reads f's output in place
    CHECK(b.kind() == CallKind::recording);
    CHECK(output_values(b, 0) == repeat(6.0));
  }
  {
    auto a = must(f({x}));
    auto b = must(g({*a.get(0)}));
    CHECK(b.kind() == CallKind::replay);  // the same address: the node under f fits
    CHECK(output_values(b, 0) == repeat(6.0));
  }
  {
    auto a = must(f({x}));
    const Buffer copy = must(a.take(0));  // f's value, not at the address g was recorded with
    auto b = must(g({copy}));
    CHECK(b.kind() != CallKind::replay);
    CHECK(output_values(b, 0) == repeat(6.0));
  }
}
