// The path's contract (src/core/path.cppm), through what a program sees: the current path, node
// views, leases and stats. Path is module-internal, so these tests drive it through a host pool.
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

using cgt::FunctionMode;
namespace {

/// y = 2x, throwing while `*fail` is set (null: never).
cgt::host::Function doubling(cgt::host::Pool& pool, const std::string& name, FunctionMode mode,
                             const bool* fail = nullptr) {
  return must(pool.add_function(
      [fail](Context& ctx, Inputs in) {
        if (fail != nullptr && *fail) throw std::runtime_error("injected failure");
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = name, .mode = mode}));
}

std::vector<std::int64_t> path_ids(const cgt::host::Pool& pool) {
  std::vector<std::int64_t> ids;
  for (const cgt::Node& node : pool.current_path()) ids.push_back(node.id());
  return ids;
}

std::uintptr_t storage_of(const cgt::host::Outputs& out) {
  return HostHarness::storage_of(must(out.get(0)).get());
}

}  // namespace

TEST_CASE("a call that began a new step and failed puts the path back: its nodes, warm-up nodes and leases",
          "[path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", FunctionMode::forward);
  auto b = doubling(pool, "b", FunctionMode::backward);
  auto g = doubling(pool, "g", FunctionMode::forward, &fail);
  auto held = must(f({filled({4}, 1)}));  // warm-up node -1
  (void)must(b({filled({4}, 1)}));        // warm-up node -2, after it: the next forward begins a step
  REQUIRE(path_ids(pool) == std::vector<std::int64_t>{-1, -2});
  const cgt::Node warmed = std::move(pool.current_path()[0]);

  fail = true;
  REQUIRE_FALSE(g({filled({4}, 5)}));  // the step it began ended the path, then it failed
  CHECK(path_ids(pool) == std::vector<std::int64_t>{-1, -2});
  CHECK(warmed.exists());
  CHECK(warmed.live_outputs() == 1);
  CHECK(output_values(held, 0) == repeat(2));
  CHECK(pool.stats().steps_reclaimed == 0);
  CHECK(pool.check_memory().has_value());

  fail = false;  // the path put back is a path like any other: the call goes on down it
  auto next = must(g({filled({4}, 5)}));
  CHECK(output_values(next, 0) == repeat(10));
  CHECK(pool.stats().steps_reclaimed == 1);
  CHECK_FALSE(held.get(0));
}

TEST_CASE("warm-up nodes live only while their path does", "[path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto out = must(f({filled({4}, 1)}));
  REQUIRE(path_ids(pool) == std::vector<std::int64_t>{-1});
  const cgt::Node warmed = std::move(pool.current_path()[0]);
  CHECK(warmed.exists());
  CHECK(warmed.kind() == cgt::NodeKind::warmup);

  pool.mark_step_begin();
  out = must(f({filled({4}, 1)}));  // the new step ends the path: f records as a root
  CHECK(out.kind() == cgt::CallKind::recording);
  CHECK(path_ids(pool) == std::vector<std::int64_t>{0});
  CHECK_FALSE(warmed.exists());
  CHECK(pool.to_dot().find("nw1") == std::string::npos);
}

TEST_CASE("a warming-up path whose outputs died ends with its warm-up nodes", "[path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto g = doubling(pool, "g", FunctionMode::inference);
  (void)must(f({filled({4}, 1)}));  // its output dropped at once
  REQUIRE(path_ids(pool) == std::vector<std::int64_t>{-1});
  const cgt::Node warmed = std::move(pool.current_path()[0]);
  (void)must(g({filled({4}, 1)}));  // the path is over: g warms up as a root
  CHECK(path_ids(pool) == std::vector<std::int64_t>{-2});
  CHECK(pool.current_path()[0].depth() == 0);
  CHECK_FALSE(warmed.exists());
}

TEST_CASE("the memory of a path a new step ended is released only once the call's work may reuse it", "[path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto held = must(f({filled({4}, 1)}));
  const std::uintptr_t held_memory = storage_of(held);

  // Seen from inside g's warm-up: the held lease reads as reclaimed already, but its memory is
  // not released yet, so the warm-up allocates around it.
  std::uint64_t reclaimed_inside = 99;
  bool held_readable_inside = true;
  auto g = must(pool.add_function(
      [&](Context& ctx, Inputs in) {
        reclaimed_inside = pool.stats().steps_reclaimed;
        held_readable_inside = held.get(0).has_value();
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 3 * x.get(i));
        });
        return Values{y};
      },
      {.name = "g", .mode = FunctionMode::inference}));
  pool.mark_step_begin();
  auto next = must(g({filled({4}, 1)}));
  CHECK(next.kind() == cgt::CallKind::warmup);
  CHECK(reclaimed_inside == 0);
  CHECK_FALSE(held_readable_inside);
  CHECK(storage_of(next) != held_memory);
  CHECK(pool.stats().steps_reclaimed == 1);  // released after the warm-up
  CHECK(pool.stats().leases_invalidated == 1);
  CHECK(pool.check_memory().has_value());
}

TEST_CASE("a replaying path ends lazily, when no child fits; a warming-up or recording path once its outputs die",
          "[path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto g = doubling(pool, "g", FunctionMode::inference);
  const Buffer x = filled({4}, 1);
  {
    auto a = must(f({x}));
    (void)must(g({x}));  // a is live: g warms up after f
  }
  REQUIRE(path_ids(pool) == std::vector<std::int64_t>{-1, -2});
  {
    // The warming-up path's outputs are dead: it ends at the call's start, and f records as a root
    // (a path still warming up would make it warm up again, after g).
    auto a = must(f({x}));
    CHECK(a.kind() == cgt::CallKind::recording);
    CHECK(path_ids(pool) == std::vector<std::int64_t>{0});
    (void)must(g({x}));  // recorded after f
    REQUIRE(path_ids(pool) == std::vector<std::int64_t>{0, 1});
  }
  (void)must(f({x}));  // a replay, its output dropped at once
  REQUIRE(path_ids(pool) == std::vector<std::int64_t>{0});
  {
    // Every output of the replaying path is dead, but it is kept: g replays as f's child.
    auto replayed = must(g({x}));
    CHECK(replayed.kind() == cgt::CallKind::replay);
    CHECK(path_ids(pool) == std::vector<std::int64_t>{0, 1});
  }
  // No child of g is f: the path ends, and f replays as the root.
  auto root = must(f({x}));
  CHECK(root.kind() == cgt::CallKind::replay);
  CHECK(path_ids(pool) == std::vector<std::int64_t>{0});
}

TEST_CASE("mark_step_begin reclaims a held output at the next call, not before", "[path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  for (int i = 0; i < 2; ++i) (void)must(f({filled({4}, 1)}));
  auto held = must(f({filled({4}, 3)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  pool.mark_step_begin();
  CHECK(output_values(held, 0) == repeat(6));  // the step begins at the next call
  auto next = must(f({filled({4}, 4)}));
  CHECK(next.kind() == cgt::CallKind::replay);
  CHECK(output_values(next, 0) == repeat(8));
  auto stale = held.get(0);
  REQUIRE_FALSE(stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
  CHECK(pool.stats().steps_reclaimed == 1);
  CHECK(pool.stats().leases_invalidated == 1);
}
