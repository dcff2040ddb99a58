// The replay path's shortcuts (docs/performance.md, "The engine's bookkeeping"), attacked: the
// lease arrays a call's outputs live in, kept per thread, across threads and thread exits, moved
// across threads, reset and reused, many alive at once and dropped in random order on several
// threads, dropped inside the pool's own function, past shutdown() and the Pool handle; the owners
// that keep an argument's value alive through a call whose function drops its lease and then runs
// again; a lease moved twice into one call; the child search's shortcut for a node that nothing
// can keep from replaying, which must not skip the checks of a node that has any, against nodes
// recorded with dead or consumed outputs; and poison_dead_memory on dead and live replay outputs.
// ASan and TSan run these in CI (`scripts/test.sh`).
#include "host/host_test.hpp"
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using cgt::CallKind;
using host_test::scaling;
namespace {

/// `count` outputs: output k = x + k.
cgt::host::Function fan_out(cgt::host::Pool& pool, std::size_t count) {
  return must(pool.add_function(
      [count](Context& ctx, Inputs in) {
        Values out;
        for (std::size_t k = 0; k < count; ++k) {
          const Buffer y = ctx.allocate_like(in[0]);
          ctx.launch([x = in[0], y, k] {
            for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + static_cast<double>(k));
          });
          out.push_back(y);
        }
        return out;
      },
      {.name = "fan_out_" + std::to_string(count)}));
}

/// y = a + b.
cgt::host::Function added(cgt::host::Pool& pool) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([a = in[0], b = in[1], y] {
          for (std::size_t i = 0; i < a.numel(); ++i) y.set(i, a.get(i) + b.get(i));
        });
        return Values{y};
      },
      {.name = "added"}));
}

/// Returns its input (a view of it: an output that shares the input's storage).
cgt::host::Function identity(cgt::host::Pool& pool) {
  return must(pool.add_function([](Context& /*ctx*/, Inputs in) { return Values{in[0]}; }, {.name = "identity"}));
}

std::vector<double> expected_fan(double x, std::size_t k) {
  return repeat(x + static_cast<double>(k));
}

bool all_nan(const std::vector<double>& values) {
  return std::ranges::all_of(values, [](double v) { return std::isnan(v); });
}

}  // namespace

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

TEST_CASE("an Outputs moved between threads, reset, reused and dropped on a third thread", "[replay-path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = scaling(pool, "scaled", 2);
  const Buffer x = filled({4}, 1.5);
  for (int i = 0; i < 3; ++i) (void)must(f({x}));

  std::optional<cgt::host::Outputs> carried;
  std::thread([&] { carried.emplace(must(f({x}))); }).join();  // array allocated on a thread now gone
  REQUIRE(carried.has_value());
  CHECK(carried->kind() == CallKind::replay);
  CHECK(output_values(*carried, 0) == repeat(3.0));
  carried->reset();
  CHECK(carried->size() == 1);
  CHECK(carried->get(0).error().code == cgt::Errc::invalid_argument);
  CHECK(carried->release(0)->is_valid() == false);
  carried->reset();         // twice: a no-op
  *carried = must(f({x}));  // reused: the reset array is freed (kept on this thread), a new one moved in
  CHECK(output_values(*carried, 0) == repeat(3.0));
  std::thread([&, moved = std::move(*carried)]() mutable {
    CHECK(output_values(moved, 0) == repeat(3.0));
    moved.reset();
    moved = must(f({x}));  // a call on this thread into the moved-to bundle
    CHECK(output_values(moved, 0) == repeat(3.0));
    cgt::host::Outputs again = std::move(moved);
    moved = std::move(again);  // back and forth
    auto lease = must(moved.release(0));
    moved.reset();
    CHECK(must(lease.get()).get().get(0) == 3.0);
  }).join();
  CHECK(carried->size() == 0);  // moved from
  carried.reset();
  CHECK(must(f({x})).kind() == CallKind::replay);
  must(pool.check_memory());
  CHECK(pool.live_blocks().empty());
}

