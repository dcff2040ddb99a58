// cgt.torch:models — exported models as pool functions: TorchScript modules and AOTInductor packages.
//
//   #include <torch/script.h>   // for torch::jit::load; include before the imports
//   import cgt.torch;
//
//   torch::jit::Module module = torch::jit::load("model.pt", torch::Device(torch::kCUDA, 0));
//   module.eval();
//   auto model = cgt::torch::add_jit_module(*pool, module, {.name = "bert"});
//   // or: auto model = cgt::torch::add_aoti_package(*pool, "model.pt2", {.name = "bert"});
//   pool->mark_step_begin();
//   auto out = (*model)({tokens, mask});          // IValues: tensors, ints, tuples, lists, dicts
//   c10::IValue result = *out->value();           // the model's own output structure, borrowed
//   c10::IValue kept = *out->take();              // the same structure, copied out of the pool
//
// One call registers the model as one pool function. Its parameters and buffers are not inputs:
// the graph reads them at their addresses, as constants, so they are never copied and never in
// the pool's memory (keep them where they are: no `module.to(...)` after the first call). Inputs
// and outputs are flattened: every tensor (and integer) of the inputs, depth-first, is an input
// of the pool function (`ModelOptions::static_inputs` and `size_source` count in that order), and
// the tensors of the output are its outputs, handed back in the output's structure.
//
// What cannot be graphed, and what happens:
//  * a parameter or buffer that is not on the pool's device: `add_jit_module` fails with
//    `invalid_argument` (move the module first);
//  * an input on the CPU or another device: the call runs eagerly (`Reason::input_on_other_device`);
//  * an output that is not a tensor, None, or a tuple / list / dict of them (an int, a string), or
//    a tensor output not on the pool's device, or an output whose structure differs from the
//    first call's: the call fails with `function_failed`, saying which output; the pool is restored.
//  * a model that synchronises with the host: that shape runs eagerly (`Reason::capture_failed`).
// Every model runs under `torch::NoGradGuard` (serving: no autograd history is built).
module;
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// The adapters take these by reference; include <torch/script.h> or
// <torch/csrc/inductor/aoti_package/model_package_loader.h> to make them.
namespace torch::jit {
struct Module;
}  // namespace torch::jit
namespace torch::inductor {
class AOTIModelPackageLoader;
}  // namespace torch::inductor

// The deleted borrows say why (`= delete("...")`, C++26, which clang accepts earlier).
#pragma clang diagnostic ignored "-Wc++26-extensions"

export module cgt.torch:models;
import cgt.backend;
import :api;

