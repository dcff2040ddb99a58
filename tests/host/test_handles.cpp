// The handles in every state a careless program can leave them in: moved from, after shutdown(),
// moved into a call that fails, borrowed from a temporary. Each gives a value or an Errc, never a
// crash, and a borrow that would dangle does not compile.
#include "host/host_test.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

using scenario::HostTensor;
namespace {

// y = 2 x, allocating in the pool; throws while `should_throw` is set.
cgt::host::Function twice(cgt::host::Pool& pool, const bool* should_throw = nullptr) {
  return must(pool.add_function(
      [should_throw](cgt::host::Context& ctx, cgt::host::Inputs in) {
        if (should_throw != nullptr && *should_throw) throw std::runtime_error("boom");
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = "twice"}));
}

double first_of(const cgt::host::OutputLease& lease) {
  return must(lease.get()).get().get(0);
}

// What a program can spell; checked by the compiler, in a template so that a spelling that does
// not compile reads as false instead of failing the build.
template <class R>
concept borrows_through_arrow = requires(R&& result) { std::forward<R>(result)->get(0); };
template <class R>
concept borrows_through_star = requires(R&& result) { (*std::forward<R>(result)).get(0); };
template <class R>
concept borrows_through_value = requires(R&& result) { std::forward<R>(result).value().get(0); };
template <class R>
concept takes_through_arrow = requires(R&& result) { std::forward<R>(result)->take(0); };
template <class R>
concept takes_through_star = requires(R&& result) { (*std::forward<R>(result)).take(0); };
template <class L>
concept lease_borrows = requires(L&& lease) { std::forward<L>(lease).get(); };
template <class L>
concept lease_takes = requires(L&& lease) { std::forward<L>(lease).take(); };
template <class R>
concept released_lease_borrows_through_arrow = requires(R&& result) { std::forward<R>(result)->get(); };
template <class R>
concept released_lease_takes_through_arrow = requires(R&& result) { std::forward<R>(result)->take(); };
template <class P>
concept reaches_device = requires(P&& pool) { std::forward<P>(pool).device(); };

using CallResult = decltype(std::declval<const cgt::host::Function&>()({}));
using Released = decltype(std::declval<cgt::host::Outputs&>().release(0));

}  // namespace

TEST_CASE("a call's result is a cgt::Result of Outputs", "[handles][host]") {
  STATIC_REQUIRE(std::is_convertible_v<CallResult, cgt::Result<cgt::host::Outputs>>);
  STATIC_REQUIRE(std::is_base_of_v<cgt::Result<cgt::host::Outputs>, CallResult>);
  STATIC_REQUIRE(std::is_base_of_v<cgt::Result<cgt::host::OutputLease>, Released>);
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  cgt::Result<cgt::host::Outputs> out = f({filled({4}, 1)});  // a plain Result keeps working
  REQUIRE(out);
  CHECK(must(out->get(0)).get().get(0) == 2);
}

TEST_CASE("borrowing from a temporary Outputs or OutputLease does not compile", "[handles][host]") {
  // Named results lend their values.
  STATIC_REQUIRE(borrows_through_arrow<CallResult&>);
  STATIC_REQUIRE(borrows_through_arrow<const CallResult&>);
  STATIC_REQUIRE(borrows_through_star<CallResult&>);
  STATIC_REQUIRE(borrows_through_value<CallResult&>);
  STATIC_REQUIRE(lease_borrows<cgt::host::OutputLease&>);
  STATIC_REQUIRE(lease_borrows<const cgt::host::OutputLease&>);
  STATIC_REQUIRE(released_lease_borrows_through_arrow<Released&>);
  STATIC_REQUIRE(reaches_device<cgt::host::Pool&>);
  // Temporaries do not: the borrow would dangle at the end of the statement.
  STATIC_REQUIRE(!borrows_through_arrow<CallResult>);
  STATIC_REQUIRE(!borrows_through_arrow<const CallResult>);
  STATIC_REQUIRE(!borrows_through_star<CallResult>);
  STATIC_REQUIRE(!borrows_through_value<CallResult>);
  STATIC_REQUIRE(!lease_borrows<cgt::host::OutputLease>);
  STATIC_REQUIRE(!lease_borrows<const cgt::host::OutputLease>);
  STATIC_REQUIRE(!released_lease_borrows_through_arrow<Released>);
  STATIC_REQUIRE(!reaches_device<cgt::host::Pool>);
  // A copy is the caller's: taking from a temporary is fine.
  STATIC_REQUIRE(takes_through_arrow<CallResult>);
  STATIC_REQUIRE(takes_through_star<CallResult>);
  STATIC_REQUIRE(lease_takes<cgt::host::OutputLease>);
  STATIC_REQUIRE(released_lease_takes_through_arrow<Released>);
}

