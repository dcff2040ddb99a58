// cgt.cuda:api — the cuda backend's types; see cgt.cuda.cppm for how to use them.
module;
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

export module cgt.cuda:api;
// The core and the backend interface; importers of cgt.cuda get `cgt` only.
import cgt;
import cgt.core;

namespace cgt::cuda {
class CudaDevice;   // the engine's side of the device (backend::Device), src/cuda/device.cpp; not exported
class CudaCapture;  // a recording in progress (backend::Capture), src/cuda/device.cpp; not exported
}  // namespace cgt::cuda
namespace cgt::kernels {
struct HostSegments;  // a host-decided recording's cuts (src/kernels/host_segments.hpp); not exported
}  // namespace cgt::kernels

export namespace cgt::cuda {

using cgt::ElementType;
// The pool's memory (`Device::arena()`, `PoolOptions::arena`): `cgt::Arena` is the backend API's.
using cgt::Arena;            // NOLINT(misc-unused-using-decls): re-exported for users
using cgt::ArenaCheckpoint;  // NOLINT(misc-unused-using-decls): re-exported for users
using cgt::ArenaOptions;

/// A typed, strided view of device memory: a storage (pointer and bytes) on one device and a
/// `Layout`. Copying a buffer copies the view. `Buffer::make` and `take()` give buffers that own
/// their memory; a buffer from a pool views pool memory and is valid as long as its lease.
class Buffer {
 public:
  inline Buffer() = default;

  /// New contiguous device memory (cudaMalloc), owned by the buffer and its copies, zeroed. Fails
  /// with `invalid_argument` for a negative size, more than `max_rank` dimensions or a byte count
  /// that overflows; with `out_of_memory` when the device has no room.
  [[nodiscard]] static Result<Buffer> make(ElementType type, std::span<const std::int64_t> sizes, int device = 0);
  [[nodiscard]] static Result<Buffer> make(ElementType type, std::initializer_list<std::int64_t> sizes,
                                           int device = 0) {
    return make(type, std::span<const std::int64_t>(sizes.begin(), sizes.size()), device);
  }
  /// A contiguous view of `bytes` of device memory at `storage` (owned only through `owner`).
  [[nodiscard]] static Buffer view_of(std::byte* storage, std::size_t bytes, ElementType type,
                                      std::span<const std::int64_t> sizes, int device,
                                      std::shared_ptr<void> owner = {});

  [[nodiscard]] inline bool empty() const noexcept { return storage_ == nullptr; }
  /// Whether the view is usable: its layout is valid (see `Layout`) and every element lies inside
  /// its storage. A view made with arguments out of range is not; the pools refuse it.
  [[nodiscard]] inline bool fits() const noexcept { return fits_; }
  [[nodiscard]] inline const Layout& layout() const noexcept { return layout_; }
  [[nodiscard]] inline ElementType type() const noexcept { return layout_.type(); }
  [[nodiscard]] inline std::size_t rank() const noexcept { return layout_.rank(); }
  [[nodiscard]] inline std::span<const std::int64_t> sizes() const noexcept { return layout_.sizes(); }
  [[nodiscard]] inline std::span<const std::int64_t> strides() const noexcept { return layout_.strides(); }
  [[nodiscard]] inline std::size_t numel() const noexcept { return layout_.numel(); }
  [[nodiscard]] inline int device() const noexcept { return device_; }
  /// The memory block this buffer views, and its size.
  [[nodiscard]] inline std::byte* storage() const noexcept { return storage_; }
  [[nodiscard]] inline std::size_t storage_bytes() const noexcept { return storage_bytes_; }
  /// Device address of the first element.
  [[nodiscard]] inline std::byte* data() const noexcept { return storage_ + layout_.byte_offset(); }
  template <class T>
  [[nodiscard]] inline T* as() const noexcept {
    return reinterpret_cast<T*>(data());  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  }
  [[nodiscard]] inline const std::shared_ptr<void>& owner() const noexcept { return owner_; }

  /// The same storage through another layout (a view); see `cgt::Layout` for the view operations.
  [[nodiscard]] inline Buffer with_layout(const Layout& layout) const {
    Buffer view = *this;
    view.layout_ = layout;
    view.fits_ = layout.fits(storage_bytes_);
    return view;
  }
  /// The same view over another storage.
  [[nodiscard]] Buffer on_storage(std::byte* storage, std::size_t bytes, std::shared_ptr<void> owner = {}) const;

