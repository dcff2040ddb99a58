// Loops and branches the kernels decide (Context::loop_while, if_then, switch_on) in the tree:
// recorded once, decided anew at every replay, equal to the same function run eagerly; bounded,
// checked, and a body that breaks its capture or throws leaves the pool usable.
#include "host/host_test.hpp"

#include <catch2/matchers/catch_matchers_string.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace {

using cgt::ElementType;

/// A one-element buffer of `type` holding `value`.
Buffer scalar(ElementType type, double value) {
  Buffer buffer = must(Buffer::make(type, {1}));
  buffer.set(0, value);
  return buffer;
}

/// The state a counting loop carries, in static buffers (the program's, as a KV cache would be):
/// `count` (f32) and `go_on` (i32), both written in place by the loop's kernels.
struct Counter {
  Buffer count = scalar(ElementType::f32, 0);
  Buffer go_on = scalar(ElementType::i32, 0);
  std::shared_ptr<int> body_runs = std::make_shared<int>(0);  // how often the body's C++ ran
};

/// A function over (count, go_on, target) that counts up to `target` in a device-decided loop of
/// at most `max_iterations`, one step per iteration, and returns the count it reached (a pool
/// buffer). Before the loop a kernel decides whether to enter it at all; the body's kernel steps
/// and decides whether to go on, as a decode step decides on its end token.
cgt::host::Function counting_loop(cgt::host::Pool& pool, const Counter& counter, std::uint64_t max_iterations,
                                  bool synchronize_in_body = false) {
  return must(pool.add_function(
      [runs = counter.body_runs, max_iterations, synchronize_in_body](Context& ctx, Inputs in) {
        const Buffer count = in[0];
        const Buffer go_on = in[1];
        const Buffer target = in[2];
        ctx.launch([count, go_on, target] { go_on.set(0, count.get(0) < target.get(0) ? 1 : 0); });
        ctx.loop_while(go_on, max_iterations, [&](Context& body) {
          ++*runs;
          body.launch([count, go_on, target] {
            count.set(0, count.get(0) + 1);
            go_on.set(0, count.get(0) < target.get(0) ? 1 : 0);
          });
          if (synchronize_in_body) body.synchronize();
        });
        Buffer reached = ctx.allocate(ElementType::f32, {1});
        ctx.launch([count, reached] { reached.set(0, count.get(0)); });
        return Values{reached};
      },
      {.name = "count", .static_inputs = {0, 1}, .mutated_inputs = {0, 1}}));
}

/// Calls `loop` from a count of 0 towards `target`; the count it reached and what the call did.
struct Reached {
  double count;
  cgt::CallKind kind;
};
Reached count_to(cgt::host::Pool& pool, cgt::host::Function& loop, const Counter& counter, double target) {
  pool.mark_step_begin();
  counter.count.set(0, 0);
  const Buffer goal = scalar(ElementType::f32, target);
  auto out = must(loop({counter.count, counter.go_on, goal}));
  const double reached = output_values(out, 0).at(0);
  CHECK(reached == counter.count.get(0));  // the output is the state the loop left
  return {.count = reached, .kind = out.kind()};
}

}  // namespace

TEST_CASE("control flow: a device-decided loop is recorded once and each replay decides its iterations",
          "[control_flow]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);

  const Reached warmup = count_to(pool, loop, counter, 5);
  CHECK(warmup.kind == K::warmup);
  CHECK(warmup.count == 5);
  CHECK(*counter.body_runs == 5);  // outside a recording the body runs once per iteration

  const Reached recording = count_to(pool, loop, counter, 3);
  CHECK(recording.kind == K::recording);
  CHECK(recording.count == 3);
  CHECK(*counter.body_runs == 6);  // captured once, whatever the iterations

  // Each replay iterates as its own data says: more than the recording did, fewer, none.
  for (const double target : {7.0, 1.0, 0.0, 42.0, 3.0}) {
    const Reached replay = count_to(pool, loop, counter, target);
    CHECK(replay.kind == K::replay);
    CHECK(replay.count == target);
  }
  CHECK(*counter.body_runs == 6);  // the host never ran the body again
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
}

TEST_CASE("control flow: max_iterations bounds a loop whose condition never turns false, eager and replayed alike",
          "[control_flow]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 8);
  for (int call = 0; call < 4; ++call) {  // warm-up, recording, replays
    const Reached reached = count_to(pool, loop, counter, 1e9);
    CHECK(reached.count == 8);
    CHECK(counter.go_on.get(0) == 1);  // it still said "go on": the bound stopped it
  }
  CHECK(pool.stats().replays == 2);
}

TEST_CASE("control flow: a loop's output lease held across later calls keeps its value", "[control_flow]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  for (int warm = 0; warm < 2; ++warm) (void)count_to(pool, loop, counter, 2);

  pool.mark_step_begin();
  counter.count.set(0, 0);
  const Buffer four = scalar(ElementType::f32, 4);
  auto held = must(loop({counter.count, counter.go_on, four}));
  CHECK(held.kind() == K::replay);
  for (const double target : {9.0, 6.0}) {  // the same step: the held output's memory is not reused
    counter.count.set(0, 0);
    const Buffer goal = scalar(ElementType::f32, target);
    auto out = must(loop({counter.count, counter.go_on, goal}));
    CHECK(output_values(out, 0) == std::vector<double>{target});
  }
  CHECK(output_values(held, 0) == std::vector<double>{4});
}

