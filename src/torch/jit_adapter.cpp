// TorchScript modules as pool functions: the runner calls the module's `forward`.
module;
#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <cstdint>
#include <exception>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
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

// Without the executor's optimisations a traced graph runs as recorded, and two of its habits
// break a capture (Hugging Face's BERT has both); the optimised executor removes them at its first
// run by specialising to the shapes, so they must go here, once and for every shape:
// * `torch.tensor(0.0, device=x.device)` is a host constant and a copy to the device at each
//   call, a pageable copy: fold every node whose inputs are all constants (after inlining the
//   submodules' calls, so that it sees them).
// * `x.size(1) + offset` is a host tensor plus a 0-dim tensor constant, which loading the module
//   onto the device put there; `int()` of the sum reads it back, a synchronisation: arithmetic
//   whose result is only converted to a host number gets host copies of its device constants.
// Both compute the values the call would have.
bool converts_to_host_number(const ::torch::jit::Node& node) {
  static const std::unordered_set<c10::Symbol> kinds{
      c10::Symbol::fromQualString("aten::Int"),         c10::Symbol::fromQualString("aten::Float"),
      c10::Symbol::fromQualString("aten::Bool"),        c10::Symbol::fromQualString("aten::ScalarImplicit"),
      c10::Symbol::fromQualString("aten::IntImplicit"), c10::Symbol::fromQualString("aten::FloatImplicit"),
      c10::Symbol::fromQualString("aten::item")};
  return kinds.contains(node.kind());
}

bool is_scalar_arithmetic(const ::torch::jit::Node& node) {
  static const std::unordered_set<c10::Symbol> kinds{
      c10::Symbol::fromQualString("aten::add"),       c10::Symbol::fromQualString("aten::sub"),
      c10::Symbol::fromQualString("aten::rsub"),      c10::Symbol::fromQualString("aten::mul"),
      c10::Symbol::fromQualString("aten::div"),       c10::Symbol::fromQualString("aten::floor_divide"),
      c10::Symbol::fromQualString("aten::remainder"), c10::Symbol::fromQualString("aten::neg")};
  return kinds.contains(node.kind());
}

// A use of a device constant: the node that reads it, at which input, and the constant's value.
struct Use {
  ::torch::jit::Node* user = nullptr;
  std::size_t index = 0;
  at::Tensor value;
};

// The uses of device constants in the arithmetic that computes `value`, or nullopt where that
// arithmetic reads anything but constants and host sizes, or where one of its results is also used
// elsewhere (moving it to the host would change what that use sees).
std::optional<std::vector<Use>> device_constants_of(::torch::jit::Value* value) {
  ::torch::jit::Node* node = value->node();
  if (node->kind() == c10::prim::NumToTensor) return std::vector<Use>{};  // a host tensor
  if (!is_scalar_arithmetic(*node) || value->uses().size() != 1) return std::nullopt;
  std::vector<Use> found;
  for (std::size_t i = 0; i < node->inputs().size(); ++i) {
    ::torch::jit::Value* input = node->input(i);
    if (!input->type()->isSubtypeOf(*c10::TensorType::get())) continue;  // alpha, rounding mode
    if (input->node()->kind() == c10::prim::Constant) {
      const std::optional<c10::IValue> constant = ::torch::jit::toIValue(input);
      if (!constant || !constant->isTensor() || constant->toTensor().dim() != 0) return std::nullopt;
      if (!constant->toTensor().is_cpu()) found.push_back({.user = node, .index = i, .value = constant->toTensor()});
      continue;
    }
    std::optional<std::vector<Use>> deeper = device_constants_of(input);
    if (!deeper) return std::nullopt;
    found.insert(found.end(), deeper->begin(), deeper->end());
  }
  return found;
}

void keep_host_numbers_on_host(::torch::jit::Graph& graph) {
  for (::torch::jit::Node* node : graph.nodes()) {  // the top block: a trace has no other
    if (!converts_to_host_number(*node)) continue;
    const std::optional<std::vector<Use>> uses = device_constants_of(node->input(0));
    if (!uses) continue;
    for (const auto& [user, index, value] : *uses) {
      const ::torch::jit::WithInsertPoint before(user);
      user->replaceInput(index, graph.insertConstant(value.cpu()));
    }
  }
}

void make_capturable_unoptimised(::torch::jit::Module& module) {
  std::shared_ptr<::torch::jit::Graph> graph =
      ::torch::jit::toGraphFunction(module.get_method("forward").function()).graph();
  ::torch::jit::Inline(*graph);
  ::torch::jit::ConstantPropagation(graph);
  keep_host_numbers_on_host(*graph);
  ::torch::jit::EliminateDeadCode(graph);
}

}  // namespace

Result<Model> add_jit_module(Pool& pool, const ::torch::jit::Module& module, ModelOptions options) {
  auto device = pool.device();
  if (!device) return std::unexpected(std::move(device.error()));
  const auto index = static_cast<c10::DeviceIndex>(device->get().index());
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
    // whatever the setting: a clone has executors (and graphs) of its own and shares the
    // parameters.
    try {
      runs = module.clone(/*inplace=*/true);
      make_capturable_unoptimised(runs);
    } catch (const std::exception& error) {
      return fail(Errc::invalid_argument,
                  "the TorchScript module cannot be prepared to run unoptimised (cloned, its constants folded): " +
                      message_of(error),
                  options.name);
    }
  }
  const bool optimised = options.jit_optimize;  // read here: `options` moves into register_model
  auto runner = std::make_shared<JitRunner>(std::move(runs), index, priming, optimised);
  // Optimised, its executor profiles and optimises each new signature in the warm-up's priming
  // runs; without, a new batch size records at its first call, as an AOTInductor package's.
  auto function = register_model(pool, runner, std::move(options), /*warm_up_each_shape_by_default=*/optimised);
  if (!function) return std::unexpected(std::move(function.error()));
  return Model(std::move(*function), std::move(runner));
}

}  // namespace cgt::torch
