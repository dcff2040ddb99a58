// cgt.torch on a GPU: a call runs its function's work once on every path (warm-up, recording,
// replay, eager fallbacks, a sparse output, a write to a copied input, a capture that breaks),
// counted on the device by the function itself (`counter.add_(1)` on a static counter, which
// every replay repeats) and on the host (the body); a call made inside the program's own CUDA
// graph capture is refused; a call from a thread whose current context is one the program made
// runs in the pool's and puts the program's back. Tagged [gpu]; SKIPPED without a device.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <expected>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "gpu_context.hpp"
#include "torch/harness.hpp"

using H = TorchHarness;
using K = cgt::CallKind;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

at::TensorOptions cuda() {
  return H::cuda();
}

// The device's count of runs: a static input every run adds one to, and the host's count of bodies.
struct Runs {
  at::Tensor counter = at::zeros({1}, cuda());
  int bodies = 0;
  [[nodiscard]] std::int64_t kernels() const { return counter.item<float>(); }
};

// Options that make input `counter` static and written in place (declared mutated).
cgt::FunctionOptions counting(std::string name, std::size_t counter, cgt::FunctionOptions options = {}) {
  options.name = std::move(name);
  options.static_inputs.push_back(counter);
  options.mutated_inputs.push_back(counter);
  return options;
}

cgt::torch::Pool quiet_pool(cgt::Options options = {}) {
  options.debug_checks = true;
  options.log_sink = [](const cgt::Event&) {};
  return must(H::make_pool(std::move(options)));
}

}  // namespace

TEST_CASE("torch/runs once: a function whose output is sparse runs once in its first call, then eagerly",
          "[gpu][runs-once]") {
  // Before the fix the warm-up ran it to the end, its sparse output was refused, and the call ran
  // it again eagerly: the counter (a KV-cache append, BatchNorm's statistics) moved twice.
  REQUIRE_GPU();
  auto pool = quiet_pool();
  Runs runs;
  auto f = must(pool.add_function(
      [&runs](cgt::torch::Inputs in) {
        ++runs.bodies;
        in[1].add_(1);
        return cgt::torch::Values{(in[0] * 2).to_sparse(), in[0] + 1};
      },
      counting("sparse", 1)));
  for (int call = 1; call <= 3; ++call) {
    pool.mark_step_begin();
    const at::Tensor x = at::tensor({0.0, 1.0, 0.0, 3.0 + call}, cuda()).reshape({2, 2});
    auto out = must(f({x, runs.counter}));
    CHECK(out.kind() == (call == 1 ? K::warmup : K::eager));
    CHECK(runs.kernels() == call);
    CHECK(runs.bodies == call);
    const at::Tensor& sparse = must(out.get(0)).get();
    CHECK(sparse.is_sparse());
    CHECK(at::equal(sparse.to_dense(), x * 2));
    CHECK(at::equal(must(out.get(1)).get(), x + 1));
  }
  CHECK(pool.stats().count(cgt::Reason::unsupported_output) == 2);
  CHECK(pool.check_memory());
}

TEST_CASE("torch/runs once: warm-up, recording, replays, and every fallback run the work once", "[gpu][runs-once]") {
  REQUIRE_GPU();
  auto pool = quiet_pool({.shape_key_limit = 2});
  Runs runs;
  auto f = must(pool.add_function(
      [&runs](cgt::torch::Inputs in) {
        ++runs.bodies;
        in[1].add_(1);
        return cgt::torch::Values{in[0] * 2};
      },
      counting("f", 1)));
  std::int64_t calls = 0;
  const auto once = [&](const at::Tensor& x, K kind) {
    pool.mark_step_begin();
    auto out = must(f({x, runs.counter}));
    ++calls;
    CHECK(out.kind() == kind);
    CHECK(runs.kernels() == calls);
    CHECK(at::equal(must(out.get(0)).get(), x * 2));
  };
  const at::Tensor x = at::arange(8, cuda());
  once(x, K::warmup);
  once(x, K::recording);
  once(x, K::replay);
  once(x, K::replay);
  once(at::arange(4, cuda()), K::warmup);  // a second key
  once(at::arange(2, cuda()), K::eager);   // past shape_key_limit
  once(x.to(at::kCPU), K::eager);          // on another device
  CHECK(runs.bodies == calls - 2);         // the replays ran no body
}

