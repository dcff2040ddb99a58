// PoolMemory's contract (src/core/pool_memory.cppm), through what a program sees: the allocator's
// live blocks, `check_memory`, and the values leases read. PoolMemory is module-internal, so these
// tests drive it through a host pool that poisons dead memory (a stale read sees NaN).
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using cgt::FunctionMode;

namespace {

// y = 2x, allocating `scratch` more buffers first (freed when the call ends), throwing while
// `*fail` is set (after its allocations), and dropping `*drop` first if it is set.
cgt::host::Function doubling(cgt::host::Pool& pool, const std::string& name, FunctionMode mode,
                             const bool* fail = nullptr, std::optional<cgt::host::OutputLease>* drop = nullptr,
                             int scratch = 0) {
  return must(pool.add_function(
      [fail, drop, scratch](Context& ctx, Inputs in) {
        if (drop != nullptr && drop->has_value()) drop->reset();
        std::vector<Buffer> kept;
        for (int i = 0; i < scratch; ++i) kept.push_back(ctx.allocate_like(in[0]));
        const Buffer y = ctx.allocate_like(in[0]);
        if (fail != nullptr && *fail) throw std::runtime_error("injected failure");
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = name, .mode = mode}));
}

std::vector<std::uintptr_t> addresses(const cgt::host::Pool& pool) {
  std::vector<std::uintptr_t> out;
  for (const cgt::Block& block : pool.live_blocks()) out.push_back(block.address);
  return out;
}

}  // namespace

TEST_CASE("pool memory: a warm-up that fails after allocating puts the allocator back as it was",
          "[pool_memory][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto g = doubling(pool, "g", FunctionMode::inference, &fail, nullptr, 3);
  auto held = must(f({filled({4}, 1)}));
  const std::vector<std::uintptr_t> before = addresses(pool);
  REQUIRE(before.size() == 1);

  fail = true;
  REQUIRE_FALSE(g({filled({4}, 5)}));  // four buffers allocated in the pool, then the throw
  CHECK(addresses(pool) == before);
  must(pool.check_memory());
  CHECK(output_values(held, 0) == repeat(2));

  fail = false;  // and the pool goes on: g warms up in the memory the failed call had
  CHECK(output_values(must(g({filled({4}, 5)})), 0) == repeat(10));
  must(pool.check_memory());
}

TEST_CASE("pool memory: a lease dropped inside a function that then fails frees its block once",
          "[pool_memory][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = true;
  std::optional<cgt::host::OutputLease> victim;
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto g = doubling(pool, "g", FunctionMode::inference, &fail, &victim);
  {
    auto out = must(f({filled({4}, 1)}));
    victim.emplace(must(out.release(0)));
  }
  REQUIRE(pool.live_blocks().size() == 1);

  REQUIRE_FALSE(g({filled({4}, 5)}));  // drops the victim's lease, allocates, throws
  CHECK_FALSE(victim.has_value());
  CHECK(pool.live_blocks().empty());  // the snapshot held it; the roll-back freed it, once
  must(pool.check_memory());
}

TEST_CASE("pool memory: a new step copies held outputs out when asked, and frees their pool memory",
          "[pool_memory][host]") {
  auto pool = poisoned_pool({.debug_checks = true, .copy_out_on_new_step = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto first = must(f({filled({4}, 1)}));
  REQUIRE(pool.live_blocks().size() == 1);

  pool.mark_step_begin();
  auto second = must(f({filled({4}, 3)}));
  CHECK(output_values(first, 0) == repeat(2));  // the copy, out of the pool
  CHECK(output_values(second, 0) == repeat(6));
  CHECK(pool.live_blocks().size() == 1);  // the first step's block went back to the pool
  must(pool.check_memory());
}

TEST_CASE("pool memory: a new step that fails before its work keeps the last step's memory and values",
          "[pool_memory][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = doubling(pool, "f", FunctionMode::inference);
  auto held = must(f({filled({4}, 1)}));
  const std::vector<std::uintptr_t> before = addresses(pool);

  pool.mark_step_begin();
  const Buffer wrong_rank = must(Buffer::make(cgt::host::ElementType::f32, {2, 2}));
  REQUIRE_FALSE(f({wrong_rank}));  // refused at the signature: the ended path is put back
  CHECK(output_values(held, 0) == repeat(2));
  CHECK(addresses(pool) == before);
  must(pool.check_memory());
}

TEST_CASE("pool memory: after shutdown, a lease's death frees nothing and the lease says why", "[pool_memory][host]") {
  auto pool = poisoned_pool();
  auto f = doubling(pool, "f", FunctionMode::inference);
  std::optional<cgt::host::Outputs> held(must(f({filled({4}, 1)})));
  must(pool.shutdown());
  const auto read = held->get(0);
  REQUIRE_FALSE(read);
  CHECK(read.error().code == cgt::Errc::pool_shut_down);
  held.reset();  // the death after shutdown: nothing to free, nothing to crash
  CHECK(pool.live_blocks().empty());
}
