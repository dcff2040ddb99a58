// cgt.torch's model adapters on a GPU (add_jit_module, add_aoti_package), against the same
// module or package run eagerly: outputs bit-identical (torch::equal) and in the model's own
// structure, every call after warm-up and recording a replay, two batch sizes, parameters read
// in place (never copied, never pool memory), and the errors for what cannot be graphed.
// TorchScript modules defined here need nothing else; the exported models (TorchScript and
// AOTInductor, made by scripts/export-test-models.py) are found in $CGT_TEST_MODELS, and their
// tests report SKIPPED when it is not set. Every test is tagged [gpu][models].
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using Catch::Matchers::ContainsSubstring;
using scenario::must;

#define REQUIRE_GPU() scenario::skip_unless_available<H>()

namespace {

at::TensorOptions cuda() {
  return at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, 0);
}

/// The path of an exported test model, or SKIP when there is none.
std::string exported_model(const std::string& file) {
  REQUIRE_GPU();
  const char* dir = std::getenv("CGT_TEST_MODELS");
  if (dir == nullptr || *dir == '\0') {
    SKIP("CGT_TEST_MODELS is not set: export the test models with python3 scripts/export-test-models.py DIR");
  }
  const std::string path = std::string(dir) + "/" + file;
  if (!std::filesystem::exists(path)) SKIP(path + " does not exist (scripts/export-test-models.py makes it)");
  return path;
}

// An exported TorchScript module (exported_model), loaded onto GPU 0 in eval mode.
torch::jit::Module load_exported_module(const std::string& file) {
  torch::jit::Module module = torch::jit::load(exported_model(file), torch::Device(torch::kCUDA, 0));
  module.eval();
  return module;
}

/// `got` has `expected`'s structure (tuples, lists, dicts with the same keys, None) and every
/// tensor of it is bit-identical.
void check_same(const c10::IValue& got, const c10::IValue& expected, const std::string& path = "output") {
  INFO(path);
  if (expected.isTensor()) {
    REQUIRE(got.isTensor());
    CHECK(torch::equal(got.toTensor(), expected.toTensor()));
  } else if (expected.isNone()) {
    CHECK(got.isNone());
  } else if (expected.isTuple()) {
    REQUIRE(got.isTuple());
    const auto& a = got.toTupleRef().elements();
    const auto& b = expected.toTupleRef().elements();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) check_same(a[i], b[i], path + "[" + std::to_string(i) + "]");
  } else if (expected.isList()) {
    REQUIRE(got.isList());
    const auto a = got.toListRef();
    const auto b = expected.toListRef();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) check_same(a[i], b[i], path + "[" + std::to_string(i) + "]");
  } else if (expected.isGenericDict()) {
    REQUIRE(got.isGenericDict());
    const auto a = got.toGenericDict();
    const auto b = expected.toGenericDict();
    REQUIRE(a.size() == b.size());
    auto ia = a.begin();
    for (auto ib = b.begin(); ib != b.end(); ++ia, ++ib) {
      REQUIRE(ia->key().toStringRef() == ib->key().toStringRef());
      check_same(ia->value(), ib->value(), path + "['" + ib->key().toStringRef() + "']");
    }
  } else {
    FAIL("unexpected output kind " << expected.tagKind());
  }
}

/// A TorchScript module defined from source, its parameter `weight` on `options`' device.
torch::jit::Module scripted(const std::string& source, at::TensorOptions options = cuda()) {
  torch::jit::Module module("Scripted");
  module.register_parameter("weight", at::randn({8, 8}, options), /*is_buffer=*/false);
  module.define(source);
  module.eval();
  return module;
}

}  // namespace

TEST_CASE("torch/models: a TorchScript module's structured inputs and output round-trip, equal to eager",
          "[gpu][models]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  torch::jit::Module module = scripted(R"JIT(
def forward(self, x: Tensor, extras: Dict[str, Tensor], scale: float, flag: bool):
    y = torch.matmul(x, self.weight) * scale
    if flag:
        y = y + 1
    return y, [y + extras["a"], extras["b"] * 2], {"sum": y + extras["a"] + extras["b"]}, None
)JIT");
  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_jit_module(pool, module, {.name = "structured"}));

  c10::Dict<std::string, at::Tensor> extras;
  extras.insert("a", at::randn({4, 8}, cuda()));
  extras.insert("b", at::randn({4, 8}, cuda()));
  const at::Tensor x = at::randn({4, 8}, cuda());
  // Each (scale, flag) is its own shape key: a float is a constant of the graph, a bool a scalar.
  for (const auto& [scale, flag] : std::vector<std::pair<double, bool>>{{0.5, true}, {0.25, true}, {0.5, false}}) {
    for (int call = 0; call < 4; ++call) {
      x.normal_();
      extras.at("a").normal_();  // new values in the same tensors: copied into the graph's slots
      pool.mark_step_begin();
      auto out = model({x, extras, scale, flag});
      REQUIRE(out);
      CHECK(out->size() == 4);  // y, two list elements, one dict value; None is no tensor
      CHECK(out->kind() == (call == 0   ? cgt::CallKind::warmup
                            : call == 1 ? cgt::CallKind::recording
                                        : cgt::CallKind::replay));
      const c10::IValue expected = module.forward({x, extras, scale, flag});
      check_same(must(out->value()), expected);
      check_same(must(out->take()), expected);
    }
  }
  const cgt::Stats stats = pool.stats();
  CHECK(stats.replays == 6);
  CHECK(stats.eager_calls == 0);
}

