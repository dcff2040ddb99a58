// The memory contract on the GPU (cgt.cuda): each recording adds what its warm-up predicted, the
// executables are measured, and a budget is kept by evicting the coldest graphs, whose segments go
// back to the device.
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

#include "cuda/harness.hpp"

using H = CudaHarness;
using K = cgt::CallKind;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

constexpr std::size_t kSegment = std::size_t{1} << 20;

// out = x, through a scratch block of `per_element` floats per element of x that the kernel
// writes: its memory grows with the call's size.
auto scaled_copy(std::int64_t per_element) {
  return [per_element](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
    const std::int64_t n = static_cast<std::int64_t>(in[0].numel());
    cgt::cuda::Buffer scratch = ctx.allocate(cgt::ElementType::f32, {per_element * n});
    (void)cgt_test::sum_inputs(in[0].as<float>(), nullptr, nullptr, nullptr, scratch.as<float>(), in[0].numel(),
                               ctx.stream());
    cgt::cuda::Buffer y = ctx.allocate_like(in[0]);
    (void)cgt_test::sum_inputs(scratch.as<float>(), nullptr, nullptr, nullptr, y.as<float>(), in[0].numel(),
                               ctx.stream());
    return cgt::cuda::Values{y};
  };
}

cgt::cuda::Buffer filled(std::int64_t n, float value) {
  cgt::cuda::Buffer x = must(cgt::cuda::Buffer::make(cgt::ElementType::f32, {n}));
  must(x.write(std::vector<double>(static_cast<std::size_t>(n), value)));
  return x;
}

// A new step, a call on `n` elements of `value`, its value checked.
K step(cgt::cuda::Pool& pool, cgt::cuda::Function& f, std::int64_t n, float value) {
  pool.mark_step_begin();
  auto out = must(f({filled(n, value)}));
  CHECK(must(must(out.get(0)).get().read()) == std::vector<double>(static_cast<std::size_t>(n), value));
  return out.kind();
}

}  // namespace

TEST_CASE("cuda/memory: each recording adds what its warm-up predicted, within 2%; executables are measured",
          "[gpu][memory]") {
  REQUIRE_GPU();
  cgt::cuda::PoolOptions options;
  options.tree.debug_checks = true;
  options.arena.segment_bytes = kSegment;
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  auto f = must(pool.add_function(scaled_copy(3), {.name = "f"}));
  std::size_t grown = 0;
  for (const std::int64_t n : {std::int64_t{1} << 10, std::int64_t{1} << 16, std::int64_t{1} << 19,
                               std::int64_t{3} << 18, std::int64_t{1} << 21}) {
    CHECK(step(pool, f, n, 1) == K::warmup);
    CHECK(step(pool, f, n, 2) == K::recording);
    std::vector<cgt::Node> path = pool.current_path();
    const cgt::NodeMemory memory = path.back().memory();
    REQUIRE(memory.predicted_pool_bytes.has_value());
    const double predicted = static_cast<double>(*memory.predicted_pool_bytes);
    const double added = static_cast<double>(memory.pool_bytes);
    CHECK(predicted <= added * 1.02 + 1);
    CHECK(predicted >= added * 0.98 - 1);
    CHECK(memory.slot_bytes == static_cast<std::size_t>(n) * 4);
    grown += memory.pool_bytes;
    CHECK(step(pool, f, n, 3) == K::replay);
  }
  CHECK(grown > 0);
  const cgt::MemoryReport report = pool.memory_report();
  CHECK(report.reserved_bytes == pool.memory().reserved_bytes);
  CHECK(report.live_bytes + report.cached_bytes == report.reserved_bytes);
  REQUIRE(report.functions.size() == 1);
  CHECK(report.functions[0].graphs == 5);
  CHECK(report.functions[0].executable_bytes == report.executable_bytes);
  CHECK(report.budgeted_bytes() == report.reserved_bytes + report.executable_bytes);
}