TEST_CASE(
    "hostile: many Outputs of 1 to 12 outputs alive at once, dropped in random order on four threads "
    "while the main thread calls",
    "[replay-path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  std::vector<cgt::host::Function> functions;
  const std::vector<std::size_t> counts{1, 3, 8, 9, 12};
  for (const std::size_t count : counts) functions.push_back(fan_out(pool, count));
  const Buffer x = filled({4}, 10);

  struct Held {
    cgt::host::Outputs outputs;
    std::size_t count;
  };
  std::mt19937 random(1234);
  for (int round = 0; round < 3; ++round) {
    std::vector<Held> held;
    for (int i = 0; i < 30; ++i) {
      const std::size_t which = static_cast<std::size_t>(i) % counts.size();
      held.push_back({must(functions[which]({x})), counts[which]});
    }
    for (const Held& h : held) {
      for (std::size_t k = 0; k < h.count; ++k) REQUIRE(output_values(h.outputs, k) == expected_fan(10, k));
    }
    std::ranges::shuffle(held, random);
    std::vector<std::vector<Held>> shares(4);
    for (std::size_t i = 0; i < held.size(); ++i) shares[i % 4].push_back(std::move(held[i]));
    std::atomic<int> wrong{0};
    std::vector<std::thread> droppers;
    for (std::size_t t = 0; t < shares.size(); ++t) {
      droppers.emplace_back([&wrong, t, share = std::move(shares[t])]() mutable {
        for (std::size_t i = 0; i < share.size(); ++i) {
          Held& h = share[i];
          for (std::size_t k = 0; k < h.count; ++k) {
            if (values_of(must(h.outputs.get(k)).get()) != expected_fan(10, k)) ++wrong;
          }
          switch ((i + t) % 4) {
            case 0: h.outputs.reset(); break;  // emptied, freed with the vector
            case 1: {                          // one lease moved out, dropped after the bundle
              auto lease = must(h.outputs.release(h.count - 1));
              h.outputs = cgt::host::Outputs(std::move(h.outputs));
              {
                auto gone = std::move(h.outputs);
              }
              lease.reset();
              break;
            }
            case 2: {
              auto gone = std::move(h.outputs);
            } break;
            default: break;  // dropped with the vector, at the thread's end
          }
        }
      });
    }
    for (int i = 0; i < 20; ++i) {  // meanwhile: calls whose outputs are dropped at once
      const std::size_t which = static_cast<std::size_t>(i) % counts.size();
      auto out = must(functions[which]({x}));
      for (std::size_t k = 0; k < counts[which]; ++k) CHECK(output_values(out, k) == expected_fan(10, k));
    }
    for (auto& thread : droppers) thread.join();
    CHECK(wrong.load() == 0);
    must(pool.check_memory());
    CHECK(pool.live_blocks().empty());
    pool.mark_step_begin();
  }
  (void)must(functions[4]({x}));  // a root of its own (it ran only down paths so far): recorded here
  auto last = must(functions[4]({x}));
  CHECK(last.kind() == CallKind::replay);
  for (std::size_t k = 0; k < 12; ++k) CHECK(output_values(last, k) == expected_fan(10, k));
}

TEST_CASE(
    "hostile: a thread whose only lease-array drop is in a thread_local's destructor at its exit, "
    "and one that keeps more than four blocks",
    "[replay-path][host]") {
  auto pool = poisoned_pool();
  auto f = scaling(pool, "scaled", 2);
  auto g = fan_out(pool, 3);
  const Buffer x = filled({4}, 1.5);
  for (int i = 0; i < 3; ++i) (void)must(f({x}));
  std::thread([&] {
    // Nothing was kept on this thread before its exit: the first kept block registers the
    // freeing while the thread's locals are being destroyed (LSan sees a leak if it never runs).
    thread_local std::optional<cgt::host::Outputs> only;
    only.emplace(must(f({x})));
  }).join();
  std::thread([&] {
    std::vector<cgt::host::Outputs> many;
    for (int i = 0; i < 9; ++i) many.push_back(must(i % 2 == 0 ? f({x}) : g({x})));
    many.clear();                                              // nine small arrays freed: four kept, five freed
    for (int i = 0; i < 6; ++i) many.push_back(must(f({x})));  // takes the kept ones, then allocates
    thread_local std::optional<cgt::host::Outputs> last;       // constructed after the watcher: dropped before it
    last.emplace(must(g({x})));
  }).join();
  CHECK(must(f({x})).kind() == CallKind::replay);
  must(pool.check_memory());
}

