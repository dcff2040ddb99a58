// cgt.cuda on a GPU: loops and branches the GPU decides (Context::loop_while, if_then, switch_on)
// are conditional nodes of the recorded graph: recorded once, each launch iterating or branching
// as its data says, with the values the same code gives run eagerly; a body CUDA forbids in a
// conditional node (a host callback) makes the pool record the function again with the host
// deciding between segments, with the same values. Tagged [gpu]; SKIPPED without a device.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
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
using cgt::cuda::Buffer;
using cgt::cuda::Context;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

void set(const Buffer& buffer, double value) {
  must(buffer.write(std::vector<double>{value}));
}
Buffer scalar(cgt::ElementType type, double value) {
  Buffer buffer = must(Buffer::make(type, {1}));
  set(buffer, value);
  return buffer;
}
double value_of(const Buffer& buffer) {
  return must(buffer.read()).at(0);
}

// A counting loop's state, in the program's buffers (as a KV cache would be): the count and
// whether to go on, both written in place by the loop's kernels.
struct Counter {
  Buffer count = scalar(cgt::ElementType::f32, 0);
  Buffer go_on = scalar(cgt::ElementType::i32, 0);
  std::shared_ptr<int> body_runs = std::make_shared<int>(0);                            // how often the body's C++ ran
  std::shared_ptr<std::atomic<int>> callbacks = std::make_shared<std::atomic<int>>(0);  // host callbacks run
};

void count_callback(void* counted) {
  ++*static_cast<std::atomic<int>*>(counted);
}

// Counts up to its target input in a loop of at most `max_iterations` steps the GPU decides, and
// returns the count reached (pool memory). `host_callback` puts a host node into the body, which
// CUDA forbids in a conditional node's body.
cgt::cuda::Function counting_loop(cgt::cuda::Pool& pool, const Counter& counter, std::uint64_t max_iterations,
                                  bool host_callback = false) {
  return must(pool.add_function(
      [runs = counter.body_runs, callbacks = counter.callbacks, max_iterations, host_callback](Context& ctx,
                                                                                               cgt::cuda::Inputs in) {
        auto* count = in[0].as<float>();
        auto* go_on = in[1].as<std::int32_t>();
        const auto* target = in[2].as<float>();
        (void)cgt_test::count_decide(count, go_on, target, ctx.stream());
        ctx.loop_while(in[1], max_iterations, [&](Context& body) {
          ++*runs;
          (void)cgt_test::count_step(count, go_on, target, body.stream());
          if (host_callback) (void)cudaLaunchHostFunc(body.stream(), count_callback, callbacks.get());
        });
        Buffer reached = ctx.allocate(cgt::ElementType::f32, {1});
        (void)cgt_test::sum_inputs(count, nullptr, nullptr, nullptr, reached.as<float>(), 1, ctx.stream());
        return cgt::cuda::Values{reached};
      },
      {.name = host_callback ? "count_with_callback" : "count", .static_inputs = {0, 1}, .mutated_inputs = {0, 1}}));
}

struct Reached {
  double count;
  K kind;
};
// From a count of 0 towards `target` (a copied input: the graph reads it through its slot).
Reached count_to(cgt::cuda::Pool& pool, cgt::cuda::Function& loop, const Counter& counter, double target) {
  pool.mark_step_begin();
  set(counter.count, 0);
  const Buffer goal = scalar(cgt::ElementType::f32, target);
  auto out = must(loop({counter.count, counter.go_on, goal}));
  const double reached = must(must(out.get(0)).get().read()).at(0);
  CHECK(reached == value_of(counter.count));
  return {.count = reached, .kind = out.kind()};
}

}  // namespace

TEST_CASE("cuda/control flow: a WHILE node is recorded once and each replay iterates as its data says",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);

  const Reached warmup = count_to(pool, loop, counter, 5);
  CHECK(warmup.kind == K::warmup);
  CHECK(warmup.count == 5);
  CHECK(*counter.body_runs == 5);
  const Reached recording = count_to(pool, loop, counter, 3);
  CHECK(recording.kind == K::recording);
  CHECK(recording.count == 3);
  CHECK(*counter.body_runs == 6);
  for (const double target : {7.0, 1.0, 0.0, 42.0, 3.0}) {
    const Reached replay = count_to(pool, loop, counter, target);
    CHECK(replay.kind == K::replay);
    CHECK(replay.count == target);
  }
  CHECK(*counter.body_runs == 6);  // the host never ran the body again, nor read go_on
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
}

TEST_CASE(
    "cuda/control flow: a WHILE node replays right after its pool slept and woke (its counter's memory was "
    "given back and mapped again)",
    "[gpu][control_flow][sleep]") {
  REQUIRE_GPU();
  cgt::cuda::PoolOptions options;
  options.tree.debug_checks = true;
  options.sleepable = true;
  auto pool = must(cgt::cuda::make_pool(std::move(options)));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  CHECK(count_to(pool, loop, counter, 5).kind == K::warmup);
  CHECK(count_to(pool, loop, counter, 3).kind == K::recording);
  for (const double target : {7.0, 0.0, 42.0}) {
    CHECK(must(pool.sleep()) >= pool.memory().reserved_bytes);
    const Reached replay = count_to(pool, loop, counter, target);
    CHECK(replay.kind == K::replay);
    CHECK(replay.count == target);
  }
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().sleeps == 3);
}

