// Layouts and sizes on the host backend, the odd ones a careless program passes: views with
// overlapping, negative or out-of-range strides, sizes whose byte count overflows, zero-element
// outputs, kernels that throw anything, and what the backend tells the engine about its outputs.
// Each test names the behaviour a user relies on.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend_of.hpp"

import cgt;
import cgt.host;
// Drives the host device through the backend interface.
import cgt.core;

namespace {

using Catch::Matchers::ContainsSubstring;
using cgt::Errc;
using cgt::Layout;
using cgt::host::Buffer;
using cgt::host::Context;
using cgt::host::ElementType;
using cgt::host::Inputs;
using cgt::host::Values;

constexpr std::int64_t kHuge = std::int64_t{1} << 62;

template <class T>
T must(cgt::Result<T> result) {
  if (!result) FAIL("unexpected error: " << result.error().describe());
  return std::move(*result);
}

Buffer iota(std::initializer_list<std::int64_t> sizes, double start = 1) {
  Buffer buffer = must(Buffer::make(ElementType::f32, sizes));
  for (std::size_t i = 0; i < buffer.numel(); ++i) buffer.set(i, start + static_cast<double>(i));
  return buffer;
}

std::vector<double> values_of(const Buffer& buffer) {
  std::vector<double> values(buffer.numel());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = buffer.get(i);
  return values;
}

Layout f32(std::initializer_list<std::int64_t> sizes) {
  return Layout::contiguous(ElementType::f32, std::span<const std::int64_t>(sizes.begin(), sizes.size()));
}

Layout restrided(const Layout& layout, std::int64_t offset, std::initializer_list<std::int64_t> sizes,
                 std::initializer_list<std::int64_t> strides) {
  return layout.restrided(offset, std::span<const std::int64_t>(sizes.begin(), sizes.size()),
                          std::span<const std::int64_t>(strides.begin(), strides.size()));
}

Buffer view(const Buffer& buffer, std::int64_t offset, std::initializer_list<std::int64_t> sizes,
            std::initializer_list<std::int64_t> strides) {
  return buffer.with_layout(restrided(buffer.layout(), offset, sizes, strides));
}

cgt::host::Pool make_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  cgt::host::PoolOptions pool_options;
  pool_options.tree = std::move(options);
  pool_options.poison_dead_memory = true;
  return must(cgt::host::make_pool(std::move(pool_options)));
}

// y = 2 x element by element, through x's layout (a kernel honouring strides). Records the strides
// it saw while capturing in `seen`, if given.
cgt::host::Function twice(cgt::host::Pool& pool, std::shared_ptr<std::vector<std::int64_t>> seen = nullptr) {
  return must(pool.add_function(
      [seen](Context& ctx, Inputs in) {
        if (seen && ctx.is_capturing()) seen->assign(in[0].strides().begin(), in[0].strides().end());
        Buffer y = ctx.allocate(ElementType::f32, in[0].sizes());
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = "twice"}));
}

std::vector<double> doubled(const Buffer& x) {
  std::vector<double> values = values_of(x);
  for (double& value : values) value *= 2;
  return values;
}

// --- Layout arithmetic -------------------------------------------------------------------------

TEST_CASE("required_bytes counts the highest element of a view with negative strides", "[layout][host]") {
  const Layout reversed = restrided(f32({4}), 3, {4}, {-1});  // elements 3, 2, 1, 0
  CHECK(reversed.valid());
  CHECK(reversed.required_bytes() == 16);
  CHECK(reversed.fits(16));
  CHECK_FALSE(reversed.fits(12));
  // Offset 0 with a negative stride reaches before the storage: it fits no storage at all.
  const Layout before_start = restrided(f32({4}), 0, {4}, {-1});
  CHECK_FALSE(before_start.fits(1 << 20));
  // Mixed signs: the highest element comes from the positive stride alone.
  const Layout mixed = restrided(f32({3, 3}), 6, {3, 3}, {-3, 1});
  CHECK(mixed.required_bytes() == 9 * 4);
  CHECK(mixed.fits(9 * 4));
}

