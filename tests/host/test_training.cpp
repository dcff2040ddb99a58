// Training on the host backend: forward and backward functions in one tree, and PyTorch's rules
// for them (its AUTOGRAD tests: pairing and expected-dead sets, pending backwards and the new
// step, mark_step_begin, a backward never called, one forced to run eagerly, accumulation with the
// saved values kept, dynamic shapes in the backward, saved values across steps).
//
// The model is one elementwise layer y = x * w, run as two pool functions:
//   forward(x, w)       -> (y, saved)   saved: a copy of x in the pool, the activation the backward reads
//   backward(gy, saved, w) -> (gx, gw)  gx = gy * w, gw = gy * saved
// The caller plays autograd: it holds `saved`'s lease until it runs the backward, moving it in.
#include "host/host_test.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

using cgt::FunctionMode;
namespace {

// y = x * w and the saved copy of x; `w` (input 1) is static, like a parameter.
cgt::host::Function forward(cgt::host::Pool& pool, const std::string& name) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        const Buffer saved = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], w = in[1], y, saved] {
          for (std::size_t i = 0; i < x.numel(); ++i) {
            y.set(i, x.get(i) * w.get(i));
            saved.set(i, x.get(i));
          }
        });
        return Values{y, saved};
      },
      {.name = name, .static_inputs = {1}, .mode = FunctionMode::forward}));
}

// gx = gy * w, gw = gy * saved; `w` (input 2) is static.
cgt::host::Function backward(cgt::host::Pool& pool, const std::string& name, cgt::FunctionOptions extra = {}) {
  extra.name = name;
  extra.static_inputs = {2};
  extra.mode = FunctionMode::backward;
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer gx = ctx.allocate_like(in[0]);
        const Buffer gw = ctx.allocate_like(in[0]);
        ctx.launch([gy = in[0], saved = in[1], w = in[2], gx, gw] {
          for (std::size_t i = 0; i < gy.numel(); ++i) {
            gx.set(i, gy.get(i) * w.get(i));
            gw.set(i, gy.get(i) * saved.get(i));
          }
        });
        return Values{gx, gw};
      },
      std::move(extra)));
}

std::vector<std::string> path_functions(const cgt::host::Pool& pool) {
  std::vector<std::string> names;
  for (const cgt::Node& node : pool.current_path()) names.push_back(node.function());
  return names;
}

struct EventLog {
  std::vector<cgt::Event> events;
  std::vector<std::string> messages;  // the views in `events` die with the call
  cgt::LogSink sink() {
    return [this](const cgt::Event& event) {
      events.push_back(event);
      messages.emplace_back(event.message);
    };
  }
  [[nodiscard]] std::size_t count(cgt::Reason reason) const {
    std::size_t n = 0;
    for (const auto& event : events) n += event.reason == reason ? 1 : 0;
    return n;
  }
};

}  // namespace

TEST_CASE("two layers' forwards and backwards form one path, replayed whole on later steps", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto forward1 = forward(pool, "forward1");
  auto forward2 = forward(pool, "forward2");
  auto backward1 = backward(pool, "backward1");
  auto backward2 = backward(pool, "backward2");
  const Buffer w1 = filled({4}, 2);
  const Buffer w2 = filled({4}, 3);
  for (int step = 0; step < 4; ++step) {  // no mark_step_begin: each first forward begins the step
    const Buffer x = filled({4}, 1 + step);
    auto out1 = must(forward1({x, w1}));
    auto out2 = must(forward2({must(out1.get(0)), w2}));  // layer 2 reads layer 1's output in place
    auto saved2 = must(out2.release(1));
    auto saved1 = must(out1.release(1));
    auto grads2 = must(backward2({filled({4}, 1), std::move(saved2), w2}));
    auto grads1 = must(backward1({must(grads2.get(0)), std::move(saved1), w1}));
    const double xs = 1 + step;
    CHECK(output_values(out2, 0) == repeat(xs * 6));
    CHECK(output_values(grads2, 1) == repeat(xs * 2));  // d(y2)/d(w2) = y1
    CHECK(output_values(grads1, 0) == repeat(6));       // d(y2)/dx = w1 * w2
    CHECK(output_values(grads1, 1) == repeat(xs * 3));  // d(y2)/d(w1) = x * w2
    const cgt::CallKind kinds[] = {cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay};
    const cgt::CallKind expected = kinds[std::min(step, 2)];
    CHECK(out1.kind() == expected);
    CHECK(out2.kind() == expected);
    CHECK(grads2.kind() == expected);
    CHECK(grads1.kind() == expected);
    CHECK_FALSE(pool.has_pending_backward());
  }
  CHECK(path_functions(pool) == std::vector<std::string>{"forward1", "forward2", "backward2", "backward1"});
  REQUIRE(pool.roots().size() == 1);
  CHECK(pool.roots()[0].num_descendants() == 3);
  CHECK(pool.stats().recordings == 4);
  CHECK(pool.stats().replays == 8);
  CHECK(pool.stats().steps_begun_by_forward == 3);  // steps 1, 2, 3: each after a backward ran
  must(pool.check_memory());
}