TEST_CASE(
    "hostile: a function that drops the lease of its own eager argument, then fails its capture and "
    "runs again, reads a live value object",
    "[replay-path][host]") {
  const bool copy_out = GENERATE(false, true);
  auto pool = poisoned_pool({.copy_out_on_new_step = copy_out, .log_sink = [](const cgt::Event&) {}});
  // s synchronises: its capture fails and it runs eagerly from then on (its outputs have owners).
  auto s = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        ctx.synchronize();
        return Values{y};
      },
      {.name = "syncs"}));
  cgt::host::OutputLease* victim = nullptr;
  int runs = 0;
  auto g = must(pool.add_function(
      [&victim, &runs](Context& ctx, Inputs in) {
        ++runs;
        const Buffer y = ctx.allocate_like(in[0]);
        if (victim != nullptr) victim->reset();  // the caller's lease on in[0], dropped mid-call
        const double first = in[0].get(0);       // the value object must still be alive
        ctx.launch([x = in[0], y, first] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 3 * x.get(i) + 0 * first);
        });
        ctx.synchronize();  // breaks a capture: the function runs again
        return Values{y};
      },
      {.name = "drops_its_argument"}));
  const Buffer x = filled({4}, 1);
  (void)must(s({x}));  // warm-up
  (void)must(g({x}));  // warm-up (g's shape is warmed up: its next call records)
  pool.mark_step_begin();
  auto eager = must(s({x}));
  REQUIRE(eager.kind() == CallKind::eager);
  pool.mark_step_begin();
  cgt::host::OutputLease lease = must(eager.release(0));
  eager = cgt::host::Outputs(std::move(eager));
  {
    auto gone = std::move(eager);
  }  // the bundle is gone: the lease's owner is the value's only owner
  victim = &lease;
  runs = 0;
  auto out = must(g({lease}));  // by lvalue: borrowed
  victim = nullptr;
  CHECK(runs == 2);  // the failed capture, then the eager run
  CHECK(out.kind() == CallKind::eager);
  CHECK(output_values(out, 0) == repeat(6.0));
  CHECK(lease.get().error().code == cgt::Errc::invalid_argument);  // the function dropped it
  must(pool.check_memory());
}

TEST_CASE(
    "hostile: a warm-up output borrowed by a call whose function drops it reads poison, never a freed "
    "value object",
    "[replay-path][host]") {
  auto pool = poisoned_pool();
  auto f = scaling(pool, "f", 2);
  cgt::host::OutputLease* victim = nullptr;
  auto g = must(pool.add_function(
      [&victim](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        if (victim != nullptr) victim->reset();
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i));
        });
        return Values{y};
      },
      {.name = "g"}));
  const Buffer x = filled({4}, 1);
  auto warm = must(f({x}));
  REQUIRE(warm.kind() == CallKind::warmup);
  auto lease = must(warm.release(0));
  {
    auto gone = std::move(warm);
  }
  victim = &lease;
  auto out = must(g({lease}));
  victim = nullptr;
  CHECK(out.kind() == CallKind::warmup);
  CHECK(all_nan(output_values(out, 0)));  // dead memory, poisoned (docs: Arg)
  CHECK_FALSE(lease.is_valid());
}

