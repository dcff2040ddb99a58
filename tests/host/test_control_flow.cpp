// Loops and branches the kernels decide (Context::loop_while, if_then, switch_on) in the tree:
// recorded once, decided anew at every replay, equal to the same function run eagerly; bounded,
// checked, and a body that breaks its capture or throws leaves the pool usable.
#include "host/host_test.hpp"

#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
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
/// as `choice` says, nothing when out of range (switch_on). Returns x. Its branch comes first: a
/// host-decided recording (`on_host`) leaves the empty segment before it out.
cgt::host::Function branching(cgt::host::Pool& pool, bool on_host = false) {
  cgt::FunctionOptions options{.name = "branch", .static_inputs = {0, 1, 2}, .mutated_inputs = {0}};
  options.control_flow_on_host = on_host;
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
      std::move(options)));
}

/// The inputs of `branching` (x, condition, choice), in static buffers, and one call of it from x
/// = 0: the value it returns and what the call did.
struct BranchInputs {
  Buffer x = scalar(ElementType::f32, 0);
  Buffer condition = scalar(ElementType::i32, 0);
  Buffer choice = scalar(ElementType::i32, 0);
  std::pair<double, cgt::CallKind> run(cgt::host::Pool& pool, cgt::host::Function& fn, int taken, int chosen) const {
    pool.mark_step_begin();
    x.set(0, 0);
    condition.set(0, taken);
    choice.set(0, chosen);
    auto out = must(fn({x, condition, choice}));
    return {output_values(out, 0).at(0), out.kind()};
  }
};

/// (taken, chosen) pairs: both ways of the branch, every body of the choice and two out of range.
constexpr std::array<std::pair<int, int>, 8> branch_cases{
    {{1, 0}, {0, 2}, {1, 1}, {0, -1}, {1, 3}, {0, 0}, {1, 2}, {0, 7}}};

}  // namespace

TEST_CASE("control flow: if_then and switch_on are recorded once and decided at each replay, as eagerly",
          "[control_flow]") {
  auto graphed_pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto graphed = branching(graphed_pool);
  const BranchInputs inputs;
  // Each pair (taken, chosen) against what the code computes when run now.
  std::vector<cgt::CallKind> kinds;
  for (const auto& [taken, chosen] : branch_cases) {
    const auto [value, kind] = inputs.run(graphed_pool, graphed, taken, chosen);
    const double expected = (taken != 0 ? 10 : 0) + (chosen >= 0 && chosen < 3 ? chosen + 1 : 0);
    CHECK(value == expected);
    kinds.push_back(kind);
  }
  CHECK(kinds.front() == K::warmup);
  CHECK(kinds.at(1) == K::recording);
  for (std::size_t i = 2; i < kinds.size(); ++i) CHECK(kinds[i] == K::replay);
  CHECK(graphed_pool.stats().recordings == 1);
}

// --- The fallback: loops and branches the host decides between segments of the graph ---

namespace {

/// `counting_loop` whose body also calls a host function (counted in `host_calls`): a graph may
/// hold it, a conditional node's body may not, as with a host callback on a GPU.
cgt::host::Function counting_loop_calling_host(cgt::host::Pool& pool, const Counter& counter,
                                               const std::shared_ptr<int>& host_calls) {
  return must(pool.add_function(
      [runs = counter.body_runs, host_calls](Context& ctx, Inputs in) {
        const Buffer count = in[0];
        const Buffer go_on = in[1];
        const Buffer target = in[2];
        ctx.launch([count, go_on, target] { go_on.set(0, count.get(0) < target.get(0) ? 1 : 0); });
        ctx.loop_while(go_on, 100, [&](Context& body) {
          ++*runs;
          body.launch([count, go_on, target] {
            count.set(0, count.get(0) + 1);
            go_on.set(0, count.get(0) < target.get(0) ? 1 : 0);
          });
          body.call_on_host([host_calls] { ++*host_calls; });
        });
        Buffer reached = ctx.allocate(ElementType::f32, {1});
        ctx.launch([count, reached] { reached.set(0, count.get(0)); });
        return Values{reached};
      },
      {.name = "count_calling_host", .static_inputs = {0, 1}, .mutated_inputs = {0, 1}}));
}

}  // namespace

