// The ledger's contract (src/core/ledger.cppm), through what a program sees: leases, the memory of
// an escaped copy of a value (a poisoned pool overwrites memory the moment it dies), live blocks.
// Ledger is module-internal, so these tests drive it through a host pool. Also pinned elsewhere: a
// stale copy whose memory lived again is refused by its life number (tests/host/test_misuse.cpp,
// "an escaped copy is refused even when its memory lives again"), a lease moved into a failing
// call stays valid (tests/host/test_handles.cpp), drops racing a stream of calls
// (tests/host/test_stress.cpp, [threads]).
#include "host/host_test.hpp"

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

/// y = 2x; with `twice` true it hands y out as two outputs: one storage, two leases.
cgt::host::Function doubling(cgt::host::Pool& pool, const std::string& name, bool twice = false) {
  return must(pool.add_function(
      [twice](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return twice ? Values{y, y} : Values{y};
      },
      {.name = name}));
}

/// Whether the memory behind `escaped` (a copy that holds no lease) died: the pool poisoned it.
/// Read at the last element: a call below that allocates after a death may reuse the memory, and
/// writes its first element only.
bool is_dead(const Buffer& escaped) {
  return std::isnan(escaped.get(escaped.numel() - 1));
}

}  // namespace

TEST_CASE("the drop of the last lease on a storage is the moment its memory dies, not before", "[ledger][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto pair = doubling(pool, "pair", true);
  auto out = must(pair({filled({4}, 1)}));  // a warm-up: the allocator holds the block for the leases
  const Buffer escaped = must(out.get(0)).get();
  auto first = must(out.release(0));
  auto second = must(out.release(1));
  out.reset();
  REQUIRE(pool.live_blocks().size() == 1);

  first.reset();
  CHECK(values_of(escaped) == repeat(2));  // one lease is left: the memory is live
  CHECK(pool.live_blocks().size() == 1);
  second.reset();
  CHECK(is_dead(escaped));  // at this drop, before any call: the next one may reuse it at once
  CHECK(pool.live_blocks().empty());
  must(pool.check_memory());
}

TEST_CASE("a lease dropped on another thread while a call holds the state is applied when the call lets go",
          "[ledger][host][threads]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto make = doubling(pool, "make");
  auto held = must(make({filled({4}, 1)}));
  const Buffer escaped = must(held.get(0)).get();
  std::vector<double> seen_in_call;
  auto drop_meanwhile = must(pool.add_function(
      [&](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([y] { y.set(0, 0); });
        std::thread dropper([&held] { held.reset(); });  // a drop never waits for the call
        dropper.join();
        seen_in_call = values_of(escaped);  // deferred to this call: the memory is still live
        return Values{y};
      },
      {.name = "drop_meanwhile"}));

  auto out = must(drop_meanwhile({filled({4}, 3)}));
  CHECK(seen_in_call == repeat(2));
  CHECK(is_dead(escaped));                // applied as the call let go of the state
  CHECK(pool.live_blocks().size() == 1);  // `out`'s
  must(pool.check_memory());
}

TEST_CASE("a lease moved into a call is consumed after the call's outputs took theirs, and only if it succeeds",
          "[ledger][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto make = doubling(pool, "make");
  bool fail = false;
  auto view = must(pool.add_function(  // returns its input: the output shares the input's storage
      [&fail](Context& /*ctx*/, Inputs in) {
        if (fail) throw std::runtime_error("injected failure");
        return Values{in[0]};
      },
      {.name = "view"}));
  auto lease = must(must(make({filled({4}, 1)})).release(0));
  const Buffer escaped = must(lease.get()).get();

  fail = true;
  REQUIRE_FALSE(view({std::move(lease)}));
  CHECK(lease.is_valid());  // NOLINT(bugprone-use-after-move): a failing call consumes nothing
  CHECK(values_of(escaped) == repeat(2));

  fail = false;
  auto out = must(view({std::move(lease)}));
  CHECK_FALSE(lease.is_valid());           // NOLINT(bugprone-use-after-move): consumed
  CHECK(values_of(escaped) == repeat(2));  // the output's lease came first: the memory lives on
  CHECK(output_values(out, 0) == repeat(2));
  out.reset();
  CHECK(is_dead(escaped));  // with the last lease, the output's
  must(pool.check_memory());
}

TEST_CASE("leases dropped in any order and on any thread each kill their memory at their own drop",
          "[ledger][host][threads]") {
  auto pool = poisoned_pool({.force_warmup = true, .debug_checks = true});  // every output is the allocator's
  auto make = doubling(pool, "make");
  std::vector<cgt::host::Outputs> held;
  std::vector<Buffer> escaped;
  for (int i = 0; i < 4; ++i) {
    held.push_back(must(make({filled({4}, i)})));
    escaped.push_back(must(held.back().get(0)).get());
  }
  const auto dead = [&escaped] {
    std::vector<bool> which;
    for (const Buffer& buffer : escaped) which.push_back(is_dead(buffer));
    return which;
  };

  std::thread([&held] { held[2].reset(); }).join();  // another thread, between calls
  CHECK(dead() == std::vector<bool>{false, false, true, false});

  std::vector<bool> seen_after_own_drop;
  std::vector<bool> seen_after_other_drop;
  auto drops = must(pool.add_function(
      [&](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([y] { y.set(0, 0); });
        held[0].reset();  // this thread, inside the call: applied at once
        seen_after_own_drop = dead();
        std::thread([&held] { held[3].reset(); }).join();  // another thread, inside the call: deferred
        seen_after_other_drop = dead();
        return Values{y};
      },
      {.name = "drops"}));
  auto out = must(drops({filled({4}, 9)}));
  CHECK(seen_after_own_drop == std::vector<bool>{true, false, true, false});
  CHECK(seen_after_other_drop == std::vector<bool>{true, false, true, false});
  CHECK(dead() == std::vector<bool>{true, false, true, true});

  held[1].reset();  // the calling thread, between calls
  CHECK(dead() == std::vector<bool>{true, true, true, true});
  out.reset();
  CHECK(pool.live_blocks().empty());
  must(pool.check_memory());
}