TEST_CASE("torch/runs once: a capture that breaks runs the work once, eagerly", "[gpu][runs-once]") {
  REQUIRE_GPU();
  auto pool = quiet_pool();
  Runs runs;
  auto syncing = must(pool.add_function(
      [&runs](cgt::torch::Inputs in) {
        ++runs.bodies;
        in[1].add_(1);
        const float total = in[0].sum().item<float>();  // a synchronisation: breaks a capture
        return cgt::torch::Values{in[0] * total};
      },
      counting("syncing", 1)));
  const at::Tensor x = at::ones({4}, cuda());
  for (int call = 1; call <= 3; ++call) {
    auto out = must(syncing({x, runs.counter}));
    CHECK(out.kind() == (call == 1 ? K::warmup : K::eager));
    CHECK(runs.kernels() == call);  // the broken capture ran nothing
    CHECK(at::equal(must(out.get(0)).get(), x * 4));
  }
  CHECK(runs.bodies == 4);  // the second call's body ran under the capture, then eagerly
}

TEST_CASE("torch/runs once: a write to a copied input seen at capture: one run, the write lands once",
          "[gpu][runs-once][writes]") {
  REQUIRE_GPU();
  auto pool = quiet_pool({.skip_warmup = true});
  Runs runs;
  auto f = must(pool.add_function(
      [&runs](cgt::torch::Inputs in) {
        ++runs.bodies;
        in[1].add_(1);
        in[0].mul_(3);  // undeclared, on a caller's tensor: the graph writes its slot
        return cgt::torch::Values{in[0] + 1};
      },
      counting("writes", 1)));
  const at::Tensor x = at::full({16}, 2.0, cuda());
  {
    auto out = must(f({x, runs.counter}));
    CHECK(out.kind() == K::warmup);  // recorded, ran once, written back, not kept
    CHECK(runs.kernels() == 1);
    CHECK(runs.bodies == 1);
    CHECK(at::equal(x, at::full({16}, 6.0, cuda())));
    CHECK(at::equal(must(out.get(0)).get(), at::full({16}, 7.0, cuda())));
  }
  CHECK(pool.stats().recordings_not_kept == 1);
  auto second = must(f({x, runs.counter}));
  CHECK(second.kind() == K::eager);  // input 0 counts as mutated, and is a caller's tensor
  CHECK(runs.kernels() == 2);
  CHECK(at::equal(x, at::full({16}, 18.0, cuda())));
}

TEST_CASE("torch/a call inside the program's own CUDA graph capture is refused, and the capture survives",
          "[gpu][capture]") {
  // Before the fix the call was neither refused nor run: its warm-up was captured into the
  // program's graph, and the lease held memory nothing had computed.
  REQUIRE_GPU();
  const bool called_before = GENERATE(false, true);
  auto pool = quiet_pool();
  auto f = must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2}; }, {.name = "f"}));
  const at::Tensor x = at::arange(16, cuda());
  if (called_before) {
    for (int call = 0; call < 3; ++call) (void)must(f({x}));  // warm-up, recording, replay
  }
  const cgt::Stats before = pool.stats();
  at::cuda::CUDAGraph graph;
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor tripled;
  cgt::Result<cgt::torch::Outputs> refused = std::unexpected(cgt::Error{});
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    graph.capture_begin();
    tripled = x * 3;  // the program's own work
    refused = f({x});
    graph.capture_end();
  }
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::nested_capture);
  CHECK(refused.error().message.find("capturing a CUDA graph") != std::string::npos);
  CHECK(pool.stats().calls == before.calls);  // refused before anything
  graph.replay();
  CHECK(at::equal(tripled, x * 3));
  auto after = must(f({x}));
  CHECK(after.kind() == (called_before ? K::replay : K::warmup));
  CHECK(at::equal(must(after.get(0)).get(), x * 2));
}

namespace {

// Calls of y = 2x + 1 from a thread whose context is none, or one the program made.
void calls_keep_the_callers_context(bool own_context) {
  auto pool = quiet_pool();
  auto f = must(pool.add_function([](cgt::torch::Inputs in) { return cgt::torch::Values{in[0] * 2 + 1}; },
                                  {.name = "f"}));
  const at::Tensor x = at::arange(32, cuda());
  gpu_context::calls_keep_the_callers_context(
      own_context, [&] { return f({x}); },
      [&](const cgt::torch::Outputs& out) { CHECK(at::equal(must(out.take(0)), x * 2 + 1)); });
}

}  // namespace

TEST_CASE("torch/a call from a thread with no context current leaves none current", "[gpu][context]") {
  // Before the fix, the device was compared instead of the context, and the previous device's
  // primary context, not the caller's (here none), was made current after a switch.
  REQUIRE_GPU();
  calls_keep_the_callers_context(false);
}

TEST_CASE("torch/a call from a context the program made runs in the pool's and leaves the program's current",
          "[gpu][context]") {
  // Before the fix, a context the program made on the pool's device passed for the pool's. Skipped
  // where the device takes no second context in one process (an exclusive compute mode).
  REQUIRE_GPU();
  calls_keep_the_callers_context(true);
}
