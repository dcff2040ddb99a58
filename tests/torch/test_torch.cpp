// cgt.torch on a GPU: the shared scenario suite with real tensors (live blocks counted from the
// caching allocator's snapshot of the pool, as PyTorch's tests do), and what only libtorch has:
// RNG in graphs, cuBLAS, nn::Linear parameters, poisoning of escaped tensors, several pools,
// shutdown with leases held. Every test is tagged [gpu] and reports SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <deque>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"
#include "device_surface.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"
#include "scenario/register.hpp"

using H = TorchHarness;
using scenario::must;

// The device a program reaches (`pool.device()`) offers its own members, none of the engine's side.
static_assert(!cgt_test::offers_the_engine_side<cgt::torch::Device>);
static_assert(requires(cgt::torch::Device& d) {
  d.index();
  d.contains(0);
  d.graph_counts();
});

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

// The shared scenario suite (scenario/register.hpp), named "torch/<scenario>" and tagged [gpu].
namespace {
const bool registered = scenario::register_scenarios<H>("torch/", "[gpu]");
}  // namespace

namespace {

at::TensorOptions cuda() {
  return H::cuda();
}

cgt::torch::Pool new_pool(cgt::Options options = {}) {
  return must(H::make_pool(std::move(options)));
}

}  // namespace

// PyTorch's check_rng: random numbers drawn in a warm-up, a recording and a replay are the ones
// eager execution draws after the same seed.
TEST_CASE("torch/check_rng", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  auto foo = must(pool.add_function([](cgt::torch::Inputs) { return cgt::torch::Values{at::rand({20}, cuda())}; },
                                    {.name = "foo"}));
  std::vector<at::Tensor> first, second;
  std::vector<cgt::CallKind> kinds;
  for (auto* draws : {&first, &second}) {
    at::manual_seed(0);
    for (int i = 0; i < 3; ++i) {
      pool.mark_step_begin();
      auto out = must(foo({}));
      kinds.push_back(out.kind());
      draws->push_back(must(out.take(0)));
    }
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay, K::replay, K::replay});
  at::manual_seed(0);
  for (int i = 0; i < 3; ++i) {
    const at::Tensor eager = at::rand({20}, cuda());
    INFO("draw " << i << ": eager " << eager[0].item<float>() << ", first pass "
                 << first[static_cast<std::size_t>(i)][0].item<float>() << ", second pass "
                 << second[static_cast<std::size_t>(i)][0].item<float>());
    CHECK(at::equal(first[static_cast<std::size_t>(i)], eager));
    CHECK(at::equal(second[static_cast<std::size_t>(i)], eager));
  }
  CHECK(!at::equal(first[0], first[1]));
}

TEST_CASE("torch/matmul inside a graph (cuBLAS)", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool({.debug_checks = true});
  auto mm = must(pool.add_function(
      [](cgt::torch::Inputs in) { return cgt::torch::Values{at::relu(at::matmul(in[0], in[1]) + 1)}; },
      {.name = "mm"}));
  const at::Tensor b = at::randn({128, 128}, cuda());
  for (int i = 0; i < 5; ++i) {
    const at::Tensor a = at::randn({64, 128}, cuda());
    pool.mark_step_begin();
    auto out = must(mm({a, b}));
    CHECK(at::allclose(must(out.get(0)).get(), at::relu(at::matmul(a, b) + 1), 1e-3, 1e-3));
  }
  CHECK(pool.stats().replays == 3);
  must(pool.check_memory());
}

