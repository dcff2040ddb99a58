// A call that fails changes nothing the caller holds, also when it would have begun a new step:
// the outputs of the last step stay valid until a call of the new step succeeds. (A forward's
// call begins a step by itself; `mark_step_begin()` begins one at the next call; both used to
// reclaim the last step before the call's checks and work, so a refused or throwing call left
// every held output `output_overwritten`.)
#include "host/host_test.hpp"
#include <catch2/generators/catch_generators.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "host/forwarding.hpp"

using cgt::FunctionMode;
namespace {

/// y = 2x as a forward (or inference) function that throws while `*fail` is set.
cgt::host::Function doubling(cgt::host::Pool& pool, const std::string& name, const bool* fail,
                             FunctionMode mode = FunctionMode::forward, cgt::Buckets buckets = {}) {
  return must(pool.add_function(
      [fail](Context& ctx, Inputs in) {
        if (*fail) throw std::runtime_error("injected failure");
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = name, .buckets = std::move(buckets), .mode = mode}));
}

/// The lease still reads `value` everywhere, and the pool's memory matches its leases.
void check_still_valid(const cgt::host::Outputs& out, double value, cgt::host::Pool& pool) {
  CHECK(output_values(out, 0) == repeat(value));
  CHECK(pool.check_memory().has_value());
}

/// Runs a backward: the forward's step is done, so the next forward's call begins a new one.
void run_backward(const cgt::host::Function& backward) {
  (void)must(backward({filled({4}, 1)}));
}

void check_reclaimed(const cgt::host::Outputs& out) {
  auto stale = out.get(0);
  REQUIRE_FALSE(stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
}

}  // namespace

TEST_CASE("a forward that throws while warming up leaves the last step's outputs valid", "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  auto g = doubling(pool, "g", &fail);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  auto held = must(f({filled({4}, 1)}));  // step 1: a warm-up
  run_backward(b);
  fail = true;
  auto failed = g({filled({4}, 5)});  // would begin step 2, warming g up
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == cgt::Errc::function_failed);
  check_still_valid(held, 2, pool);
  CHECK(pool.stats().steps_begun_by_forward == 0);
  CHECK(pool.stats().leases_invalidated == 0);
  fail = false;
  auto next = must(g({filled({4}, 5)}));  // now step 2 begins
  check_reclaimed(held);
  CHECK(output_values(next, 0) == repeat(10));
  CHECK(pool.stats().steps_begun_by_forward == 1);
}

TEST_CASE("a forward that throws while recording after a replayed step leaves that step's outputs valid",
          "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  auto g = doubling(pool, "g", &fail);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  for (int step = 0; step < 3; ++step) {  // f and b: warm-up, recording, replay
    (void)must(f({filled({4}, 1)}));
    run_backward(b);
  }
  (void)must(g({filled({4}, 1)}));  // g warmed up (its own step)
  run_backward(b);
  auto held = must(f({filled({4}, 3)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  run_backward(b);
  fail = true;
  auto failed = g({filled({4}, 5)});  // a new step; g records as a root, over memory f's graph wrote
  REQUIRE_FALSE(failed);
  check_still_valid(held, 6, pool);
  fail = false;
  auto next = must(g({filled({4}, 5)}));
  CHECK(next.kind() == cgt::CallKind::recording);
  CHECK(output_values(next, 0) == repeat(10));
  check_reclaimed(held);
  // The tree is as it would be without the failure: f replays on.
  run_backward(b);
  auto again = must(f({filled({4}, 4)}));
  CHECK(again.kind() == cgt::CallKind::replay);
  CHECK(output_values(again, 0) == repeat(8));
}

TEST_CASE("a forward refused for its pad value leaves the last step's outputs valid", "[failures][host][buckets]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  cgt::Buckets buckets{.sizes = {8}, .pad = cgt::Pad::constant(std::numeric_limits<double>::quiet_NaN())};
  auto padded = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      {.name = "padded", .buckets = std::move(buckets), .mode = FunctionMode::forward}));
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  auto held = must(f({filled({4}, 1)}));
  run_backward(b);
  const Buffer ints = Buffer::make(cgt::ElementType::i32, {4}).value();
  auto refused = padded({ints});  // NaN is no i32: refused when padding, after the step began
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  check_still_valid(held, 2, pool);
  CHECK(pool.stats().steps_begun_by_forward == 0);
}

TEST_CASE("a held output passed to the forward that begins the next step is refused, and stays valid",
          "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  auto held = must(f({filled({4}, 1)}));
  run_backward(b);
  auto refused = f({must(held.get(0)).get()});  // its memory is what the new step reclaims
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::output_overwritten);
  CHECK(refused.error().input == 0);
  CHECK(refused.error().message.find("take()") != std::string::npos);
  check_still_valid(held, 2, pool);
}