TEST_CASE(
    "control flow: a loop body that synchronises breaks its capture, and that shape runs eagerly with the "
    "same values",
    "[control_flow]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100, /*synchronize_in_body=*/true);
  for (const double target : {5.0, 3.0, 6.0, 2.0}) CHECK(count_to(pool, loop, counter, target).count == target);
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().replays == 0);
  CHECK(pool.stats().eager_calls >= 2);
}

TEST_CASE("control flow: a loop body that throws at recording fails that call, and the pool goes on",
          "[control_flow]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  const Counter counter;
  auto throws_when_capturing = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        ctx.loop_while(in[1], 4, [](Context& body) {
          if (body.is_capturing()) throw cgt::host::InvalidArgument("the body refuses to be recorded");
        });
        return Values{};
      },
      {.name = "refuses", .static_inputs = {0, 1}}));
  counter.go_on.set(0, 0);
  const Buffer goal = scalar(ElementType::f32, 1);
  must(throws_when_capturing({counter.count, counter.go_on, goal}));  // warm-up: the loop is not entered
  auto recorded = throws_when_capturing({counter.count, counter.go_on, goal});
  REQUIRE_FALSE(recorded);
  CHECK(recorded.error().code == cgt::Errc::invalid_argument);
  // The pool is whole: another function records and replays.
  auto loop = counting_loop(pool, counter, 100);
  for (const double target : {2.0, 4.0, 1.0}) CHECK(count_to(pool, loop, counter, target).count == target);
  must(pool.check_memory());
}

TEST_CASE("control flow: a loop decided on a value that is not one i32 element, or bounded by 0, is refused",
          "[control_flow]") {
  auto pool = must(cgt::host::make_pool({}));
  auto refused = [&](Buffer decider, std::uint64_t max_iterations) {
    auto fn = must(pool.add_function(
        [max_iterations](Context& ctx, Inputs in) {
          ctx.loop_while(in[0], max_iterations, [](Context&) {});
          return Values{};
        },
        {.name = "bad", .static_inputs = {0}}));
    auto out = fn({std::move(decider)});
    REQUIRE_FALSE(out);
    return out.error();
  };
  CHECK(refused(scalar(ElementType::f32, 1), 4).code == cgt::Errc::invalid_argument);
  CHECK(refused(must(Buffer::make(ElementType::i32, {2})), 4).code == cgt::Errc::invalid_argument);
  CHECK_THAT(refused(scalar(ElementType::i32, 1), 0).message, Catch::Matchers::ContainsSubstring("max_iterations"));
}

namespace {

/// A function that adds 10 to `x` when `condition` is non-zero (if_then), then adds 1, 2 or 3
/// as `choice` says, nothing when out of range (switch_on). Returns x.
cgt::host::Function branching(cgt::host::Pool& pool) {
  return must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer x = in[0];
        ctx.if_then(in[1], [x](Context& body) { body.launch([x] { x.set(0, x.get(0) + 10); }); });
        std::array<Context::Body, 3> cases;
        for (std::size_t i = 0; i < cases.size(); ++i) {
          cases[i] = [x, i](Context& body) {
            body.launch([x, i] { x.set(0, x.get(0) + static_cast<double>(i + 1)); });
          };
        }
        ctx.switch_on(in[2], cases);
        Buffer result = ctx.allocate(ElementType::f32, {1});
        ctx.launch([x, result] { result.set(0, x.get(0)); });
        return Values{result};
      },
      {.name = "branch", .static_inputs = {0, 1, 2}, .mutated_inputs = {0}}));
}

}  // namespace

TEST_CASE("control flow: if_then and switch_on are recorded once and decided at each replay, as eagerly",
          "[control_flow]") {
  auto graphed_pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto graphed = branching(graphed_pool);
  const Buffer x = scalar(ElementType::f32, 0);
  const Buffer condition = scalar(ElementType::i32, 0);
  const Buffer choice = scalar(ElementType::i32, 0);
  auto run = [&](cgt::host::Pool& pool, cgt::host::Function& fn, int taken, int chosen) {
    pool.mark_step_begin();
    x.set(0, 0);
    condition.set(0, taken);
    choice.set(0, chosen);
    auto out = must(fn({x, condition, choice}));
    return std::pair{output_values(out, 0).at(0), out.kind()};
  };
  // Each pair (taken, chosen) against what the code computes when run now.
  const std::array<std::pair<int, int>, 8> cases{{{1, 0}, {0, 2}, {1, 1}, {0, -1}, {1, 3}, {0, 0}, {1, 2}, {0, 7}}};
  std::vector<cgt::CallKind> kinds;
  for (const auto& [taken, chosen] : cases) {
    const auto [value, kind] = run(graphed_pool, graphed, taken, chosen);
    const double expected = (taken != 0 ? 10 : 0) + (chosen >= 0 && chosen < 3 ? chosen + 1 : 0);
    CHECK(value == expected);
    kinds.push_back(kind);
  }
  CHECK(kinds.front() == K::warmup);
  CHECK(kinds.at(1) == K::recording);
  for (std::size_t i = 2; i < kinds.size(); ++i) CHECK(kinds[i] == K::replay);
  CHECK(graphed_pool.stats().recordings == 1);
}