TEST_CASE(
    "control flow: a loop body a conditional node cannot hold runs that call eagerly, and the shape's next recording "
    "has the host decide between segments; replays equal eager",
    "[control_flow]") {
  std::vector<cgt::Reason> said;
  auto pool = must(cgt::host::make_pool(
      {.tree = {.debug_checks = true, .log_sink = [&](const cgt::Event& event) { said.push_back(event.reason); }}}));
  const Counter counter;
  const auto host_calls = std::make_shared<int>(0);
  auto loop = counting_loop_calling_host(pool, counter, host_calls);

  CHECK(count_to(pool, loop, counter, 4).kind == K::warmup);
  CHECK(*counter.body_runs == 4);
  CHECK(*host_calls == 4);

  // The capture with a conditional node is given up: that call runs eagerly (the body's C++ once
  // captured, then once per iteration), and the shape's next call records with the host deciding.
  const Reached given_up = count_to(pool, loop, counter, 3);
  CHECK(given_up.kind == K::eager);
  CHECK(given_up.count == 3);
  CHECK(*counter.body_runs == 4 + 1 + 3);
  CHECK(*host_calls == 7);
  CHECK(pool.stats().eager_calls == 1);
  CHECK(pool.stats().count(cgt::Reason::control_flow_on_host) == 1);
  CHECK(std::ranges::count(said, cgt::Reason::control_flow_on_host) == 1);

  const Reached recording = count_to(pool, loop, counter, 2);
  CHECK(recording.kind == K::recording);
  CHECK(recording.count == 2);
  CHECK(*counter.body_runs == 9);  // captured once
  CHECK(*host_calls == 9);         // the first run ran the body's segment twice
  CHECK(pool.stats().recordings == 1);
  auto roots = pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots.front().control_flow_on_host());
  CHECK_THAT(pool.to_dot(), Catch::Matchers::ContainsSubstring("host-decided"));

  // Each replay runs the body's segment as often as its data says, the host reading go_on.
  int expected_host_calls = *host_calls;
  for (const double target : {7.0, 0.0, 1.0, 42.0, 3.0}) {
    const Reached replay = count_to(pool, loop, counter, target);
    CHECK(replay.kind == K::replay);
    CHECK(replay.count == target);
    expected_host_calls += static_cast<int>(target);
    CHECK(*host_calls == expected_host_calls);
  }
  CHECK(*counter.body_runs == 9);  // recorded: the body's C++ never ran again
  CHECK(pool.stats().eager_calls == 1);
  CHECK(pool.stats().count(cgt::Reason::control_flow_on_host) == 1);  // said once
  CHECK(std::ranges::count(said, cgt::Reason::control_flow_on_host) == 1);
  must(pool.check_memory());
}

TEST_CASE(
    "control flow: FunctionOptions::control_flow_on_host records branches and choices as segments, equal to "
    "the conditional nodes' results",
    "[control_flow]") {
  auto segmented_pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  auto conditional_pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  // The same function in both pools; one records it with the host deciding.
  auto on_host = branching(segmented_pool, true);
  auto conditional = branching(conditional_pool);
  const BranchInputs inputs;
  for (const auto& [taken, chosen] : branch_cases) {
    const auto [host_decided, host_kind] = inputs.run(segmented_pool, on_host, taken, chosen);
    const auto [device_decided, device_kind] = inputs.run(conditional_pool, conditional, taken, chosen);
    CHECK(host_decided == device_decided);
    CHECK(host_kind == device_kind);
  }
  CHECK(segmented_pool.stats().replays == 6);
  CHECK(segmented_pool.stats().count(cgt::Reason::control_flow_on_host) == 0);  // asked for: nothing to say
  auto roots = segmented_pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots.front().control_flow_on_host());
  CHECK_FALSE(conditional_pool.roots().front().control_flow_on_host());
}

