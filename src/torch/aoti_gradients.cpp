// The gradient function of an AOTInductor package of a joint forward and backward: the package
// is called with the parameters, then the step's inputs (scripts/aoti_training.py exports one).
module;
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstddef>
#include <expected>
#include <memory>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :model_runner;

namespace cgt::torch {

Result<GradientFunction> load_aoti_gradients(const std::string& path, std::vector<at::Tensor> params,
                                             c10::DeviceIndex device, const std::string& model_name) {
  const at::Device expected(at::kCUDA, device);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (!params[i].defined() || params[i].device() != expected) {
      return fail(Errc::invalid_argument, "parameter " + std::to_string(i) + " is not on " + expected.str() +
                                              ": the package's graph reads the parameters where they are");
    }
  }
  auto loader = load_package_for_capture(path, model_name, device);
  if (!loader) return std::unexpected(std::move(loader.error()));
  // The parameters are passed by handle: the graph reads them at their addresses, where the
  // optimizer updates them in place. They come back with the function too, so the training step
  // can check that the optimizer updates them in this order.
  Callable run = [loader = std::move(*loader), params](Inputs in) -> Values {
    std::vector<at::Tensor> arguments;
    arguments.reserve(params.size() + in.size());
    arguments.insert(arguments.end(), params.begin(), params.end());
    for (std::size_t i = 0; i < in.size(); ++i) arguments.push_back(in[i]);
    return loader->run(arguments);
  };
  return GradientFunction{.params = std::move(params), .loss_and_gradients = std::move(run)};
}

}  // namespace cgt::torch