TEST_CASE("cuda/control flow: max_iterations bounds a WHILE node whose condition never turns false",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 8);
  for (int call = 0; call < 4; ++call) {
    CHECK(count_to(pool, loop, counter, 1e9).count == 8);
    CHECK(value_of(counter.go_on) == 1);
  }
  CHECK(pool.stats().replays == 2);
}

TEST_CASE(
    "cuda/control flow: a loop body with a host callback runs that call eagerly, then is recorded with the host "
    "deciding between segments; each replay runs the body as often as eagerly",
    "[gpu][control_flow]") {
  REQUIRE_GPU();
  std::vector<cgt::Event> events;
  auto pool = must(H::make_pool({.debug_checks = true, .log_sink = [&](const cgt::Event& e) { events.push_back(e); }}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100, /*host_callback=*/true);
  std::vector<K> kinds;
  int iterations = 0;
  for (const double target : {5.0, 3.0, 6.0, 2.0, 0.0, 9.0}) {
    const Reached reached = count_to(pool, loop, counter, target);
    CHECK(reached.count == target);
    kinds.push_back(reached.kind);
    iterations += static_cast<int>(target);
  }
  CHECK(kinds == std::vector<K>{K::warmup, K::eager, K::recording, K::replay, K::replay, K::replay});
  CHECK(*counter.body_runs == 5 + (1 + 3) + 1);  // warm-up; a capture given up, then eager; the recording
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(counter.callbacks->load() == iterations);  // one callback per iteration, every call
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 1);
  CHECK(pool.stats().count(cgt::Reason::control_flow_on_host) == 1);
  bool said_why = false;
  for (const cgt::Event& event : events) {
    said_why = said_why || (event.reason == cgt::Reason::control_flow_on_host &&
                            event.message.find("host node") != std::string::npos);
  }
  CHECK(said_why);
  auto roots = pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots.front().control_flow_on_host());
}

TEST_CASE("cuda/control flow: a loop's output lease held across later calls keeps its value", "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  for (int warm = 0; warm < 2; ++warm) (void)count_to(pool, loop, counter, 2);
  pool.mark_step_begin();
  set(counter.count, 0);
  const Buffer four = scalar(cgt::ElementType::f32, 4);
  auto held = must(loop({counter.count, counter.go_on, four}));
  for (const double target : {9.0, 6.0}) {
    set(counter.count, 0);
    const Buffer goal = scalar(cgt::ElementType::f32, target);
    auto out = must(loop({counter.count, counter.go_on, goal}));
    CHECK(must(must(out.get(0)).get().read()).at(0) == target);
  }
  CHECK(must(must(held.get(0)).get().read()).at(0) == 4);
}

TEST_CASE("cuda/control flow: a WHILE graph re-recorded for moved static state replays each recording on its own state",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter first;
  const Counter second;  // the same function over other static buffers: a re-recording
  auto loop = counting_loop(pool, first, 100);
  (void)count_to(pool, loop, first, 3);
  (void)count_to(pool, loop, first, 3);
  CHECK(count_to(pool, loop, second, 5).kind == K::recording);
  // The two recordings may share one executable (updated in place to the one a replay needs):
  // each replay must iterate over its own state, whatever the other left.
  for (const auto& [state, target] : {std::pair{&first, 4.0}, std::pair{&second, 6.0}, std::pair{&first, 2.0},
                                      std::pair{&second, 7.0}, std::pair{&first, 9.0}}) {
    set(state == &first ? second.count : first.count, -100);  // the other's state, unread
    const Reached replay = count_to(pool, loop, *state, target);
    CHECK(replay.kind == K::replay);
    CHECK(replay.count == target);
    CHECK(value_of(state == &first ? second.count : first.count) == -100);
  }
  const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
  INFO("instantiated " << counts.instantiated << ", updated in place " << counts.updated_in_place);
  CHECK(counts.instantiated + counts.updated_in_place == 2);
}

