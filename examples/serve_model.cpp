// Serving an exported model through one cgt pool: a request loop over two batch sizes, one step
// per request, one output kept across requests with take(), then the pool's stats and its tree.
//
//   serve_model MODEL SAMPLE_SHAPE [REQUESTS]
//     MODEL         a TorchScript module (.pt, torch.jit.save) or an AOTInductor package (.pt2,
//                   torch._inductor.aoti_compile_and_package) taking one float tensor
//                   [batch, SAMPLE_SHAPE...] on cuda:0
//     SAMPLE_SHAPE  the input's shape without the batch dimension, e.g. 256 or 16x64
//
// Without arguments it says how to export a model. With the test models of
// scripts/export-test-models.py:  serve_model DIR/block.pt2 16x64   (or DIR/mlp.pt 256)
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

import cgt;
import cgt.torch;

namespace {

int usage() {
  std::cerr << R"(usage: serve_model MODEL SAMPLE_SHAPE [REQUESTS]
  MODEL: a TorchScript module (.pt) or an AOTInductor package (.pt2) taking one float tensor
         [batch, SAMPLE_SHAPE...] on cuda:0; SAMPLE_SHAPE is e.g. 256 or 16x64.

Export one from Python (random weights are fine), on the machine that will serve it:

  import torch
  model = MyModel().cuda().eval()
  example = torch.randn(4, 16, 64, device="cuda")
  torch.jit.script(model).save("model.pt")                       # TorchScript
  batch = torch.export.Dim("batch", min=1, max=64)                # AOTInductor, dynamic batch
  program = torch.export.export(model, (example,), dynamic_shapes={"x": {0: batch}})
  torch._inductor.aoti_compile_and_package(program, package_path="model.pt2")

or run:  python3 scripts/export-test-models.py DIR   (DIR/mlp.pt 256, DIR/block.pt 16x64,
                                                       DIR/block.pt2 16x64)
)";
  return 2;
}

std::optional<std::vector<std::int64_t>> parse_shape(const std::string& text) {
  std::vector<std::int64_t> shape;
  std::istringstream in(text);
  std::string part;
  while (std::getline(in, part, 'x')) {
    try {
      shape.push_back(std::stoll(part));
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (shape.back() <= 0) return std::nullopt;
  }
  if (shape.empty()) return std::nullopt;
  return shape;
}

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

// The first tensor of a model's output (a tensor, or the first of a tuple / list / dict).
at::Tensor first_tensor(const c10::IValue& value) {
  if (value.isTensor()) return value.toTensor();
  if (value.isTuple()) return first_tensor(value.toTupleRef().elements()[0]);
  if (value.isList()) return first_tensor(value.toListRef()[0]);
  if (value.isGenericDict()) return first_tensor(value.toGenericDict().begin()->value());
  return {};
}

}  // namespace

int main(int argc, char* argv[]) {
  if (argc < 3) return usage();
  const std::string path = argv[1];
  const auto sample_shape = parse_shape(argv[2]);
  if (!sample_shape) return usage();
  const int requests = argc > 3 ? std::atoi(argv[3]) : 200;
  if (!cgt::torch::is_available()) {
    std::cerr << "no CUDA device\n";
    return 1;
  }
  const torch::NoGradGuard no_grad;  // serving: on the thread that calls the pool
  const bool is_aoti = path.ends_with(".pt2");

  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());

  // The model, and the same model run eagerly for comparison.
  std::optional<torch::jit::Module> module;
  std::shared_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  std::optional<cgt::torch::Model> model;
  try {
    if (is_aoti) {
      // Loaded as capture needs it (run_single_threaded); add_aoti_package(*pool, path) does the same.
      loader = std::make_shared<torch::inductor::AOTIModelPackageLoader>(path, "model", true, 1, 0);
      auto added = cgt::torch::add_aoti_package(*pool, loader, {.name = "aoti"});
      if (!added) return report(added.error());
      model.emplace(std::move(*added));
    } else {
      module = torch::jit::load(path, torch::Device(torch::kCUDA, 0));
      module->eval();
      auto added = cgt::torch::add_jit_module(*pool, *module, {.name = "torchscript"});
      if (!added) return report(added.error());
      model.emplace(std::move(*added));
    }
  } catch (const std::exception& error) {
    std::cerr << "cannot load " << path << ": " << error.what() << '\n';
    return 1;
  }
  auto eager = [&](const at::Tensor& x) -> c10::IValue {
    if (is_aoti) {
      c10::List<at::Tensor> outputs;
      for (const at::Tensor& output : loader->run({x})) outputs.push_back(output);
      return outputs;
    }
    return module->forward({x});
  };

  const std::vector<std::int64_t> batch_sizes{1, 8};
  at::Tensor kept;  // an output kept across requests: a copy, taken out of the pool
  double max_difference = 0;
  std::chrono::nanoseconds serving{0};
  int timed = 0;
  for (int request = 0; request < requests; ++request) {
    std::vector<std::int64_t> shape{batch_sizes[static_cast<std::size_t>(request) % batch_sizes.size()]};
    shape.insert(shape.end(), sample_shape->begin(), sample_shape->end());
    const at::Tensor x = at::randn(shape, at::TensorOptions().device(at::kCUDA, 0));

    const auto start = std::chrono::steady_clock::now();
    pool->mark_step_begin();  // one step per request: the last request's outputs may be reused
    auto out = (*model)({x});
    if (!out) return report(out.error());
    const auto launched = std::chrono::steady_clock::now();
    if (out->kind() == cgt::CallKind::replay) {
      serving += launched - start;
      ++timed;
    }

    auto value = out->value();  // the model's output structure, over pool memory: valid while `out` lives
    if (!value) return report(value.error());
    const at::Tensor result = first_tensor(*value);
    if (request % 50 == 7) {
      const at::Tensor expected = first_tensor(eager(x));
      max_difference = std::max(max_difference, (result - expected).abs().max().item<double>());
    }
    if (request == 3) {
      auto taken = out->take(0);  // a copy: survives the next requests' steps
      if (!taken) return report(taken.error());
      kept = *taken;
    }
  }

  const cgt::Stats stats = pool->stats();
  std::cout << "served " << requests << " requests of batch 1 and 8 from " << path << " ("
            << (is_aoti ? "AOTInductor" : "TorchScript") << ")\n"
            << "calls " << stats.calls << ", warm-ups " << stats.warmups << ", recordings " << stats.recordings
            << ", replays " << stats.replays << ", eager " << stats.eager_calls << '\n'
            << "CPU time per replayed request (to the launch): "
            << (timed > 0 ? std::chrono::duration<double, std::micro>(serving).count() / timed : 0.0) << " us\n"
            << "max |cgt - eager| on sampled requests: " << max_difference << '\n'
            << "output 0 of request 3, kept with take(): sum " << kept.sum().item<double>() << '\n'
            << "pool memory: " << pool->memory().reserved_bytes / 1024 << " KiB reserved\n\n"
            << pool->to_dot();
  return max_difference == 0 && stats.eager_calls == 0 ? 0 : 1;
}
