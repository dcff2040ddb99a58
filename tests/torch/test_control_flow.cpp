// cgt.torch on a GPU: loops and branches the GPU decides in a libtorch pool function
// (cgt::torch::loop_while, if_then, switch_on) are conditional nodes of the recorded graph:
// recorded once, each replay iterating or branching as its data says, with what the same code
// computes eagerly; a body CUDA forbids there (a host callback) makes the pool record the function
// again with the host deciding between segments, with the same values; bad deciders, bodies that
// draw random numbers or keep what they make are refused. Tagged [gpu]; SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using K = cgt::CallKind;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

at::TensorOptions cuda() {
  return H::cuda();
}

// A counting loop's state in the program's tensors (as a KV cache would be), written in place.
struct Counter {
  at::Tensor count = at::zeros({1}, cuda());
  at::Tensor go_on = at::zeros({1}, cuda().dtype(at::kInt));
  std::shared_ptr<int> body_runs = std::make_shared<int>(0);
  std::shared_ptr<std::atomic<int>> callbacks = std::make_shared<std::atomic<int>>(0);  // host callbacks run
};

void count_callback(void* counted) {
  ++*static_cast<std::atomic<int>*>(counted);
}

// Counts up to its target input (copied into the graph's slot) in a loop of at most
// `max_iterations` the GPU decides; returns the count reached (pool memory).
cgt::torch::Function counting_loop(cgt::torch::Pool& pool, const Counter& counter, std::uint64_t max_iterations,
                                   bool host_callback = false) {
  return must(pool.add_function(
      [runs = counter.body_runs, callbacks = counter.callbacks, max_iterations, host_callback](cgt::torch::Inputs in) {
        at::Tensor count = in[0];
        at::Tensor go_on = in[1];
        const at::Tensor target = in[2];
        go_on.copy_(count < target);
        cgt::torch::loop_while(go_on, max_iterations, [&] {
          ++*runs;
          count.add_(1);
          go_on.copy_(count < target);
          if (host_callback) {
            (void)cudaLaunchHostFunc(c10::cuda::getCurrentCUDAStream().stream(), count_callback, callbacks.get());
          }
        });
        return cgt::torch::Values{count.clone()};
      },
      {.name = host_callback ? "count_with_callback" : "count", .static_inputs = {0, 1}, .mutated_inputs = {0, 1}}));
}

struct Reached {
  double count;
  K kind;
};
Reached count_to(cgt::torch::Pool& pool, cgt::torch::Function& loop, const Counter& counter, double target) {
  pool.mark_step_begin();
  counter.count.zero_();
  const at::Tensor goal = at::full({1}, target, cuda());
  auto out = must(loop({counter.count, counter.go_on, goal}));
  const double reached = must(out.get(0)).get().item<float>();
  CHECK(reached == counter.count.item<float>());
  return {.count = reached, .kind = out.kind()};
}

}  // namespace

TEST_CASE("torch/control flow: a WHILE node is recorded once and each replay iterates as its data says",
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
  CHECK(*counter.body_runs == 6);
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
}

TEST_CASE("torch/control flow: max_iterations bounds a WHILE node whose condition never turns false",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 8);
  for (int call = 0; call < 4; ++call) {
    CHECK(count_to(pool, loop, counter, 1e9).count == 8);
    CHECK(counter.go_on.item<int>() == 1);
  }
  CHECK(pool.stats().replays == 2);
}

TEST_CASE(
    "torch/control flow: a body with a host callback runs that call eagerly, then is recorded with the host deciding "
    "between segments; each replay runs the body as often as eagerly",
    "[gpu][control_flow]") {
  REQUIRE_GPU();
  std::vector<std::string> reasons;
  auto pool = must(H::make_pool({.debug_checks = true, .log_sink = [&](const cgt::Event& event) {
                                   if (event.reason == cgt::Reason::control_flow_on_host) {
                                     reasons.emplace_back(event.message);
                                   }
                                 }}));
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
  torch::cuda::synchronize();
  CHECK(counter.callbacks->load() == iterations);  // one callback per iteration, every call
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 1);
  REQUIRE(reasons.size() == 1);
  CHECK_THAT(reasons.front(), Catch::Matchers::ContainsSubstring("host node"));
  CHECK(pool.roots().front().control_flow_on_host());
  must(pool.check_memory());
}