TEST_CASE("cuda/control flow: IF and SWITCH nodes, and a WHILE inside an IF, decide at each replay as eagerly",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  // Conditional nodes, then the same function recorded with the host deciding (the fallback).
  const bool on_host = GENERATE(false, true);
  CAPTURE(on_host);
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter counter;
  cgt::FunctionOptions options{.name = "branch", .static_inputs = {0, 1, 2, 3, 4}, .mutated_inputs = {0, 3, 4}};
  options.control_flow_on_host = on_host;
  auto branch = must(pool.add_function(
      [](Context& ctx, cgt::cuda::Inputs in) {
        auto* x = in[0].as<float>();
        ctx.if_then(in[1], [x](Context& body) { (void)cgt_test::add_repeatedly(x, 1, 10, 1, body.stream()); });
        std::array<Context::Body, 3> cases;
        for (std::size_t i = 0; i < cases.size(); ++i) {
          cases[i] = [x, i](Context& body) {
            (void)cgt_test::add_repeatedly(x, 1, static_cast<float>(i + 1), 1, body.stream());
          };
        }
        ctx.switch_on(in[2], cases);
        // A loop nested in a branch: counts to the target when the condition holds.
        auto* count = in[3].as<float>();
        auto* go_on = in[4].as<std::int32_t>();
        const auto* target = in[5].as<float>();
        ctx.if_then(in[1], [&](Context& body) {
          (void)cgt_test::count_decide(count, go_on, target, body.stream());
          body.loop_while(in[4], 50,
                          [&](Context& inner) { (void)cgt_test::count_step(count, go_on, target, inner.stream()); });
        });
        Buffer result = ctx.allocate(cgt::ElementType::f32, {1});
        (void)cgt_test::sum_inputs(x, count, nullptr, nullptr, result.as<float>(), 1, ctx.stream());
        return cgt::cuda::Values{result};
      },
      options));
  const Buffer x = scalar(cgt::ElementType::f32, 0);
  const Buffer condition = scalar(cgt::ElementType::i32, 0);
  const Buffer choice = scalar(cgt::ElementType::i32, 0);
  const std::array<std::pair<int, int>, 8> cases{{{1, 0}, {0, 2}, {1, 1}, {0, -1}, {1, 3}, {0, 0}, {1, 2}, {0, 7}}};
  std::vector<K> kinds;
  for (const auto& [taken, chosen] : cases) {
    pool.mark_step_begin();
    set(x, 0);
    set(condition, static_cast<double>(taken));
    set(choice, static_cast<double>(chosen));
    set(counter.count, 0);
    const Buffer goal = scalar(cgt::ElementType::f32, 5);
    auto out = must(branch({x, condition, choice, counter.count, counter.go_on, goal}));
    const double expected = (taken != 0 ? 10 + 5 : 0) + (chosen >= 0 && chosen < 3 ? chosen + 1 : 0);
    CHECK(must(must(out.get(0)).get().read()).at(0) == expected);
    kinds.push_back(out.kind());
  }
  CHECK(kinds.at(0) == K::warmup);
  CHECK(kinds.at(1) == K::recording);
  for (std::size_t i = 2; i < kinds.size(); ++i) CHECK(kinds[i] == K::replay);
  CHECK(pool.roots().front().control_flow_on_host() == on_host);
}

TEST_CASE("cuda/control flow: a loop decided on a value that is not one i32 element, or bounded by 0, is refused",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({}));
  auto refused = [&](Buffer decider, std::uint64_t max_iterations) {
    auto fn = must(pool.add_function(
        [max_iterations](Context& ctx, cgt::cuda::Inputs in) {
          ctx.loop_while(in[0], max_iterations, [](Context&) {});
          return cgt::cuda::Values{};
        },
        {.name = "bad", .static_inputs = {0}}));
    auto out = fn({std::move(decider)});
    REQUIRE_FALSE(out);
    return out.error();
  };
  CHECK(refused(scalar(cgt::ElementType::f32, 1), 4).code == cgt::Errc::invalid_argument);
  CHECK(refused(must(Buffer::make(cgt::ElementType::i32, {2})), 4).code == cgt::Errc::invalid_argument);
  CHECK_THAT(refused(scalar(cgt::ElementType::i32, 1), 0).message,
             Catch::Matchers::ContainsSubstring("max_iterations"));
}

TEST_CASE("cuda/control flow: a body that throws while it is recorded fails that call; the pool goes on",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  const bool on_host = GENERATE(false, true);
  CAPTURE(on_host);
  std::string said;
  auto pool =
      must(H::make_pool({.debug_checks = true, .log_sink = [&](const cgt::Event& event) {
                           said += std::string(cgt::to_string(event.reason)) + ": " + std::string(event.message) + "\n";
                         }}));
  cgt::FunctionOptions options{.name = "refuses", .static_inputs = {0}};
  options.control_flow_on_host = on_host;
  auto refuses = must(pool.add_function(
      [](Context& ctx, cgt::cuda::Inputs in) {
        ctx.loop_while(in[0], 4, [](Context& body) {
          if (body.is_capturing()) throw cgt::cuda::InvalidArgument("the body refuses to be recorded");
        });
        return cgt::cuda::Values{};
      },
      options));
  const Buffer go_on = scalar(cgt::ElementType::i32, 0);
  must(refuses({go_on}));  // warm-up: the loop is not entered
  auto recorded = refuses({go_on});
  if (recorded) {
    FAIL("the call succeeded as a " << cgt::to_string(recorded->kind()) << "; " << cgt::to_string(pool.stats())
                                    << "; the pool said:\n"
                                    << said);
  }
  CHECK(recorded.error().code == cgt::Errc::invalid_argument);
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  for (const double target : {2.0, 4.0, 1.0}) CHECK(count_to(pool, loop, counter, target).count == target);
  must(pool.check_memory());
}
