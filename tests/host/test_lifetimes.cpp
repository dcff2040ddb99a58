// Lifetimes of the handles: destroyed in every order, moved into themselves, kept past shutdown();
// leases in every state across a step with copy_out_on_new_step; and what the introspection
// surface says after a capture failed and after shutdown().
#include "host/host_test.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

// y = x * 2 (in the pool); when `syncs`, it synchronises with the host, which breaks a capture.
cgt::host::Function twice(cgt::host::Pool& pool, bool syncs = false) {
  return must(pool.add_function(
      [syncs](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * 2);
        });
        if (syncs) ctx.synchronize();
        return Values{y};
      },
      {.name = syncs ? "syncs" : "twice"}));
}

double first_of(const cgt::host::OutputLease& lease) {
  return must(lease.get()).get().get(0);
}

// `x = std::move(x)`, spelled so that the compiler does not see the self-move it would warn of.
template <class T>
void move_into_itself(T& x) {
  T* alias = &x;
  x = std::move(*alias);
}

}  // namespace

TEST_CASE("pool, function, outputs and a released lease destroyed in every order", "[lifetimes][host]") {
  std::array<int, 4> order{0, 1, 2, 3};
  int orders = 0;
  do {
    std::optional<cgt::host::Pool> pool = poisoned_pool({.debug_checks = true});
    std::optional<cgt::host::Function> f = twice(*pool);
    std::optional<cgt::host::Outputs> out = must((*f)({filled({4}, 1)}));  // a warm-up: pool memory
    pool->mark_step_begin();
    auto second = must((*f)({filled({4}, 3)}));  // a recording
    std::optional<cgt::host::OutputLease> lease = must(second.release(0));
    for (const int which : order) {
      switch (which) {
        case 0: pool.reset(); break;
        case 1: f.reset(); break;
        case 2: out.reset(); break;
        default: lease.reset(); break;
      }
      // What is still held reads its value: dropping other handles is not a shutdown.
      if (lease) CHECK(first_of(*lease) == 6);
      if (f) CHECK(must((*f)({filled({4}, 5)})->take(0)).get(0) == 10);
      if (pool) must(pool->check_memory());
    }
    ++orders;
  } while (std::ranges::next_permutation(order).found);
  CHECK(orders == 24);
}

TEST_CASE("every handle moved into itself keeps working", "[lifetimes][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto f = twice(pool);
  auto out = must(f({filled({4}, 1)}));
  auto lease = must(out.release(0));
  auto kept = must(f({filled({4}, 2)}));
  move_into_itself(pool);
  move_into_itself(f);
  move_into_itself(lease);
  move_into_itself(kept);
  CHECK(!pool.is_shut_down());
  CHECK(pool.stats().calls == 2);
  CHECK(f.name() == "twice");
  CHECK(first_of(lease) == 2);
  REQUIRE(kept.size() == 1);
  CHECK(must(kept.get(0)).get().get(0) == 4);
  CHECK(must(f({filled({4}, 3)})->take(0)).get(0) == 6);
  auto roots = pool.roots();
  must(pool.check_memory());
  must(pool.shutdown());
}

TEST_CASE("copy_out_on_new_step with leases in every state", "[lifetimes][host]") {
  auto pool = poisoned_pool({.debug_checks = true, .copy_out_on_new_step = true});
  auto f = twice(pool);
  auto sum = must(pool.add_function(  // consumes its input: y = x + 1
      [](Context& ctx, Inputs in) {
        Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] { y.set(0, x.get(0) + 1); });
        return Values{y};
      },
      {.name = "sum"}));
  auto kept = must(f({filled({1}, 1)}));                       // 2, held in its Outputs
  auto released = must(must(f({filled({1}, 2)})).release(0));  // 4, a lease released from dropped Outputs
  auto reset = must(must(f({filled({1}, 3)})).release(0));     // 6, dropped before the step
  reset.reset();
  auto consumed = must(must(f({filled({1}, 4)})).release(0));  // 8, moved into a call
  auto from_consumed = must(sum({std::move(consumed)}));       // 9
  CHECK(!consumed.is_valid());                                 // NOLINT(bugprone-use-after-move)
  const auto blocks_before = pool.live_blocks().size();
  CHECK(blocks_before == 3);  // kept, released, from_consumed

  pool.mark_step_begin();
  (void)must(f({filled({1}, 0)}));  // the new step copies the held outputs out of the pool
  CHECK(pool.stats().leases_copied_out == 3);
  CHECK(must(kept.get(0)).get().get(0) == 2);
  CHECK(first_of(released) == 4);
  CHECK(must(from_consumed.get(0)).get().get(0) == 9);
  CHECK(reset.get().error().code == cgt::Errc::invalid_argument);
  CHECK(consumed.get().error().code == cgt::Errc::invalid_argument);  // NOLINT(bugprone-use-after-move)

  pool.mark_step_begin();
  (void)must(f({filled({1}, 0)}));  // copies are the lease's own: a second step leaves them be
  CHECK(pool.stats().leases_copied_out == 3);
  CHECK(first_of(released) == 4);
  auto one = must(released.take());
  auto two = must(released.take());  // take() twice: two independent copies
  one.set(0, 100);
  CHECK(two.get(0) == 4);
  CHECK(first_of(released) == 4);
  // A copied-out lease can be passed into a call: it is not pool memory.
  CHECK(must(sum({released})->take(0)).get(0) == 5);

  must(pool.shutdown());
  CHECK(released.get().error().code == cgt::Errc::pool_shut_down);
  CHECK(kept.take(0).error().code == cgt::Errc::pool_shut_down);
  CHECK(one.get(0) == 100);  // a take()n copy is the caller's, whatever the pool does
}