  /// The elements, in row-major order, as doubles (waits for the whole device, then copies the
  /// storage to the host). A convenience for tests and examples, not for hot paths.
  [[nodiscard]] Result<std::vector<double>> read() const;
  /// Sets the elements (row-major order) from `values`; returns when they are on the device.
  [[nodiscard]] Result<void> write(std::span<const double> values) const;

  /// For the pool: which life number of pool memory this value was handed out in (0: not
  /// handed out by a pool). A copy of a value keeps it; the pool refuses an input whose life number
  /// is not the current one of its memory (an escaped copy of an output whose memory was reused).
  [[nodiscard]] inline std::uint64_t life() const noexcept { return life_; }
  inline void set_life(std::uint64_t life) noexcept { life_ = life; }

 private:
  std::shared_ptr<void> owner_;
  std::byte* storage_ = nullptr;
  std::size_t storage_bytes_ = 0;
  Layout layout_;
  // Decided whenever the view or its storage changes (a pool checks every input on every call:
  // `Layout::fits` divides by the element size).
  bool fits_ = layout_.fits(0);
  std::uint64_t life_ = 0;
  int device_ = 0;
};

/// Thrown by `Context::allocate` when the pool is exhausted; the call fails with `out_of_memory`.
using OutOfMemory = backend::OutOfMemory;
/// Thrown by `Context::allocate` for sizes no buffer can have (negative, too many dimensions, a
/// byte count that overflows); the call fails with `invalid_argument`.
using InvalidArgument = backend::InvalidArgument;

/// What a pool function receives: where to allocate and where to launch.
class Context {
 public:
  /// A new contiguous buffer: pool memory in warm-ups and recordings, cudaMalloc'd memory in
  /// eager calls. Buffers the function does not return are freed when the call ends. Throws
  /// `OutOfMemory`, and `InvalidArgument` for sizes no buffer can have (the call then fails with
  /// `invalid_argument`).
  [[nodiscard]] Buffer allocate(ElementType type, std::span<const std::int64_t> sizes);
  [[nodiscard]] Buffer allocate(ElementType type, std::initializer_list<std::int64_t> sizes) {
    return allocate(type, std::span<const std::int64_t>(sizes.begin(), sizes.size()));
  }
  [[nodiscard]] Buffer allocate_like(const Buffer& like) { return allocate(like.type(), like.sizes()); }
  /// The stream to launch every kernel of the call on (captured while recording).
  [[nodiscard]] cudaStream_t stream() const noexcept;
  [[nodiscard]] bool is_capturing() const noexcept { return capturing_; }

  /// The body of a loop or branch the GPU decides: it launches its kernels on `ctx.stream()` of
  /// the context it is given (this one, whose stream is then the body's).
  using Body = std::function<void(Context&)>;
  /// A loop the GPU decides (a CUDA WHILE conditional node): while the one i32 element of `go_on`
  /// is non-zero (checked before each iteration, the first included), and at most
  /// `max_iterations` times, runs `body`, whose kernels write `go_on` to say whether to go on. In a
  /// recording the body is captured once into the node, and each launch of the graph decides its
  /// iterations on the GPU: the host neither waits nor reads `go_on`. Outside a recording (warm-up,
  /// eager) it runs now, the host reading `go_on` before each iteration (a wait on the stream).
  /// A body CUDA forbids in a conditional node (a host callback, an event record or wait, a
  /// `cudaMallocAsync`) or a driver without conditional nodes makes that call run eagerly and the
  /// next recording of the shape cut its graph into segments that each replay launches one by
  /// one, the host reading `go_on` between them, with the same results
  /// (`Reason::control_flow_on_host`; asked for from the start by
  /// `FunctionOptions::control_flow_on_host`). Throws `InvalidArgument` (the call then
  /// fails with `invalid_argument`) when `go_on` is not one i32 element on this device or
  /// `max_iterations` is 0.
  void loop_while(const Buffer& go_on, std::uint64_t max_iterations, const Body& body);
  /// A branch the GPU decides (an IF node): runs `body` when the one i32 element of `condition`
  /// is non-zero. Captured once in a recording, decided at each launch; as `loop_while` otherwise.
  void if_then(const Buffer& condition, const Body& body);
  /// A choice the GPU makes (a SWITCH node, CUDA 12.8+): runs `bodies[i]` for the one i32 element
  /// `i` of `index`, none when `i` is out of range. Captured once in a recording (every body),
  /// decided at each launch; as `loop_while` otherwise.
  void switch_on(const Buffer& index, std::span<const Body> bodies);

