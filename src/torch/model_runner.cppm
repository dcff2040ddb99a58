// cgt.torch:model_runner — what the model adapters share: the structure of a model's inputs and
// outputs (flattened to the pool function's tensors and scalars, and back), and the runner that
// is the pool function's body. The TorchScript and AOTInductor runners derive from it
// (jit_adapter.cpp, aoti_adapter.cpp); model.cpp implements it.
module;
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace torch::inductor {
class AOTIModelPackageLoader;
}  // namespace torch::inductor

module cgt.torch:model_runner;
import cgt;
import cgt.core;
import :api;

namespace cgt::torch {

/// One node of a model's output: a tensor (flattened output `index`), None, or a container.
struct OutputStructure {
  enum class Kind : std::uint8_t { tensor, none, tuple, list, dict };
  Kind kind = Kind::none;
  std::size_t index = 0;                  ///< tensor: its index in the flattened outputs
  std::vector<OutputStructure> children;  ///< tuple, list: the elements; dict: the values
  std::vector<c10::IValue> keys;          ///< dict: the keys, in order
  c10::TypePtr element_type;              ///< list: the element type; dict: the key type
  c10::TypePtr value_type;                ///< dict: the value type
};

/// One node of a call's inputs. Tensors, integers and bools are arguments of the pool function
/// (in this order, depth-first); other leaves are constants of the structure.
struct InputNode {
  enum class Kind : std::uint8_t { tensor, integer, boolean, constant, tuple, list, dict };
  Kind kind = Kind::constant;
  c10::IValue constant;  ///< constant: the value (None, a float, a string, a device)
  std::vector<InputNode> children;
  std::vector<c10::IValue> keys;
  c10::TypePtr element_type;
  c10::TypePtr value_type;
};

/// The inputs of one call of a model, as the runner rebuilds them inside the pool function.
struct ModelCall {
  const Model::Runner* runner = nullptr;
  std::vector<InputNode> inputs;  ///< the top-level arguments (empty when `tensors_only`)
  std::uint64_t structure_hash = 0;
  /// Every top-level argument is a tensor (the usual call): each is one input of the pool
  /// function, in order, and `inputs` is not built (the runner passes the tensors as they come).
  bool tensors_only = false;
};

/// The body of a model's pool function: rebuilds the model's inputs from the pool function's,
/// runs the model (priming it on new input signatures), flattens its output.
struct Model::Runner {
  Runner(std::string kind, c10::DeviceIndex device, std::uint32_t priming_runs, bool structured_inputs,
         bool prime_each_signature)
      : kind(std::move(kind)),
        device(device),
        priming_runs(priming_runs),
        structured_inputs(structured_inputs),
        prime_each_signature(prime_each_signature) {}
  virtual ~Runner() = default;
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  /// Runs the model once on `inputs`.
  virtual c10::IValue forward(std::vector<c10::IValue> inputs) = 0;

  /// Flattens `inputs` into the pool function's arguments (borrowing their tensors) and `call`.
  [[nodiscard]] Result<void> flatten_inputs(const std::vector<c10::IValue>& inputs, ModelCall& call,
                                            std::vector<Arg>& args) const;
  /// The pool function's body.
  Values operator()(Inputs in);
  /// Runs the model `priming_runs` times outside the pool's memory (a new input signature).
  void prime(const std::vector<c10::IValue>& arguments);

  const std::string kind;  ///< "TorchScript module", "AOTInductor package": for messages
  const c10::DeviceIndex device;
  const std::uint32_t priming_runs;
  /// TorchScript: IValue inputs of any structure, and a last scalar naming it. AOTInductor: tensors.
  const bool structured_inputs;
  /// TorchScript: its executor profiles and optimises per input signature. AOTInductor: its
  /// kernels serve every shape, loaded at the first run; later signatures need no priming.
  const bool prime_each_signature;
  /// The output's structure, set by the first run; later runs must produce the same.
  std::shared_ptr<const OutputStructure> structure;
  /// Input signatures the model was primed on.
  std::unordered_set<std::uint64_t> primed;
};

/// Registers `runner` with `pool` as a pool function made with `options` (taken, as the `add_*`
/// functions take theirs); an unset `warm_up_each_shape` is `warm_up_each_shape_by_default` (the
/// format's default).
[[nodiscard]] Result<Function> register_model(Pool& pool, std::shared_ptr<Model::Runner> runner, ModelOptions options,
                                              bool warm_up_each_shape_by_default);

/// Loads an AOTInductor package for capture, on `device`: `run_single_threaded`, as the default
/// runner records a CUDA event per run and queries it at the next, which a capture does not
/// allow. Fails with `invalid_argument` naming the path and the model when it cannot be loaded.
[[nodiscard]] Result<std::shared_ptr<::torch::inductor::AOTIModelPackageLoader>> load_package_for_capture(
    const std::string& path, const std::string& model_name, c10::DeviceIndex device);

/// The message of an exception, without libtorch's backtrace.
[[nodiscard]] std::string message_of(const std::exception& error);

}  // namespace cgt::torch