TEST_CASE("introspection after a failed capture, then after shutdown()", "[lifetimes][host]") {
  auto pool = poisoned_pool({.debug_checks = true, .log_sink = [](const cgt::Event&) {}});
  auto f = twice(pool, /*syncs=*/true);
  auto warm = must(f({filled({2}, 1)}));
  CHECK(warm.kind() == cgt::CallKind::warmup);
  pool.mark_step_begin();
  auto failed = must(f({filled({2}, 2)}));  // the capture fails: this shape runs eagerly from now on
  CHECK(failed.kind() == cgt::CallKind::eager);
  CHECK(must(failed.get(0)).get().get(0) == 4);
  CHECK(warm.get(0).error().code == cgt::Errc::output_overwritten);

  CHECK(pool.roots().empty());  // no graph was added, nor is one half made
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().warmups == 1);
  CHECK(pool.stats().count(cgt::Reason::capture_failed) == 1);
  CHECK(pool.to_dot().find("graph\\n") == std::string::npos);
  CHECK(pool.live_blocks().empty());  // the failed capture's output went back; the eager one is not pool memory
  must(pool.check_memory());
  auto again = must(f({filled({2}, 3)}));
  CHECK(again.kind() == cgt::CallKind::eager);
  CHECK(pool.roots().empty());

  // A graph beside it, so that there is a tree to read and views to keep.
  auto g = twice(pool);
  pool.mark_step_begin();
  (void)must(g({filled({2}, 1)}));
  pool.mark_step_begin();
  auto recorded = must(g({filled({2}, 1)}));
  CHECK(recorded.kind() == cgt::CallKind::recording);
  auto roots = pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots[0].function() == "twice");
  CHECK(pool.memory().allocated_bytes > 0);
  const auto calls = pool.stats().calls;

  must(pool.shutdown());
  CHECK(pool.is_shut_down());
  CHECK(pool.roots().empty());
  CHECK(pool.current_path().empty());
  CHECK(pool.live_blocks().empty());
  CHECK(pool.memory().allocated_bytes == 0);
  CHECK(pool.to_dot().find("label") == std::string::npos);
  CHECK(pool.check_memory().error().code == cgt::Errc::pool_shut_down);
  CHECK(pool.stats().calls == calls);  // the counters stay readable
  CHECK(!roots[0].exists());           // a view kept from before is empty
  CHECK(roots[0].children().empty());
  CHECK(roots[0].function().empty());
  CHECK(recorded.get(0).error().code == cgt::Errc::pool_shut_down);
  CHECK(failed.take(0).error().code == cgt::Errc::pool_shut_down);
  CHECK(f({filled({2}, 1)}).error().code == cgt::Errc::pool_shut_down);
  must(pool.shutdown());  // a second one does nothing
  pool.mark_step_begin();
  CHECK(pool.stats().calls == calls);
}

// What a function's graphs use besides their inputs (an NCCL communicator, a library handle)
// outlives them when the callable owns it: the pool destroys every graph before the callables,
// at shutdown() and when its last handle goes. `used` is what the graphs' kernels use; each
// kernel's own token dies with the graph (or run) that holds the kernel.
TEST_CASE("a resource the callable owns outlives every graph recorded from it", "[lifetimes][host]") {
  for (const bool shut_down : {false, true}) {
    std::vector<std::weak_ptr<int>> kernels;  // one per launched kernel: alive while its graph is
    bool graphs_gone_first = false;
    bool resource_destroyed = false;
    {
      auto pool = poisoned_pool();
      std::shared_ptr<int> used(new int(3), [&](int* value) {
        graphs_gone_first = std::ranges::all_of(kernels, [](const std::weak_ptr<int>& k) { return k.expired(); });
        resource_destroyed = true;
        delete value;  // NOLINT(cppcoreguidelines-owning-memory): the deleter of what it made
      });
      auto f = must(pool.add_function(
          [used, &kernels](Context& ctx, Inputs in) {
            const Buffer y = ctx.allocate_like(in[0]);
            auto token = std::make_shared<int>(0);
            kernels.push_back(token);
            ctx.launch([x = in[0], y, used, token] {
              for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) * *used);
            });
            return Values{y};
          },
          {.name = "uses_a_resource"}));
      used.reset();  // the callable owns it now
      for (int step = 0; step < 3; ++step) {
        pool.mark_step_begin();
        const auto out = must(f({filled({4}, 2)}));
        CHECK(host_test::output_values(out, 0) == host_test::repeat(6));
      }
      CHECK(pool.stats().recordings == 1);
      CHECK_FALSE(resource_destroyed);
      if (shut_down) {
        REQUIRE(pool.shutdown());
        CHECK(resource_destroyed);
      }
    }
    CHECK(resource_destroyed);
    CHECK(graphs_gone_first);
  }
}