TEST_CASE("torch/nn::Linear parameters as static inputs, and as constants", "[gpu]") {
  REQUIRE_GPU();
  torch::NoGradGuard no_grad;
  torch::nn::Linear linear(64, 32);
  linear->to(torch::Device(torch::kCUDA, 0));
  auto pool = new_pool({.debug_checks = true});
  auto as_inputs =
      must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{at::linear(in[0], in[1], in[2])}; },
                             {.name = "linear_inputs", .static_inputs = {1, 2}}));
  auto as_constants = must(pool.add_function(
      [&linear](cgt::torch::Inputs in) { return cgt::torch::Values{linear->forward(in[0]), linear->weight}; },
      {.name = "linear_module"}));
  for (int i = 0; i < 4; ++i) {
    const at::Tensor x = at::randn({8, 64}, cuda());
    const at::Tensor expected = linear->forward(x);
    pool.mark_step_begin();
    auto a = must(as_inputs({x, linear->weight, linear->bias}));
    CHECK(at::allclose(must(a.get(0)).get(), expected, 1e-4, 1e-4));
    auto b = must(as_constants({x}));
    CHECK(at::allclose(must(b.get(0)).get(), expected, 1e-4, 1e-4));
    // The parameter returned by the function is the parameter itself, not pool memory.
    CHECK(must(b.get(1)).get().data_ptr() == linear->weight.data_ptr());
  }
  const auto roots = pool.roots();
  REQUIRE(roots.size() == 1);
  CHECK(roots[0].copied_inputs() == std::vector<std::size_t>{0});  // weight and bias are used in place
  CHECK(pool.stats().replays >= 4);
}

// A static input that moves is re-recorded as a sibling (PyTorch's rule), and the re-recording,
// of the same topology, updates the first graph's executable instead of instantiating another.
// Both addresses keep replaying correctly, each loading its graph back when the other ran last.
TEST_CASE("torch/a moved static input updates the recorded graph in place, and every address still replays", "[gpu]") {
  REQUIRE_GPU();
  for (const bool in_place : {true, false}) {
    INFO("update_graphs_in_place = " << in_place);
    auto pool = must(cgt::torch::make_pool({.tree = {.debug_checks = true}, .update_graphs_in_place = in_place}));
    auto scale = must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * in[1] + 1}; },
                                        {.name = "scale", .static_inputs = {1}}));
    std::vector<at::Tensor> weights;
    for (int w = 0; w < 3; ++w) weights.push_back(at::full({4}, w + 2, cuda()));
    // weight 0: warm-up, then the first recording; weights 1 and 2: re-recordings; then replays
    // that alternate between the three graphs.
    const std::vector<int> order{0, 0, 1, 2, 0, 1, 2, 1, 0};
    for (std::size_t step = 0; step < order.size(); ++step) {
      const auto w = static_cast<std::size_t>(order[step]);
      const auto x = static_cast<float>(step + 1);
      pool.mark_step_begin();
      auto out = must(scale({at::full({4}, x, cuda()), weights[w]}));
      CHECK(must(out.get(0)).get()[3].item<float>() == x * static_cast<float>(w + 2) + 1);
      CHECK(out.kind() ==
            (step == 0 ? cgt::CallKind::warmup : (step < 4 ? cgt::CallKind::recording : cgt::CallKind::replay)));
    }
    CHECK(pool.stats().rerecords == 2);
    const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
    CHECK(counts.instantiated == (in_place ? 1U : 3U));
    CHECK(counts.updated_in_place == (in_place ? 2U : 0U));
    CHECK(counts.switched == (in_place ? 5U : 0U));
    must(pool.check_memory());
  }
}

// A graph that draws random numbers replays through CUDAGraph::replay, which advances the
// generator; it never shares an executable, and each re-recording draws fresh numbers.
TEST_CASE("torch/a graph that draws random numbers is re-recorded, not updated in place", "[gpu]") {
  REQUIRE_GPU();
  auto pool = must(cgt::torch::make_pool({}));
  auto noisy =
      must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] + at::rand({16}, cuda())}; },
                             {.name = "noisy", .static_inputs = {0}}));
  const at::Tensor a = at::zeros({16}, cuda());
  const at::Tensor b = at::zeros({16}, cuda());
  std::vector<at::Tensor> draws;
  for (const at::Tensor* base : {&a, &a, &b, &b, &a}) {
    pool.mark_step_begin();
    draws.push_back(must(must(noisy({*base})).take(0)));
  }
  const cgt::GraphCounts& counts = must(pool.device()).get().graph_counts();
  CHECK(counts.instantiated == 2);
  CHECK(counts.updated_in_place == 0);
  for (std::size_t i = 1; i < draws.size(); ++i) CHECK(!at::equal(draws[i], draws[i - 1]));
}