TEST_CASE("torch/models: what a graph cannot hand out fails the call, and the pool goes on", "[gpu][models]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  auto pool = must(cgt::torch::make_pool());
  const at::Tensor x = at::randn({4, 8}, cuda());

  SECTION("an integer output: function_failed naming it") {
    auto model = must(cgt::torch::add_jit_module(pool, scripted(R"JIT(
def forward(self, x: Tensor):
    return torch.matmul(x, self.weight), x.size(0)
)JIT"),
                                                 {.name = "sized"}));
    auto out = model({x});
    REQUIRE_FALSE(out);
    CHECK(out.error().code == cgt::Errc::function_failed);
    CHECK_THAT(out.error().message, ContainsSubstring("output[1]") && ContainsSubstring("Int"));
  }
  SECTION("a tensor output on the CPU: function_failed naming it") {
    auto model = must(cgt::torch::add_jit_module(pool, scripted(R"JIT(
def forward(self, x: Tensor):
    return torch.matmul(x, self.weight).cpu()
)JIT"),
                                                 {.name = "to_host"}));
    auto out = model({x});
    REQUIRE_FALSE(out);
    CHECK(out.error().code == cgt::Errc::function_failed);
    CHECK_THAT(out.error().message, ContainsSubstring("output") && ContainsSubstring("cpu"));
  }
  SECTION("a parameter on the CPU: add_jit_module fails with invalid_argument") {
    auto model = cgt::torch::add_jit_module(pool, scripted(R"JIT(
def forward(self, x: Tensor):
    return torch.matmul(x, self.weight)
)JIT",
                                                           at::TensorOptions().dtype(at::kFloat)));
    REQUIRE_FALSE(model);
    CHECK(model.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(model.error().message, ContainsSubstring("weight") && ContainsSubstring("cpu"));
  }
  SECTION("a package that does not exist: add_aoti_package fails with invalid_argument") {
    auto model = cgt::torch::add_aoti_package(pool, "/nonexistent/model.pt2");
    REQUIRE_FALSE(model);
    CHECK(model.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(model.error().message, ContainsSubstring("/nonexistent/model.pt2"));
  }
  // The pool is as it was: a good model on it warms up, records and replays.
  torch::jit::Module good = scripted(R"JIT(
def forward(self, x: Tensor):
    return torch.relu(torch.matmul(x, self.weight))
)JIT");
  auto model = must(cgt::torch::add_jit_module(pool, good, {.name = "good"}));
  for (int call = 0; call < 3; ++call) {
    pool.mark_step_begin();
    auto out = model({x});
    REQUIRE(out);
    CHECK(torch::equal(must(out->get(0)).get(), good.forward({x}).toTensor()));
  }
  CHECK(pool.stats().replays == 1);
}

TEST_CASE("torch/models: an exported TorchScript MLP serves two batch sizes, equal to eager, its parameters in place",
          "[gpu][models]") {
  const torch::NoGradGuard no_grad;
  torch::jit::Module module = load_exported_module("mlp.pt");
  std::size_t parameter_bytes = 0;
  std::vector<std::uintptr_t> parameters;
  for (const at::Tensor& parameter : module.parameters()) {
    parameter_bytes += parameter.nbytes();
    parameters.push_back(reinterpret_cast<std::uintptr_t>(parameter.data_ptr()));
  }
  REQUIRE(parameter_bytes > 4 * 1024 * 1024);

  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_jit_module(pool, module, {.name = "mlp"}));
  const std::vector<std::int64_t> batch_sizes{4, 16};
  for (int round = 0; round < 2; ++round) {  // a warm-up, then a recording, per batch size
    for (const std::int64_t batch : batch_sizes) {
      pool.mark_step_begin();
      REQUIRE(model({at::randn({batch, 256}, cuda())}));
    }
  }
  const cgt::Stats before = pool.stats();
  CHECK(before.warmups == 2);
  CHECK(before.recordings == 2);
  for (int round = 0; round < 5; ++round) {
    for (const std::int64_t batch : batch_sizes) {
      const at::Tensor x = at::randn({batch, 256}, cuda());
      pool.mark_step_begin();
      auto out = model({x});
      REQUIRE(out);
      CHECK(out->kind() == cgt::CallKind::replay);
      const at::Tensor& y = must(out->get(0)).get();
      CHECK(y.sizes() == at::IntArrayRef{batch, 64});
      CHECK(torch::equal(y, module.forward({x}).toTensor()));
      // Parameters are not inputs: nothing but the pool's own outputs is allocated.
      CHECK(pool.memory().allocated_bytes < parameter_bytes / 4);
    }
  }
  const cgt::Stats after = pool.stats();
  CHECK(after.replays == before.replays + 10);
  CHECK(after.warmups == before.warmups);
  CHECK(after.recordings == before.recordings);
  CHECK(after.eager_calls == 0);
  // Read in place: no parameter lives in the pool, and each graph copies its input only.
  cgt::torch::Device& device = must(pool.device()).get();
  for (const std::uintptr_t address : parameters) CHECK_FALSE(device.contains(address));
  const auto roots = pool.roots();
  REQUIRE(roots.size() == 2);
  for (const cgt::Node& root : roots) CHECK(root.copied_inputs() == std::vector<std::size_t>{0});
}

