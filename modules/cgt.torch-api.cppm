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
import cgt;
import cgt.core;

namespace cgt::torch {
class TorchDevice;  // the engine's side of the device (backend::Device), src/torch/internal.cppm; not exported
}

export namespace cgt::torch {

/// The inputs of a call, by position: `in[i]` is input `i` as a tensor (undefined where the call
/// passed a scalar), `in.scalar(i)` as a scalar (0 where the call passed a tensor). Converts to
/// `std::vector<at::Tensor>`, so a function may be written over one.
using Inputs = backend::Inputs<at::Tensor>;

/// What a pool function returns (an undefined tensor stands for "no value").
using Values = std::vector<at::Tensor>;
/// A libtorch pool function.
using Callable = std::move_only_function<Values(Inputs)>;

/// The body of a loop or branch the GPU decides: libtorch ops on the current stream.
using Body = std::function<void()>;
/// What `loop_while`, `if_then` and `switch_on` throw for a decider or bound no loop can have, or
/// a call on a stream that captures the program's own graph (a `std::exception`); inside a pool
/// function the call then fails with `invalid_argument`.
using InvalidArgument = backend::InvalidArgument;
/// A loop the GPU decides, for use inside a pool function (a CUDA WHILE conditional node): while
/// `go_on` (one int32 element on the pool's device) is non-zero, checked before each iteration
/// (the first included), and at most `max_iterations` times, runs `body`, whose ops write `go_on`
/// in place to say whether to go on (`go_on.copy_(...)`). In a recording the body is captured
/// once into the node and each replay decides its iterations on the GPU, the host neither waiting
/// nor reading `go_on`; outside one (warm-up, eager) it runs now, reading `go_on` before each
/// iteration (`item()`, a wait). A body CUDA forbids in a conditional node (a host callback, an
/// event record or wait, as cross-stream work records) makes that call run eagerly and the
/// shape's next recording cut into segments the host decides between, with the same results
/// (`Reason::control_flow_on_host`; from the start with `FunctionOptions::control_flow_on_host`).
/// What a body makes must die in it, and a loop body may not draw random numbers: else the
/// shape runs eagerly (`Reason::capture_failed`). Throws `InvalidArgument` (the call then fails
/// with `invalid_argument`) for a `go_on` that is not one int32 element on a CUDA device, or a
/// `max_iterations` of 0. Outside a pool function it runs as outside a recording, and throws
/// `InvalidArgument` while the current stream captures a graph of the program's own.
void loop_while(const at::Tensor& go_on, std::uint64_t max_iterations, const Body& body);
/// A branch the GPU decides (an IF node): runs `body` when `condition` (one int32 element) is
/// non-zero. Captured once in a recording, decided at each replay; as `loop_while` otherwise.
void if_then(const at::Tensor& condition, const Body& body);
/// A choice the GPU makes (a SWITCH node): runs `bodies[i]` for `i` the one int32 element of
/// `index`, none when out of range. Captured once in a recording (every body), decided at each
/// replay; as `loop_while` otherwise.
void switch_on(const at::Tensor& index, std::span<const Body> bodies);

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

/// The CUDA device of one pool, as a program sees it: its index, what memory is its private
/// memory pool's, how its graphs came to be. Reach it with `pool.device()`; it is valid while the
/// pool's engine lives (the `Pool`, a `Function` or a lease keeps it). Not copyable: a reference
/// to the pool's own view. The device warms up and records on a stream of its own (never shared
/// with another pool) and never synchronises the whole device, so pools on several threads record
/// and replay at once; their functions must not draw random numbers from libtorch's default
/// generator while another thread captures (it is one per device).
class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// The CUDA device index (`PoolOptions::device`).
  [[nodiscard]] std::int16_t index() const noexcept;
  /// Is `address` inside a segment of this pool's private memory pool? (False after
  /// `Pool::shutdown()`.)
  [[nodiscard]] bool contains(std::uintptr_t address) const;
  /// How this pool's graphs came to be: instantiated, updated in place, switched, nodes rewritten.
  [[nodiscard]] const GraphCounts& graph_counts() const noexcept;

 private:
  friend class TorchDevice;
  explicit Device(TorchDevice& device) noexcept : device_(&device) {}
  TorchDevice* device_;
};

}  // namespace cgt::torch

namespace cgt::torch {

/// The libtorch backend, as the handle templates of module cgt need it (modules/cgt.core.cppm lists
/// what they ask of it). Not exported: programs name the handles (`Pool`, ...) and never `Backend`,
/// whose members are the engine's side (backend::ArgDesc, backend::Invoker, backend::Device).
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
  /// The program's view of the pool's device. REQUIRES: `device` is a libtorch device (`make_pool`'s).
  [[nodiscard]] static Device& view(backend::Device& device) noexcept;
};

}  // namespace cgt::torch

export namespace cgt::torch {

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