 private:
  friend class CudaDevice;
  friend class CudaCapture;
  enum class Target : std::uint8_t { device_memory, pool };
  Context(CudaDevice& device, Target target, bool capturing) noexcept
      : device_(device), target_(target), capturing_(capturing) {}
  /// The stream that captures the bodies of conditional nodes nested `depth` deep (0: the
  /// outermost), made before the capture began; null past the deepest (src/cuda/device.cpp).
  [[nodiscard]] cudaStream_t body_stream(std::size_t depth) const noexcept;
  /// The CUDA device index of the pool (src/cuda/device.cpp).
  [[nodiscard]] int pool_device() const noexcept;
  /// In a warm-up: frees the pool blocks allocated since `from` (a loop's last iteration's).
  void free_allocations_since(std::size_t from);
  /// Captures what `launch_all` launches on this context into `body`, a conditional node's body
  /// (src/cuda/control_flow.cpp).
  void capture_body(cudaGraph_t body, const std::function<void()>& launch_all);
  /// Gives the recording up for `why` (the first reason is kept): recorded again with the host
  /// deciding its loops and branches when `host_may_decide` (only a conditional node failed),
  /// else its shapes run eagerly.
  void give_up_recording(std::string why, bool host_may_decide);
  CudaDevice& device_;
  Target target_;
  bool capturing_;
  cudaStream_t body_stream_ = nullptr;         // while a conditional node's body is captured: its stream
  std::size_t depth_ = 0;                      // how many bodies are being captured, one in another
  std::string uncapturable_;                   // why the recording must be given up; empty: it need not
  bool host_may_decide_ = false;               // with uncapturable_: recorded again, the host deciding
  bool made_conditional_nodes_ = false;        // the capture holds a conditional node
  kernels::HostSegments* segments_ = nullptr;  // in a recording whose loops and branches the host decides
  std::vector<std::uintptr_t> allocations_;    // pool blocks allocated by this call
};

/// The inputs of a call, by position: `in[i]` is input `i` as a buffer (an empty buffer where the
/// call passed a scalar), `in.scalar(i)` as a scalar (0 where the call passed a buffer).
using Inputs = backend::Inputs<Buffer>;

/// What a pool function returns (an empty buffer stands for "no value").
using Values = std::vector<Buffer>;
/// A cuda pool function.
using Callable = std::move_only_function<Values(Context&, Inputs)>;

/// How a cuda pool is made.
struct PoolOptions {
  cgt::Options tree;  ///< the tree's behaviour
  int device = 0;     ///< CUDA device index
  /// The arena's segments (default 64 MiB each, no limit).
  ArenaOptions arena{.segment_bytes = std::size_t{64} << 20};
  /// Fill memory with 0xFF (NaN for floats) when it dies or is reclaimed.
  bool poison_dead_memory = false;
  /// The pool's stream is a blocking one: it waits for the legacy default stream (stream 0,
  /// plain cudaMemcpy) and that stream waits for it, so inputs prepared there are ordered before
  /// the pool's work. false makes it non-blocking, which launches faster (see bench/results),
  /// and then you order inputs with the pool's work yourself (`pool.device().stream()`, events).
  bool blocking_stream = true;
  /// A re-recording because a static input moved, with the same graph topology as the recording
  /// it redoes, updates that one's executable (cudaGraphExecUpdate) instead of instantiating its
  /// own; the two then share it, and a replay of the one not loaded loads its graph back first.
  bool update_graphs_in_place = true;
  /// Before instantiating a recorded graph, replace its memset nodes by kernel nodes that write
  /// the same bytes: a graph with memset nodes costs cudaGraphLaunch many times the CPU of one
  /// with kernels only (60 memsets among 400 kernels: 116 us against 5 us on an H100, see
  /// bench/results/launch.md). Counted in `GraphCounts`; false keeps them as captured.
  bool rewrite_memset_nodes = true;
  /// Replace one-row device-to-device memcpy nodes by copy kernels too. Off by default: they were
  /// measured no slower to launch than kernels.
  bool rewrite_memcpy_nodes = false;
  /// The arena's segments are made with CUDA's virtual memory management (addresses reserved,
  /// pages mapped there; granularity 2 MiB on current GPUs), so that `Pool::sleep()` can give the
  /// pages back while the graphs stay recorded over the addresses, and `wake()` map new pages
  /// there. Off: segments come from cudaMalloc, and `sleep()` fails with `invalid_argument`.
  /// `make_pool` fails with `backend_error` where the driver has no virtual memory management.
  bool sleepable = false;
};

/// How a pool's graphs came to be (`cgt::GraphCounts`).
using GraphCounts = cgt::GraphCounts;

/// Number of usable CUDA devices (0 without a driver). Never throws.
[[nodiscard]] int device_count() noexcept;

/// The CUDA device of one pool, as a program sees it: its index, its arena to look at, its stream,
/// how its graphs came to be. Reach it with `pool.device()`; it is valid while the pool's engine
/// lives (the `Pool`, a `Function` or a lease keeps it). Not copyable: a reference to the pool's
/// own view.
class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// The CUDA device index (`PoolOptions::device`).
  [[nodiscard]] std::int32_t index() const noexcept;
  /// Whether `address` is memory of the pool's arena (false after `Pool::shutdown()`).
  [[nodiscard]] bool contains(std::uintptr_t address) const noexcept;
  /// The pool's stream: warm-ups, recordings and replays run on it.
  [[nodiscard]] cudaStream_t stream() const noexcept;
  /// The pool's memory, to look at (what is allocated, where): the engine's to change, not the
  /// program's. REQUIRES: the pool is not shut down (`shutdown()` releases the arena).
  [[nodiscard]] const Arena& arena() const noexcept;
  /// Waits for the pool's stream. Fails with `backend_error` for a CUDA error.
  [[nodiscard]] Result<void> synchronize() const;
  /// Orders this pool's later work after the work issued so far on `producer`'s stream, without
  /// blocking the host (an event recorded there, waited for here). Every pool has its own stream,
  /// and two pools' streams are not ordered with each other (a blocking stream waits for the
  /// legacy stream only): before passing another pool's output (or anything written on its
  /// stream) into this pool's function, call `consumer.wait_for(producer)`. Either device.
  /// Fails with `backend_error` for a CUDA error.
  [[nodiscard]] Result<void> wait_for(const Device& producer) const;
  /// How this pool's graphs came to be: instantiated, updated in place, nodes rewritten.
  [[nodiscard]] const GraphCounts& graph_counts() const noexcept;

