// The memory contract on the host backend: what a recording will add predicted from its warm-up,
// a budget kept by running eagerly or by evicting the coldest graphs, the memory by owner, and the
// arena's traces, holds and segments given back that these rest on.
#include "host/host_test.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

import cgt.core; // cgt::Arena, ArenaTrace, SegmentHold: the arena on its own

using cgt::Arena;

namespace {

constexpr std::size_t kSegment = 4096;

double first_of(const cgt::host::Outputs& outputs) {
  return must(outputs.get(0)).get().get(0);
}

// out = 2 * x, with temporaries of `scratch` floats per call (allocated and freed inside the call,
// in this order): what a recording allocates besides its output and slot.
auto doubler(std::vector<std::int64_t> scratch) {
  return [scratch](Context& ctx, Inputs in) {
    for (const std::int64_t n : scratch) (void)ctx.allocate(cgt::ElementType::f32, {n});
    Buffer y = ctx.allocate_like(in[0]);
    ctx.launch([x = in[0], y] {
      for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
    });
    return Values{y};
  };
}

// out = 2 * x, with a temporary of `per_element` floats per element of x: its memory grows with
// the call's size.
auto scaled_doubler(std::int64_t per_element) {
  return [per_element](Context& ctx, Inputs in) {
    (void)ctx.allocate(cgt::ElementType::f32, {per_element * in[0].sizes()[0]});
    Buffer y = ctx.allocate_like(in[0]);
    ctx.launch([x = in[0], y] {
      for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
    });
    return Values{y};
  };
}

// Calls `f` on `n` elements of `value`, a new step first, and checks the value computed.
cgt::host::Outputs step(cgt::host::Pool& pool, cgt::host::Function& f, std::int64_t n, double value) {
  pool.mark_step_begin();
  auto out = must(f({filled({n}, value)}));
  CHECK(first_of(out) == 2 * value);
  return out;
}

// A pool of 4 KiB segments that keeps `budget` by evicting the coldest graphs.
cgt::host::Pool evicting_pool(std::size_t budget, bool copy_out = false) {
  return must(cgt::host::make_pool({.tree = {.debug_checks = true,
                                             .copy_out_on_new_step = copy_out,
                                             .memory_budget_bytes = budget,
                                             .over_budget = cgt::OverBudget::evict_coldest},
                                    .arena = {.segment_bytes = kSegment}}));
}

// Warms `f` up at `n` elements, then records it: the recording's node.
cgt::Node record_at(cgt::host::Pool& pool, cgt::host::Function& f, std::int64_t n) {
  step(pool, f, n, 1);
  CHECK(step(pool, f, n, 2).kind() == K::recording);
  std::vector<cgt::Node> path = pool.current_path();
  return std::move(path.back());
}

}  // namespace

// --- the arena ------------------------------------------------------------------------------------

TEST_CASE("an arena's trace predicts, byte for byte, what the same requests add from another state",
          "[memory][arena][host]") {
  Arena arena({.segment_bytes = kSegment});
  // Something allocated first, so the replayed requests start from a fuller arena than the traced ones.
  auto kept = must(arena.allocate(3000));
  arena.start_trace();
  auto a = must(arena.allocate(1000));
  auto b = must(arena.allocate(5000));  // larger than a segment: one of its own
  must(arena.free(reinterpret_cast<std::uintptr_t>(a)));
  auto c = must(arena.allocate(2000));
  const cgt::ArenaTrace trace = arena.stop_trace();
  CHECK(trace.requests() == 4);
  CHECK(trace.peak_bytes() >= 7000);
  CHECK_FALSE(trace.segments().empty());

  for (const std::size_t first : {std::size_t{0}, std::size_t{100}, std::size_t{4000}, std::size_t{9000}}) {
    const std::vector<std::size_t> slots = first == 0 ? std::vector<std::size_t>{} : std::vector<std::size_t>{first};
    const std::size_t predicted = arena.growth_for(slots, trace);
    const std::size_t reserved = arena.memory().reserved_bytes;
    std::vector<std::byte*> made;
    for (const std::size_t bytes : slots) made.push_back(must(arena.allocate(bytes)));
    auto a2 = must(arena.allocate(1000));
    made.push_back(must(arena.allocate(5000)));
    must(arena.free(reinterpret_cast<std::uintptr_t>(a2)));
    made.push_back(must(arena.allocate(2000)));
    CHECK(arena.memory().reserved_bytes - reserved == predicted);
    for (std::byte* block : made) must(arena.free(reinterpret_cast<std::uintptr_t>(block)));
  }
  (void)b;
  (void)c;
  (void)kept;
}