TEST_CASE("a lease moved twice into one call is consumed once: a view of it stays live", "[replay-path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = scaling(pool, "scaled", 2);
  auto view = identity(pool);
  auto add = added(pool);
  const Buffer x = filled({4}, 1);
  for (int step = 0; step < 5; ++step) {
    auto a = must(f({x}));
    auto lease = must(a.release(0));
    auto viewed = must(view({lease}));  // a second lease on the same storage
    auto sum = must(add({std::move(lease), std::move(lease)}));
    CHECK(output_values(sum, 0) == repeat(4.0));
    CHECK(lease.get().error().code == cgt::Errc::invalid_argument);  // consumed
    auto more = must(f({x}));                                        // may reuse dead memory: not the view's
    auto more_sum = must(add({*more.get(0), *more.get(0)}));
    CHECK(output_values(viewed, 0) == repeat(2.0));
    CHECK(output_values(more_sum, 0) == repeat(4.0));
    pool.mark_step_begin();
  }
  must(pool.check_memory());
}

TEST_CASE(
    "hostile: a child recorded while an output of its parent was dead is not replayed while that "
    "output is live",
    "[replay-path][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto two = fan_out(pool, 2);  // x, x + 1
  auto g = scaling(pool, "g", 5);
  const Buffer x = filled({256}, 1);
  for (int i = 0; i < 3; ++i) {  // the parent's output 0 dies before g: g's graph may reuse its memory
    auto parent = must(two({x}));
    must(parent.release(0)).reset();
    auto child = must(g({x}));
    CHECK(output_values(parent, 1) == repeat(2.0, 256));
    CHECK(output_values(child, 0) == repeat(5.0, 256));
    if (i > 0) CHECK(child.kind() == CallKind::replay);
    pool.mark_step_begin();
  }
  for (int i = 0; i < 3; ++i) {  // now both of the parent's outputs are live through g
    auto parent = must(two({x}));
    CHECK(parent.kind() == CallKind::replay);
    auto child = must(g({x}));
    CHECK(output_values(parent, 0) == repeat(1.0, 256));
    CHECK(output_values(parent, 1) == repeat(2.0, 256));
    CHECK(output_values(child, 0) == repeat(5.0, 256));
    pool.mark_step_begin();
  }
  must(pool.check_memory());
}

TEST_CASE("a child recorded consuming its input's lease is not replayed for a borrowed one", "[replay-path][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto f = scaling(pool, "f", 2);
  auto g = scaling(pool, "g", 3);
  auto h = scaling(pool, "h", 7);
  const Buffer x = filled({256}, 1);
  for (int i = 0; i < 3; ++i) {
    auto a = must(f({x}));
    auto lease = must(a.release(0));
    auto b = must(g({std::move(lease)}));  // f's output dies during the call
    auto c = must(h({x}));                 // may reuse f's dead memory
    CHECK(output_values(b, 0) == repeat(6.0, 256));
    CHECK(output_values(c, 0) == repeat(7.0, 256));
    pool.mark_step_begin();
  }
  for (int i = 0; i < 3; ++i) {
    auto a = must(f({x}));
    auto lease = must(a.release(0));
    auto b = must(g({lease}));  // borrowed: f's output stays live
    auto c = must(h({x}));
    CHECK(output_values(b, 0) == repeat(6.0, 256));
    CHECK(output_values(c, 0) == repeat(7.0, 256));
    CHECK(must(lease.get()).get().get(0) == 2.0);
    CHECK(values_of(must(lease.get()).get()) == repeat(2.0, 256));
    pool.mark_step_begin();
  }
  must(pool.check_memory());
}