TEST_CASE("torch/an escaped tensor is poisoned when its memory is reclaimed", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool({.debug_checks = true});
  auto f =
      must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; }, {.name = "doubler"}));
  const at::Tensor x = at::ones({16}, cuda());
  for (int i = 0; i < 3; ++i) {  // warm-up, recording, replay: every kind of output
    pool.mark_step_begin();
    auto out = must(f({x}));
    at::Tensor escaped = must(out.get(0)).get();               // a copy of the lease's tensor
    at::Tensor view = must(out.get(0)).get().narrow(0, 0, 4);  // a view of it
    CHECK(escaped.sum().item<float>() == 32);
    out.reset();  // the memory is dead: the copies must not read what the next replay writes
    std::string message;
    try {
      (void)escaped.sum();
    } catch (const c10::Error& error) {
      message = error.what_without_backtrace();
    }
    CHECK(message.find("'doubler'") != std::string::npos);
    CHECK_THROWS_AS(view.sum(), c10::Error);
  }
  // Outputs nobody escaped are reused; the pool keeps working after poisoning.
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    CHECK(must(must(f({x})).take(0)).sum().item<float>() == 32);
  }
  // A new step reclaims outputs still leased: the lease reports it, and its escaped copy raises.
  auto held = must(f({x}));
  at::Tensor escaped = must(held.get(0)).get();
  pool.mark_step_begin();
  (void)must(f({x}));
  CHECK(held.get(0).error().code == cgt::Errc::output_overwritten);
  CHECK_THROWS_AS(escaped.sum(), c10::Error);
  // Passing a poisoned tensor into a call fails cleanly.
  auto call = f({escaped});
  REQUIRE(!call);
  CHECK(call.error().code == cgt::Errc::output_overwritten);
}

TEST_CASE("torch/two pools on one device are independent", "[gpu]") {
  REQUIRE_GPU();
  auto first = new_pool({.debug_checks = true});
  auto second = new_pool({.debug_checks = true});
  auto add =
      must(first.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] + 1}; }, {.name = "add"}));
  auto mul =
      must(second.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 3}; }, {.name = "mul"}));
  for (int i = 0; i < 4; ++i) {
    first.mark_step_begin();
    second.mark_step_begin();
    const at::Tensor x = at::full({32}, static_cast<double>(i), cuda());
    auto a = must(add({x}));
    auto b = must(mul({must(a.get(0)).get()}));  // an output of the other pool is an ordinary input here
    CHECK(must(b.get(0)).get()[0].item<float>() == static_cast<float>((i + 1) * 3));
    // Warm-ups and recordings allocate their outputs in their own pool; replays allocate nothing.
    CHECK(first.live_blocks().size() == (a.kind() == cgt::CallKind::replay ? 0U : 1U));
    CHECK(second.live_blocks().size() == (b.kind() == cgt::CallKind::replay ? 0U : 1U));
  }
  CHECK(first.stats().replays == 2);
  CHECK(second.stats().replays == 2);
  CHECK(second.roots()[0].copied_inputs() == std::vector<std::size_t>{0});
}

TEST_CASE("torch/shutdown with outputs still leased", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  auto f = must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] + 5, in[0] * 5}; },
                                  {.name = "pair"}));
  const at::Tensor x = at::ones({1024}, cuda());
  std::vector<cgt::torch::Outputs> held;
  for (int i = 0; i < 3; ++i) held.push_back(must(f({x})));  // warm-ups and a recording, all held
  at::Tensor escaped = must(held.back().get(0)).get();
  must(pool.shutdown());
  for (const auto& out : held) CHECK(out.get(0).error().code == cgt::Errc::pool_shut_down);
  CHECK_THROWS_AS(escaped.sum(), c10::Error);
  CHECK(f({x}).error().code == cgt::Errc::pool_shut_down);
  held.clear();  // dropping leases after shutdown frees nothing twice
}