TEST_CASE("torch/control flow: a loop body that draws random numbers, or keeps a tensor it made, is not recorded",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  const bool on_host = GENERATE(false, true);
  CAPTURE(on_host);
  std::vector<std::string> reasons;
  auto pool = must(H::make_pool({.debug_checks = true, .log_sink = [&](const cgt::Event& event) {
                                   if (event.reason == cgt::Reason::capture_failed) reasons.emplace_back(event.message);
                                 }}));
  cgt::FunctionOptions random_options{.name = "random_body", .static_inputs = {0, 1}, .mutated_inputs = {0, 1}};
  random_options.control_flow_on_host = on_host;
  auto random_body = must(pool.add_function(
      [](cgt::torch::Inputs in) {
        at::Tensor x = in[0];
        at::Tensor go_on = in[1];
        cgt::torch::loop_while(go_on, 4, [&] {
          x.add_(at::rand_like(x));
          go_on.copy_((x < 100).all());
        });
        return cgt::torch::Values{x.clone()};
      },
      random_options));
  cgt::FunctionOptions kept_options{.name = "kept_body", .static_inputs = {0, 1}, .mutated_inputs = {1}};
  kept_options.control_flow_on_host = on_host;
  auto kept = must(pool.add_function(
      [](cgt::torch::Inputs in) {
        at::Tensor x = in[0];
        at::Tensor go_on = in[1];
        cgt::torch::loop_while(go_on, 3, [&] { x = x * 2; });  // a new tensor each iteration, eagerly
        return cgt::torch::Values{x.clone()};
      },
      kept_options));
  const at::Tensor x = at::ones({4}, cuda());
  const at::Tensor go_on = at::ones({1}, cuda().dtype(at::kInt));
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    x.fill_(1);
    go_on.fill_(1);
    auto drawn = must(random_body({x, go_on}));
    CHECK(must(drawn.get(0)).get().min().item<float>() > 1);
    go_on.fill_(1);
    x.fill_(1);
    auto doubled = must(kept({x, go_on}));
    CHECK(must(doubled.get(0)).get().min().item<float>() == 8);  // three doublings, as eagerly
  }
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().eager_calls == 4);
  REQUIRE(reasons.size() == 2);
  CHECK_THAT(reasons.at(0), Catch::Matchers::ContainsSubstring("random"));
  CHECK_THAT(reasons.at(1), Catch::Matchers::ContainsSubstring("outlives the body"));
}

TEST_CASE("torch/control flow: a loop's output lease held across later calls keeps its value", "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  for (int warm = 0; warm < 2; ++warm) (void)count_to(pool, loop, counter, 2);
  pool.mark_step_begin();
  counter.count.zero_();
  auto held = must(loop({counter.count, counter.go_on, at::full({1}, 4.0, cuda())}));
  for (const double target : {9.0, 6.0}) {
    counter.count.zero_();
    auto out = must(loop({counter.count, counter.go_on, at::full({1}, target, cuda())}));
    CHECK(must(out.get(0)).get().item<float>() == target);
  }
  CHECK(must(held.get(0)).get().item<float>() == 4);
}

TEST_CASE(
    "torch/control flow: a WHILE graph re-recorded for moved static state replays each recording on its own state",
    "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  const Counter first;
  const Counter second;  // the same function over other static tensors: a re-recording
  auto loop = counting_loop(pool, first, 100);
  (void)count_to(pool, loop, first, 3);
  (void)count_to(pool, loop, first, 3);
  CHECK(count_to(pool, loop, second, 5).kind == K::recording);
  // The two recordings may share one executable (updated in place to the one a replay needs):
  // each replay must iterate over its own state, whatever the other left.
  for (const auto& [state, target] : {std::pair{&first, 4.0}, std::pair{&second, 6.0}, std::pair{&first, 2.0},
                                      std::pair{&second, 7.0}, std::pair{&first, 9.0}}) {
    const Counter& other = state == &first ? second : first;
    other.count.fill_(-100);
    const Reached replay = count_to(pool, loop, *state, target);
    CHECK(replay.kind == K::replay);
    CHECK(replay.count == target);
    CHECK(other.count.item<float>() == -100);
  }
  const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
  INFO("instantiated " << counts.instantiated << ", updated in place " << counts.updated_in_place);
  CHECK(counts.instantiated + counts.updated_in_place == 2);
}