TEST_CASE("view operations with out-of-range arguments give invalid layouts instead of overflowing", "[layout][host]") {
  const Layout base = f32({4, 3});
  CHECK_FALSE(base.select(4).valid());
  CHECK_FALSE(base.select(-5).valid());
  CHECK(base.select(-1).offset() == 9);  // negative indices count from the end, as in torch
  CHECK(base.select(-1).valid());
  // slice clamps like Python and torch: never a negative size, never past the end.
  CHECK(base.slice(-2, 100).sizes()[0] == 2);
  CHECK(base.slice(-2, 100).offset() == 6);
  CHECK(base.slice(3, 1).sizes()[0] == 0);
  CHECK(base.slice(std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()).sizes()[0] == 4);
  // expand: a dimension other than 1 cannot change, fewer dimensions are refused, -1 keeps.
  const std::array<std::int64_t, 2> wider{5, 3};
  const std::array<std::int64_t, 1> fewer{3};
  const std::array<std::int64_t, 3> grown{2, -1, 3};
  CHECK_FALSE(base.expand(wider).valid());
  CHECK_FALSE(base.expand(fewer).valid());
  CHECK(base.expand(grown).valid());
  CHECK(base.expand(grown).numel() == 24);
  // restrided: mismatched spans, negative sizes, and element offsets past 64 bits are refused.
  const std::array<std::int64_t, 2> two{2, 2};
  const std::array<std::int64_t, 1> one{1};
  CHECK_FALSE(base.restrided(0, two, one).valid());
  CHECK_FALSE(restrided(base, 0, {-1}, {1}).valid());
  CHECK_FALSE(restrided(base, 0, {4, 4}, {kHuge, kHuge}).valid());
  // An invalid layout has no elements, fits no storage, and costs "everything".
  const Layout invalid = base.select(100);
  CHECK(invalid.numel() == 0);
  CHECK_FALSE(invalid.fits(std::numeric_limits<std::size_t>::max()));
  CHECK(invalid.required_bytes() == std::numeric_limits<std::size_t>::max());
  CHECK_FALSE(f32({-3}).valid());
  CHECK_FALSE(f32({kHuge, kHuge}).valid());
}

TEST_CASE("dense_like gives copied-input slots a dense layout that holds each element once", "[layout][host]") {
  const Layout overlapping = restrided(f32({5}), 0, {3, 3}, {1, 1});
  CHECK_FALSE(overlapping.is_injective_apart_from_broadcast());
  const Layout slot = overlapping.dense_like();
  CHECK(slot.is_injective_apart_from_broadcast());
  CHECK(slot.is_dense());
  CHECK(slot.required_bytes() == 9 * 4);

  const Layout reversed = restrided(f32({4}), 3, {4}, {-1}).dense_like();
  CHECK(reversed.strides()[0] == 1);
  CHECK(reversed.offset() == 0);

  // A dense permutation (a transpose) gets its own strides back: replays copy it with one memcpy.
  const Layout transposed = f32({2, 3}).transposed();
  CHECK(transposed.dense_like().strides()[0] == transposed.strides()[0]);
  CHECK(transposed.dense_like().strides()[1] == transposed.strides()[1]);

  // Broadcast dimensions stay broadcast (the shape key says which); the rest is dense.
  const std::array<std::int64_t, 2> sizes{4, 3};
  const Layout broadcast = f32({3}).expand(sizes);
  CHECK(broadcast.dense_like().expanded_dims() == broadcast.expanded_dims());
  CHECK(broadcast.dense_like().required_bytes() == 3 * 4);
}

// --- Sizes --------------------------------------------------------------------------------------

TEST_CASE("Buffer::make refuses sizes whose byte count overflows or is negative with invalid_argument",
          "[sizes][host]") {
  for (const std::vector<std::int64_t>& sizes :
       {std::vector<std::int64_t>{kHuge + 1}, std::vector<std::int64_t>{-1}, std::vector<std::int64_t>{4, -2},
        std::vector<std::int64_t>{std::int64_t{1} << 31, std::int64_t{1} << 31, std::int64_t{1} << 31},
        std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 1}}) {
    auto made = Buffer::make(ElementType::f32, sizes);
    REQUIRE_FALSE(made);
    CHECK(made.error().code == Errc::invalid_argument);
    CHECK_THAT(made.error().message, ContainsSubstring("Buffer::make"));
  }
  CHECK(must(Buffer::make(ElementType::f64, {0})).numel() == 0);
}