// Replays copy contiguous inputs by the graph's copy nodes (eight inputs each) and the rest by
// copy_: ten inputs take two nodes, and a replay that passes a strided view for one of them
// must still compute with the values it passed, then with the next call's.
TEST_CASE("torch/ten copied inputs, some passed as strided views, reach every replay", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  auto total = must(pool.add_function(
      [](cgt::torch::Inputs in) {
        at::Tensor sum = in[0] * 1;
        for (std::size_t i = 1; i < in.size(); ++i) sum = sum + in[i] * static_cast<double>(i + 1);
        return cgt::torch::Values{sum};
      },
      {.name = "total"}));
  for (int step = 0; step < 6; ++step) {
    std::vector<at::Tensor> inputs;
    for (int i = 0; i < 10; ++i) inputs.push_back(at::randn({16, 16}, cuda()));
    if (step == 3) inputs[9] = inputs[9].t().contiguous().t();                // same values, transposed strides
    if (step == 4) inputs[2] = at::randn({16, 32}, cuda()).narrow(1, 8, 16);  // rows 32 apart: copy_
    if (step == 5) inputs[7] = at::randn({32, 16}, cuda()).narrow(0, 8, 16);  // contiguous at an offset
    at::Tensor expected = inputs[0] * 1;
    for (std::size_t i = 1; i < inputs.size(); ++i) expected = expected + inputs[i] * static_cast<double>(i + 1);
    const std::vector<cgt::torch::Arg> args(inputs.begin(), inputs.end());
    pool.mark_step_begin();
    auto out = must(total(args));
    INFO("step " << step);
    CHECK(at::allclose(must(out.get(0)).get(), expected, 1e-4, 1e-4));
  }
  // Steps 3 and 4 pass other strides: a new shape key (strides are part of it).
  CHECK(pool.stats().replays >= 2);
}

TEST_CASE("torch/an input on the CPU runs eagerly", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool();
  auto f = must(
      pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] + 1}; }, {.name = "cpu_input"}));
  auto out = must(f({at::ones({4})}));
  CHECK(out.kind() == cgt::CallKind::eager);
  CHECK(pool.stats().count(cgt::Reason::input_on_other_device) == 1);
  CHECK(must(out.get(0)).get()[0].item<float>() == 2);
}

TEST_CASE("torch/make_pool refuses a memory budget it cannot keep, before it looks for a device", "[torch]") {
  cgt::torch::PoolOptions options;
  options.tree.memory_budget_bytes = std::size_t{1} << 30;
  auto pool = cgt::torch::make_pool(std::move(options));
  REQUIRE(!pool);
  CHECK(pool.error().code == cgt::Errc::invalid_argument);
  CHECK(pool.error().message.find("memory_budget_bytes") != std::string::npos);
}

TEST_CASE("torch/a pool refuses to sleep (libtorch's allocator keeps its memory) and goes on", "[gpu][torch]") {
  REQUIRE_GPU();
  auto pool = must(cgt::torch::make_pool({}));
  auto f = must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; }, {.name = "f"}));
  for (int i = 0; i < 2; ++i) (void)must(f({at::ones({4}, at::kCUDA)}));
  auto refused = pool.sleep();
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  CHECK_FALSE(pool.asleep());
  auto out = must(f({at::ones({4}, at::kCUDA)}));
  CHECK(out.kind() == cgt::CallKind::replay);
  CHECK(must(out.get(0)).get().sum().item<float>() == 8);
}

TEST_CASE("torch/make_pool without a usable device fails cleanly", "[torch]") {
  auto pool = cgt::torch::make_pool({.device = 99});
  REQUIRE(!pool);
  CHECK(pool.error().code == cgt::Errc::backend_error);
}

namespace {

// A function that synchronises (.item(): a device-to-host copy and a wait): it cannot be captured.
cgt::torch::Values scaled_by_total(cgt::torch::Inputs in) {
  const float total = in[0].sum().item<float>();
  return cgt::torch::Values{in[0] * total};
}

// A pool whose log sink keeps the messages of capture_failed decisions.
cgt::torch::Pool pool_logging_capture_failures(std::vector<std::string>& messages) {
  cgt::Options options;
  options.debug_checks = true;
  options.log_sink = [&messages](const cgt::Event& event) {
    if (event.reason == cgt::Reason::capture_failed) messages.emplace_back(event.message);
  };
  return new_pool(std::move(options));
}

}  // namespace

