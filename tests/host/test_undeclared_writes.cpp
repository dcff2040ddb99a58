// Writes to inputs that FunctionOptions::mutated_inputs does not list. A graph reads a caller's
// input through a copy in a slot, so such a write would go to the slot and never reach the
// caller: the host backend sees it (the input's bytes changed) and the engine treats the input as
// mutated from then on. Every case checks the caller's input after each call, as eager code
// would leave it, and which calls replayed or ran eagerly.
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {

// Counts the warnings that name an undeclared write.
struct WriteWarnings {
  int count = 0;
  cgt::LogSink sink() {
    return [this](const cgt::Event& event) {
      if (event.kind == cgt::EventKind::warning && event.reason == cgt::Reason::undeclared_write) ++count;
    };
  }
};

cgt::host::Pool make_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  return host_test::poisoned_pool(std::move(options));
}

// x += 1 in place (input 0, never declared), and y = 2 * x after the write.
cgt::host::Function bump_and_double(cgt::host::Pool& pool, cgt::FunctionOptions options) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate(in[0].type(), in[0].sizes());
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) {
            x.set(i, x.get(i) + 1);
            y.set(i, 2 * x.get(i));
          }
        });
        return Values{y};
      },
      std::move(options)));
}

// y = x + 1, a fresh pool output (to pass back in as pool memory).
cgt::host::Function plus_one(cgt::host::Pool& pool) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate(in[0].type(), in[0].sizes());
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      {.name = "plus_one"}));
}

}  // namespace

TEST_CASE("an undeclared write seen in a warm-up makes the input mutated: later calls run eagerly, none loses it",
          "[host][writes]") {
  WriteWarnings warnings;
  auto pool = make_pool({.log_sink = warnings.sink()});
  auto f = bump_and_double(pool, {.name = "bump"});
  const Buffer x = filled({4}, 1);
  for (int call = 1; call <= 4; ++call) {
    auto out = must(f({x}));
    CHECK(values_of(x) == repeat(1 + call));  // the caller's input saw every write
    CHECK(output_values(out, 0) == repeat(2 * (1 + call)));
    CHECK(out.kind() == (call == 1 ? K::warmup : K::eager));
  }
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().count(cgt::Reason::mutated_input) == 3);
  CHECK(warnings.count == 1);  // said once, when seen
  CHECK(pool.stats().count(cgt::Reason::undeclared_write) == 1);
  CHECK(cgt::to_string(cgt::Reason::undeclared_write) == "undeclared_write");
}

TEST_CASE("an undeclared write seen while recording is the call's one run: carried to the input, no graph kept",
          "[host][writes]") {
  // No warm-up: the first call records, and the write goes to the slot. The graph's first run is
  // the call's run: its write is copied back to the caller's input, and nothing runs it again.
  auto pool = make_pool({.skip_warmup = true});
  auto f = bump_and_double(pool, {.name = "bump"});
  const Buffer x = filled({4}, 1);
  {
    auto first = must(f({x}));
    CHECK(first.kind() == K::warmup);  // the graph ran once and is not kept
    CHECK(values_of(x) == repeat(2));  // written once
    CHECK(output_values(first, 0) == repeat(4));
  }
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().recordings_not_kept == 1);
  CHECK(pool.memory().allocated_bytes == 0);  // the output went with its lease, the slot with the graph
  CHECK(pool.check_memory());
  auto second = must(f({x}));
  CHECK(second.kind() == K::eager);
  CHECK(values_of(x) == repeat(3));
}

TEST_CASE("an undeclared write to a static input keeps the graph, which writes it in place on every replay",
          "[host][writes]") {
  WriteWarnings warnings;
  auto pool = make_pool({.log_sink = warnings.sink()});
  auto f = bump_and_double(pool, {.name = "bump", .static_inputs = {0}});
  const Buffer cache = filled({4}, 0);
  for (int call = 1; call <= 5; ++call) {
    auto out = must(f({cache}));
    CHECK(values_of(cache) == repeat(call));
    CHECK(output_values(out, 0) == repeat(2 * call));
    if (call > 2) CHECK(out.kind() == K::replay);
  }
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
  CHECK(warnings.count == 1);  // it now counts as mutated: a copied cache would run eagerly
}