TEST_CASE("after mark_step_begin, a call that throws leaves the last step's outputs valid", "[failures][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  bool fail = false;
  auto f = doubling(pool, "f", &fail, FunctionMode::inference);
  for (int step = 0; step < 2; ++step) {
    pool.mark_step_begin();
    (void)must(f({filled({4}, 1)}));
  }
  pool.mark_step_begin();
  auto held = must(f({filled({4}, 7)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  auto g = doubling(pool, "g", &fail, FunctionMode::inference);
  pool.mark_step_begin();
  fail = true;
  REQUIRE_FALSE(g({filled({4}, 5)}));  // g warms up over the memory f's graph wrote: it fails first
  check_still_valid(held, 14, pool);
  fail = false;
  auto next = must(g({filled({4}, 5)}));
  check_reclaimed(held);
  CHECK(output_values(next, 0) == repeat(10));
}

namespace {

// A host device whose recordings refuse their replay's arguments while `refuse` is set, as
// cgt.cuda's refuse an input in another layout (Recording::check).
class RefusingDevice final : public host_test::ForwardingDevice {
 public:
  bool refuse = false;

  cgt::Result<std::unique_ptr<cgt::backend::Capture>> begin_recording(cgt::backend::Invoker& fn,
                                                                      std::span<const cgt::backend::ArgSlot> args,
                                                                      const cgt::backend::RecordPlan& plan) override {
    auto capture = inner().begin_recording(fn, args, plan);
    if (!capture) return capture;
    return std::make_unique<Capture>(std::move(*capture), *this);
  }

 private:
  class Recording final : public host_test::ForwardingRecording {
   public:
    Recording(std::unique_ptr<cgt::backend::Recording> inner, const RefusingDevice& device)
        : ForwardingRecording(std::move(inner)), device_(device) {}
    bool checks_arguments() const noexcept override { return true; }
    cgt::Result<void> check(std::span<const cgt::backend::ArgSlot> args) const override {
      if (device_.refuse) return cgt::fail(cgt::Errc::wrong_shape, "injected: input 0 has another layout");
      return ForwardingRecording::check(args);
    }

   private:
    const RefusingDevice& device_;
  };
  class Capture final : public host_test::ForwardingCapture {
   public:
    Capture(std::unique_ptr<cgt::backend::Capture> inner, const RefusingDevice& device)
        : ForwardingCapture(std::move(inner)), device_(device) {}
    cgt::Result<cgt::backend::Recorded> finish() override {
      auto recorded = ForwardingCapture::finish();
      if (recorded) recorded->recording = std::make_unique<Recording>(std::move(recorded->recording), device_);
      return recorded;
    }

   private:
    const RefusingDevice& device_;
  };
};

}  // namespace

TEST_CASE("a replay refused for its arguments after a new step began leaves the last step's outputs held",
          "[failures][host]") {
  // Before the fix the replay released the last step's outputs first, then found the input's
  // layout wrong: the call failed, and every held output read output_overwritten.
  const bool by_forward = GENERATE(false, true);
  auto device = std::make_unique<RefusingDevice>();
  RefusingDevice& refusing = *device;
  auto pool = must(cgt::backend::make_pool<cgt::host::Pool>(std::move(device), {.debug_checks = true}));
  bool fail = false;
  auto f = doubling(pool, "f", &fail, by_forward ? FunctionMode::forward : FunctionMode::inference);
  auto b = doubling(pool, "b", &fail, FunctionMode::backward);
  const auto next_step = [&] {
    if (by_forward) {
      run_backward(b);  // the next forward begins the next step
    } else {
      pool.mark_step_begin();
    }
  };
  for (int step = 0; step < 2; ++step) {  // warm-up, recording
    next_step();
    (void)must(f({filled({4}, 1)}));
  }
  next_step();
  auto held = must(f({filled({4}, 3)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  const cgt::Stats before = pool.stats();
  next_step();
  refusing.refuse = true;
  auto refused = f({filled({4}, 5)});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::wrong_shape);
  check_still_valid(held, 6, pool);
  CHECK(pool.stats().steps_reclaimed == before.steps_reclaimed);
  CHECK(pool.stats().steps_begun_by_forward == before.steps_begun_by_forward);  // a forward's step taken back
  refusing.refuse = false;
  auto next = must(f({filled({4}, 5)}));
  CHECK(next.kind() == cgt::CallKind::replay);
  CHECK(output_values(next, 0) == repeat(10));
  check_reclaimed(held);
  CHECK(pool.stats().steps_reclaimed == before.steps_reclaimed + 1);
}

TEST_CASE("a replay that fails in its work after a new step began: the last step's outputs are reclaimed, as said",
          "[failures][host]") {
  // The one loss errors.md names: once the checks passed, the replay releases the last step's
  // outputs (its graph writes their memory) and launches; a failure of the launch itself (a kernel
  // that throws here, a device error on a GPU) comes after that.
  auto pool = poisoned_pool({});
  bool kernel_throws = false;
  auto f = must(pool.add_function(
      [&kernel_throws](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, &kernel_throws] {
          if (kernel_throws) throw std::runtime_error("injected: the device failed");
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, 2 * x.get(i));
        });
        return Values{y};
      },
      {.name = "f"}));
  for (int step = 0; step < 2; ++step) {
    pool.mark_step_begin();
    (void)must(f({filled({4}, 1)}));
  }
  pool.mark_step_begin();
  auto held = must(f({filled({4}, 3)}));
  REQUIRE(held.kind() == cgt::CallKind::replay);
  pool.mark_step_begin();
  kernel_throws = true;
  auto failed = f({filled({4}, 5)});
  REQUIRE_FALSE(failed);
  CHECK(failed.error().code == cgt::Errc::function_failed);
  CHECK(failed.error().message.find("while replaying") != std::string::npos);
  check_reclaimed(held);
}

// Composed pools: an encoder pool's function called by a decoder pool's function. The decoder's
// recording cannot hold the encoder's call (its graph and leases are the encoder pool's), so the
// inner call is refused with nested_capture, the decoder runs that shape eagerly with
// Reason::nested_pool (logged once, never silently), and there the encoder's call works and
// graphs in its own pool. Values equal eager on every call.
TEST_CASE("a pool function that calls another pool's function runs eagerly with nested_pool, values right",
          "[failures][host][nested]") {
  std::vector<cgt::Reason> logged;
  std::vector<std::string> messages;
  cgt::Options outer_options{.debug_checks = true};
  outer_options.log_sink = [&](const cgt::Event& event) {
    logged.push_back(event.reason);
    messages.emplace_back(event.message);
  };
  auto inner_pool = poisoned_pool({.debug_checks = true});
  auto outer_pool = poisoned_pool(std::move(outer_options));
  bool never = false;
  auto encoder = doubling(inner_pool, "encoder", &never, FunctionMode::inference);
  std::vector<cgt::Errc> inner_failures;
  auto decoder = must(outer_pool.add_function(
      [&](Context& ctx, Inputs in) {
        auto encoded = encoder({in[0]});
        if (!encoded) {
          inner_failures.push_back(encoded.error().code);
          throw std::runtime_error(encoded.error().message);
        }
        const Buffer code = must(encoded->take(0));  // ordinary memory: kept past the inner lease
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([code, y] {
          for (std::size_t i = 0; i < code.numel(); ++i) y.set(i, code.get(i) + 1);
        });
        return Values{y};
      },
      {.name = "decoder"}));
  std::vector<cgt::CallKind> kinds;
  for (int step = 0; step < 4; ++step) {
    outer_pool.mark_step_begin();
    inner_pool.mark_step_begin();
    auto out = must(decoder({filled({4}, step)}));
    kinds.push_back(out.kind());
    CHECK(output_values(out, 0) == repeat((2.0 * step) + 1));
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::eager, K::eager, K::eager});
  CHECK(inner_failures == std::vector{cgt::Errc::nested_capture});  // refused once: at the recording
  CHECK(std::ranges::count(logged, cgt::Reason::nested_pool) == 1);
  REQUIRE(!messages.empty());
  CHECK(messages.back().find("another pool") != std::string::npos);
  CHECK(outer_pool.stats().count(cgt::Reason::nested_pool) == 3);  // one per eager call
  CHECK(outer_pool.stats().recordings == 0);
  CHECK(inner_pool.stats().recordings == 1);  // the encoder graphs in its own pool, eagerly called
  CHECK(inner_pool.stats().replays >= 1);
}

// A function that swallows the refusal (it returns without the inner call's work) must not
// leave a graph without that work behind: the recording is given up all the same.
TEST_CASE("a recording whose function swallowed a refused call of another pool is given up",
          "[failures][host][nested]") {
  auto inner_pool = poisoned_pool({});
  std::vector<cgt::Reason> logged;
  cgt::Options outer_options{.skip_warmup = true};
  outer_options.log_sink = [&logged](const cgt::Event& event) { logged.push_back(event.reason); };
  auto outer_pool = poisoned_pool(std::move(outer_options));
  bool never = false;
  auto encoder = doubling(inner_pool, "encoder", &never, FunctionMode::inference);
  auto decoder = must(outer_pool.add_function(
      [&](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        auto encoded = encoder({in[0]});
        const Buffer code = encoded ? must(encoded->take(0)) : in[0];  // falls back on its input
        ctx.launch([code, y] {
          for (std::size_t i = 0; i < code.numel(); ++i) y.set(i, code.get(i));
        });
        return Values{y};
      },
      {.name = "decoder"}));
  for (int step = 0; step < 3; ++step) {
    outer_pool.mark_step_begin();
    auto out = must(decoder({filled({4}, 3)}));
    CHECK(out.kind() == cgt::CallKind::eager);
    CHECK(output_values(out, 0) == repeat(6));  // the encoder's work is in every value
  }
  CHECK(outer_pool.stats().recordings == 0);
  CHECK(logged == std::vector{cgt::Reason::nested_pool});
}
