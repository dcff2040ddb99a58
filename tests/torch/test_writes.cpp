// Writes to inputs that FunctionOptions::mutated_inputs (ModelOptions::mutated_inputs) does not
// list, on a GPU. cgt.torch sees them through libtorch's version counters: the input counts as
// mutated from then on, a recording that wrote a copied input is given up before it ran, and a
// write to a padded copy reaches the caller's rows. Every case checks the caller's tensor after
// each call against what eager code leaves in it. Tagged [gpu][writes]; SKIPPED without a device.
#include <torch/script.h>
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
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

// Counts the warnings that name an undeclared write.
struct WriteWarnings {
  int count = 0;
  cgt::LogSink sink() {
    return [this](const cgt::Event& event) {
      if (event.kind == cgt::EventKind::warning && event.reason == cgt::Reason::undeclared_write) ++count;
    };
  }
};

// x += 1 in place (input 0, not declared), and 2 * x after the write.
cgt::torch::Values bump_and_double(cgt::torch::Inputs in) {
  in[0].add_(1);
  return {in[0] * 2};
}

bool all_equal(const at::Tensor& tensor, double value) {
  return at::equal(tensor, at::full_like(tensor, value));
}

}  // namespace

TEST_CASE("torch/writes: an undeclared write seen in the warm-up: later calls run eagerly and every write lands",
          "[gpu][writes]") {
  REQUIRE_GPU();
  WriteWarnings warnings;
  auto pool = must(cgt::torch::make_pool({.tree = {.log_sink = warnings.sink()}}));
  auto f = must(pool.add_function(bump_and_double, {.name = "bump"}));
  const at::Tensor x = at::zeros({64}, cuda());
  for (int call = 1; call <= 4; ++call) {
    pool.mark_step_begin();
    auto out = must(f({x}));
    CHECK(out.kind() == (call == 1 ? K::warmup : K::eager));
    CHECK(all_equal(x, call));
    CHECK(all_equal(must(out.get(0)).get(), 2.0 * call));
  }
  CHECK(pool.stats().recordings == 0);
  CHECK(warnings.count == 1);
}

TEST_CASE("torch/writes: an undeclared write seen in the capture: the graph runs once, the write lands, no graph kept",
          "[gpu][writes]") {
  REQUIRE_GPU();
  auto pool = must(cgt::torch::make_pool({.tree = {.skip_warmup = true, .debug_checks = true}}));
  auto f = must(pool.add_function(bump_and_double, {.name = "bump"}));
  const at::Tensor x = at::full({64}, 5.0, cuda());
  {
    auto out = must(f({x}));
    CHECK(out.kind() == K::warmup);  // the graph's one run is the call's: carried back, then dropped
    CHECK(all_equal(x, 6));          // once
    CHECK(all_equal(must(out.get(0)).get(), 12));
  }
  CHECK(pool.stats().recordings == 0);
  CHECK(pool.stats().recordings_not_kept == 1);
  CHECK(pool.check_memory());
  CHECK(pool.memory().allocated_bytes == 0);  // the output went with its lease, the slot with the graph
  auto again = must(f({x}));
  CHECK(again.kind() == K::eager);
  CHECK(all_equal(x, 7));
}

TEST_CASE("torch/writes: inputs made under InferenceMode: the write is seen in the slot, and lands", "[gpu][writes]") {
  REQUIRE_GPU();
  const c10::InferenceMode inference;
  auto pool = must(cgt::torch::make_pool());
  auto f = must(pool.add_function(bump_and_double, {.name = "bump"}));
  const at::Tensor x = at::zeros({64}, cuda());  // an inference tensor: no version counter
  REQUIRE(x.is_inference());
  for (int call = 1; call <= 4; ++call) {
    pool.mark_step_begin();
    auto out = must(f({x}));
    // The warm-up wrote the caller's tensor itself; the recording wrote its slot (a normal
    // tensor), ran once, and its write was carried back to the caller's tensor (no graph kept);
    // from then on the input counts as mutated.
    CHECK(out.kind() == (call <= 2 ? K::warmup : K::eager));
    CHECK(all_equal(x, call));
    CHECK(all_equal(must(out.get(0)).get(), 2.0 * call));
  }
  CHECK(pool.stats().recordings == 0);
}

TEST_CASE("torch/writes: an undeclared write to a static cache keeps the graph, which writes it in place",
          "[gpu][writes]") {
  REQUIRE_GPU();
  auto pool = must(cgt::torch::make_pool());
  auto f = must(pool.add_function(
      [](cgt::torch::Inputs in) {
        in[0].add_(in[1]);  // the cache accumulates the input
        return cgt::torch::Values{in[0].sum()};
      },
      {.name = "accumulate", .static_inputs = {0}}));
  const at::Tensor cache = at::zeros({32}, cuda());
  at::Tensor eager = at::zeros({32}, cuda());
  for (int call = 0; call < 6; ++call) {
    const at::Tensor step = at::randn({32}, cuda());
    eager.add_(step);
    pool.mark_step_begin();
    auto out = must(f({cache, step}));
    if (call >= 2) CHECK(out.kind() == K::replay);
    CHECK(at::equal(cache, eager));
    CHECK(at::allclose(must(out.get(0)).get(), eager.sum()));
  }
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
}

TEST_CASE("torch/writes: an undeclared write to a padded input reaches the caller's rows", "[gpu][writes][buckets]") {
  REQUIRE_GPU();
  auto pool = must(cgt::torch::make_pool());
  auto f = must(
      pool.add_function(bump_and_double, {.name = "bump", .buckets = {.sizes = {4, 8}, .pad = {}, .per_input = {}}}));
  const at::Tensor x = at::zeros({3, 16}, cuda());  // padded to 4 rows
  for (int call = 1; call <= 3; ++call) {
    pool.mark_step_begin();
    auto out = must(f({x}));
    CHECK(out.kind() == (call == 1 ? K::warmup : K::eager));
    CHECK(all_equal(x, call));
    const at::Tensor y = must(out.get(0)).get();
    CHECK(y.sizes() == x.sizes());  // sliced back to the caller's rows
    CHECK(all_equal(y, 2.0 * call));
  }
}

TEST_CASE("torch/writes: a TorchScript model that writes its input is primed on copies and written once per call",
          "[gpu][writes][models]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  torch::jit::Module module("Bump");
  module.define(R"JIT(
def forward(self, x: Tensor):
    x.add_(1.0)
    return x * 2.0
)JIT");
  module.eval();
  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_jit_module(pool, module, {.name = "bump"}));
  const at::Tensor x = at::zeros({4, 8}, cuda());
  for (int call = 1; call <= 4; ++call) {
    pool.mark_step_begin();
    auto out = model({x});
    REQUIRE(out);
    CHECK(out->kind() == (call == 1 ? K::warmup : K::eager));
    CHECK(all_equal(x, call));  // the two priming runs read copies
  }
}