TEST_CASE("the saved values a backward consumes are the ones expected dead after its graph", "[training][host]") {
  auto pool = poisoned_pool({.skip_warmup = true, .debug_checks = true});
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer w = filled({4}, 2);
  auto out = must(layer({filled({4}, 1), w}));
  auto saved = must(out.release(1));
  auto grads = must(grad({filled({4}, 1), std::move(saved), w}));
  CHECK(grads.kind() == cgt::CallKind::recording);
  const auto path = pool.current_path();
  REQUIRE(path.size() == 2);
  // The forward's output 0 (y) stays live with the caller; output 1 (saved) died in the backward.
  CHECK(path[1].expected_dead_after() == std::vector<cgt::PathIndex>{{0, 1}});
  CHECK(path[1].expected_dead_before().empty());
}

TEST_CASE("after a backward, the next forward begins a new step and reclaims the last one's outputs",
          "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer w = filled({4}, 2);
  auto out = must(layer({filled({4}, 1), w}));
  CHECK(pool.has_pending_backward());
  auto grads = must(grad({filled({4}, 1), must(out.release(1)), w}));
  CHECK_FALSE(pool.has_pending_backward());
  // Still held: the output and the gradients. The next step's forward takes their memory back.
  auto next = must(layer({filled({4}, 5), w}));
  CHECK(pool.stats().steps_begun_by_forward == 1);
  CHECK(pool.stats().leases_invalidated == 3);
  auto stale_output = out.get(0);
  REQUIRE_FALSE(stale_output);
  CHECK(stale_output.error().code == cgt::Errc::output_overwritten);
  auto stale_gradient = grads.get(1);
  REQUIRE_FALSE(stale_gradient);
  CHECK(stale_gradient.error().code == cgt::Errc::output_overwritten);
  CHECK(output_values(next, 0) == repeat(10));
}

TEST_CASE("pending backwards hold off a new step: the forward goes down the path, and a warning says so once",
          "[training][host]") {
  EventLog log;
  auto pool = poisoned_pool({.debug_checks = true, .log_sink = log.sink()});
  auto layer = forward(pool, "forward");
  const Buffer w = filled({4}, 2);
  std::vector<cgt::host::Outputs> held;  // the autograd graphs nobody ran backward on
  for (int call = 0; call < 5; ++call) {
    auto out = must(layer({filled({4}, call), w}));
    CHECK(output_values(out, 0) == repeat(2.0 * call));
    held.push_back(std::move(out));
  }
  CHECK(pool.has_pending_backward());
  CHECK(pool.stats().steps_begun_by_forward == 0);
  CHECK(pool.stats().leases_invalidated == 0);  // nothing held was taken back
  for (std::size_t i = 0; i < held.size(); ++i) CHECK(output_values(held[i], 0) == repeat(2.0 * i));
  CHECK(path_functions(pool).size() == 5);  // the path grew instead of replaying
  CHECK(pool.stats().replays == 0);
  CHECK(log.count(cgt::Reason::pending_backward) == 1);
  CHECK(pool.stats().count(cgt::Reason::pending_backward) == 1);
  REQUIRE_FALSE(log.messages.empty());
  CHECK(log.messages.back().find("mark_step_begin") != std::string::npos);
}