TEST_CASE("a reference bound to *result or result.value() of a temporary keeps the outputs alive", "[handles][host]") {
  STATIC_REQUIRE(std::is_same_v<decltype(*std::declval<CallResult>()), cgt::host::Outputs>);
  STATIC_REQUIRE(std::is_same_v<decltype(std::declval<CallResult>().value()), cgt::host::Outputs>);
  STATIC_REQUIRE(std::is_same_v<decltype(*std::declval<CallResult&>()), cgt::host::Outputs&>);
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto f = twice(pool);
  const cgt::host::Outputs& by_star = *f({filled({4}, 1)});
  const cgt::host::Outputs& by_value = f({filled({4}, 2)}).value();
  for (int i = 0; i < 3; ++i) (void)must(f({filled({4}, 9)}));  // calls that must not reuse their memory
  CHECK(must(by_star.get(0)).get().get(0) == 2);
  CHECK(must(by_value.get(0)).get().get(0) == 4);
  must(pool.check_memory());
}

TEST_CASE("take() and release() on a temporary result copy out, or carry the call's error", "[handles][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto f = twice(pool);
  const Buffer x = filled({4}, 3);
  const Buffer copy = must(f({x})->take(0));
  CHECK(copy.get(0) == 6);
  CHECK(!pool.device()->get().arena().contains(reinterpret_cast<std::uintptr_t>(copy.storage())));
  CHECK(f({x})->size() == 1);
  auto lease = must(f({x})->release(0));
  CHECK(first_of(lease) == 6);
  CHECK(must(must(f({x})->release(0)).take()).get(0) == 6);
  CHECK(must(f({x})->release(0)->take()).get(0) == 6);

  auto failed = f({x, x})->take(0);  // the call fails: its error, not undefined behaviour
  REQUIRE(!failed);
  CHECK(failed.error().code == cgt::Errc::wrong_input_count);
  auto not_released = f({x, x})->release(0);
  REQUIRE(!not_released);
  CHECK(not_released.error().code == cgt::Errc::wrong_input_count);
  CHECK(!f({x, x})->release(0)->is_valid());
  CHECK(f({x})->take(7).error().code == cgt::Errc::invalid_argument);
  must(pool.check_memory());
}

TEST_CASE("a moved-from Function fails its calls with invalid_argument", "[handles][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  const cgt::host::Function g = std::move(f);
  auto call = f({filled({4}, 1)});  // NOLINT(bugprone-use-after-move): the point of the test
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::invalid_argument);
  CHECK(call.error().message.find("moved from") != std::string::npos);
  CHECK(f.name().empty());  // NOLINT(bugprone-use-after-move)
  CHECK(f.id() == g.id());  // NOLINT(bugprone-use-after-move)
  CHECK(g.name() == "twice");
  CHECK(first_of(must(g({filled({4}, 1)})->release(0))) == 2);  // the handle it moved into works
  auto taken = f({filled({4}, 1)})->take(0);                    // NOLINT(bugprone-use-after-move)
  CHECK(taken.error().code == cgt::Errc::invalid_argument);
}