TEST_CASE(
    "control flow: nested loops and branches decided by the host give what they give eagerly, bounded by "
    "max_iterations",
    "[control_flow]") {
  // For i in [0, n) (at most 6): when i is odd, add i; then loop inner j in [0, i) adding 1 (at
  // most 3 times); a choice on i % 3 adds 100, 200 or 300 once per outer iteration.
  auto nested = [](cgt::host::Pool& pool, bool on_host) {
    cgt::FunctionOptions options{.name = "nested", .static_inputs = {0, 1, 2, 3, 4}, .mutated_inputs = {0, 1, 2, 3, 4}};
    options.control_flow_on_host = on_host;
    return must(pool.add_function(
        [](Context& ctx, Inputs in) {
          const Buffer sum = in[0], i = in[1], go_on = in[2], odd = in[3], inner = in[4];
          const Buffer n = in[5];
          ctx.launch([=] {
            sum.set(0, 0);
            i.set(0, 0);
            go_on.set(0, n.get(0) > 0 ? 1 : 0);
          });
          ctx.loop_while(go_on, 6, [&](Context& outer) {
            outer.launch([=] { odd.set(0, static_cast<int>(i.get(0)) % 2); });
            outer.if_then(odd, [&](Context& branch) { branch.launch([=] { sum.set(0, sum.get(0) + i.get(0)); }); });
            outer.launch([=] { inner.set(0, i.get(0) > 0 ? 1 : 0); });
            Buffer j = outer.allocate(ElementType::f32, {1});
            outer.launch([j] { j.set(0, 0); });
            outer.loop_while(inner, 3, [&](Context& body) {
              body.launch([=] {
                sum.set(0, sum.get(0) + 1);
                j.set(0, j.get(0) + 1);
                inner.set(0, j.get(0) < i.get(0) ? 1 : 0);
              });
            });
            std::array<Context::Body, 3> adds;
            for (std::size_t k = 0; k < adds.size(); ++k) {
              adds[k] = [=](Context& body) { body.launch([=] { sum.set(0, sum.get(0) + 100.0 * (k + 1)); }); };
            }
            outer.launch([=] { odd.set(0, static_cast<int>(i.get(0)) % 3); });  // the choice's index
            outer.switch_on(odd, adds);
            outer.launch([=] {
              i.set(0, i.get(0) + 1);
              go_on.set(0, i.get(0) < n.get(0) ? 1 : 0);
            });
          });
          Buffer result = ctx.allocate(ElementType::f32, {1});
          ctx.launch([=] { result.set(0, sum.get(0)); });
          return Values{result};
        },
        options));
  };
  auto expected = [](int n) {
    double sum = 0;
    for (int i = 0; i < std::min(n, 6); ++i) {
      if (i % 2 == 1) sum += i;
      sum += std::min(i, 3);
      sum += 100.0 * (i % 3 + 1);
    }
    return sum;
  };
  for (const bool on_host : {true, false}) {
    auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
    auto fn = nested(pool, on_host);
    const Buffer sum = scalar(ElementType::f32, 0), i = scalar(ElementType::i32, 0),
                 go_on = scalar(ElementType::i32, 0), odd = scalar(ElementType::i32, 0),
                 inner = scalar(ElementType::i32, 0);
    for (const int n : {3, 5, 0, 9, 1, 6, 2}) {
      pool.mark_step_begin();
      auto out = must(fn({sum, i, go_on, odd, inner, scalar(ElementType::f32, n)}));
      CHECK(output_values(out, 0).at(0) == expected(n));
    }
    CHECK(pool.stats().replays == 5);
    CHECK(pool.roots().front().control_flow_on_host() == on_host);
    must(pool.check_memory());
  }
}

TEST_CASE(
    "control flow: a body that throws while the host-decided recording captures it fails that call; the pool "
    "goes on",
    "[control_flow]") {
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  cgt::FunctionOptions options{.name = "refuses_on_host", .static_inputs = {0}};
  options.control_flow_on_host = true;
  auto refuses = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        ctx.loop_while(in[0], 4, [](Context& outer) {
          outer.if_then(outer.allocate(ElementType::i32, {1}), [](Context& body) {
            if (body.is_capturing()) throw cgt::host::InvalidArgument("the body refuses to be recorded");
          });
        });
        return Values{};
      },
      options));
  const Buffer go_on = scalar(ElementType::i32, 0);
  must(refuses({go_on}));  // warm-up: the loop is not entered
  auto recorded = refuses({go_on});
  REQUIRE_FALSE(recorded);
  CHECK(recorded.error().code == cgt::Errc::invalid_argument);
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  for (const double target : {2.0, 4.0, 1.0}) CHECK(count_to(pool, loop, counter, target).count == target);
  must(pool.check_memory());
}

TEST_CASE("control flow: a warm-up's loop reuses its iterations' temporaries, as its graph does", "[control_flow]") {
  // 50 iterations, each allocating a 4 KiB temporary: the warm-up peaks at about one iteration's
  // temporary, not fifty; the last one's lives to the call's end, and an output made from it is
  // right.
  auto pool = must(cgt::host::make_pool({.tree = {.debug_checks = true}}));
  const Counter counter;
  auto loop = must(pool.add_function(
      [](Context& ctx, Inputs in) {
        const Buffer count = in[0];
        const Buffer go_on = in[1];
        ctx.launch([count, go_on] { go_on.set(0, count.get(0) < 50 ? 1 : 0); });
        Buffer last;
        ctx.loop_while(go_on, 100, [&](Context& body) {
          const Buffer temporary = body.allocate(ElementType::f32, {1024});
          body.launch([count, go_on, temporary] {
            temporary.set(1023, count.get(0) + 1);
            count.set(0, temporary.get(1023));
            go_on.set(0, count.get(0) < 50 ? 1 : 0);
          });
          last = temporary;
        });
        Buffer reached = ctx.allocate(ElementType::f32, {1});
        ctx.launch([last, reached] { reached.set(0, last.get(1023)); });
        return Values{reached};
      },
      {.name = "temporaries", .static_inputs = {0, 1}, .mutated_inputs = {0, 1}}));
  for (const cgt::CallKind kind : {K::warmup, K::recording, K::replay}) {
    pool.mark_step_begin();
    counter.count.set(0, 0);
    auto out = must(loop({counter.count, counter.go_on}));
    CHECK(out.kind() == kind);
    CHECK(output_values(out, 0) == std::vector<double>{50});
    CHECK(pool.memory().peak_allocated_bytes < 3 * 4096);
  }
  must(pool.check_memory());
}
