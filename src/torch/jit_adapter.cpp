// TorchScript modules as pool functions: the runner calls the module's `forward`.
module;
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <cstdint>
#include <exception>
#include <expected>
#include <memory>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.backend;
import :model_runner;

namespace cgt::torch {

namespace {

class JitRunner final : public Model::Runner {
 public:
  // Optimised, the executor profiles and optimises each new input signature: prime each.
  // Without, one plan serves every signature: prime once, as an AOTInductor package.
  JitRunner(::torch::jit::Module module, c10::DeviceIndex device, std::uint32_t priming_runs, bool optimize)
      : Runner("TorchScript module", device, priming_runs, /*structured_inputs=*/true,
               /*prime_each_signature=*/optimize),
        module_(std::move(module)),
        optimize_(optimize) {}

  c10::IValue forward(std::vector<c10::IValue> inputs) override {
    // Thread-local, for this call only: the program's own calls of its module keep their setting.
    const ::torch::jit::GraphOptimizerEnabledGuard optimizer(optimize_);
    return module_.forward(std::move(inputs));
  }

 private:
  ::torch::jit::Module module_;  // a handle: shares the program's module object and its parameters
  bool optimize_;
};

// Parameters and buffers are read by the graph at their addresses: they must be on its device.
Result<void> check_on_device(const ::torch::jit::Module& module, c10::DeviceIndex device) {
  const at::Device expected(at::kCUDA, device);
  auto check = [&](const std::string& what, const std::string& name, const at::Tensor& tensor) -> Result<void> {
    if (!tensor.defined() || tensor.device() == expected) return {};
    return fail(Errc::invalid_argument,
                "the TorchScript module's " + what + " '" + name + "' is on " + tensor.device().str() +
                    ", not on the pool's device " + expected.str() +
                    ": a graph reads parameters and buffers where they are; load the module with "
                    "torch::jit::load(path, device) or call module.to(device) before add_jit_module");
  };
  for (const auto& parameter : module.named_parameters(/*recurse=*/true)) {
    if (auto checked = check("parameter", parameter.name, parameter.value); !checked) return checked;
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/true)) {
    if (auto checked = check("buffer", buffer.name, buffer.value); !checked) return checked;
  }
  return {};
}

}  // namespace

Result<Model> add_jit_module(Pool& pool, const ::torch::jit::Module& module, ModelOptions options) {
  auto device = pool.device();
  if (!device) return std::unexpected(std::move(device.error()));
  const c10::DeviceIndex index = static_cast<c10::DeviceIndex>(device->get().index());
  try {
    if (!module.find_method("forward")) {
      return fail(Errc::invalid_argument, "the TorchScript module has no forward method", options.name);
    }
    if (auto checked = check_on_device(module, index); !checked) {
      checked.error().function = options.name;
      return std::unexpected(std::move(checked.error()));
    }
  } catch (const std::exception& error) {
    return fail(Errc::invalid_argument, "the TorchScript module cannot be inspected: " + message_of(error),
                options.name);
  }
  // A model that writes its inputs is not primed: the extra runs would repeat the writes.
  const std::uint32_t priming = options.mutated_inputs.empty() ? options.priming_runs : 0;
  ::torch::jit::Module runs = module;
  if (!options.jit_optimize) {
    // An executor that built its optimised plan (the program ran the module before) keeps it
    // whatever the setting: a clone has executors of its own and shares the parameters.
    try {
      runs = module.clone(/*inplace=*/true);
    } catch (const std::exception& error) {
      return fail(Errc::invalid_argument, "the TorchScript module cannot be cloned: " + message_of(error),
                  options.name);
    }
  }
  auto runner = std::make_shared<JitRunner>(std::move(runs), index, priming, options.jit_optimize);
  // Optimised, its executor profiles and optimises each new signature in the warm-up's priming
  // runs; without, a new batch size records at its first call, as an AOTInductor package's.
  auto function = register_model(pool, runner, options, /*warm_up_each_shape_by_default=*/options.jit_optimize);
  if (!function) return std::unexpected(std::move(function.error()));
  return Model(std::move(*function), std::move(runner));
}

}  // namespace cgt::torch