TEST_CASE("a held segment is not given back; one free and held by nothing is, and its bytes leave the arena",
          "[memory][arena][host]") {
  Arena arena({.segment_bytes = kSegment});
  arena.start_trace();
  auto a = must(arena.allocate(kSegment));  // fills segment 0
  auto b = must(arena.allocate(kSegment));  // segment 1
  const cgt::ArenaTrace trace = arena.stop_trace();
  REQUIRE(trace.segments() == std::vector<std::size_t>{0, 1});
  CHECK(arena.release_unused() == 0);  // both allocated
  must(arena.free(reinterpret_cast<std::uintptr_t>(a)));
  must(arena.free(reinterpret_cast<std::uintptr_t>(b)));
  {
    const cgt::SegmentHold hold = arena.hold({1});
    CHECK(arena.release_unused() == kSegment);  // segment 0 only
    CHECK(arena.segment_count() == 1);
    CHECK(arena.memory().reserved_bytes == kSegment);
    CHECK_FALSE(arena.contains(reinterpret_cast<std::uintptr_t>(a)));
    CHECK(arena.contains(reinterpret_cast<std::uintptr_t>(b)));
  }
  CHECK(arena.release_unused() == kSegment);
  CHECK(arena.memory().reserved_bytes == 0);
  CHECK(arena.released_bytes() == 2 * kSegment);
  // The arena goes on: a new segment serves the next request.
  auto c = must(arena.allocate(100));
  CHECK(arena.contains(reinterpret_cast<std::uintptr_t>(c)));
  CHECK(arena.memory().reserved_bytes == kSegment);
}

TEST_CASE("a checkpoint taken before segments were given back restores without them", "[memory][arena][host]") {
  Arena arena({.segment_bytes = kSegment});
  auto a = must(arena.allocate(100));
  const cgt::ArenaCheckpoint checkpoint = arena.checkpoint();
  const cgt::SegmentHold hold = arena.hold(checkpoint.allocated_segments());
  auto b = must(arena.allocate(kSegment));  // a second segment
  must(arena.free(reinterpret_cast<std::uintptr_t>(b)));
  CHECK(arena.release_unused() == kSegment);  // segment 0 is held and allocated
  arena.restore(checkpoint);
  CHECK(arena.is_allocated(reinterpret_cast<std::uintptr_t>(a)));
  CHECK(arena.memory().allocated_bytes == 256);
  CHECK(arena.live_blocks().size() == 1);
}

// --- prediction -----------------------------------------------------------------------------------

TEST_CASE("a recording adds to the pool exactly what its warm-up predicted, at every shape",
          "[memory][prediction][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}, .arena = {.segment_bytes = kSegment}}));
  auto f = must(pool.add_function(doubler({700, 3000, 250}), {.name = "f"}));
  for (const std::int64_t n : {16, 1000, 3000, 64, 5000}) {
    step(pool, f, n, 1);  // warm-up
    auto recorded = step(pool, f, n, 2);
    REQUIRE(recorded.kind() == K::recording);
    const cgt::NodeMemory memory = pool.current_path().back().memory();
    REQUIRE(memory.predicted_pool_bytes.has_value());
    CHECK(*memory.predicted_pool_bytes == memory.pool_bytes);
    CHECK(memory.slot_bytes >= static_cast<std::size_t>(n) * 4);  // the copied input's slot
    CHECK(step(pool, f, n, 3).kind() == K::replay);
  }
  // At least one shape needed new segments (else the test shows nothing).
  std::size_t grown = 0;
  for (const cgt::FunctionMemory& owner : pool.memory_report().functions) grown += owner.pool_bytes;
  CHECK(grown > 0);
}

TEST_CASE("without a warm-up a recording has no prediction", "[memory][prediction][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.skip_warmup = true}, .arena = {.segment_bytes = kSegment}}));
  auto f = must(pool.add_function(doubler({100}), {.name = "f"}));
  CHECK(step(pool, f, 16, 1).kind() == K::recording);
  CHECK_FALSE(pool.current_path().back().memory().predicted_pool_bytes.has_value());
}

