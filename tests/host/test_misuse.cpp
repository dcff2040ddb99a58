// The engine's promise under misuse (no silent wrong data, no crash, no leak): each case is a
// sequence a careless or hostile user can write, and the value or Errc they must get.
#include "host/host_test.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using scenario::HostTensor;
namespace {

Buffer iota(std::vector<std::int64_t> sizes) {
  return HostHarness::make(HostTensor::iota(std::move(sizes)));
}

// y = x + add, element by element in row-major order of x's sizes (honouring its strides).
cgt::host::Function plus(cgt::host::Pool& pool, double add, cgt::FunctionOptions options) {
  return must(pool.add_function(
      [add](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate(in[0].type(), in[0].sizes());
        ctx.launch([x = in[0], y, add] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + add);
        });
        return Values{y};
      },
      std::move(options)));
}

cgt::host::Pool make_pool(cgt::Options options = {}) {
  cgt::host::PoolOptions pool_options;
  pool_options.tree = std::move(options);
  pool_options.poison_dead_memory = true;
  return must(cgt::host::make_pool(std::move(pool_options)));
}

}  // namespace

TEST_CASE("an eager call returning a view of a pool output keeps that memory live", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 1, {.name = "make"});
  // Runs eagerly on every call (its size is never in the allow-list) and returns a view of its input.
  auto view = must(pool.add_function([](Context&, Inputs in) { return Values{in[0].slice(0, 2)}; },
                                     {.name = "view", .graph_sizes = {99}}));
  for (int step = 0; step < 3; ++step) {  // warm-up, recording, replay
    pool.mark_step_begin();
    (void)must(make({filled({4}, 1)}));
  }
  pool.mark_step_begin();
  auto made = must(make({filled({4}, 1)}));
  auto viewed = must(view({must(made.get(0))}));
  CHECK(viewed.kind() == cgt::CallKind::eager);
  made.reset();                              // the eager view is now the only claim on the memory
  auto next = must(make({filled({4}, 7)}));  // records beside the view, never over it
  CHECK(output_values(viewed, 0) == std::vector<double>{2, 2});
  CHECK(output_values(next, 0) == std::vector<double>{8, 8, 8, 8});
  must(pool.check_memory());
  pool.mark_step_begin();
  (void)must(make({filled({4}, 3)}));
  auto stale = viewed.get(0);  // reclaimed with the output it views, like any lease on it
  REQUIRE(!stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
}

TEST_CASE("a static input passed transposed at the same address replays a graph of its own layout", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto copy = plus(pool, 0, {.name = "copy", .static_inputs = {0}});
  const Buffer matrix = iota({2, 2});  // [[0, 1], [2, 3]]
  const std::int64_t sizes[] = {2, 2};
  const std::int64_t strides[] = {1, 2};
  const Buffer transposed = matrix.restrided(0, sizes, strides);
  for (int step = 0; step < 3; ++step) {
    pool.mark_step_begin();
    CHECK(output_values(must(copy({matrix})), 0) == std::vector<double>{0, 1, 2, 3});
  }
  for (int step = 0; step < 3; ++step) {
    pool.mark_step_begin();
    auto out = must(copy({transposed}));
    CHECK(output_values(out, 0) == std::vector<double>{0, 2, 1, 3});
  }
  pool.mark_step_begin();
  auto again = must(copy({matrix}));
  CHECK(again.kind() == cgt::CallKind::replay);
  CHECK(output_values(again, 0) == std::vector<double>{0, 1, 2, 3});
}

TEST_CASE("a pool output passed transposed replays a graph of its own layout", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 0, {.name = "make"});
  auto copy = plus(pool, 0, {.name = "copy"});
  const std::int64_t sizes[] = {2, 2};
  const std::int64_t strides[] = {1, 2};
  for (int step = 0; step < 6; ++step) {
    pool.mark_step_begin();
    auto made = must(make({iota({2, 2})}));
    const Buffer& m = must(made.get(0)).get();
    const bool transpose = step >= 3;
    auto out = must(copy({transpose ? m.restrided(0, sizes, strides) : m}));
    CHECK(output_values(out, 0) == (transpose ? std::vector<double>{0, 2, 1, 3} : std::vector<double>{0, 1, 2, 3}));
  }
}