TEST_CASE(
    "cuda/memory: evict_coldest keeps a budget, gives the coldest graph's segments back to the device, and "
    "records it again",
    "[gpu][memory]") {
  REQUIRE_GPU();
  constexpr std::size_t kBudget = std::size_t{44} << 20;  // with room for the executables
  cgt::cuda::PoolOptions options;
  options.tree.debug_checks = true;
  options.tree.memory_budget_bytes = kBudget;
  options.tree.over_budget = cgt::OverBudget::evict_coldest;
  options.arena.segment_bytes = kSegment;
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  auto f = must(pool.add_function(scaled_copy(1), {.name = "f"}));
  // Blocks larger than a segment take segments of their own size; recorded small to large, no
  // graph shares another's: b holds 3 x 2 MiB, a 3 x 8 MiB, c 3 x 10 MiB. b and a fit the budget
  // together; c does only once a goes.
  constexpr std::int64_t kB = std::int64_t{1} << 19;
  constexpr std::int64_t kA = std::int64_t{1} << 21;
  constexpr std::int64_t kC = std::int64_t{5} << 19;
  auto record = [&](std::int64_t n) {
    CHECK(step(pool, f, n, 1) == K::warmup);
    CHECK(step(pool, f, n, 2) == K::recording);
    std::vector<cgt::Node> path = pool.current_path();
    // An executable is measured as the device's free memory before and after its instantiation:
    // another process allocating meanwhile (ctest runs GPU tests side by side) inflates it, and the
    // budget then counts that too. This graph's own is well under a MiB.
    if (path.back().memory().executable_bytes > (std::size_t{1} << 20)) {
      SKIP("another process allocated on the device while this pool instantiated a graph");
    }
    return std::move(path.back());
  };
  const cgt::Node b = record(kB);
  const cgt::Node a = record(kA);
  for (int i = 0; i < 3; ++i) CHECK(step(pool, f, kB, 5) == K::replay);
  CHECK(pool.stats().evictions == 0);
  CHECK(step(pool, f, kC, 1) == K::warmup);
  CHECK(step(pool, f, kC, 2) == K::recording);
  const cgt::Stats stats = pool.stats();
  CHECK(stats.evictions == 1);
  CHECK(stats.evicted_bytes >= std::size_t{24} << 20);
  CHECK_FALSE(a.exists());
  CHECK(b.exists());
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
  // a's 24 MiB went back to the device: the pool holds b's and c's segments (6 + 30 MiB), not a's.
  CHECK(pool.memory().reserved_bytes <= std::size_t{36} << 20);
  must(pool.check_memory());
  CHECK(step(pool, f, kB, 6) == K::replay);
  CHECK(step(pool, f, kC, 6) == K::replay);
  CHECK(step(pool, f, kA, 7) == K::recording);
  CHECK(step(pool, f, kA, 8) == K::replay);
  CHECK(pool.memory_report().budgeted_bytes() <= kBudget);
  must(pool.check_memory());
}

TEST_CASE(
    "cuda/memory: a sleepable pool gives all its segments' memory back to the device while its graphs stay; "
    "the next call maps it back at the same addresses and replays",
    "[gpu][memory][sleep]") {
  REQUIRE_GPU();
  cgt::cuda::PoolOptions options;
  options.tree.debug_checks = true;
  options.sleepable = true;
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  auto f = must(pool.add_function(scaled_copy(4), {.name = "f"}));
  constexpr std::int64_t kN = std::int64_t{1} << 22;  // 16 MiB per buffer: the pool holds about 100 MiB
  CHECK(step(pool, f, kN, 1) == K::warmup);
  CHECK(step(pool, f, kN, 2) == K::recording);
  std::uintptr_t before = 0;
  {
    pool.mark_step_begin();
    auto out = must(f({filled(kN, 3)}));
    REQUIRE(out.kind() == K::replay);
    before = reinterpret_cast<std::uintptr_t>(must(out.get(0)).get().data());  // NOLINT
  }
  const std::size_t reserved = pool.memory().reserved_bytes;
  REQUIRE(reserved >= std::size_t{96} << 20);
  const std::size_t released = must(pool.sleep());
  CHECK(released >= reserved);  // every segment, rounded up to the driver's granularity
  CHECK(pool.asleep());
  // (The device's free memory rises by as much: bench/memory_bench measures it in a process of its
  // own. Here other tests' processes may allocate meanwhile: ctest runs them side by side.)
  // The next call maps it back and replays, at the same addresses, with right values.
  pool.mark_step_begin();
  auto out = must(f({filled(kN, 5)}));
  CHECK(out.kind() == K::replay);
  CHECK(reinterpret_cast<std::uintptr_t>(must(out.get(0)).get().data()) == before);  // NOLINT
  CHECK(must(must(out.get(0)).get().read()) == std::vector<double>(static_cast<std::size_t>(kN), 5));
  CHECK_FALSE(pool.asleep());
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().sleeps == 1);
  CHECK(pool.stats().wakes == 1);
}

TEST_CASE("cuda/memory: a pool made without sleepable refuses to sleep, and goes on", "[gpu][memory][sleep]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  auto f = must(pool.add_function(scaled_copy(1), {.name = "f"}));
  CHECK(step(pool, f, 1024, 1) == K::warmup);
  CHECK(step(pool, f, 1024, 2) == K::recording);
  auto refused = pool.sleep();
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  CHECK(refused.error().message.find("sleepable") != std::string::npos);
  CHECK_FALSE(pool.asleep());
  CHECK(step(pool, f, 1024, 3) == K::replay);
}
