// Re-entrancy: user code the pool runs while it is in a call (a pool function, a kernel it
// launches, the log sink) calling back into the same pool. What would change the pool fails with
// `concurrent_use`; what reads it answers; nothing deadlocks, crashes or corrupts a value.
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

double first_of(const cgt::host::Outputs& out) {
  return must(out.get(0)).get().get(0);
}

// What code running inside a call of `pool` got back when it called into the same pool.
struct Probe {
  int runs = 0;
  std::optional<cgt::Errc> call_self, call_other, shutdown, add_function, check_memory;
  std::uint64_t calls_seen = 0;
  std::size_t roots_seen = 0;
  std::string dot;

  // Tries everything a careless callback could, on `pool`, from inside one of its calls.
  void poke(cgt::host::Pool& pool, const cgt::host::Function* self, const cgt::host::Function* other) {
    ++runs;
    const Buffer x = filled({2}, 1);
    if (self != nullptr) {
      auto again = (*self)({x});
      call_self = again ? std::nullopt : std::optional(again.error().code);
    }
    if (other != nullptr) {
      auto nested = (*other)({x});
      call_other = nested ? std::nullopt : std::optional(nested.error().code);
    }
    auto shut = pool.shutdown();
    shutdown = shut ? std::nullopt : std::optional(shut.error().code);
    auto added = pool.add_function([](Context&, Inputs in) { return Values{in[0]}; });
    add_function = added ? std::nullopt : std::optional(added.error().code);
    auto checked = pool.check_memory();
    check_memory = checked ? std::nullopt : std::optional(checked.error().code);
    calls_seen = pool.stats().calls;
    roots_seen = pool.roots().size();
    dot = pool.to_dot();
    (void)pool.memory();
    (void)pool.live_blocks();
    (void)pool.current_path();
    (void)pool.has_pending_backward();
    (void)pool.is_shut_down();
  }

  void check_refused(bool called_self = true) const {
    if (called_self) CHECK(call_self == cgt::Errc::concurrent_use);
    CHECK(call_other == cgt::Errc::concurrent_use);
    CHECK(shutdown == cgt::Errc::concurrent_use);
    CHECK(add_function == cgt::Errc::concurrent_use);
    // The pool is halfway through the call: its memory cannot be checked against its leases now.
    CHECK(check_memory == cgt::Errc::concurrent_use);
    CHECK(dot.starts_with("digraph cgt"));
  }
};

// y = x + 1, allocating in the pool.
cgt::host::Function plus_one(cgt::host::Pool& pool, std::string name, std::vector<std::int64_t> graph_sizes = {}) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      {.name = std::move(name), .graph_sizes = std::move(graph_sizes)}));
}

}  // namespace

TEST_CASE("a pool function calling into its own pool: changes are concurrent_use, reads answer", "[reentrancy][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto other = plus_one(pool, "other");
  Probe probe;
  std::optional<cgt::host::Function> self;
  self = must(pool.add_function(
      [&](Context& ctx, Inputs in) {
        // Its output is allocated, and no lease holds it yet: the pool is halfway through the call.
        Buffer y = ctx.allocate_like(in[0]);
        probe.poke(pool, &*self, &other);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * 3);
        });
        return Values{y};
      },
      {.name = "self"}));
  const cgt::CallKind kinds[] = {cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay};
  for (const cgt::CallKind kind : kinds) {
    pool.mark_step_begin();
    auto out = must((*self)({filled({2}, 2)}));
    CHECK(out.kind() == kind);
    CHECK(first_of(out) == 6);
  }
  CHECK(probe.runs == 2);  // the warm-up and the recording ran the function; the replay did not
  probe.check_refused();
  CHECK(probe.calls_seen == 2);  // the call in flight counts
  must(pool.check_memory());
  CHECK(!pool.is_shut_down());
}

TEST_CASE("an eager call's function calling into its own pool", "[reentrancy][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  Probe probe;
  std::optional<cgt::host::Function> self;
  self = must(pool.add_function(
      [&](Context& ctx, Inputs in) {
        probe.poke(pool, &*self, nullptr);
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] { y.set(0, x.get(0) + 5); });
        return Values{y};
      },
      {.name = "eager", .graph_sizes = {99}}));
  auto out = must((*self)({filled({2}, 1)}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(first_of(out) == 6);
  CHECK(probe.call_self == cgt::Errc::concurrent_use);
  CHECK(probe.shutdown == cgt::Errc::concurrent_use);
  CHECK(probe.check_memory == cgt::Errc::concurrent_use);
}

TEST_CASE("a kernel calling into its own pool during a replay", "[reentrancy][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto other = plus_one(pool, "other");
  auto probe = std::make_shared<Probe>();
  cgt::host::Pool* pool_ptr = &pool;
  auto f = must(pool.add_function(
      [probe, pool_ptr, &other](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([probe, pool_ptr, &other, x = in[0], y] {
          probe->poke(*pool_ptr, nullptr, &other);
          y.set(0, x.get(0) * 2);
        });
        return Values{y};
      },
      {.name = "f"}));
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    auto out = must(f({filled({1}, 4)}));
    CHECK(first_of(out) == 8);
  }
  CHECK(probe->runs == 3);  // warm-up, the recording's first replay, the replay
  probe->check_refused(false);
  CHECK(pool.stats().replays == 1);
}