TEST_CASE("a call mutating a caller's buffer runs eagerly, also right after a failed recording", "[host]") {
  auto pool = make_pool({.skip_warmup = true, .debug_checks = true});
  auto make = plus(pool, 0, {.name = "make"});
  bool should_throw = false;
  auto bump = must(pool.add_function(
      [&should_throw](Context& ctx, Inputs in) {
        if (should_throw) throw std::runtime_error("boom");
        ctx.launch([x = in[0]] {
          for (std::size_t i = 0; i < x.numel(); ++i) x.set(i, x.get(i) + 1);
        });
        return Values{};
      },
      {.name = "bump", .mutated_inputs = {0}}));
  auto made = must(make({filled({4}, 1)}));  // recorded: the path is recording
  should_throw = true;
  auto failed = bump({must(made.get(0))});  // pool memory: would record, but throws
  REQUIRE(!failed);
  CHECK(failed.error().code == cgt::Errc::function_failed);
  should_throw = false;
  const Buffer mine = filled({4}, 5);
  auto out = must(bump({mine}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(values_of(mine) == std::vector<double>{6, 6, 6, 6});  // mutated in place, not in a slot
  CHECK(pool.stats().count(cgt::Reason::mutated_input) == 1);
}

TEST_CASE("a log sink that throws never escapes a call", "[host]") {
  auto pool = make_pool({.log_sink = [](const cgt::Event&) { throw 42; }});
  auto f = plus(pool, 1, {.name = "f", .graph_sizes = {99}});
  auto out = f({filled({2}, 1)});  // a logged fallback
  REQUIRE(out);
  CHECK(output_values(*out, 0) == std::vector<double>{2, 2});
  CHECK(pool.stats().log_sink_failures == 1);
  CHECK(pool.stats().count(cgt::Reason::size_not_graphed) == 1);
}

TEST_CASE("a function that drops its own pool's last handles while running", "[host]") {
  struct Handles {
    std::optional<cgt::host::Pool> pool;
    std::optional<cgt::host::Function> self;
  };
  auto handles = std::make_shared<Handles>();
  handles->pool = make_pool({.debug_checks = true});
  handles->self = must(handles->pool->add_function(
      [weak = std::weak_ptr<Handles>(handles)](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] { y.set(0, x.get(0) * 3); });
        if (auto owner = weak.lock()) owner->pool.reset();  // the pool handle goes mid-call
        return Values{y};
      },
      {.name = "suicidal"}));
  // The Function handle is moved out of reach and dropped inside the call too: the call holds on.
  cgt::host::Function f = std::move(*handles->self);
  handles->self.reset();
  auto out = must(f({filled({1}, 2)}));
  CHECK(output_values(out, 0) == std::vector<double>{6});
  {
    const cgt::host::Function gone = std::move(f);
  }  // the last handle but the output's lease
  CHECK(output_values(out, 0) == std::vector<double>{6});
}

TEST_CASE("a lease dropped inside a function that then throws leaves nothing allocated", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 0, {.name = "make"});
  std::optional<cgt::host::Outputs> held;
  auto drop_then_throw = must(pool.add_function(
      [&held](Context& ctx, Inputs in) -> Values {
        Buffer y = ctx.allocate_like(in[0]);
        held.reset();                      // the caller's output dies mid-call...
        throw std::runtime_error("boom");  // ...and the call fails
      },
      {.name = "drop_then_throw"}));
  for (int step = 0; step < 3; ++step) {  // warm-up, then recording, then replay of `make`
    pool.mark_step_begin();
    held = must(make({filled({4}, 1)}));
    auto failed = drop_then_throw({filled({4}, 1)});
    REQUIRE(!failed);
    CHECK(failed.error().code == cgt::Errc::function_failed);
    CHECK(pool.live_blocks().empty());  // the dropped output's block was freed, not restored
    must(pool.check_memory());
  }
}

TEST_CASE("shutdown() releases functions that hold handles of their own pool", "[host]") {
  auto pool = make_pool();
  auto sentinel = std::make_shared<int>(0);
  const std::weak_ptr<int> watch = sentinel;
  auto self = std::make_shared<std::optional<cgt::host::Function>>();
  *self = must(pool.add_function(
      [self, sentinel](Context&, Inputs in) {  // a cycle: the callable holds its own Function
        return Values{in[0]};
      },
      {.name = "cyclic"}));
  sentinel.reset();
  self.reset();
  CHECK(!watch.expired());
  must(pool.shutdown());
  CHECK(watch.expired());  // the callable, and the Function it held, are gone
}