namespace {

/// Three rounds of calls, one per input shape, through `model` (`module` registered with
/// jit_optimize = false). In the first round the first shape warms up (the model's first call)
/// and every other records at its first call; in the third every call replays. Every output
/// equals `module` run unoptimised.
void serve_unoptimised(cgt::torch::Pool& pool, const cgt::torch::Model& model, const torch::jit::Module& module,
                       const std::vector<std::vector<std::int64_t>>& shapes) {
  for (int round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const at::Tensor x = at::randn(shapes[i], cuda());
      pool.mark_step_begin();
      auto out = model({x});
      REQUIRE(out);
      if (round == 0) CHECK(out->kind() == (i == 0 ? cgt::CallKind::warmup : cgt::CallKind::recording));
      if (round == 2) CHECK(out->kind() == cgt::CallKind::replay);
      c10::IValue expected;
      {
        const torch::jit::GraphOptimizerEnabledGuard unoptimised(false);
        expected = module.clone(/*inplace=*/true).forward({x});
      }
      check_same(must(out->value()), expected);
    }
  }
}

}  // namespace

// jit_optimize = false: one plan of eager kernels serves every shape, so each new batch size
// records at its first call (one warm-up in all, at the first), even after the program ran the
// module optimised (its executor has an optimised plan: cgt runs a clone). Outputs equal the
// unoptimised module's run eagerly.
TEST_CASE("torch/models: a TorchScript block without the executor's optimisations records each new size at once",
          "[gpu][models]") {
  const torch::NoGradGuard no_grad;
  torch::jit::Module module = load_exported_module("block.pt");
  for (int i = 0; i < 3; ++i) (void)module.forward({at::randn({2, 16, 64}, cuda())});  // profiled, optimised
  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_jit_module(pool, module, {.name = "block", .jit_optimize = false}));
  const std::vector<std::vector<std::int64_t>> shapes{{1, 16, 64}, {3, 16, 64}, {8, 16, 64}, {5, 16, 64}, {16, 16, 64}};
  serve_unoptimised(pool, model, module, shapes);
  const cgt::Stats stats = pool.stats();
  CHECK(stats.warmups == 1);
  CHECK(stats.recordings == shapes.size());
  CHECK(stats.eager_calls == 0);
}

// A traced module with Hugging Face BERT's two capture breakers (scripts/export-test-models.py,
// HostScalars): unoptimised, an int() of a device constant plus the input's size (a
// synchronisation) and a host constant copied to the device at each call. cgt's clone folds
// them, so every size records (none runs eagerly), with outputs equal to the module run
// unoptimised; the program's own module is left as it was.
TEST_CASE("torch/models: a traced module that synchronises and copies from the host unoptimised records every size",
          "[gpu][models]") {
  const torch::NoGradGuard no_grad;
  torch::jit::Module module = load_exported_module("host_scalars.pt");
  const auto nodes_of = [](const torch::jit::Module& m) {
    std::size_t count = 0;
    for (const torch::jit::Node* node : m.get_method("forward").graph()->nodes()) count += node != nullptr ? 1 : 0;
    return count;
  };
  const std::size_t nodes_before = nodes_of(module);
  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_jit_module(pool, module, {.name = "host_scalars", .jit_optimize = false}));
  CHECK(nodes_of(module) == nodes_before);
  const std::vector<std::vector<std::int64_t>> shapes{{1, 16, 64}, {3, 16, 64}, {8, 16, 64}, {3, 40, 64}};
  serve_unoptimised(pool, model, module, shapes);
  CHECK(pool.stats().eager_calls == 0);
  CHECK(pool.stats().recordings == shapes.size());
}