// --- the budget -----------------------------------------------------------------------------------

TEST_CASE("over budget, a recording is not made: the call runs eagerly, warned once, and records once it fits",
          "[memory][budget][host]") {
  std::vector<cgt::Event> said;
  constexpr std::size_t kBudget = 3 * kSegment;
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true,
                                                  .memory_budget_bytes = kBudget,
                                                  .log_sink = [&](const cgt::Event& event) { said.push_back(event); }},
                                         .arena = {.segment_bytes = kSegment}}));
  // Four floats of scratch per element: at 16 elements all of it fits one segment; at 2000 its
  // slot, scratch and output take 48 KiB.
  auto f = must(pool.add_function(scaled_doubler(4), {.name = "f"}));
  CHECK(step(pool, f, 16, 1).kind() == K::warmup);
  for (int call = 0; call < 3; ++call) {
    auto out = step(pool, f, 2000, 2);  // a new shape: a warm-up (unbudgeted), then over budget
    CHECK(out.kind() == (call == 0 ? K::warmup : K::eager));
    // What the warm-up left (segments no graph holds) went back when the recording was judged.
    if (call > 0) CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
  }
  const cgt::Stats stats = pool.stats();
  CHECK(stats.count(cgt::Reason::over_budget) == 2);
  CHECK(stats.recordings == 0);
  CHECK(std::ranges::count_if(said, [](const cgt::Event& e) { return e.reason == cgt::Reason::over_budget; }) == 1);
  must(pool.check_memory());
  // The small shape fits: it records and replays.
  CHECK(step(pool, f, 16, 3).kind() == K::recording);
  CHECK(step(pool, f, 16, 4).kind() == K::replay);
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
}