TEST_CASE("mark_step_begin overrides pending backwards: each step reclaims the last, and replays", "[training][host]") {
  EventLog log;
  auto pool = poisoned_pool({.debug_checks = true, .log_sink = log.sink()});
  auto layer = forward(pool, "forward");
  const Buffer w = filled({4}, 2);
  std::vector<cgt::host::Outputs> held;
  for (int call = 0; call < 5; ++call) {
    pool.mark_step_begin();
    auto out = must(layer({filled({4}, call), w}));
    CHECK(output_values(out, 0) == repeat(2.0 * call));
    held.push_back(std::move(out));
  }
  CHECK(pool.has_pending_backward());  // still pending: the program's steps do not wait for it
  CHECK(path_functions(pool) == std::vector<std::string>{"forward"});
  CHECK(pool.stats().replays == 3);
  CHECK(log.count(cgt::Reason::pending_backward) == 0);
  auto stale = held[0].get(0);
  REQUIRE_FALSE(stale);
  CHECK(stale.error().code == cgt::Errc::output_overwritten);
}

TEST_CASE("once the program marked a step, forwards begin none by themselves", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer w = filled({4}, 2);
  pool.mark_step_begin();
  auto out = must(layer({filled({4}, 1), w}));
  auto grads = must(grad({filled({4}, 1), must(out.release(1)), w}));
  auto next = must(layer({filled({4}, 3), w}));  // no backward pending, but steps are the program's
  CHECK(pool.stats().steps_begun_by_forward == 0);
  CHECK(output_values(out, 0) == repeat(2));
  CHECK(output_values(grads, 1) == repeat(1));
  CHECK(output_values(next, 0) == repeat(6));
}

TEST_CASE("a backward never called frees what its forward saved once the caller drops it", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto layer = forward(pool, "forward");
  const Buffer w = filled({4}, 2);
  for (int step = 0; step < 3; ++step) {
    auto out = must(layer({filled({4}, 1), w}));
    if (step == 0) CHECK(pool.live_blocks().size() == 2);  // the warm-up's y and saved
    // The autograd graph goes without a backward (loss never used): y and saved are dropped.
  }
  CHECK(pool.live_blocks().empty());
  must(pool.check_memory());
  CHECK(pool.has_pending_backward());  // no backward ran; the path ended because nothing is live
  CHECK(pool.stats().replays == 1);
  CHECK(pool.stats().leases_invalidated == 0);
}

TEST_CASE("a backward that runs eagerly still ends the pending backward", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto layer = forward(pool, "forward");
  // Its size is never in the allow-list: it runs eagerly, as a backward PyTorch would not graph.
  auto grad = backward(pool, "backward", {.graph_sizes = {99}});
  const Buffer w = filled({4}, 2);
  for (int step = 0; step < 3; ++step) {
    auto out = must(layer({filled({4}, 1), w}));
    auto grads = must(grad({filled({4}, 1), must(out.release(1)), w}));
    CHECK(grads.kind() == cgt::CallKind::eager);
    CHECK(output_values(grads, 1) == repeat(1));
    CHECK_FALSE(pool.has_pending_backward());
  }
  CHECK(pool.stats().recordings == 1);  // the forward only
  CHECK(pool.stats().count(cgt::Reason::size_not_graphed) == 3);
}

