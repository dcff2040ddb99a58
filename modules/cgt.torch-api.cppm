// cgt.torch:api — the libtorch backend's interface; see cgt.torch.cppm for how to use it.
//
// One unit: its parts (autograd, optim, models) are the files cgt.torch-*.inc, included at its end.
// libtorch's headers are then parsed once per build, where a partition of each part parsed them
// again and merged them with the others' (a consumer's compile of cgt.torch took 4x as long).
module;
// at::Tensor and c10::IValue only: <ATen/ATen.h> (every operator) would double a consumer's compile.
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// The model adapters take these by reference; include <torch/script.h> or
// <torch/csrc/inductor/aoti_package/model_package_loader.h> to make them.
namespace torch::jit {
struct Module;
}  // namespace torch::jit
namespace torch::inductor {
class AOTIModelPackageLoader;
}  // namespace torch::inductor
// The checkpoints of the optimizers part take these by reference; <torch/torch.h> (or
// <torch/serialize.h> and <torch/nn/module.h>) makes them.
namespace torch::serialize {
class OutputArchive;
class InputArchive;
}  // namespace torch::serialize
namespace torch::nn {
class Module;
}  // namespace torch::nn

// The deleted borrows of the models part say why (`= delete("...")`, C++26, which clang accepts earlier).
#pragma clang diagnostic ignored "-Wc++26-extensions"

export module cgt.torch:api;
// The core and the backend interface; importers of cgt.torch get `cgt` only.
import cgt.core;

export namespace cgt::torch {

/// The inputs of a call, by position: `in[i]` is input `i` as a tensor (undefined where the call
/// passed a scalar), `in.scalar(i)` as a scalar (0 where the call passed a tensor). Converts to
/// `std::vector<at::Tensor>`, so a function may be written over one.
using Inputs = backend::Inputs<at::Tensor>;

/// What a pool function returns (an undefined tensor stands for "no value").
using Values = std::vector<at::Tensor>;
/// A libtorch pool function.
using Callable = std::move_only_function<Values(Inputs)>;

/// How a libtorch pool is made.
struct PoolOptions {
  cgt::Options tree;        ///< the tree's behaviour
  std::int16_t device = 0;  ///< CUDA device index
  /// A re-recording because a static input moved, with the same graph topology as the recording
  /// it redoes, updates that one's executable (cudaGraphExecUpdate) instead of instantiating its
  /// own; the two then share it, and a replay of the one not loaded loads its graph back first.
  /// Only graphs that draw no random numbers share (those replay through `CUDAGraph::replay`).
  bool update_graphs_in_place = true;
  /// Before instantiating a recorded graph, replace its memset nodes (cuBLAS, cuDNN, CUB and
  /// Inductor captures have them) by kernel nodes that write the same bytes: a graph with memset
  /// nodes costs cudaGraphLaunch many times the CPU of one with kernels only (a BERT-like stack of
  /// at:: ops with 24 memsets: 55 us a raw launch, 15 us a cgt replay, on an H100; see
  /// bench/results/launch.md). Counted in `GraphCounts`; false keeps them as captured.
  bool rewrite_memset_nodes = true;
  /// Replace one-row device-to-device memcpy nodes (`copy_` of contiguous tensors) by copy
  /// kernels too. Off by default: they were measured no slower to launch than kernels.
  bool rewrite_memcpy_nodes = false;
};

/// Number of usable CUDA devices; 0 without a GPU or driver. Never throws.
[[nodiscard]] int device_count() noexcept;
/// True when a CUDA device is usable.
[[nodiscard]] inline bool is_available() noexcept {
  return device_count() > 0;
}

/// The CUDA device of one pool: its private memory pool and the stream warm-ups and recordings
/// run on (its own, never shared with another pool). Reach it with `pool.device()`. It never
/// synchronises the whole device, so pools on several threads record and replay at once; their
/// functions must not draw random numbers from libtorch's default generator while another thread
/// captures (it is one per device).
class Device final : public backend::Device {
 public:
  explicit Device(std::int16_t device, bool update_graphs_in_place = true, bool rewrite_memset_nodes = true,
                  bool rewrite_memcpy_nodes = false);
  ~Device() override;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  [[nodiscard]] std::int16_t index() const noexcept;
  /// Is `address` inside a segment of this pool's private memory pool?
  [[nodiscard]] bool contains(std::uintptr_t address) const;
  /// How this pool's graphs came to be: instantiated, updated in place, switched, nodes rewritten.
  [[nodiscard]] const GraphCounts& graph_counts() const noexcept;

