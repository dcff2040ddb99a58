// cgt.torch on a GPU: the shared scenario suite with real tensors (live blocks counted from the
// caching allocator's snapshot of the pool, as PyTorch's tests do), and what only libtorch has:
// RNG in graphs, cuBLAS, nn::Linear parameters, poisoning of escaped tensors, several pools,
// shutdown with leases held. Every test is tagged [gpu] and reports SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <deque>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "scenario/scenarios.hpp"
#include "scenario/property.hpp"
#include "torch/harness.hpp"

using H = TorchHarness;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

TEST_CASE("torch/run_simple", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::run_simple<H>();
}
TEST_CASE("torch/function_compiled_multiple_times", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::function_compiled_multiple_times<H>();
}
TEST_CASE("torch/end_recording_early", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::end_recording_early<H>();
}
TEST_CASE("torch/execution_into_recording", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::execution_into_recording<H>();
}
TEST_CASE("torch/accumulate_multiple_recordings", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::accumulate_multiple_recordings<H>();
}
TEST_CASE("torch/live_outputs_multiple_graphs", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::live_outputs_multiple_graphs<H>();
}
TEST_CASE("torch/tensor_dies_between_checkpoint", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::tensor_dies_between_checkpoint<H>();
}
TEST_CASE("torch/aliased_storage_single_weakref", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::aliased_storage_single_weakref<H>();
}
TEST_CASE("torch/aliasing_static_ref", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::aliasing_static_ref<H>();
}
TEST_CASE("torch/constant_output", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::constant_output<H>();
}
TEST_CASE("torch/expanded_inputs", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::expanded_inputs<H>();
}
TEST_CASE("torch/mutation_on_inp", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::mutation_on_inp<H>();
}
TEST_CASE("torch/mutation_cudagraph_managed_tensors", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::mutation_cudagraph_managed_tensors<H>();
}
TEST_CASE("torch/mutation_cudagraph_managed_tensor_warn_only_once", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::mutation_cudagraph_managed_tensor_warn_only_once<H>();
}
TEST_CASE("torch/mutation_cudagraph_managed_tensor_warn", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::mutation_cudagraph_managed_tensor_warn<H>();
}
TEST_CASE("torch/memory_of_branches_is_max_not_sum", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::memory_of_branches_is_max_not_sum<H>();
}
TEST_CASE("torch/replay_never_changes_a_held_value", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::replay_never_changes_a_held_value<H>();
}
TEST_CASE("torch/new_liveness_pattern_records_a_sibling", "[scenario][gpu]") {
  REQUIRE_GPU();
  scenario::new_liveness_pattern_records_a_sibling<H>();
}
TEST_CASE("torch/random_calls_match_eager", "[scenario][property][gpu]") {
  REQUIRE_GPU();
  const auto report = scenario::random_calls_match_eager<H>(20261122, 10000);
  CHECK(report.steps == 10000);
  CHECK(report.stats.replays > 1000);
  CHECK(report.stats.checkpoint_restores > 10);
  CHECK(report.stats.leases_invalidated > 0);
}

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
  CHECK(pool.stats().replays == 4);
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

TEST_CASE("torch/make_pool without a usable device fails cleanly", "[torch]") {
  auto pool = cgt::torch::make_pool({.device = 99});
  REQUIRE(!pool);
  CHECK(pool.error().code == cgt::Errc::backend_error);
}