// A function that synchronises (.item()) cannot be captured: its recording's
// capture fails ("capture failed: <CUDA error>", which the engine turns into an eager run, logged
// with Reason::capture_failed). Everything the capture touched is as before: random draws of the
// process work (the generator left capture mode), pinned host memory is allocated as usual, and
// the pool records and replays another function (the allocators' routing into the pool ended).
TEST_CASE("torch/a capture that fails leaves the pool, the allocators and the generator as they were",
          "[gpu][provokes-api-errors]") {
  REQUIRE_GPU();
  std::vector<std::string> logged;
  auto pool = pool_logging_capture_failures(logged);
  auto syncing = must(pool.add_function(scaled_by_total, {.name = "syncing"}));
  auto affine = must(
      pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2 + 1}; }, {.name = "affine"}));
  const at::Tensor x = at::arange(16, cuda());
  {
    auto warm = must(syncing({x}));
    CHECK(warm.kind() == cgt::CallKind::warmup);
    CHECK(at::equal(must(warm.get(0)).get(), x * 120));
  }
  pool.mark_step_begin();
  {
    auto failed_capture = must(syncing({x}));
    CHECK(failed_capture.kind() == cgt::CallKind::eager);
    CHECK(at::equal(must(failed_capture.get(0)).get(), x * 120));
  }
  REQUIRE(!logged.empty());
  for (const std::string& message : logged) UNSCOPED_INFO(message);
  CHECK(std::ranges::any_of(logged, [](const std::string& message) {
    return message.find("capture failed: cudaError") != std::string::npos;
  }));

  CHECK_NOTHROW(at::rand({8}, cuda()).sum().item<float>());  // the generator is out of capture mode
  at::Tensor pinned = at::empty({16}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  pinned.copy_(x);  // pinned host memory comes from the host allocator, no longer routed into the pool
  CHECK(at::equal(pinned, x.cpu()));

  std::vector<cgt::CallKind> kinds;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor input = at::full({16}, static_cast<double>(i), cuda());
    pool.mark_step_begin();
    auto out = must(affine({input}));
    kinds.push_back(out.kind());
    CHECK(at::equal(must(out.get(0)).get(), input * 2 + 1));
  }
  using K = cgt::CallKind;
  for (const std::string& message : logged) UNSCOPED_INFO(message);
  for (std::size_t r = 0; r < static_cast<std::size_t>(cgt::Reason::count_); ++r) {
    UNSCOPED_INFO(cgt::to_string(static_cast<cgt::Reason>(r)) << ": " << pool.stats().by_reason[r]);
  }
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay});
  CHECK_NOTHROW(at::rand({8}, cuda()).sum().item<float>());
  must(pool.check_memory());
}

// Beyond PyTorch: a capture that failed for a reason that will not change is
// not retried; the function runs eagerly from then on for that shape, counted and logged once.
TEST_CASE("torch/a function whose capture fails runs eagerly from then on, with right values",
          "[gpu][provokes-api-errors]") {
  REQUIRE_GPU();
  std::vector<std::string> logged;
  auto pool = pool_logging_capture_failures(logged);
  auto syncing = must(pool.add_function(scaled_by_total, {.name = "syncing"}));
  const at::Tensor x = at::arange(16, cuda());
  (void)must(syncing({x}));  // warm-up
  std::vector<cgt::CallKind> kinds;
  for (int i = 0; i < 4; ++i) {
    const at::Tensor input = at::full({16}, static_cast<double>(i + 1), cuda());
    pool.mark_step_begin();
    auto out = must(syncing({input}));
    kinds.push_back(out.kind());
    CHECK(at::equal(must(out.get(0)).get(), input * static_cast<double>(16 * (i + 1))));
  }
  CHECK(kinds == std::vector<cgt::CallKind>(4, cgt::CallKind::eager));
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().count(cgt::Reason::capture_failed) >= 1);
  CHECK(!logged.empty());
  CHECK(at::rand({8}, cuda()).numel() == 8);
}