 private:
  // The engine's side (backend::Device), which it calls through the base class: private here, so
  // that the device a program reaches with `pool.device()` offers only the members above.
  // (Those it does not override too: a base member would otherwise be public through the base.)
  using backend::Device::owns;
  using backend::Device::stamp;
  using backend::Device::stamps_values;
  /// A tensor's element type by name ("Float"), for messages.
  [[nodiscard]] std::string type_name(std::uint16_t dtype) const override {
    return c10::toString(static_cast<c10::ScalarType>(dtype));
  }
  [[nodiscard]] Result<backend::RunResult> run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                               backend::RunMode mode) override;
  [[nodiscard]] Result<std::unique_ptr<backend::Capture>> begin_recording(backend::Invoker& fn,
                                                                          std::span<const backend::ArgSlot> args,
                                                                          const backend::RecordPlan& plan) override;
  [[nodiscard]] Result<std::unique_ptr<backend::Checkpoint>> checkpoint() override;
  [[nodiscard]] Result<void> restore(const backend::Checkpoint& checkpoint,
                                     std::span<backend::StorageHandle* const> live,
                                     std::span<const std::uintptr_t> dead) override;
  void release(backend::StorageHandle& storage, backend::Release why, std::string_view function) override;
  [[nodiscard]] std::int32_t device_index() const noexcept override { return index(); }
  /// A call whose caller's current stream is capturing a graph of the program's own (an
  /// `at::cuda::CUDAGraph` around it) is refused: the pool's work would be captured into that
  /// graph, which replays it without the pool knowing. The call's work runs in the pool's context,
  /// and the caller's (one the program made, or none) is current again after it.
  [[nodiscard]] bool scopes_calls() const noexcept override { return true; }
  [[nodiscard]] Result<void> begin_call() override;
  void end_call() noexcept override;
  /// `release` acts on a storage's libtorch record only: one with none has nothing to release.
  [[nodiscard]] bool releases_unowned_storage() const noexcept override { return false; }
  void adopt(backend::StorageHandle& storage) override;
  [[nodiscard]] Result<std::shared_ptr<void>> rescue(const backend::StorageHandle& storage) override;
  [[nodiscard]] std::shared_ptr<const void> rebase(const void* value, const backend::StorageHandle& from,
                                                   const std::shared_ptr<void>& rescued) override;
  /// Batch buckets: inputs padded with libtorch ops on the caller's stream, outputs sliced with
  /// `narrow` (views registered with their storage's record, like the outputs they view).
  [[nodiscard]] std::string why_no_buckets() const override { return {}; }
  [[nodiscard]] Result<backend::Padded> pad(const void* value, const backend::ArgDesc& desc, std::size_t dim,
                                            std::int64_t size, Pad pad) override;
  [[nodiscard]] Result<std::shared_ptr<const void>> slice(const void* value, const backend::StorageHandle* storage,
                                                          std::size_t dim, std::int64_t bucket,
                                                          std::int64_t size) override;
  [[nodiscard]] std::vector<std::int64_t> sizes_of(const void* value) const override;
  /// A write to a padded copy (seen through its version counter) copied back into the caller's rows.
  [[nodiscard]] Result<void> write_back(const void* padded, const void* original, std::size_t dim,
                                        std::int64_t rows) override;
  [[nodiscard]] std::vector<Block> live_blocks() const override;
  [[nodiscard]] MemoryInfo memory() const override;
  void shutdown() override;

 public:
  struct State;  // the libtorch objects; defined in src/torch

 private:
  std::unique_ptr<State> state_;
};

/// The libtorch backend, as `cgt::Pool` and friends need it.
struct Backend {
  using Value = at::Tensor;
  using Callable = torch::Callable;
  using Device = torch::Device;
  /// Fails with `invalid_argument` for an undefined tensor or one without strided storage
  /// (sparse, nested, mkldnn: a graph cannot read it), `output_overwritten` for a tensor whose
  /// pool memory was reclaimed (an escaped copy of a lease's tensor).
  [[nodiscard]] static Result<void> describe(const at::Tensor& tensor, backend::ArgDesc& desc);
  /// `tensor.clone()`: a copy in ordinary CUDA memory.
  [[nodiscard]] static Result<at::Tensor> take(const at::Tensor& tensor);
  [[nodiscard]] static std::unique_ptr<backend::Invoker> make_invoker(Callable&& fn);
};

using Pool = cgt::Pool<Backend>;
using Function = cgt::Function<Backend>;
using Outputs = cgt::Outputs<Backend>;
using OutputLease = cgt::OutputLease<Backend>;
using Arg = cgt::Arg<Backend>;

/// A pool on CUDA device `options.device`. Fails with `backend_error` when the device is not
/// usable (no GPU, no driver) or libtorch cannot make the pool.
[[nodiscard]] Result<Pool> make_pool(PoolOptions options = {});

}  // namespace cgt::torch

// The parts, in the purview of this unit (see the top).
#include "cgt.torch-autograd.inc"
#include "cgt.torch-optim.inc"
#include "cgt.torch-models.inc"