TEST_CASE("torch/control flow: IF and SWITCH nodes, and a WHILE inside an IF, decide at each replay as eagerly",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  // Conditional nodes, then the same function recorded with the host deciding (the fallback).
  const bool on_host = GENERATE(false, true);
  CAPTURE(on_host);
  auto pool = must(H::make_pool({.debug_checks = true}));
  cgt::FunctionOptions options{.name = "branch", .static_inputs = {0, 1, 2, 3, 4}, .mutated_inputs = {0, 3, 4}};
  options.control_flow_on_host = on_host;
  auto branch = must(pool.add_function(
      [](cgt::torch::Inputs in) {
        at::Tensor x = in[0];
        cgt::torch::if_then(in[1], [&] { x.add_(10); });
        std::array<cgt::torch::Body, 3> cases;
        for (std::size_t i = 0; i < cases.size(); ++i) cases[i] = [&x, i] { x.add_(static_cast<double>(i + 1)); };
        cgt::torch::switch_on(in[2], cases);
        // A loop nested in a branch, whose body allocates (pool memory, on the body's stream).
        at::Tensor count = in[3];
        at::Tensor go_on = in[4];
        const at::Tensor target = in[5];
        cgt::torch::if_then(in[1], [&] {
          go_on.copy_(count < target);
          cgt::torch::loop_while(go_on, 50, [&] {
            const at::Tensor step = at::ones_like(count);
            count.add_(step);
            go_on.copy_(count < target);
          });
        });
        return cgt::torch::Values{x + count};
      },
      options));
  const at::Tensor x = at::zeros({1}, cuda());
  const at::Tensor condition = at::zeros({1}, cuda().dtype(at::kInt));
  const at::Tensor choice = at::zeros({1}, cuda().dtype(at::kInt));
  const Counter counter;
  const std::array<std::pair<int, int>, 8> cases{{{1, 0}, {0, 2}, {1, 1}, {0, -1}, {1, 3}, {0, 0}, {1, 2}, {0, 7}}};
  std::vector<K> kinds;
  for (const auto& [taken, chosen] : cases) {
    pool.mark_step_begin();
    x.zero_();
    condition.fill_(taken);
    choice.fill_(chosen);
    counter.count.zero_();
    auto out = must(branch({x, condition, choice, counter.count, counter.go_on, at::full({1}, 5.0, cuda())}));
    const double expected = (taken != 0 ? 10 + 5 : 0) + (chosen >= 0 && chosen < 3 ? chosen + 1 : 0);
    CHECK(must(out.get(0)).get().item<float>() == expected);
    kinds.push_back(out.kind());
  }
  CHECK(kinds.at(0) == K::warmup);
  CHECK(kinds.at(1) == K::recording);
  for (std::size_t i = 2; i < kinds.size(); ++i) CHECK(kinds[i] == K::replay);
  CHECK(pool.roots().front().control_flow_on_host() == on_host);
  must(pool.check_memory());
}

TEST_CASE("torch/control flow: a decider that is not one int32 element on the GPU, or a bound of 0, is refused",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({}));
  auto refused = [&](at::Tensor decider, std::uint64_t max_iterations) {
    auto fn = must(pool.add_function(
        [max_iterations](cgt::torch::Inputs in) {
          cgt::torch::loop_while(in[0], max_iterations, [] {});
          return cgt::torch::Values{};
        },
        {.name = "bad", .static_inputs = {0}}));
    auto out = fn({std::move(decider)});
    REQUIRE_FALSE(out);
    return out.error();
  };
  CHECK(refused(at::ones({1}, cuda()), 4).code == cgt::Errc::invalid_argument);
  CHECK(refused(at::ones({2}, cuda().dtype(at::kInt)), 4).code == cgt::Errc::invalid_argument);
  CHECK(refused(at::ones({1}, at::TensorOptions().dtype(at::kInt)), 4).code == cgt::Errc::invalid_argument);
  CHECK_THAT(refused(at::ones({1}, cuda().dtype(at::kInt)), 0).message,
             Catch::Matchers::ContainsSubstring("max_iterations"));
}

TEST_CASE("torch/control flow: a body that throws while it is recorded fails that call; the pool goes on",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  const bool on_host = GENERATE(false, true);
  CAPTURE(on_host);
  auto pool = must(H::make_pool({.debug_checks = true}));
  cgt::FunctionOptions options{.name = "refuses", .static_inputs = {0}};
  options.control_flow_on_host = on_host;
  auto refuses = must(pool.add_function(
      [](cgt::torch::Inputs in) {
        cgt::torch::loop_while(in[0], 4, [] {
          cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
          (void)cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream().stream(), &status);
          if (status == cudaStreamCaptureStatusActive) throw std::runtime_error("the body refuses to be recorded");
        });
        return cgt::torch::Values{};
      },
      options));
  const at::Tensor go_on = at::ones({1}, cuda().dtype(at::kInt));
  go_on.zero_();
  must(refuses({go_on}));  // warm-up: the loop is not entered
  auto recorded = refuses({go_on});
  REQUIRE_FALSE(recorded);
  CHECK(recorded.error().code == cgt::Errc::function_failed);
  CHECK_THAT(recorded.error().message, Catch::Matchers::ContainsSubstring("refuses to be recorded"));
  // The pool is whole: another function records and replays.
  const Counter counter;
  auto loop = counting_loop(pool, counter, 100);
  for (const double target : {2.0, 4.0, 1.0}) CHECK(count_to(pool, loop, counter, target).count == target);
  must(pool.check_memory());
}

TEST_CASE("torch/control flow: loop_while on a stream capturing the program's own graph is refused before it reads",
          "[gpu][control_flow]") {
  REQUIRE_GPU();
  const at::Tensor go_on = at::ones({1}, cuda().dtype(at::kInt));
  const at::Tensor x = at::zeros({1}, cuda());
  at::cuda::CUDAGraph graph;
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  std::string refused;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    x.add_(1);
    try {
      cgt::torch::loop_while(go_on, 4, [&] { x.add_(1); });
    } catch (const cgt::torch::InvalidArgument& error) {
      refused = error.what();
    }
    graph.capture_end();  // the program's capture was left intact
  }
  CHECK_THAT(refused, Catch::Matchers::ContainsSubstring("program's own"));
  graph.replay();
  torch::cuda::synchronize();
  CHECK(x.item<float>() == 1);  // its one op, captured before the refusal
}