TEST_CASE("torch/models: an exported TorchScript block hands back its tuple and dict, equal to eager",
          "[gpu][models]") {
  const torch::NoGradGuard no_grad;
  torch::jit::Module module = load_exported_module("block.pt");
  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_jit_module(pool, module, {.name = "block"}));
  for (int round = 0; round < 4; ++round) {
    for (const std::int64_t batch : {2, 8}) {
      const at::Tensor x = at::randn({batch, 16, 64}, cuda());
      pool.mark_step_begin();
      auto out = model({x});
      REQUIRE(out);
      if (round >= 2) CHECK(out->kind() == cgt::CallKind::replay);
      const c10::IValue value = must(out->value());
      REQUIRE(value.isTuple());
      REQUIRE(value.toTupleRef().elements().size() == 2);
      CHECK(value.toTupleRef().elements()[0].toTensor().sizes() == at::IntArrayRef{batch, 10});
      REQUIRE(value.toTupleRef().elements()[1].isGenericDict());
      check_same(value, module.forward({x}));
    }
  }
  CHECK(pool.stats().replays == 4);
  CHECK(pool.stats().eager_calls == 0);
}

TEST_CASE("torch/models: an exported AOTInductor package serves two batch sizes, equal to its loader run eagerly",
          "[gpu][models]") {
  const std::string path = exported_model("block.pt2");
  const torch::NoGradGuard no_grad;
  auto loader = std::make_shared<torch::inductor::AOTIModelPackageLoader>(path, "model", /*run_single_threaded=*/true,
                                                                          /*num_runners=*/1, /*device_index=*/0);
  auto pool = must(cgt::torch::make_pool());
  auto model = must(cgt::torch::add_aoti_package(pool, loader, {.name = "block.aoti"}));
  at::Tensor kept;
  at::Tensor kept_expected;
  for (int round = 0; round < 4; ++round) {
    for (const std::int64_t batch : {2, 8}) {
      const at::Tensor x = at::randn({batch, 16, 64}, cuda());
      pool.mark_step_begin();
      auto out = model({x});
      REQUIRE(out);
      if (round >= 2) CHECK(out->kind() == cgt::CallKind::replay);
      REQUIRE(out->size() == 3);  // logits, hidden, pooled: the loader's flat outputs
      const std::vector<at::Tensor> expected = loader->run({x});
      const c10::IValue value = must(out->value());
      REQUIRE(value.isList());
      REQUIRE(value.toListRef().size() == 3);
      for (std::size_t i = 0; i < 3; ++i) CHECK(torch::equal(value.toListRef()[i].toTensor(), expected[i]));
      if (round == 2 && batch == 2) {
        kept = must(out->take(0));  // kept across later steps
        kept_expected = expected[0];
      }
    }
  }
  // By default a package warms up at its first shape only: batch 8 records at its first call.
  CHECK(pool.stats().warmups == 1);
  CHECK(pool.stats().recordings == 2);
  CHECK(pool.stats().replays == 5);
  CHECK(pool.stats().eager_calls == 0);
  CHECK(torch::equal(kept, kept_expected));

  SECTION("warm_up_each_shape = true warms up every batch size, as PyTorch's trees do") {
    auto each = must(cgt::torch::make_pool());
    auto warmed = must(cgt::torch::add_aoti_package(each, loader, {.name = "block.each", .warm_up_each_shape = true}));
    for (int round = 0; round < 3; ++round) {
      for (const std::int64_t batch : {2, 8}) {
        const at::Tensor x = at::randn({batch, 16, 64}, cuda());
        each.mark_step_begin();
        auto out = warmed({x});
        REQUIRE(out);
        CHECK(out->kind() == (round == 0   ? cgt::CallKind::warmup
                              : round == 1 ? cgt::CallKind::recording
                                           : cgt::CallKind::replay));
        CHECK(torch::equal(must(out->get(0)).get(), loader->run({x})[0]));
      }
    }
    CHECK(each.stats().warmups == 2);
  }

  SECTION("inputs other than tensors are refused") {
    auto out = model({at::randn({2, 16, 64}, cuda()), 3});
    REQUIRE_FALSE(out);
    CHECK(out.error().code == cgt::Errc::invalid_argument);
  }
  SECTION("loaded by path, the package gives the same outputs") {
    auto other = must(cgt::torch::make_pool());
    auto by_path = must(cgt::torch::add_aoti_package(other, path, {.name = "block.path"}));
    const at::Tensor x = at::randn({8, 16, 64}, cuda());
    for (int call = 0; call < 3; ++call) {
      other.mark_step_begin();
      auto out = by_path({x});
      REQUIRE(out);
      CHECK(torch::equal(must(out->get(2)).get(), loader->run({x})[2]));
    }
    CHECK(other.stats().replays == 1);
  }
}