export namespace cgt::torch {

/// How a model is registered.
struct ModelOptions {
  /// Names the pool function (messages, the log, the DOT dump).
  std::string name = "model";
  /// Flattened inputs at a stable address, never copied (`FunctionOptions::static_inputs`): a KV
  /// cache, say. Index in the flattened inputs (each tensor and integer of the call, depth-first).
  std::vector<std::size_t> static_inputs;
  /// Flattened inputs the model writes to (`FunctionOptions::mutated_inputs`).
  std::vector<std::size_t> mutated_inputs;
  /// Only these sizes are graphed (`FunctionOptions::graph_sizes`), compared with
  /// `size_source` (an index in the flattened inputs); empty: every size.
  std::vector<std::int64_t> graph_sizes;
  SizeSource size_source;
  /// Extra runs of the model in the first call of each new input signature (sizes, strides,
  /// types, structure; an AOTInductor package: in its first call only, as its kernels serve every
  /// shape), before its result is computed, on a side stream outside the pool's memory;
  /// not while a capture is in progress. They make lazy set-up happen before the recording, and
  /// keep what the model keeps from it out of the pool: TorchScript's profiling executor
  /// profiles its first run and optimises (compiles fusions) at its second; an AOTInductor
  /// package loads its kernels at its first. The extra runs read copies of the inputs (a write to
  /// one is not repeated on the caller's). A model with `mutated_inputs` is never primed (its
  /// inputs may be large caches, and not worth copying); nor is any model when the
  /// pool's `Options::skip_warmup` records the first call directly (then TorchScript's
  /// profiling runs inside the capture: leave `skip_warmup` off for TorchScript).
  std::uint32_t priming_runs = 2;
  /// `FunctionOptions::warm_up_each_shape`: false records a new batch size at its first call (no
  /// eager warm-up after the model's first shape): faster capture of many sizes. Unset: false
  /// for an AOTInductor package (its kernels, loaded at its first run, serve every shape; a shape
  /// whose capture still fails warms up and records at its next call) and for TorchScript with
  /// `jit_optimize` false, true for TorchScript optimised (a recording without a warm-up is not
  /// primed: the executor would profile a new signature inside the capture and the graph would
  /// keep its unoptimised kernels).
  std::optional<bool> warm_up_each_shape;
  /// TorchScript only. True: the module runs through its profiling executor's optimisations
  /// (fusions compiled for each new input signature, primed before its warm-up). False: cgt's
  /// calls run it as `torch::jit::setGraphExecutorOptimize(false)` would (on a clone sharing its
  /// parameters; the program's own calls keep their setting): one plan of eager libtorch kernels
  /// serves every shape, so a new batch size is neither primed nor warmed up but recorded at its
  /// first call, as an AOTInductor package's (`warm_up_each_shape` unset: false). The clone's
  /// `forward` is inlined and its constant expressions folded once, as the optimised executor
  /// does at its first run: a trace's host constants copied to the device at each call, and
  /// device constants read back as numbers (`int(x.size(1) + offset)`), would break a capture.
  /// Faster capture of many sizes; outputs bit-identical to eager libtorch; the optimised
  /// executor's fused elementwise kernels are given up.
  bool jit_optimize = true;
};

/// What a model's output looks like: tensors (index `i` is flattened output `i`), None, and
/// tuples, lists and dicts of them. Shared by the model and the outputs of its calls.
struct OutputStructure;

/// The outputs of one call of a model: the flattened tensors, each held by a lease on pool memory
/// (as `Outputs`), and the structure to put them back into. Move-only.
class ModelOutputs {
 public:
  ModelOutputs(ModelOutputs&&) noexcept = default;
  ModelOutputs& operator=(ModelOutputs&&) noexcept = default;
  ModelOutputs(const ModelOutputs&) = delete;
  ModelOutputs& operator=(const ModelOutputs&) = delete;
  ~ModelOutputs() = default;

  /// Number of flattened tensor outputs.
  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  /// What the call did: warm-up, recording, replay or eager fallback.
  [[nodiscard]] CallKind kind() const noexcept { return tensors_.kind(); }

  /// The output in the model's structure (a tensor, or a tuple / list / dict of tensors), over
  /// the leased tensors, borrowed: valid while this object lives and no new step reclaimed it
  /// (a tensor of it used later raises a `c10::Error`, cgt's escape poisoning). Fails like
  /// `Outputs::get`.
  [[nodiscard]] Result<c10::IValue> value() const&;
  Result<c10::IValue> value() const&& = delete(
      "the tensors of a temporary ModelOutputs die at the end of the statement: name the result first, or take()");
  /// The output in the model's structure, every tensor copied out of the pool: yours to keep
  /// across steps. Fails like `Outputs::take`.
  [[nodiscard]] Result<c10::IValue> take() const;

  /// Flattened output `i`, borrowed (`Outputs::get`) or copied (`Outputs::take`).
  [[nodiscard]] Result<Ref<at::Tensor>> get(std::size_t i) const& [[clang::lifetimebound]] { return tensors_.get(i); }
  Result<Ref<at::Tensor>> get(std::size_t i) const&& = delete("name the result first, or take() a copy");
  [[nodiscard]] Result<at::Tensor> take(std::size_t i) const { return tensors_.take(i); }
  /// The flattened outputs' leases: to `release` one and pass it into another call.
  [[nodiscard]] Outputs& tensors() & noexcept { return tensors_; }

  /// What `->` reaches on a temporary result (`(*model)({x})->take()`): the members that copy.
  class Temporary {
   public:
    explicit Temporary(std::expected<ModelOutputs, Error>& outputs) noexcept : outputs_(&outputs) {}
    [[nodiscard]] const Temporary* operator->() const noexcept { return this; }
    /// 0 for a failed call (check the result first to tell why).
    [[nodiscard]] std::size_t size() const noexcept { return outputs_->has_value() ? (**outputs_).size() : 0; }
    /// `CallKind::eager` for a failed call (check the result first to tell why).
    [[nodiscard]] CallKind kind() const noexcept {
      return outputs_->has_value() ? (**outputs_).kind() : CallKind::eager;
    }
    [[nodiscard]] Result<c10::IValue> take() const {
      if (!outputs_->has_value()) return std::unexpected(outputs_->error());
      return (**outputs_).take();
    }
    [[nodiscard]] Result<at::Tensor> take(std::size_t i) const {
      if (!outputs_->has_value()) return std::unexpected(outputs_->error());
      return (**outputs_).take(i);
    }