TEST_CASE("poison_dead_memory: a dead replay output's stale copy reads poison, a live one never does",
          "[replay-path][host]") {
  auto pool = poisoned_pool({.skip_warmup = true});
  auto f = scaling(pool, "f", 2);
  auto g = scaling(pool, "g", 3);
  const Buffer x = filled({8}, 1);
  (void)must(f({x}));  // recording
  {
    auto out = must(f({x}));
    REQUIRE(out.kind() == CallKind::replay);
    const Buffer stale = must(out.get(0)).get();  // a copy that escapes the lease
    CHECK(values_of(stale) == repeat(2.0, 8));
    out.reset();  // the replay output dies
    CHECK(all_nan(values_of(stale)));
  }
  {
    auto live = must(f({x}));
    REQUIRE(live.kind() == CallKind::replay);
    const Buffer copy = must(live.get(0)).get();
    for (int i = 0; i < 4; ++i) {
      auto other = must(g({x}));  // recorded under f and replayed, with f's output live
      auto lease = must(other.release(0));
      lease.reset();  // another output dies: not this one
      CHECK(values_of(copy) == repeat(2.0, 8));
    }
    CHECK(output_values(live, 0) == repeat(2.0, 8));
  }
  // Dropped on another thread: poisoned as well.
  auto out = must(f({x}));
  const Buffer stale = must(out.get(0)).get();
  std::thread([gone = std::move(out)]() mutable { gone.reset(); }).join();
  CHECK(all_nan(values_of(stale)));
  CHECK(output_values(must(f({x})), 0) == repeat(2.0, 8));
}

TEST_CASE("a pool function that drops its own pool's Outputs (more than eight leases) mid-call",
          "[replay-path][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto wide = fan_out(pool, 12);
  auto one = fan_out(pool, 1);
  std::optional<cgt::host::Outputs> held;
  auto dropper = must(pool.add_function(
      [&held](Context& ctx, Inputs in) {
        held.reset();  // on the thread holding the pool's state
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * 4);
        });
        return Values{y};
      },
      {.name = "dropper"}));
  const Buffer x = filled({4}, 1);
  for (int step = 0; step < 6; ++step) {
    held.emplace(must(step % 2 == 0 ? wide({x}) : one({x})));
    auto small = must(one({x}));
    auto out = must(dropper({x}));
    CHECK(!held.has_value());
    CHECK(output_values(out, 0) == repeat(4.0));
    CHECK(output_values(small, 0) == repeat(1.0));
    pool.mark_step_begin();
  }
  must(pool.check_memory());
}

TEST_CASE("outputs, released leases and reset bundles outlive shutdown() and the Pool handle", "[replay-path][host]") {
  std::optional<cgt::host::Outputs> wide_out;
  std::optional<cgt::host::Outputs> one_out;
  std::optional<cgt::host::OutputLease> lease;
  std::optional<cgt::host::Outputs> reset_out;
  {
    auto pool = poisoned_pool();
    auto wide = fan_out(pool, 12);
    auto one = fan_out(pool, 1);
    const Buffer x = filled({4}, 1);
    for (int i = 0; i < 3; ++i) {
      (void)must(wide({x}));
      (void)must(one({x}));
    }
    wide_out.emplace(must(wide({x})));
    one_out.emplace(must(one({x})));
    lease.emplace(must(wide_out->release(3)));
    reset_out.emplace(must(one({x})));
    reset_out->reset();
    CHECK(output_values(*wide_out, 11) == repeat(12.0));
    must(pool.shutdown());
    CHECK(wide_out->get(0).error().code == cgt::Errc::pool_shut_down);
    CHECK(one_out->take(0).error().code == cgt::Errc::pool_shut_down);
    CHECK(lease->get().error().code == cgt::Errc::pool_shut_down);
    CHECK(reset_out->get(0).error().code == cgt::Errc::invalid_argument);
    CHECK_FALSE(lease->is_valid());
  }  // the Pool handle and the functions go
  CHECK(wide_out->get(11).error().code == cgt::Errc::pool_shut_down);
  std::thread([&] {
    wide_out->reset();
    *one_out = std::move(*wide_out);  // drops one_out's leases, takes the emptied array
    one_out.reset();
  }).join();
  reset_out.reset();
  wide_out.reset();
  lease.reset();  // the engine's last reference, on this thread
}