// One pool per thread is the documented model: three threads record and replay
// their own pools at once, over several rounds, and every result equals eager execution. Nothing
// synchronises the whole device while another thread captures. The functions draw no random
// numbers (libtorch's default generator is one per device; a capture puts it in capture mode).
TEST_CASE("torch/pools on three threads record and replay concurrently, each equal to eager", "[gpu][threads]") {
  REQUIRE_GPU();
  constexpr int kThreads = 3;
  constexpr int kRounds = 6;
  std::vector<std::string> failures(kThreads);  // Catch2's assertions are for the main thread
  std::vector<std::uint64_t> replays(kThreads, 0);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures, &replays, &ready] {
      std::string& failure = failures[static_cast<std::size_t>(t)];
      try {
        auto pool = cgt::torch::make_pool({.tree = {.debug_checks = true}, .device = 0});
        if (!pool) {
          failure = "make_pool: " + pool.error().describe();
          ++ready;
          return;
        }
        auto layer = pool->add_function(
            [](cgt::torch::Inputs in) {
              return cgt::torch::Values{at::relu(at::matmul(in[0], in[1]) + in[0].sum(1, true)), in[0] * 3};
            },
            {.name = "layer" + std::to_string(t), .static_inputs = {1}});
        if (!layer) {
          failure = "add_function: " + layer.error().describe();
          ++ready;
          return;
        }
        const at::Tensor w = (at::arange(64 * 64, cuda()).reshape({64, 64}).remainder(7) - 3) / 8;
        ++ready;
        while (ready.load() < kThreads) std::this_thread::yield();  // all threads start together
        for (int round = 0; round < kRounds; ++round) {
          const at::Tensor x =
              (at::arange(32 * 64, cuda()).reshape({32, 64}) + round * (t + 1)).remainder(11) / 10 - 0.5;
          const at::Tensor expected = at::relu(at::matmul(x, w) + x.sum(1, true));
          pool->mark_step_begin();
          auto out = (*layer)({x, w});
          if (!out) {
            failure += "round " + std::to_string(round) + ": " + out.error().describe() + "\n";
            continue;
          }
          auto first = out->get(0);
          auto second = out->get(1);
          if (!first || !second) {
            failure += "round " + std::to_string(round) + ": an output is not readable\n";
            continue;
          }
          if (!at::allclose(first->get(), expected, 1e-4, 1e-4) || !at::equal(second->get(), x * 3)) {
            failure += "round " + std::to_string(round) + " (" + std::string(cgt::to_string(out->kind())) +
                       "): values differ from eager\n";
          }
        }
        replays[static_cast<std::size_t>(t)] = pool->stats().replays;
        if (auto checked = pool->check_memory(); !checked) failure += "check_memory: " + checked.error().describe();
      } catch (const std::exception& error) {
        failure += std::string("threw: ") + error.what();
        if (ready.load() < kThreads) ++ready;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << failures[static_cast<std::size_t>(t)]);
    CHECK(failures[static_cast<std::size_t>(t)].empty());
    CHECK(replays[static_cast<std::size_t>(t)] == kRounds - 2);
  }
  CHECK(at::rand({4}, cuda()).numel() == 4);
}

// A tensor without strided storage cannot be read by a graph nor handed out by
// one: a sparse input is refused with invalid_argument before any work, a sparse output fails the
// call with function_failed; both say why, and the pool goes on working. A meta input (strided,
// no memory) runs eagerly like any input that is not on the pool's device.
// As an input, a tensor without strided storage is refused (a graph could not read it); as an
// output, the warm-up's value is copied out of the pool and handed out (the function runs once),
// and the function runs eagerly from then on (Reason::unsupported_output), its value the caller's.
TEST_CASE("torch/a tensor without strided storage is refused as input, and runs eagerly as output", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool({.debug_checks = true});
  auto twice =
      must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; }, {.name = "twice"}));
  const at::Tensor dense = at::eye(4, cuda());
  auto sparse_in = twice({dense.to_sparse()});
  REQUIRE(!sparse_in);
  INFO(sparse_in.error().message);
  CHECK(sparse_in.error().code == cgt::Errc::invalid_argument);
  CHECK(sparse_in.error().message.find("no strided storage") != std::string::npos);
  CHECK(pool.stats().calls <= 1);

  auto meta = must(twice({at::empty({4, 4}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta))}));
  CHECK(meta.kind() == cgt::CallKind::eager);
  CHECK(must(meta.get(0)).get().is_meta());

  auto to_sparse = must(pool.add_function(
      [](cgt::torch::Inputs in) { return cgt::torch::Values{(in[0] * 2).to_sparse()}; }, {.name = "to_sparse"}));
  for (int i = 0; i < 2; ++i) {
    pool.mark_step_begin();
    auto sparse_out = must(to_sparse({dense}));
    CHECK(sparse_out.kind() == (i == 0 ? cgt::CallKind::warmup : cgt::CallKind::eager));
    CHECK(at::equal(must(sparse_out.get(0)).get().to_dense(), dense * 2));
  }
  CHECK(pool.stats().count(cgt::Reason::unsupported_output) == 1);  // the eager call
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    CHECK(at::equal(must(must(twice({dense})).take(0)), dense * 2));
  }
  CHECK(pool.stats().replays == 1);
  must(pool.check_memory());
}