TEST_CASE("a backward run twice on the same saved values (retain_graph) accumulates twice", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto layer = forward(pool, "forward");
  // The gradient accumulator of w: a static input the backward adds into (AccumulateGrad).
  auto accumulate = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        ctx.launch([gy = in[0], saved = in[1], acc = in[2]] {
          for (std::size_t i = 0; i < gy.numel(); ++i) acc.set(i, acc.get(i) + (gy.get(i) * saved.get(i)));
        });
        return Values{};
      },
      {.name = "backward", .static_inputs = {2}, .mutated_inputs = {2}, .mode = FunctionMode::backward}));
  const Buffer w = filled({4}, 2);
  const Buffer grad_w = filled({4}, 0);
  for (int step = 0; step < 3; ++step) {
    HostHarness::write(grad_w, scenario::HostTensor::full({4}, 0));  // zero_grad
    auto out = must(layer({filled({4}, 1 + step), w}));
    auto saved = must(out.release(1));
    (void)must(accumulate({filled({4}, 1), saved, grad_w}));  // retain_graph: saved stays held
    CHECK(saved.is_valid());
    (void)must(accumulate({filled({4}, 1), std::move(saved), grad_w}));
    CHECK(values_of(grad_w) == repeat(2.0 * (1 + step)));
  }
  must(pool.check_memory());
}

TEST_CASE("a backward called with new shapes records a graph of its own under the same forward", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto layer = forward(pool, "forward");
  auto grad = backward(pool, "backward");
  const Buffer weights[] = {filled({4}, 2), filled({6}, 2)};
  for (int step = 0; step < 6; ++step) {
    const std::int64_t size = step % 2 == 0 ? 4 : 6;  // alternating batch sizes
    const Buffer& w = weights[step % 2];
    auto out = must(layer({filled({size}, 3), w}));
    auto grads = must(grad({filled({size}, 1), must(out.release(1)), w}));
    CHECK(output_values(grads, 1) == repeat(3, static_cast<std::size_t>(size)));
    CHECK(output_values(grads, 0) == repeat(2, static_cast<std::size_t>(size)));
  }
  CHECK(pool.roots().size() == 2);  // one forward per shape, each with its backward below
  for (const cgt::Node& root : pool.roots()) CHECK(root.num_descendants() == 1);
}

TEST_CASE("saved values survive a new step with copy_out_on_new_step, and fail clearly without it",
          "[training][host]") {
  for (const bool copy_out : {true, false}) {
    auto pool = poisoned_pool({.debug_checks = true, .copy_out_on_new_step = copy_out});
    auto layer = forward(pool, "forward");
    auto grad = backward(pool, "backward");
    const Buffer w = filled({4}, 2);
    auto out = must(layer({filled({4}, 5), w}));
    auto saved = must(out.release(1));
    pool.mark_step_begin();  // the step ends before its backward ran (a gradient-accumulation loop)
    auto grads = grad({filled({4}, 1), std::move(saved), w});
    if (copy_out) {
      REQUIRE(grads);
      CHECK(output_values(*grads, 1) == repeat(5));
      CHECK(pool.stats().leases_copied_out == 2);
    } else {
      REQUIRE_FALSE(grads);
      CHECK(grads.error().code == cgt::Errc::output_overwritten);
      CHECK(pool.has_pending_backward());  // the failed backward did not run
    }
  }
}

TEST_CASE("inference functions begin no step: their held outputs stay valid", "[training][host]") {
  auto pool = poisoned_pool({.debug_checks = true});
  auto infer = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, x.get(i) + 1);
        });
        return Values{y};
      },
      {.name = "infer"}));
  std::vector<cgt::host::Outputs> held;
  held.reserve(4);
  for (int call = 0; call < 4; ++call) held.push_back(must(infer({filled({4}, call)})));
  for (std::size_t i = 0; i < held.size(); ++i) CHECK(output_values(held[i], 0) == repeat(1.0 + i));
  CHECK(pool.stats().steps_begun_by_forward == 0);
  CHECK_FALSE(pool.has_pending_backward());
}

TEST_CASE("function modes have names", "[training][host]") {
  CHECK(cgt::to_string(FunctionMode::inference) == "inference");
  CHECK(cgt::to_string(FunctionMode::forward) == "forward");
  CHECK(cgt::to_string(FunctionMode::backward) == "backward");
  CHECK(cgt::to_string(cgt::Reason::pending_backward) == "pending_backward");
}
