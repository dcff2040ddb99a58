// AOTInductor packages as pool functions: the runner calls a package loader made for capture.
module;
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdint>
#include <exception>
#include <expected>
#include <memory>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :model_runner;

namespace cgt::torch {

namespace {

using Loader = ::torch::inductor::AOTIModelPackageLoader;

class AotiRunner final : public Model::Runner {
 public:
  AotiRunner(std::shared_ptr<Loader> loader, c10::DeviceIndex device, std::uint32_t priming_runs)
      : Runner("AOTInductor package", device, priming_runs, /*structured_inputs=*/false,
               /*prime_each_signature=*/false),
        loader_(std::move(loader)) {}

  // No stream argument: the runner then uses the current stream, the pool's during warm-up and
  // capture. The outputs come back flat, as the loader returns them: a list of tensors.
  c10::IValue forward(std::vector<c10::IValue> inputs) override {
    std::vector<at::Tensor> tensors;
    tensors.reserve(inputs.size());
    for (c10::IValue& input : inputs) tensors.push_back(std::move(input).toTensor());
    c10::List<at::Tensor> outputs;
    for (at::Tensor& output : loader_->run(tensors)) outputs.push_back(std::move(output));
    return outputs;
  }

 private:
  std::shared_ptr<Loader> loader_;
};

}  // namespace

Result<std::shared_ptr<Loader>> load_package_for_capture(const std::string& path, const std::string& model_name,
                                                         c10::DeviceIndex device) {
  try {
    return std::make_shared<Loader>(path, model_name, /*run_single_threaded=*/true, /*num_runners=*/1, device);
  } catch (const std::exception& error) {
    return fail(Errc::invalid_argument, "cannot load the AOTInductor package '" + path + "' (model '" + model_name +
                                            "'): " + message_of(error));
  }
}

Result<Model> add_aoti_package(Pool& pool, const std::string& path, ModelOptions options,
                               const std::string& model_name) {
  auto device = pool.device();
  if (!device) return std::unexpected(std::move(device.error()));
  auto loader = load_package_for_capture(path, model_name, static_cast<c10::DeviceIndex>(device->get().index()));
  if (!loader) {
    loader.error().function = options.name;
    return std::unexpected(std::move(loader.error()));
  }
  return add_aoti_package(pool, std::move(*loader), std::move(options));
}

Result<Model> add_aoti_package(Pool& pool, std::shared_ptr<Loader> loader, ModelOptions options) {
  if (!loader) return fail(Errc::invalid_argument, "add_aoti_package with an empty loader", options.name);
  auto device = pool.device();
  if (!device) return std::unexpected(std::move(device.error()));
  // A model that writes its inputs is not primed: the extra runs would repeat the writes.
  const std::uint32_t priming = options.mutated_inputs.empty() ? options.priming_runs : 0;
  auto runner =
      std::make_shared<AotiRunner>(std::move(loader), static_cast<c10::DeviceIndex>(device->get().index()), priming);
  // Its kernels are loaded by the priming run and serve every shape: later shapes need no warm-up.
  auto function = register_model(pool, runner, std::move(options), /*warm_up_each_shape_by_default=*/false);
  if (!function) return std::unexpected(std::move(function.error()));
  return Model(std::move(*function), std::move(runner));
}

}  // namespace cgt::torch