TEST_CASE("a moved-from Pool reads as empty and refuses what would change it", "[handles][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.rerecord_limit = 7, .debug_checks = true}}));
  auto f = twice(pool);
  auto held = must(f({filled({4}, 1)}));
  cgt::host::Pool moved = std::move(pool);
  // NOLINTBEGIN(bugprone-use-after-move): the point of the test
  pool.mark_step_begin();  // does nothing
  CHECK(pool.is_shut_down());
  CHECK(pool.options().rerecord_limit == cgt::Options{}.rerecord_limit);
  CHECK(pool.stats().calls == 0);
  CHECK(pool.memory().allocated_bytes == 0);
  CHECK(pool.live_blocks().empty());
  CHECK(pool.roots().empty());
  CHECK(pool.current_path().empty());
  CHECK(!pool.to_dot().empty());
  CHECK(pool.check_memory().error().code == cgt::Errc::invalid_argument);
  CHECK(pool.shutdown().error().code == cgt::Errc::invalid_argument);
  auto added = pool.add_function([](cgt::host::Context&, cgt::host::Inputs) { return cgt::host::Values{}; });
  REQUIRE(!added);
  CHECK(added.error().code == cgt::Errc::invalid_argument);
  auto device = pool.device();
  REQUIRE(!device);
  CHECK(device.error().code == cgt::Errc::invalid_argument);
  // NOLINTEND(bugprone-use-after-move)
  // The pool it moved into has everything: the options, the step, the held output.
  CHECK(moved.options().rerecord_limit == 7);
  CHECK(moved.stats().calls == 1);
  CHECK(must(held.get(0)).get().get(0) == 2);
  must(moved.check_memory());
  must(moved.shutdown());
}

TEST_CASE("device() gives the pool's device until shutdown(), then pool_shut_down", "[handles][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  auto out = must(f({filled({4}, 1)}));
  auto device = pool.device();
  REQUIRE(device);
  cgt::host::Device& same = device->get();
  CHECK(same.arena().contains(reinterpret_cast<std::uintptr_t>(must(out.get(0)).get().storage())));
  must(pool.shutdown());
  auto gone = pool.device();
  REQUIRE(!gone);
  CHECK(gone.error().code == cgt::Errc::pool_shut_down);
}

TEST_CASE("moved-from Outputs and OutputLease give invalid_argument, never a crash", "[handles][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto f = twice(pool);
  auto out = must(f({filled({4}, 1)}));
  cgt::host::Outputs outputs = std::move(out);
  // NOLINTBEGIN(bugprone-use-after-move): the point of the test
  CHECK(out.size() == 0);
  CHECK(out.get(0).error().code == cgt::Errc::invalid_argument);
  CHECK(out.take(0).error().code == cgt::Errc::invalid_argument);
  CHECK(out.release(0).error().code == cgt::Errc::invalid_argument);
  out.reset();

  cgt::host::OutputLease lease = must(outputs.release(0));
  cgt::host::OutputLease kept = std::move(lease);
  CHECK(!lease.is_valid());
  CHECK(lease.get().error().code == cgt::Errc::invalid_argument);
  CHECK(lease.take().error().code == cgt::Errc::invalid_argument);
  lease.reset();
  auto call = f({lease});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::invalid_argument);
  CHECK(call.error().input == 0);
  auto moved_in = f({std::move(lease)});
  REQUIRE(!moved_in);
  CHECK(moved_in.error().code == cgt::Errc::invalid_argument);
  // NOLINTEND(bugprone-use-after-move)
  CHECK(first_of(kept) == 2);
  must(pool.check_memory());
}

TEST_CASE("a moved-from Node view is empty", "[handles][host]") {
  auto pool = must(cgt::host::make_pool());
  auto f = twice(pool);
  for (int i = 0; i < 2; ++i) (void)must(f({filled({4}, 1)}));  // a warm-up, then a recording
  auto roots = pool.roots();
  REQUIRE(roots.size() == 1);
  cgt::Node node = std::move(roots[0]);
  const cgt::Node& empty = roots[0];
  CHECK(node.exists());
  CHECK(!empty.exists());  // NOLINT(bugprone-use-after-move)
  CHECK(empty.function().empty());
  CHECK(empty.children().empty());
  CHECK(empty.output_count() == 0);
  CHECK(empty.live_outputs() == 0);
  CHECK(empty.copied_inputs().empty());
}

TEST_CASE("a lease moved into a call that fails with wrong_input_count still holds its value", "[handles][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto f = twice(pool);
  auto lease = must(f({filled({4}, 1)})->release(0));
  auto call = f({std::move(lease), filled({4}, 1)});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::wrong_input_count);
  REQUIRE(lease.is_valid());  // NOLINT(bugprone-use-after-move): the point of the test
  CHECK(first_of(lease) == 2);
  must(pool.check_memory());
}

