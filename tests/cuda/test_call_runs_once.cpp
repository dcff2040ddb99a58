// cgt.cuda on a GPU: a call runs its function's work once on every path (warm-up, recording,
// replays, eager fallbacks, a capture that breaks), counted on the device by the function itself
// (a kernel adding one to a static counter, which every replay repeats) and on the host (the
// body); an input that differs only in the stride of a dimension of one element replays the same
// graph; a call from a thread whose current context is one the program made runs in the pool's
// and puts the program's back. Tagged [gpu]; SKIPPED without a device.
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/kernels.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

#include "cuda/harness.hpp"
#include "gpu_context.hpp"

using H = CudaHarness;
using K = cgt::CallKind;
using scenario::HostTensor;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

// The device's count of runs (a static counter every run adds one to) and the host's (bodies).
struct Runs {
  H::Value counter = H::make(HostTensor{{1}, {0}});
  H::Value one = H::make(HostTensor{{1}, {1}});
  int bodies = 0;
  [[nodiscard]] double kernels() const { return H::read(counter).data[0]; }
};

// y = x + 1, and the counter's kernel; `sync` breaks a capture (a host synchronisation).
cgt::cuda::Function counted_plus_one(cgt::cuda::Pool& pool, Runs& runs, bool sync = false) {
  return must(pool.add_function(
      [&runs, sync](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
        ++runs.bodies;
        const cgt::cuda::Buffer& x = in[0];
        cgt::cuda::Buffer y = ctx.allocate(cgt::ElementType::f32, x.sizes());
        const auto n = static_cast<std::int64_t>(x.numel());
        // y = x + 1
        (void)cgt_test::sum_inputs(x.as<float>(), nullptr, nullptr, nullptr, y.as<float>(), n, ctx.stream());
        (void)cgt_test::add_repeatedly(y.as<float>(), n, 1, 1, ctx.stream());
        // counter += one
        (void)cgt_test::sum_inputs(in[1].as<float>(), in[2].as<float>(), nullptr, nullptr, in[1].as<float>(), 1,
                                   ctx.stream());
        if (sync) (void)cudaStreamSynchronize(ctx.stream());
        return cgt::cuda::Values{y};
      },
      {.name = sync ? "syncing" : "plus_one", .static_inputs = {1, 2}, .mutated_inputs = {1}}));
}

std::vector<double> plus_one(const H::Value& x) {
  std::vector<double> values = H::read(x).data;
  for (double& v : values) v += 1;
  return values;
}

}  // namespace

TEST_CASE("cuda/runs once: warm-up, recording, replays and every fallback run the work once", "[gpu][runs-once]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true, .shape_key_limit = 2, .log_sink = [](const cgt::Event&) {}}));
  Runs runs;
  auto f = counted_plus_one(pool, runs);
  int calls = 0;
  const auto once = [&](const H::Value& x, K kind) {
    pool.mark_step_begin();
    auto out = must(f({x, runs.counter, runs.one}));
    ++calls;
    CHECK(out.kind() == kind);
    CHECK(runs.kernels() == calls);
    CHECK(H::read(must(out.get(0)).get()).data == plus_one(x));
  };
  const H::Value x = H::make(HostTensor::iota({8}));
  once(x, K::warmup);
  once(x, K::recording);
  once(x, K::replay);
  once(x, K::replay);
  once(H::make(HostTensor::iota({4})), K::warmup);
  once(H::make(HostTensor::iota({2})), K::eager);  // past shape_key_limit
  CHECK(runs.bodies == calls - 2);
}

TEST_CASE("cuda/runs once: a capture that breaks runs the work once, eagerly", "[gpu][runs-once]") {
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.log_sink = [](const cgt::Event&) {}}));
  Runs runs;
  auto f = counted_plus_one(pool, runs, /*sync=*/true);
  const H::Value x = H::make(HostTensor::iota({8}));
  for (int call = 1; call <= 3; ++call) {
    auto out = must(f({x, runs.counter, runs.one}));
    CHECK(out.kind() == (call == 1 ? K::warmup : K::eager));
    CHECK(runs.kernels() == call);
    CHECK(H::read(must(out.get(0)).get()).data == plus_one(x));
  }
  CHECK(runs.bodies == 4);
}

TEST_CASE("cuda/an input that differs only in a size-1 dimension's stride replays the same graph", "[gpu]") {
  // The shape key counts such a stride as 0, so the calls share a graph; before the fix its replay
  // compared every stride and failed with wrong_shape, after releasing the last step's outputs.
  REQUIRE_GPU();
  auto pool = must(H::make_pool({.debug_checks = true}));
  auto f = must(H::add(pool, scenario::unary("f", scenario::in(0) + 1)));
  const H::Value row = H::make(HostTensor::iota({1, 8}));  // strides (8, 1)
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    (void)must(f({row}));
  }
  pool.mark_step_begin();
  auto held = must(f({row}));
  REQUIRE(held.kind() == K::replay);
  const std::vector<std::int64_t> sizes{1, 8};
  const std::vector<std::int64_t> strides{100, 1};  // never stepped along: one row
  const H::Value other = H::make(HostTensor::iota({1, 8}));
  const H::Value same_row = other.with_layout(other.layout().restrided(0, sizes, strides));
  pool.mark_step_begin();
  auto out = must(f({same_row}));
  CHECK(out.kind() == K::replay);
  CHECK(H::read(must(out.get(0)).get()).data == plus_one(other));
}

namespace {

// Calls of y = 2x + 1 from a thread whose context is none, or one the program made.
void calls_keep_the_callers_context(bool own_context) {
  auto pool = must(H::make_pool({}));
  auto f = must(H::add(pool, scenario::unary("f", scenario::in(0) * 2 + 1)));
  const H::Value x = H::make(HostTensor::iota({32}));
  std::vector<double> expected = H::read(x).data;
  for (double& v : expected) v = v * 2 + 1;
  gpu_context::calls_keep_the_callers_context(
      own_context, [&] { return f({x}); },
      [&](const cgt::cuda::Outputs& out) { CHECK(H::read(must(out.get(0)).get()).data == expected); });
}

}  // namespace

TEST_CASE("cuda/a call from a thread with no context current leaves none current", "[gpu][context]") {
  // Before the fix, the device was compared instead of the context, and the previous device's
  // primary context, not the caller's (here none), was made current after a switch.
  REQUIRE_GPU();
  calls_keep_the_callers_context(false);
}

TEST_CASE("cuda/a call from a context the program made runs in the pool's and leaves the program's current",
          "[gpu][context]") {
  // Before the fix, a context the program made on the pool's device passed for the pool's. Skipped
  // where the device takes no second context in one process (an exclusive compute mode).
  REQUIRE_GPU();
  calls_keep_the_callers_context(true);
}