TEST_CASE("Context::allocate with a bad size fails the call with invalid_argument and frees the call's blocks",
          "[sizes][host]") {
  auto pool = make_pool();
  auto f = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer first = ctx.allocate(ElementType::f32, {64});  // allocated before the bad one
        if (in.scalar(0) != 0) {
          const std::int64_t size = in.scalar(0);
          (void)ctx.allocate(ElementType::f32, {size});
        }
        return Values{first};
      },
      {.name = "bad_size"}));
  const std::size_t blocks_before = pool.live_blocks().size();
  const std::size_t bytes_before = pool.memory().allocated_bytes;
  // Every kind of call: warm-up, then recording (the first good call records after one warm-up).
  for (const std::int64_t bad : {kHuge + 1, std::int64_t{-5}}) {
    auto out = f({bad});
    REQUIRE_FALSE(out);
    CHECK(out.error().code == Errc::invalid_argument);
    CHECK(pool.live_blocks().size() == blocks_before);
    CHECK(pool.memory().allocated_bytes == bytes_before);
  }
  (void)must(f({std::int64_t{0}}));  // warm-up works after the failures
}

// --- Copied inputs with hostile strides (item 3) -------------------------------------------------

TEST_CASE("a copied input with overlapping strides reads right and its slot holds each element once",
          "[copied_inputs][host]") {
  auto pool = make_pool();
  auto seen = std::make_shared<std::vector<std::int64_t>>();
  auto f = twice(pool, seen);
  const Buffer storage = iota({5});
  const Buffer overlapping = view(storage, 0, {3, 3}, {1, 1});  // rows 1 2 3 / 2 3 4 / 3 4 5
  for (int call = 0; call < 4; ++call) {
    storage.set(0, 10 + call);  // new data each call: replays must copy it
    auto out = must(f({overlapping}));
    CHECK(values_of(must(out.get(0)).get()) == doubled(overlapping));
  }
  CHECK(pool.stats().replays >= 1);
  REQUIRE(seen->size() == 2);
  CHECK(*seen == std::vector<std::int64_t>{3, 1});  // the recording saw a dense, injective slot
  // A plain input of the same sizes afterwards reads its own values.
  const Buffer plain = iota({3, 3}, 100);
  for (int call = 0; call < 3; ++call) {
    auto out = must(f({plain}));
    CHECK(values_of(must(out.get(0)).get()) == doubled(plain));
  }
}

// A dimension of size 1 is never stepped along: its stride says nothing about the data, and a
// view of one element ([1], stride 8: a column of a prompt) shares the graph of a fresh one.
TEST_CASE("the stride of a size-1 dimension does not split graphs", "[copied_inputs][host]") {
  auto pool = make_pool();
  auto f = twice(pool);
  const Buffer storage = iota({16});
  for (int call = 0; call < 6; ++call) {
    const Buffer column = view(storage, call, {1, 2}, {8, 1});  // elements call, call + 1
    const Buffer fresh = iota({1, 2}, 100 + call);
    const Buffer& x = call % 2 == 0 ? column : fresh;
    auto out = must(f({x}));
    CHECK(values_of(must(out.get(0)).get()) == doubled(x));
  }
  const cgt::Stats stats = pool.stats();
  CHECK(stats.warmups == 1);
  CHECK(stats.recordings == 1);
  CHECK(stats.replays == 4);
}

TEST_CASE("a copied input with a negative stride is copied inside its slot, never before it", "[copied_inputs][host]") {
  auto pool = make_pool();
  auto seen = std::make_shared<std::vector<std::int64_t>>();
  auto f = twice(pool, seen);
  const Buffer storage = iota({6});
  const Buffer reversed = view(storage, 5, {2, 3}, {-3, -1});  // 6 5 4 / 3 2 1
  for (int call = 0; call < 4; ++call) {
    storage.set(5, 60 + call);
    auto out = must(f({reversed}));
    CHECK(values_of(must(out.get(0)).get()) == doubled(reversed));
  }
  CHECK(pool.stats().replays >= 1);
  CHECK(*seen == std::vector<std::int64_t>{3, 1});
  REQUIRE(pool.check_memory().has_value());
}