TEST_CASE("a write to a pool output passed in replays in place; a caller's buffer in its place then runs eagerly",
          "[host][writes]") {
  auto pool = make_pool();
  auto make = plus_one(pool);
  auto f = bump_and_double(pool, {.name = "bump"});
  for (int step = 0; step < 3; ++step) {
    pool.mark_step_begin();
    auto made = must(make({filled({4}, 1)}));  // 2
    auto out = must(f({must(made.get(0))}));   // the pool output goes to 3, y = 6
    CHECK(values_of(must(made.get(0)).get()) == repeat(3));
    CHECK(output_values(out, 0) == repeat(6));
    if (step == 2) CHECK(out.kind() == K::replay);
  }
  // Now a caller's buffer where the pool output was: a graph would copy it into a slot.
  pool.mark_step_begin();
  auto made = must(make({filled({4}, 1)}));
  const Buffer x = filled({4}, 10);
  auto out = must(f({x}));
  CHECK(out.kind() == K::warmup);  // recorded with a slot, ran once, the write carried back, not kept
  CHECK(values_of(x) == repeat(11));
  CHECK(output_values(out, 0) == repeat(22));
  auto again = must(f({x}));
  CHECK(again.kind() == K::eager);
  CHECK(values_of(x) == repeat(12));
}

TEST_CASE("an undeclared write to a padded input reaches the caller's rows, and later padded calls run eagerly",
          "[host][writes][buckets]") {
  auto pool = make_pool();
  auto f = bump_and_double(pool, {.name = "bump", .buckets = {.sizes = {4, 8}, .pad = {}, .per_input = {}}});
  // Size 3 pads to 4: the warm-up runs on the padded copy, and the write is copied back.
  Buffer x = must(Buffer::make(cgt::ElementType::f32, {3, 2}));
  x.fill(1);
  auto first = must(f({x}));
  CHECK(first.kind() == K::warmup);
  CHECK(values_of(x) == repeat(2, 6));
  CHECK(output_values(first, 0) == repeat(4, 6));  // sliced back to 3 rows
  auto second = must(f({x}));
  CHECK(second.kind() == K::eager);
  CHECK(values_of(x) == repeat(3, 6));
  CHECK(output_values(second, 0) == repeat(6, 6));
  CHECK(pool.stats().recordings == 0);
}

TEST_CASE("an undeclared write to a padded input seen while recording reaches the caller's input once",
          "[host][writes][buckets]") {
  auto pool = make_pool({.skip_warmup = true});
  auto f = bump_and_double(pool, {.name = "bump", .buckets = {.sizes = {4}, .pad = {}, .per_input = {}}});
  Buffer x = must(Buffer::make(cgt::ElementType::f32, {3, 2}));
  x.fill(5);
  // The padded copy goes to a slot: the write is carried to the padded copy, then to the caller's rows.
  auto first = must(f({x}));
  CHECK(first.kind() == K::warmup);
  CHECK(values_of(x) == repeat(6, 6));
  CHECK(output_values(first, 0) == repeat(12, 6));
  auto at_bucket = must(f({must(Buffer::make(cgt::ElementType::f32, {4, 2}))}));
  CHECK(at_bucket.kind() == K::eager);  // mutated, and not pool memory
  CHECK(pool.stats().recordings == 0);
}

TEST_CASE("a declared mutated input gives no warning, and a function that only reads its inputs is not flagged",
          "[host][writes]") {
  WriteWarnings warnings;
  auto pool = make_pool({.log_sink = warnings.sink()});
  auto declared = bump_and_double(pool, {.name = "declared", .mutated_inputs = {0}});
  auto reader = plus_one(pool);
  const Buffer x = filled({4}, 1);
  for (int call = 0; call < 3; ++call) {
    (void)must(declared({x}));
    auto out = must(reader({filled({4}, 7)}));
    if (call == 2) CHECK(out.kind() == K::replay);
  }
  CHECK(values_of(x) == repeat(4));
  CHECK(warnings.count == 0);
}