   private:
    std::expected<ModelOutputs, Error>* outputs_;
  };

 private:
  friend class Model;
  ModelOutputs(Outputs&& tensors, std::shared_ptr<const OutputStructure> structure) noexcept
      : tensors_(std::move(tensors)), structure_(std::move(structure)) {}
  Outputs tensors_;
  std::shared_ptr<const OutputStructure> structure_;
};

/// A model registered with a pool (`add_jit_module`, `add_aoti_package`). Move-only; it keeps
/// the module or package loaded while it (or a call's outputs) lives.
class Model {
 public:
  Model(Model&&) noexcept = default;
  Model& operator=(Model&&) noexcept = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  /// Calls the model: warm-up, recording, replay or eager fallback, as `Function::operator()`.
  /// TorchScript takes what its `forward` takes: tensors, integers and bools (part of the shape
  /// key, as scalars), None, floats and strings (constants of the graph: a new value is a new
  /// shape key), and tuples, lists and dicts of them. An AOTInductor package takes tensors only.
  /// Fails as `Function::operator()` does, and with `invalid_argument` for an input the model
  /// kind cannot take or an empty (moved-from) handle.
  [[nodiscard]] Owning<ModelOutputs> operator()(const std::vector<c10::IValue>& inputs) const;

  /// The pool function, for introspection (its name, its id in the tree). Its inputs are the
  /// flattened ones; a TorchScript model's last input is an integer naming the inputs' structure.
  [[nodiscard]] const Function& function() const noexcept { return function_; }
  [[nodiscard]] std::string_view name() const noexcept { return function_.name(); }

  struct Runner;  // the module or package, and what its calls have seen; src/torch/model_runner.cppm

 private:
  friend Result<Model> add_jit_module(Pool& pool, const ::torch::jit::Module& module, ModelOptions options);
  friend Result<Model> add_aoti_package(Pool& pool, std::shared_ptr<::torch::inductor::AOTIModelPackageLoader> loader,
                                        ModelOptions options);
  Model(Function function, std::shared_ptr<Runner> runner) noexcept;
  Function function_;
  std::shared_ptr<Runner> runner_;
};

/// Registers a TorchScript module's `forward` with `pool`. The module handle is copied (it shares
/// the module's object: its parameters are the program's own). Call `module.eval()` first: a
/// module left in training mode keeps dropout on and updates BatchNorm's running statistics at
/// every call, replays included (and at each priming run).
/// Fails with `invalid_argument` when a parameter or buffer is not on the pool's device, or the
/// module has no `forward`; as `Pool::add_function` otherwise.
[[nodiscard]] Result<Model> add_jit_module(Pool& pool, const ::torch::jit::Module& module, ModelOptions options = {});

/// Registers an AOTInductor package (`torch._inductor.aoti_compile_and_package`) with `pool`,
/// loading it the way capture needs: `AOTIModelPackageLoader(path, model_name,
/// run_single_threaded = true, 1, pool's device)` (the default multi-threaded runner queries a CUDA
/// event recorded inside the capture, which fails it). Fails with `invalid_argument` when the
/// package cannot be loaded (the loader's message says why).
[[nodiscard]] Result<Model> add_aoti_package(Pool& pool, const std::string& path, ModelOptions options = {},
                                             const std::string& model_name = "model");
/// Registers a package loader you made. Make it with `run_single_threaded = true` and the pool's
/// device index; a multi-threaded one fails every recording (`Reason::capture_failed`: the calls
/// run eagerly). A single-threaded loader must not be used by pools on several threads.
[[nodiscard]] Result<Model> add_aoti_package(Pool& pool,
                                             std::shared_ptr<::torch::inductor::AOTIModelPackageLoader> loader,
                                             ModelOptions options = {});

}  // namespace cgt::torch