TEST_CASE("a copied input whose view reaches outside its storage fails with invalid_argument",
          "[copied_inputs][host]") {
  auto pool = make_pool({.skip_warmup = true});
  const Buffer small = iota({4});
  const std::size_t blocks_before = pool.live_blocks().size();
  for (const Buffer& bad : {view(small, 0, {8}, {1}), view(small, 0, {4}, {-1}),
                            view(small, 0, {2, 2}, {1, 1}).with_layout(small.layout().select(9))}) {
    auto f = must(pool.add_function(  // a function per view: the first call fixes the rank
        [](Context& ctx, Inputs in) {
          Buffer y = ctx.allocate(ElementType::f32, in[0].sizes());  // reads nothing of in[0]
          return Values{y};
        },
        {.name = "ignores_its_input"}));
    auto out = f({bad});
    REQUIRE_FALSE(out);
    CHECK(out.error().code == Errc::invalid_argument);
    CHECK(pool.live_blocks().size() == blocks_before);
  }
}

// --- Zero-element outputs (item 17) --------------------------------------------------------------

// Returns {2 x, an empty buffer of the pool} when `with_empty`, else {2 x}.
cgt::host::Function twice_and_empty(cgt::host::Pool& pool, bool with_empty) {
  return must(pool.add_function(
      [with_empty](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate(ElementType::f32, in[0].sizes());
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        if (!with_empty) return Values{y};
        return Values{y, ctx.allocate(ElementType::f32, {0, 3})};
      },
      {.name = with_empty ? "with_empty" : "without_empty"}));
}

TEST_CASE("a held empty output does not stop the next call from replaying", "[empty_outputs][host]") {
  auto pool = make_pool();
  auto f = twice_and_empty(pool, true);
  const Buffer x = iota({4});
  std::vector<cgt::host::OutputLease> held;
  for (int call = 0; call < 6; ++call) {
    auto out = must(f({x}));
    CHECK(values_of(must(out.get(0)).get()) == doubled(x));
    const Buffer& empty = must(out.get(1)).get();
    CHECK(empty.numel() == 0);
    CHECK(empty.sizes()[1] == 3);
    held.push_back(must(out.release(1)));  // keep only the empty output
  }
  // Warm-up, recording, then replays only: the held empty outputs change no liveness pattern.
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().replays == 4);
  // And they hold no pool memory.
  for (const auto& lease : held) {
    CHECK_FALSE(pool.device()->get().arena().contains(
        reinterpret_cast<std::uintptr_t>(must(lease.get()).get().storage())));  // NOLINT
  }
}

TEST_CASE("empty outputs are not counted in live_blocks", "[empty_outputs][host]") {
  auto with = make_pool();
  auto without = make_pool();
  auto f = twice_and_empty(with, true);
  auto g = twice_and_empty(without, false);
  const Buffer x = iota({4});
  for (int call = 0; call < 4; ++call) {
    auto a = must(f({x}));
    auto b = must(g({x}));
    CHECK(with.live_blocks().size() == without.live_blocks().size());
    CHECK(with.memory().allocated_bytes == without.memory().allocated_bytes);
  }
  CHECK(with.stats().recordings == without.stats().recordings);
  CHECK(with.stats().replays == without.stats().replays);
}

// --- Exceptions (item 9) -------------------------------------------------------------------------

TEST_CASE(
    "a kernel that throws a non-std::exception in the recording's first run fails the call and frees its "
    "blocks",
    "[exceptions][host]") {
  auto pool = make_pool();
  auto throwing = std::make_shared<bool>(false);
  auto f = must(pool.add_function(
      [throwing](Context& ctx, Inputs in) {
        Buffer temp = ctx.allocate(ElementType::f32, in[0].sizes());
        Buffer y = ctx.allocate(ElementType::f32, in[0].sizes());
        ctx.launch([throwing, x = in[0], temp, y] {
          if (*throwing) throw 42;  // NOLINT(hicpp-exception-baseclass): the point of the test
          for (std::size_t i = 0; i < x.numel(); ++i) temp.set(i, x.get(i));
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * temp.get(i));
        });
        return Values{y};
      },
      {.name = "throws_int"}));
  const Buffer x = iota({8});
  (void)must(f({x}));  // warm-up: the kernel runs inside the function, does not throw
  const std::size_t blocks_before = pool.live_blocks().size();
  const std::size_t bytes_before = pool.memory().allocated_bytes;
  *throwing = true;
  std::optional<cgt::Error> error;
  REQUIRE_NOTHROW([&] {
    auto out = f({x});  // the recording's first run throws 42
    if (!out) error = out.error();
  }());
  REQUIRE(error.has_value());
  CHECK(error->code == Errc::function_failed);
  CHECK(pool.live_blocks().size() == blocks_before);
  CHECK(pool.memory().allocated_bytes == bytes_before);
  *throwing = false;
  for (int call = 0; call < 3; ++call) {
    auto good = must(f({x}));
    CHECK(values_of(must(good.get(0)).get()) == doubled(x));
  }
}