TEST_CASE("with copy_out_on_new_step, a copy goes with the last lease on it", "[host]") {
  auto pool = make_pool({.copy_out_on_new_step = true});
  auto make = plus(pool, 1, {.name = "make"});
  auto kept = must(make({filled({1024}, 1)}));
  pool.mark_step_begin();
  (void)must(make({filled({1024}, 2)}));  // reclaims `kept`, copying it out
  const Buffer& copy = must(kept.get(0)).get();
  CHECK(copy.get(0) == 2);
  // The lease's value owns the copy alone: the node keeps no second reference to it.
  CHECK(copy.owner().use_count() == 1);
}

TEST_CASE("mark_step_begin() inside a pool function takes effect at the next call", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 1, {.name = "make"});
  cgt::host::Pool* self = &pool;
  auto step_inside = must(pool.add_function(
      [self](Context& ctx, Inputs in) {
        self->mark_step_begin();
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] { y.set(0, x.get(0)); });
        return Values{y};
      },
      {.name = "step_inside"}));
  auto held = must(make({filled({1}, 1)}));
  (void)must(step_inside({filled({1}, 1)}));
  (void)must(make({filled({1}, 5)}));  // the step begun inside reclaims `held` now
  auto stale = held.get(0);
  REQUIRE(!stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
}

TEST_CASE("contradictory options are refused when the pool is made", "[host]") {
  auto pool = cgt::host::make_pool({.tree = {.skip_warmup = true, .force_warmup = true}});
  REQUIRE(!pool);
  CHECK(pool.error().code == cgt::Errc::invalid_argument);
  CHECK(pool.error().message.find("skip_warmup") != std::string::npos);
}

TEST_CASE("leases dropped on another thread while the pool is in a call", "[host][threads]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 1, {.name = "make"});
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<cgt::host::Outputs> to_drop;
  bool done = false;
  std::thread dropper([&] {
    for (;;) {
      std::unique_lock lock(mutex);
      ready.wait(lock, [&] { return done || !to_drop.empty(); });
      if (to_drop.empty()) return;
      cgt::host::Outputs out = std::move(to_drop.front());
      to_drop.pop_front();
      lock.unlock();
      out.reset();  // races with the main thread's calls unless drops are guarded
    }
  });
  for (int i = 0; i < 2000; ++i) {
    if (i % 7 == 0) pool.mark_step_begin();
    auto out = must(make({filled({8}, i)}));
    CHECK(output_values(out, 0)[7] == i + 1);
    const std::lock_guard lock(mutex);
    to_drop.push_back(std::move(out));
    ready.notify_one();
  }
  {
    const std::lock_guard lock(mutex);
    done = true;
    ready.notify_one();
  }
  dropper.join();
  (void)must(make({filled({8}, 0)}));  // applies what the dropper deferred, then checks the pool
  must(pool.check_memory());
}

TEST_CASE("a function returning a pool buffer it kept from an earlier call fails", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  std::optional<Buffer> cached;  // the "allocate once and reuse it" pattern, wrong in a pool
  auto cache = must(pool.add_function(
      [&cached](Context& ctx, Inputs in) {
        if (!cached) {
          cached = ctx.allocate_like(in[0]);
          ctx.launch([x = in[0], y = *cached] { y.set(0, x.get(0)); });
        }
        return Values{*cached};  // later calls hand back the same block (writing it would be a wild write)
      },
      {.name = "cache"}));
  auto other = plus(pool, 0, {.name = "other"});
  auto first = must(cache({filled({4}, 1)}));  // allocated in this call: fine
  first.reset();
  auto held = must(other({filled({4}, 7)}));  // may reuse the dead block
  for (int i = 0; i < 2; ++i) {
    auto again = cache({filled({4}, 2)});
    REQUIRE(!again);
    CHECK(again.error().code == cgt::Errc::function_failed);
    CHECK(again.error().message.find("neither allocated nor received") != std::string::npos);
    CHECK(output_values(held, 0) == std::vector<double>{7, 7, 7, 7});  // never handed out twice
    must(pool.check_memory());
  }
}