TEST_CASE("a log sink calling into the pool", "[reentrancy][host]") {
  struct Shared {
    std::optional<cgt::host::Pool> pool;
    std::optional<cgt::host::Function> f;
    Probe probe;
    std::vector<cgt::Reason> reasons;
  };
  auto shared = std::make_shared<Shared>();
  const std::weak_ptr<Shared> weak = shared;
  shared->pool = poisoned_pool({.debug_checks = true, .log_sink = [weak](const cgt::Event& event) {
                                  auto s = weak.lock();
                                  if (!s || !s->pool) return;
                                  s->reasons.push_back(event.reason);
                                  s->probe.poke(*s->pool, s->f ? &*s->f : nullptr, nullptr);
                                  s->pool->mark_step_begin();
                                }});
  shared->f = plus_one(*shared->pool, "f", {2});
  auto out = must((*shared->f)({filled({3}, 1)}));  // size 3 is not graphed: logged, eager
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(first_of(out) == 2);
  REQUIRE(shared->reasons == std::vector{cgt::Reason::size_not_graphed});
  CHECK(shared->probe.call_self == cgt::Errc::concurrent_use);
  CHECK(shared->probe.shutdown == cgt::Errc::concurrent_use);
  CHECK(shared->probe.add_function == cgt::Errc::concurrent_use);
  CHECK(shared->probe.check_memory == cgt::Errc::concurrent_use);
  CHECK(shared->probe.calls_seen == 1);
  // The sink's mark_step_begin belongs to the next call: this call's output is intact until then.
  CHECK(first_of(out) == 2);
  (void)must((*shared->f)({filled({2}, 1)}));  // the new step reclaims nothing graphed: out is eager
  CHECK(first_of(out) == 2);
}

TEST_CASE("a log sink that drops the pool's last handles while the pool logs", "[reentrancy][host]") {
  struct Shared {
    std::optional<cgt::host::Pool> pool;
    std::optional<cgt::host::Function> f;
  };
  auto shared = std::make_shared<Shared>();
  const std::weak_ptr<Shared> weak = shared;
  shared->pool = poisoned_pool({.log_sink = [weak](const cgt::Event&) {
    if (auto s = weak.lock()) {
      s->pool.reset();
      s->f.reset();
    }
  }});
  shared->f = plus_one(*shared->pool, "f", {2});
  cgt::host::Function f = std::move(*shared->f);
  auto out = must(f({filled({3}, 1)}));  // logged: the sink drops the pool handle
  CHECK(!shared->pool);
  CHECK(first_of(out) == 2);
  {
    const cgt::host::Function last = std::move(f);
  }
  CHECK(first_of(out) == 2);  // the lease keeps the engine
}

TEST_CASE("a log sink reading the tree while a capture fails", "[reentrancy][host]") {
  std::vector<std::string> dots;
  std::vector<std::size_t> roots_seen;
  cgt::host::Pool* self = nullptr;
  auto pool = poisoned_pool({.debug_checks = true, .log_sink = [&](const cgt::Event& event) {
                               if (event.reason != cgt::Reason::capture_failed || self == nullptr) return;
                               dots.push_back(self->to_dot());
                               roots_seen.push_back(self->roots().size());
                               for (const cgt::Node& root : self->roots()) (void)root.children();
                             }});
  self = &pool;
  auto f = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] { y.set(0, x.get(0) + 1); });
        ctx.synchronize();  // breaks the capture
        return Values{y};
      },
      {.name = "syncs"}));
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    auto out = must(f({filled({1}, 1)}));
    CHECK(first_of(out) == 2);
  }
  REQUIRE(dots.size() == 1);
  CHECK(roots_seen == std::vector<std::size_t>{0});
}

TEST_CASE("a function that drops its lease argument, then fails its capture, runs again on that argument",
          "[reentrancy][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto make = plus_one(pool, "make", {99});  // eager: its outputs are owned by their leases alone
  std::optional<cgt::host::OutputLease> held;
  int runs = 0;
  auto g = must(pool.add_function(
      [&](Context& ctx, Inputs in) {
        ++runs;
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] { y.set(0, x.get(0) * 10); });
        if (ctx.is_capturing()) {
          held->reset();      // the caller's lease goes mid-call...
          ctx.synchronize();  // ...and the capture fails: the call runs the function again
        }
        return Values{y};
      },
      {.name = "g"}));
  (void)must(g({filled({1}, 1)}));  // the warm-up
  pool.mark_step_begin();
  auto made = must(make({filled({1}, 2)}));
  held = must(made.release(0));
  auto out = must(g({*held}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(first_of(out) == 30);
  CHECK(runs == 3);
}

TEST_CASE("a log sink that drops a lease the call borrows, before the function runs", "[reentrancy][host]") {
  std::optional<cgt::host::OutputLease> held;
  auto pool = poisoned_pool({.log_sink = [&held](const cgt::Event&) {
    if (held) held->reset();  // the argument's claim goes before the eager run reads it
  }});
  auto make = plus_one(pool, "make", {99});  // eager: its outputs are owned by their leases alone
  auto g = plus_one(pool, "g", {99});
  auto made = must(make({filled({1}, 2)}));
  held = must(made.release(0));
  auto out = must(g({*held}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(first_of(out) == 4);
  CHECK(!held->is_valid());
}