// --- What the backend tells the engine (items 5 and 17, Device::owns) -----------------------------

struct DirectRun {
  cgt::host::Pool host = must(cgt::host::make_pool());
  cgt::backend::Device& device = cgt::backend::device_of(host);  // the engine's side, as the engine calls it
  std::unique_ptr<cgt::backend::Invoker> invoker;

  explicit DirectRun(cgt::host::Callable fn) : invoker(cgt_test::BackendOf<cgt::host::Pool>::make_invoker(std::move(fn))) {}
  cgt::Result<cgt::backend::RunResult> warmup(const Buffer& input) {
    const std::array<cgt::backend::ArgSlot, 1> args{cgt::backend::ArgSlot{.value = &input}};
    return device.run(*invoker, args, cgt::backend::RunMode::warmup);
  }
};

TEST_CASE("an output kept from an earlier call is reported as pool memory the call did not allocate",
          "[allocated_in_call][host]") {
  auto kept = std::make_shared<Buffer>();
  DirectRun direct([kept](Context& ctx, Inputs /*in*/) {
    if (kept->empty()) *kept = ctx.allocate(ElementType::f32, {16});  // "allocate once and cache it"
    return Values{*kept, ctx.allocate(ElementType::f32, {16})};
  });
  const Buffer x = iota({4});
  auto first = must(direct.warmup(x));
  CHECK(first.outputs[0].in_pool);
  CHECK(first.outputs[0].allocated_in_call);
  auto second = must(direct.warmup(x));
  CHECK(second.outputs[0].in_pool);
  CHECK_FALSE(second.outputs[0].allocated_in_call);  // the engine refuses this unless a live output
  CHECK(second.outputs[1].allocated_in_call);
}

TEST_CASE("a pool input returned as an output is reported as not allocated in the call", "[allocated_in_call][host]") {
  DirectRun make_one([](Context& ctx, Inputs /*in*/) { return Values{ctx.allocate(ElementType::f32, {4})}; });
  DirectRun pass_through([](Context& /*ctx*/, Inputs in) { return Values{in[0]}; });
  const Buffer x = iota({4});
  auto made = must(make_one.warmup(x));
  const Buffer& in_pool = *static_cast<const Buffer*>(made.values[0]);
  CHECK(make_one.device.owns(reinterpret_cast<std::uintptr_t>(in_pool.storage())));  // NOLINT
  CHECK_FALSE(make_one.device.owns(reinterpret_cast<std::uintptr_t>(x.storage())));  // NOLINT
  // Another device's run of it: not its pool memory at all.
  auto passed = must(pass_through.warmup(in_pool));
  CHECK_FALSE(passed.outputs[0].in_pool);
  CHECK_FALSE(passed.outputs[0].allocated_in_call);
}

TEST_CASE("a zero-element output is reported as not in the pool and keeps no block", "[empty_outputs][host]") {
  DirectRun direct([](Context& ctx, Inputs /*in*/) {
    return Values{ctx.allocate(ElementType::f32, {0}), ctx.allocate(ElementType::f32, {2})};
  });
  const Buffer x = iota({4});
  auto result = must(direct.warmup(x));
  CHECK(result.outputs[0].kind == cgt::backend::OutputKind::value);
  CHECK_FALSE(result.outputs[0].in_pool);
  CHECK(result.outputs[0].storage_bytes == 0);
  CHECK(result.outputs[1].in_pool);
  CHECK(direct.device.live_blocks().size() == 1);  // only the non-empty output's block
}

TEST_CASE("an output view reaching outside its block fails the call with invalid_argument", "[sizes][host]") {
  DirectRun direct([](Context& ctx, Inputs /*in*/) {
    const Buffer y = ctx.allocate(ElementType::f32, {4});
    const std::array<std::int64_t, 1> sizes{1000};
    const std::array<std::int64_t, 1> strides{1};
    return Values{y.restrided(0, sizes, strides)};
  });
  const Buffer x = iota({4});
  auto result = direct.warmup(x);
  REQUIRE_FALSE(result);
  CHECK(result.error().code == Errc::invalid_argument);
  CHECK(direct.device.live_blocks().empty());
}

}  // namespace