TEST_CASE("a lease moved into a call whose function throws still holds its value", "[handles][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  bool should_throw = false;
  auto f = twice(pool, &should_throw);
  (void)must(f({filled({4}, 1)}));  // the warm-up
  pool.mark_step_begin();
  auto lease = must(f({filled({4}, 1)})->release(0));  // a root recording
  should_throw = true;
  auto call = f({std::move(lease)});  // the recording of its child throws
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::function_failed);
  REQUIRE(lease.is_valid());  // NOLINT(bugprone-use-after-move): the point of the test
  CHECK(first_of(lease) == 2);
  must(pool.check_memory());
  should_throw = false;  // and the same lease moved into a call that succeeds is consumed
  auto out = must(f({std::move(lease)}));
  CHECK(!lease.is_valid());  // NOLINT(bugprone-use-after-move)
  CHECK(must(out.get(0)).get().get(0) == 4);
}

TEST_CASE("a lease moved into a call that succeeds is empty afterwards", "[handles][host]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto f = twice(pool);
  for (int step = 0; step < 4; ++step) {  // warm-up, recording, replays
    pool.mark_step_begin();
    auto lease = must(f({filled({4}, 1)})->release(0));
    auto out = must(f({std::move(lease)}));
    CHECK(!lease.is_valid());  // NOLINT(bugprone-use-after-move): the point of the test
    CHECK(lease.get().error().code == cgt::Errc::invalid_argument);
    CHECK(must(out.get(0)).get().get(0) == 4);
  }
  CHECK(pool.stats().replays > 0);
  must(pool.check_memory());
}

TEST_CASE("a lease moved into two arguments of one call is consumed once", "[handles][host]") {
  // Outputs 0 and 1 of `pair` are one storage, held by two leases. Moving one lease into both
  // inputs of `sum` gives up one lease, not two: the storage stays live for the other lease, and
  // no graph recorded while it was dead (after `sum`, `twice` reuses its memory) may replay.
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto pair = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y, y};
      },
      {.name = "pair"}));
  auto sum = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        Buffer z = ctx.allocate_like(in[0]);
        ctx.launch([a = in[0], b = in[1], z] {
          for (std::size_t i = 0; i < a.numel(); ++i) z.set(i, a.get(i) + b.get(i) + 1);
        });
        return cgt::host::Values{z};
      },
      {.name = "sum"}));
  auto f = twice(pool);
  const auto step = [&](double x, bool keep_second) {
    pool.mark_step_begin();
    auto both = must(pair({filled({4}, x)}));
    auto first = must(both.release(0));
    auto second = must(both.release(1));
    if (!keep_second) second.reset();
    auto total = must(sum({std::move(first), std::move(first)}));
    CHECK(!first.is_valid());  // NOLINT(bugprone-use-after-move): the point of the test
    CHECK(must(total.get(0)).get().get(0) == 4 * x + 1);
    auto doubled = must(f({must(total.get(0))}));
    CHECK(must(doubled.get(0)).get().get(0) == 8 * x + 2);
    if (keep_second) CHECK(first_of(second) == 2 * x);  // not overwritten by `twice`
    must(pool.check_memory());
  };
  for (int i = 0; i < 4; ++i) step(i, false);  // warm-ups, recordings, replays: the storage dies in `sum`
  for (int i = 0; i < 4; ++i) step(i, true);   // here it must not
}

TEST_CASE("a Ref reads like the value it refers to", "[handles][host]") {
  auto pool = must(cgt::host::make_pool());
  auto twice = must(pool.add_function(
      [](cgt::host::Context& ctx, cgt::host::Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return cgt::host::Values{y};
      },
      {.name = "twice"}));
  Buffer x = must(Buffer::make(cgt::ElementType::f32, {4}));
  x.fill(1.5);
  auto out = must(twice({x}));
  auto y = must(out.get(0));  // a Ref<Buffer>
  CHECK(y.get(3) == 3.0);     // the buffer's get, not the reference's
  CHECK(y->numel() == 4);
  CHECK((*y).rank() == 1);
  const Buffer& same = y;
  CHECK(&same == &y.get());
  CHECK(same.get(0) == 3.0);
}