// pool.memory() reports what is in use: the outputs a replay handed out count
// while their leases live (the allocator never allocated them), the peak follows, and once every
// lease is dropped nothing is allocated though the graphs keep their reserved memory.
TEST_CASE("torch/memory() counts the outputs that replays hand out, and its peak", "[gpu]") {
  REQUIRE_GPU();
  auto pool = new_pool({.debug_checks = true});
  auto twice =
      must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; }, {.name = "twice"}));
  constexpr std::int64_t kElements = 1 << 20;
  constexpr std::size_t kBytes = kElements * sizeof(float);
  const at::Tensor x = at::ones({kElements}, cuda());
  std::vector<cgt::CallKind> kinds;
  for (int i = 0; i < 4; ++i) {
    pool.mark_step_begin();
    auto out = must(twice({x}));
    kinds.push_back(out.kind());
    const cgt::MemoryInfo held = pool.memory();
    INFO("call " << i << " (" << cgt::to_string(out.kind()) << "): allocated " << held.allocated_bytes << ", blocks "
                 << held.live_blocks << ", peak " << held.peak_allocated_bytes << ", reserved " << held.reserved_bytes);
    CHECK(held.allocated_bytes >= kBytes);
    CHECK(held.live_blocks >= 1);
    CHECK(held.peak_allocated_bytes >= held.allocated_bytes);
    CHECK(held.reserved_bytes >= held.allocated_bytes);
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::recording, K::replay, K::replay});
  const cgt::MemoryInfo idle = pool.memory();
  CHECK(idle.allocated_bytes == 0);
  CHECK(idle.live_blocks == 0);
  CHECK(idle.peak_allocated_bytes >= kBytes);
  CHECK(idle.reserved_bytes >= kBytes);
  // Two replays' outputs held at once (two steps' worth): both count.
  pool.mark_step_begin();
  auto a = must(twice({x}));
  auto b = must(twice({x}));
  CHECK(pool.memory().allocated_bytes >= 2 * kBytes);
}

// On the libtorch side: a function that keeps a pool tensor across calls ("allocate
// once and cache it") and returns it later returns memory its call did not allocate: the call
// fails with function_failed, and no lease is handed out over memory another lease may hold.
TEST_CASE("torch/a function that returns a pool tensor kept from an earlier call fails with function_failed", "[gpu]") {
  REQUIRE_GPU();
  const at::Tensor x = at::full({64}, 3.0, cuda());
  SECTION("kept without being returned, returned later") {
    auto pool = new_pool();  // debug_checks would report the kept block after the first call
    at::Tensor kept;
    auto keeper = must(pool.add_function(
        [&kept](cgt::torch::Inputs in) {
          if (!kept.defined()) {
            kept = in[0] + 1;  // allocated in the pool by the warm-up, kept by the function
            return cgt::torch::Values{in[0] * 2};
          }
          return cgt::torch::Values{kept};
        },
        {.name = "keeper"}));
    auto first = must(keeper({x}));
    auto second = keeper({x});
    REQUIRE(!second);
    INFO(second.error().message);
    CHECK(second.error().code == cgt::Errc::function_failed);
    CHECK(at::equal(must(first.get(0)).get(), x * 2));
  }
  SECTION("returned, its lease dropped, returned again") {
    auto pool = new_pool({.debug_checks = true});
    at::Tensor cache;
    auto cacher = must(pool.add_function(
        [&cache](cgt::torch::Inputs in) {
          if (!cache.defined()) cache = in[0] * 2;
          return cgt::torch::Values{cache};
        },
        {.name = "cacher"}));
    (void)must(cacher({x}));  // the lease dies here: its memory goes back to the pool
    auto filler = must(
        pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 5}; }, {.name = "filler"}));
    auto other = must(filler({x}));  // may take that memory
    auto again = cacher({x});
    REQUIRE(!again);
    INFO(again.error().message);
    CHECK(again.error().code == cgt::Errc::function_failed);
    CHECK(again.error().message.find("kept from an earlier call") != std::string::npos);
    CHECK(at::equal(must(other.get(0)).get(), x * 5));
  }
}