TEST_CASE("an escaped copy of an output, passed back after its memory was reclaimed, is output_overwritten", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 1, {.name = "make"});
  auto use = plus(pool, 0, {.name = "use"});
  Buffer escaped;
  {
    auto out = must(make({filled({4}, 1)}));
    escaped = must(out.get(0)).get();  // a copy of the view outlives the lease
  }
  (void)must(make({filled({4}, 5)}));  // the memory is the pool's again
  auto stale = use({escaped});
  REQUIRE(!stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
  CHECK(stale.error().input == 0);
  // The same value while its lease lives is an ordinary pool-managed input.
  auto live = must(make({filled({4}, 1)}));
  CHECK(output_values(must(use({must(live.get(0))})), 0) == std::vector<double>{2, 2, 2, 2});
}

TEST_CASE("an escaped copy is refused even when its memory lives again for a newer output", "[host]") {
  auto pool = make_pool({.debug_checks = true});
  auto make = plus(pool, 1, {.name = "make"});
  auto use = plus(pool, 0, {.name = "use"});
  for (int step = 0; step < 3; ++step) {  // warm-up, recording, replay: `make` now replays
    pool.mark_step_begin();
    (void)must(make({filled({4}, 1)}));
  }
  pool.mark_step_begin();
  Buffer escaped;
  {
    auto out = must(make({filled({4}, 1)}));
    escaped = must(out.get(0)).get();
  }
  pool.mark_step_begin();
  auto newer = must(make({filled({4}, 5)}));  // a replay: the same memory, alive again for `newer`
  REQUIRE(newer.kind() == cgt::CallKind::replay);
  REQUIRE(must(newer.get(0)).get().storage() == escaped.storage());
  auto stale = use({escaped});  // reads 6s where it was handed 2s: refused
  REQUIRE(!stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
  CHECK(output_values(must(use({must(newer.get(0))})), 0) == std::vector<double>{6, 6, 6, 6});
  const Buffer slice = must(newer.get(0)).get().slice(1, 3);  // a view of a live value keeps its life number
  CHECK(output_values(must(use({slice})), 0) == std::vector<double>{6, 6});
}

TEST_CASE("static_input_moved names every static input that moved", "[host]") {
  auto pool = make_pool({.on_static_input_moved = cgt::OnStaticInputMoved::error});
  auto sum = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([a = in[0], b = in[1], c = in[2], y] { y.set(0, a.get(0) + b.get(0) + c.get(0)); });
        return Values{y};
      },
      {.name = "sum", .static_inputs = {0, 1, 2}}));
  const Buffer a = filled({1}, 1);
  const Buffer b = filled({1}, 2);
  const Buffer c = filled({1}, 3);
  for (int step = 0; step < 3; ++step) {
    pool.mark_step_begin();
    (void)must(sum({a, b, c}));
  }
  pool.mark_step_begin();
  auto moved = sum({filled({1}, 1), b, filled({1}, 3)});
  REQUIRE(!moved);
  CHECK(moved.error().code == cgt::Errc::static_input_moved);
  CHECK(moved.error().message.find("static input(s) 0, 2 of 'sum'") != std::string::npos);
}

TEST_CASE("output_overwritten names the ways to keep a value across steps", "[host]") {
  auto pool = make_pool();
  auto make = plus(pool, 1, {.name = "make"});
  auto held = must(make({filled({1}, 1)}));
  pool.mark_step_begin();
  (void)must(make({filled({1}, 2)}));
  auto stale = held.get(0);
  REQUIRE(!stale);
  CHECK(stale.error().message.find("take()") != std::string::npos);
  CHECK(stale.error().message.find("copy_out_on_new_step") != std::string::npos);
}

TEST_CASE("scalars of any integer type reach the function; an unsigned one too large is refused", "[host]") {
  auto pool = make_pool();
  auto add = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, k = in.scalar(1)] { y.set(0, x.get(0) + static_cast<double>(k)); });
        return Values{y};
      },
      {.name = "add"}));
  const Buffer x = filled({1}, 1);
  CHECK(output_values(must(add({x, 2})), 0) == std::vector<double>{3});
  CHECK(output_values(must(add({x, std::uint32_t{5}})), 0) == std::vector<double>{6});
  CHECK(output_values(must(add({x, std::size_t{7}})), 0) == std::vector<double>{8});
  CHECK(output_values(must(add({x, 9LL})), 0) == std::vector<double>{10});
  auto huge = add({x, std::uint64_t{1} << 63U});
  REQUIRE(!huge);
  CHECK(huge.error().code == cgt::Errc::invalid_argument);
  CHECK(huge.error().input == 1);
}