TEST_CASE("evict_coldest drops the graph replayed longest ago, gives its memory back, and records it again later",
          "[memory][budget][eviction][host]") {
  constexpr std::size_t kBudget = 400'000;
  auto pool = evicting_pool(kBudget);
  // Each call's slot, scratch and output are larger than a segment, so each takes a segment of its
  // own size, which a later call reuses only if its blocks are no larger. Recorded small to large,
  // no graph shares another's segments: b's graph holds about 60 KB, a's 240 KB, c's 300 KB. b
  // and a fit the budget together; c does only once a goes.
  auto f = must(pool.add_function(scaled_doubler(1), {.name = "f"}));
  auto record = [&](std::int64_t n) { return record_at(pool, f, n); };
  const cgt::Node b = record(5'000);
  const cgt::Node a = record(20'000);
  for (int i = 0; i < 3; ++i) CHECK(step(pool, f, 5'000, 5).kind() == K::replay);  // b is hot, a cold
  CHECK(pool.stats().evictions == 0);
  const cgt::Node c = record(25'000);
  const cgt::Stats stats = pool.stats();
  CHECK(stats.evictions == 1);
  CHECK(stats.evicted_bytes >= 3 * 80'000);  // a's three segments went back to the system
  CHECK_FALSE(a.exists());                   // the coldest went
  CHECK(b.exists());
  CHECK(c.exists());
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
  CHECK(pool.memory_report().functions.at(0).graphs == 2);
  must(pool.check_memory());
  // b and c replay as before.
  CHECK(step(pool, f, 5'000, 6).kind() == K::replay);
  CHECK(step(pool, f, 25'000, 6).kind() == K::replay);
  // a's shape records again at its next call (it warmed up already; its blocks fit c's segments
  // now), with right values, and replays after.
  CHECK(step(pool, f, 20'000, 7).kind() == K::recording);
  CHECK(step(pool, f, 20'000, 8).kind() == K::replay);
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
  must(pool.check_memory());
}

TEST_CASE("eviction never drops a graph of the current path: with nothing else to drop the call runs eagerly",
          "[memory][budget][eviction][host]") {
  auto pool = evicting_pool(3 * kSegment);
  auto first = must(pool.add_function(doubler({100}), {.name = "first"}));
  auto second = must(pool.add_function(doubler({3000}), {.name = "second"}));
  // second warmed up on a path of its own; then first's graph, with its output held: second's
  // call follows it on the same path, and would record there.
  step(pool, second, 2000, 1);
  step(pool, first, 16, 1);
  step(pool, first, 16, 2);
  pool.mark_step_begin();
  auto held = must(first({filled({16}, 3)}));
  REQUIRE(held.kind() == K::replay);
  std::vector<cgt::Node> path = pool.current_path();
  const cgt::Node parent = std::move(path.back());
  auto eager = must(second({filled({2000}, 2)}));  // would record under first's node
  CHECK(eager.kind() == K::eager);
  CHECK(first_of(eager) == 4);
  CHECK(parent.exists());
  CHECK(pool.stats().count(cgt::Reason::over_budget) == 1);
  CHECK(first_of(held) == 6);
}

TEST_CASE("the pool's memory by owner: segments, live and cached, slots, copies kept past a step, per function",
          "[memory][report][host]") {
  auto pool = must(cgt::host::make_pool(
      {.tree = {.debug_checks = true, .copy_out_on_new_step = true}, .arena = {.segment_bytes = kSegment}}));
  auto f = must(pool.add_function(doubler({500}), {.name = "f"}));
  auto g = must(pool.add_function(doubler({}), {.name = "g"}));
  step(pool, f, 64, 1);
  step(pool, f, 64, 2);  // recorded: one slot of 256 bytes
  step(pool, g, 32, 1);
  auto kept = step(pool, g, 32, 2);  // recorded, output held into the next step
  const cgt::MemoryReport before = pool.memory_report();
  CHECK(before.reserved_bytes == pool.memory().reserved_bytes);
  CHECK(before.live_bytes + before.cached_bytes == before.reserved_bytes);
  CHECK(before.live_bytes == pool.memory().allocated_bytes);
  CHECK(before.slot_bytes == 64 * 4 + 32 * 4);
  CHECK(before.copied_out_bytes == 0);
  CHECK(before.executable_bytes == 0);  // the host has no executables
  REQUIRE(before.functions.size() == 2);
  CHECK(before.functions[0].function == "f");
  CHECK(before.functions[0].graphs == 1);
  CHECK(before.functions[0].slot_bytes == 256);
  CHECK(before.functions[1].function == "g");
  // A new step copies the held output out of the pool: 128 bytes kept while the lease lives.
  step(pool, f, 64, 3);
  CHECK(pool.memory_report().copied_out_bytes == 32 * 4);
  CHECK(first_of(kept) == 4);
  {
    auto gone = std::move(kept);
  }
  CHECK(pool.memory_report().copied_out_bytes == 0);
  // The DOT shows each graph's memory.
  CHECK(pool.to_dot().find("pool +") != std::string::npos);
  CHECK(pool.to_dot().find("slots 256 B") != std::string::npos);
}

TEST_CASE("buckets recorded largest first cost at most 1.1x the largest bucket's memory, not the sum",
          "[memory][buckets][host]") {
  // Slot, scratch and output grow with the bucket; the segments are as small as a request allows,
  // so a smaller bucket's graph fits in a larger one's segments, never the other way round.
  auto reserved_after = [](std::vector<std::int64_t> order) {
    auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}, .arena = {.segment_bytes = kSegment}}));
    cgt::FunctionOptions options{.name = "bucketed"};
    options.buckets.sizes = {64, 256, 1024, 4096};
    auto f = must(pool.add_function(scaled_doubler(2), std::move(options)));
    for (const std::int64_t n : order) {
      step(pool, f, n, 1);
      CHECK(step(pool, f, n, 2).kind() == K::recording);
    }
    for (const std::int64_t n : order) CHECK(step(pool, f, n, 3).kind() == K::replay);
    CHECK(pool.memory_report().functions.at(0).graphs == order.size());
    return pool.memory_report().reserved_bytes;
  };
  const std::size_t largest = reserved_after({4096});
  const std::size_t all = reserved_after({4096, 1024, 256, 64});
  CHECK(static_cast<double>(all) <= 1.1 * static_cast<double>(largest));
  // Smallest first, each larger bucket needs segments of its own: the order matters (measured in
  // docs/memory.md), as it does for libtorch's allocator.
  CHECK(reserved_after({64, 256, 1024, 4096}) > all);
}

// --- sleep and wake -------------------------------------------------------------------------------

TEST_CASE("sleep gives back the pool's memory with its graphs kept; the next call takes it back and replays",
          "[memory][sleep][host]") {
  // Host memory goes back in whole pages: blocks aligned to a page make every segment whole pages.
  auto pool = must(
      cgt::host::make_pool({.tree = {.debug_checks = true}, .arena = {.segment_bytes = kSegment, .alignment = 4096}}));
  auto f = must(pool.add_function(scaled_doubler(2), {.name = "f"}));
  for (const std::int64_t n : {1000, 3000}) {
    step(pool, f, n, 1);
    CHECK(step(pool, f, n, 2).kind() == K::recording);
  }
  const std::uint64_t recordings = pool.stats().recordings;
  const std::size_t reserved = pool.memory().reserved_bytes;
  REQUIRE(reserved > 0);
  const std::size_t released = must(pool.sleep());
  CHECK(pool.asleep());
  CHECK(released == reserved);  // every page of every segment
  CHECK(pool.memory_report().asleep_bytes == released);
  CHECK(must(pool.sleep()) == released);  // asleep already: nothing more
  // The next call wakes the pool, and its graphs replay over the same addresses.
  CHECK(step(pool, f, 3000, 5).kind() == K::replay);
  CHECK_FALSE(pool.asleep());
  CHECK(pool.memory_report().asleep_bytes == 0);
  CHECK(step(pool, f, 1000, 6).kind() == K::replay);
  CHECK(pool.stats().recordings == recordings);
  CHECK(pool.memory().reserved_bytes == reserved);
  const cgt::Stats stats = pool.stats();
  CHECK(stats.sleeps == 1);
  CHECK(stats.wakes == 1);
  // An explicit wake does the same, before the call.
  (void)must(pool.sleep());
  must(pool.wake());
  CHECK_FALSE(pool.asleep());
  must(pool.wake());  // awake: nothing to do
  CHECK(step(pool, f, 1000, 7).kind() == K::replay);
  must(pool.check_memory());
}

TEST_CASE("sleep is refused while a lease holds pool memory, and changes nothing", "[memory][sleep][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}, .arena = {.segment_bytes = kSegment}}));
  auto f = must(pool.add_function(scaled_doubler(1), {.name = "f"}));
  step(pool, f, 100, 1);
  step(pool, f, 100, 2);
  pool.mark_step_begin();
  auto held = must(f({filled({100}, 3)}));  // a replay's output, held
  REQUIRE(held.kind() == K::replay);
  auto refused = pool.sleep();
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  CHECK(refused.error().message.find("held by leases") != std::string::npos);
  CHECK_FALSE(pool.asleep());
  CHECK(first_of(held) == 6);
  {
    auto gone = std::move(held);
  }
  CHECK(must(pool.sleep()) > 0);
  CHECK(step(pool, f, 100, 4).kind() == K::replay);
}

TEST_CASE("sleep from inside a call, after shutdown or on a moved-from pool fails with its code",
          "[memory][sleep][host]") {
  auto pool = must(cgt::host::make_pool({.arena = {.segment_bytes = kSegment}}));
  cgt::Result<std::size_t> inside = std::size_t{0};
  auto f = must(pool.add_function(
      [&pool, &inside](Context& ctx, Inputs in) {
        inside = pool.sleep();
        Buffer y = ctx.allocate_like(in[0]);
        return Values{y};
      },
      {.name = "sleeper"}));
  (void)must(f({filled({4}, 1)}));
  REQUIRE_FALSE(inside);
  CHECK(inside.error().code == cgt::Errc::concurrent_use);
  cgt::host::Pool moved = std::move(pool);
  CHECK(pool.sleep().error().code == cgt::Errc::invalid_argument);  // NOLINT(bugprone-use-after-move): on purpose
  must(moved.shutdown());
  CHECK(moved.sleep().error().code == cgt::Errc::pool_shut_down);
}

TEST_CASE("evict_coldest evicts nothing for a recording that would not fit even alone: the call runs eagerly",
          "[memory][budget][eviction][host]") {
  constexpr std::size_t kBudget = 100'000;
  auto pool = evicting_pool(kBudget);
  auto f = must(pool.add_function(scaled_doubler(1), {.name = "f"}));
  const cgt::Node small = record_at(pool, f, 1'000);
  // 30,000 elements: slot, scratch and output of 120 KB each, 360 KB in all, past the budget alone.
  for (int call = 0; call < 3; ++call) {
    auto out = step(pool, f, 30'000, 3);
    CHECK(out.kind() == (call == 0 ? K::warmup : K::eager));
  }
  CHECK(pool.stats().evictions == 0);
  CHECK(small.exists());
  CHECK(step(pool, f, 1'000, 4).kind() == K::replay);
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
}

TEST_CASE("the prediction counts what the program keeps resident in the pool: a held block splits the free space",
          "[memory][prediction][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}, .arena = {.segment_bytes = 64 * 1024}}));
  // A "KV cache" the program keeps through each step: the output of a graph whose lease it holds
  // while f runs after it, at a new size each time (warm-up in one step, recording in the next).
  auto cache = must(pool.add_function(scaled_doubler(0), {.name = "cache"}));
  auto f = must(pool.add_function(scaled_doubler(3), {.name = "f"}));
  std::size_t checked = 0;
  for (const std::int64_t n : {1000, 2500, 4000, 9000}) {
    for (const K expected : {K::warmup, K::recording}) {
      pool.mark_step_begin();
      auto kept = must(cache({filled({6000}, 1)}));
      auto out = must(f({filled({n}, 2)}));
      CHECK(first_of(out) == 4);
      if (out.kind() != K::recording || expected != K::recording) continue;
      std::vector<cgt::Node> path = pool.current_path();
      REQUIRE(path.size() == 2);  // under the cache's graph, whose output is live
      const cgt::NodeMemory memory = path.back().memory();
      REQUIRE(memory.predicted_pool_bytes.has_value());
      CHECK(*memory.predicted_pool_bytes == memory.pool_bytes);
      ++checked;
      CHECK(first_of(kept) == 2);
    }
  }
  CHECK(checked == 4);
  must(pool.check_memory());
}

TEST_CASE("a capture that takes more than its warm-up did is brought back under the budget by evicting others",
          "[memory][budget][eviction][host]") {
  constexpr std::size_t kBudget = 200'000;
  auto pool = evicting_pool(kBudget);
  auto plain = must(pool.add_function(scaled_doubler(1), {.name = "plain"}));
  // Allocates 120 KB more while it is captured than when it runs: its prediction is short by that.
  auto sly = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        if (ctx.is_capturing()) (void)ctx.allocate(cgt::ElementType::f32, {30'000});
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = "sly"}));
  const cgt::Node cold = record_at(pool, plain, 10'000);  // about 120 KB of its own segments
  (void)record_at(pool, sly, 1'000);
  std::vector<cgt::Node> path = pool.current_path();
  const cgt::NodeMemory memory = path.back().memory();
  REQUIRE(memory.predicted_pool_bytes.has_value());
  CHECK(memory.pool_bytes > *memory.predicted_pool_bytes);  // the capture's extra block
  CHECK_FALSE(cold.exists());                               // evicted after the recording
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
  CHECK(step(pool, sly, 1'000, 3).kind() == K::replay);
  must(pool.check_memory());
}

TEST_CASE("a lease of an evicted graph's past replay, copied out at a new step, still reads its copy",
          "[memory][budget][eviction][host]") {
  constexpr std::size_t kBudget = 400'000;
  auto pool = evicting_pool(kBudget, true);
  auto f = must(pool.add_function(scaled_doubler(1), {.name = "f"}));
  auto record = [&](std::int64_t n) { return record_at(pool, f, n); };
  (void)record(5'000);
  const cgt::Node a = record(20'000);
  pool.mark_step_begin();
  auto held = must(f({filled({20'000}, 7)}));  // a replay of a: its lease reads a's output value
  REQUIRE(held.kind() == K::replay);
  for (int i = 0; i < 3; ++i) step(pool, f, 5'000, 5);  // a new step: held is copied out; b is hot
  (void)record(25'000);                                 // evicts a, the coldest
  REQUIRE_FALSE(a.exists());
  CHECK(first_of(held) == 14);  // the copy, through the value a's recording handed out
  CHECK(must(held.get(0)).get().numel() == 20'000);
}