// PyTorch's test_sparsity: a function that returns a sparse COO tensor runs, three calls equal to
// eager. A graph cannot hand that tensor's memory out of the pool: the warm-up copies it out
// (the call's one run, handed out) and the shape runs eagerly from then on
// (Reason::unsupported_output, logged once), its values the caller's.
TEST_CASE("torch/a function that returns a sparse tensor runs eagerly with unsupported_output, values equal eager",
          "[gpu]") {
  REQUIRE_GPU();
  std::vector<cgt::Reason> logged;
  cgt::Options options{.debug_checks = true};
  options.log_sink = [&logged](const cgt::Event& event) { logged.push_back(event.reason); };
  auto pool = new_pool(std::move(options));
  auto sparse = must(
      pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{(in[0] * 2).to_sparse(), in[0] + 1}; },
                        {.name = "sparse"}));
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    const at::Tensor x = at::tensor({0.0, 1.0, 0.0, 3.0, 0.0, 5.0 + call}, cuda()).reshape({2, 3});
    auto out = must(sparse({x}));
    CHECK(out.kind() == (call == 0 ? cgt::CallKind::warmup : cgt::CallKind::eager));
    const at::Tensor& s = must(out.get(0)).get();
    CHECK(s.is_sparse());
    CHECK(at::equal(s.to_dense(), x * 2));
    CHECK(s._nnz() == 3);
    CHECK(at::equal(must(out.get(1)).get(), x + 1));
  }
  CHECK(std::ranges::count(logged, cgt::Reason::unsupported_output) == 1);
  CHECK(pool.stats().count(cgt::Reason::unsupported_output) == 2);  // the eager calls
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.live_blocks().empty());
}

// Composed pools: an encoder pool's function called from a decoder pool's function (before, the
// outer capture broke and the decoder ran eagerly for good, silently). The inner call made
// during the outer recording is refused with nested_capture before any CUDA work; the decoder
// runs that shape eagerly with Reason::nested_pool, logged once; the encoder warms up, records
// and replays in its own pool (also when called from the decoder's warm-up); every value equals
// eager's, and both pools' memory matches their leases.
TEST_CASE("torch/a pool function that calls another pool's function runs eagerly with nested_pool, values equal eager",
          "[gpu]") {
  REQUIRE_GPU();
  std::vector<cgt::Reason> logged;
  cgt::Options outer_options{.debug_checks = true};
  outer_options.log_sink = [&logged](const cgt::Event& event) { logged.push_back(event.reason); };
  auto inner_pool = new_pool({.debug_checks = true});
  auto outer_pool = new_pool(std::move(outer_options));
  auto encoder = must(inner_pool.add_function(
      [](cgt::torch::Inputs in) { return cgt::torch::Values{at::tanh(in[0]) * 2}; }, {.name = "encoder"}));
  std::vector<cgt::Errc> refused;
  auto decoder = must(outer_pool.add_function(
      [&](cgt::torch::Inputs in) {
        inner_pool.mark_step_begin();
        auto encoded = encoder({in[0]});
        if (!encoded) {
          refused.push_back(encoded.error().code);
          throw std::runtime_error(encoded.error().message);
        }
        auto code = encoded->take(0);
        if (!code) throw std::runtime_error(code.error().message);
        return cgt::torch::Values{*code + 1};
      },
      {.name = "decoder"}));
  std::vector<cgt::CallKind> kinds;
  for (int step = 0; step < 5; ++step) {
    outer_pool.mark_step_begin();
    const at::Tensor x = at::randn({64}, cuda());
    auto out = must(decoder({x}));
    kinds.push_back(out.kind());
    CHECK(at::allclose(must(out.get(0)).get(), (at::tanh(x) * 2) + 1));
  }
  using K = cgt::CallKind;
  CHECK(kinds == std::vector{K::warmup, K::eager, K::eager, K::eager, K::eager});
  REQUIRE(refused.size() == 1);  // refused once: at the recording
  CHECK(refused[0] == cgt::Errc::nested_capture);
  CHECK(std::ranges::count(logged, cgt::Reason::nested_pool) == 1);
  CHECK(outer_pool.stats().recordings == 0);
  CHECK(inner_pool.stats().recordings == 1);
  CHECK(inner_pool.stats().replays >= 2);
  must(inner_pool.check_memory());
  must(outer_pool.check_memory());
}