 private:
  friend class CudaDevice;
  explicit Device(CudaDevice& device) noexcept : device_(&device) {}
  CudaDevice* device_;
};

}  // namespace cgt::cuda

namespace cgt::cuda {

/// The cuda backend, as the handle templates of module cgt need it (modules/cgt.core.cppm lists
/// what they ask of it). Not exported: programs name the handles (`Pool`, ...) and never `Backend`,
/// whose members are the engine's side (backend::ArgDesc, backend::Invoker, backend::Device).
struct Backend {
  using Value = Buffer;
  using Callable = cuda::Callable;
  using Device = cuda::Device;
  [[nodiscard]] [[clang::always_inline]] static inline Result<void> describe(const Buffer& buffer,
                                                                             backend::ArgDesc& desc) noexcept {
    return backend::describe_buffer(buffer, buffer.device(), desc);
  }
  /// A copy in device memory of its own (same layout), complete when it returns: it waits for the
  /// device first, since a pool's stream may be non-blocking (not ordered with the copy).
  [[nodiscard]] static Result<Buffer> take(const Buffer& buffer);
  [[nodiscard]] static std::unique_ptr<backend::Invoker> make_invoker(Callable&& fn);
  /// The program's view of the pool's device. REQUIRES: `device` is a cuda device (`make_pool`'s).
  [[nodiscard]] static Device& view(backend::Device& device) noexcept;
};

}  // namespace cgt::cuda

export namespace cgt::cuda {

using Pool = cgt::Pool<Backend>;
using Function = cgt::Function<Backend>;
using Outputs = cgt::Outputs<Backend>;
using OutputLease = cgt::OutputLease<Backend>;
using Arg = cgt::Arg<Backend>;

/// A pool on CUDA device `options.device`. Fails with `backend_error` without a usable device.
[[nodiscard]] Result<Pool> make_pool(PoolOptions options = {});

}  // namespace cgt::cuda
