// cgt.host:device — the host backend: a stream whose launches run or are captured, graphs that
// replay captured launches on the same addresses, and the device that gives a pool its arena.
module;
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

export module cgt.host:device;
// The core and the backend interface; importers of cgt.host get `cgt` only.
import cgt;
import cgt.core;
import :buffer;

namespace cgt::host {
class HostDevice;     // the engine's side of the device (backend::Device), src/host/internal.cppm; not exported
class HostCapture;    // a recording in progress (backend::Capture), src/host/device.cpp; not exported
class HostRecording;  // a recorded graph (backend::Recording), src/host/device.cpp; not exported
struct HostSegments;  // a host-decided recording's cuts (src/host/internal.cppm); not exported
}  // namespace cgt::host

export namespace cgt::host {

using cgt::Arena;
using cgt::ArenaCheckpoint;  // NOLINT(misc-unused-using-decls): re-exported for users
using cgt::ArenaOptions;

/// A unit of host work: a closure over buffers. Replays run it again on the same buffers.
using Kernel = std::function<void()>;

/// Captured kernels, replayed in order with one call.
class Graph {
 public:
  /// Runs every captured kernel again, in capture order.
  void replay() const {
    for (const Kernel& kernel : kernels_) kernel();
  }
  [[nodiscard]] std::size_t size() const noexcept { return kernels_.size(); }

 private:
  friend class Stream;
  friend class HostRecording;
  // Kernels [begin, end): one segment of a recording whose loops and branches the host decides.
  void replay(std::size_t begin, std::size_t end) const {
    for (std::size_t i = begin; i < end; ++i) kernels_[i]();
  }
  std::vector<Kernel> kernels_;
};

/// Where kernels go: run at once, or, between `begin_capture` and `end_capture`, into a graph.
class Stream {
 public:
  void launch(Kernel kernel);
  void begin_capture();
  [[nodiscard]] Graph end_capture();
  void discard_capture() noexcept;
  [[nodiscard]] bool is_capturing() const noexcept { return capturing_; }
  /// Waits for the kernels launched so far (here they have all run). During a capture it breaks
  /// the capture, as synchronising a CUDA stream that is capturing does.
  void synchronize() noexcept;
  /// Whether the capture in progress was broken by a synchronisation.
  [[nodiscard]] bool capture_broken() const noexcept { return broken_; }
  /// During a capture: the kernels `launch_all` launches, captured into a graph of their own (a
  /// loop's or branch's body) instead of the capture in progress, which goes on after it.
  [[nodiscard]] Graph capture_apart(const std::function<void()>& launch_all);
  /// Kernels captured so far into the capture in progress.
  [[nodiscard]] std::size_t captured() const noexcept { return capture_.kernels_.size(); }
  /// Whether a body is being captured apart now (a conditional node's body, on a GPU).
  [[nodiscard]] bool in_body() const noexcept { return bodies_ > 0; }
  /// In a body: the body holds what a conditional node cannot (`why`); the capture goes on, and is
  /// given up at its end for one the host decides (`needs_host_decisions`).
  void forbid_in_body(std::string why);
  /// Why the capture's bodies cannot be conditional nodes ("": they can).
  [[nodiscard]] const std::string& forbidden_in_body() const noexcept { return forbidden_; }

 private:
  Graph capture_;
  bool capturing_ = false;
  bool broken_ = false;
  std::size_t bodies_ = 0;  // bodies being captured apart, one in another
  std::string forbidden_;
};

/// Thrown by `Context::allocate` when the pool is exhausted; the call fails with `out_of_memory`.
using OutOfMemory = backend::OutOfMemory;
/// Thrown by `Context::allocate` for sizes no buffer can have (negative, too many dimensions, a
/// byte count that overflows); the call fails with `invalid_argument`.
using InvalidArgument = backend::InvalidArgument;

/// What a pool function receives: where to allocate and where to launch.
class Context {
 public:
  /// A new contiguous buffer: pool memory in warm-ups and recordings, ordinary memory in eager
  /// calls. Buffers the function does not return are freed when the call ends. Throws
  /// `OutOfMemory` (the call then fails with `out_of_memory`) and, for sizes no buffer can have,
  /// `InvalidArgument` (the call then fails with `invalid_argument`).
  [[nodiscard]] Buffer allocate(ElementType type, std::span<const std::int64_t> sizes);
  [[nodiscard]] Buffer allocate(ElementType type, std::initializer_list<std::int64_t> sizes) {
    return allocate(type, std::span<const std::int64_t>(sizes.begin(), sizes.size()));
  }
  /// A new contiguous buffer with the type and sizes of `like`.
  [[nodiscard]] Buffer allocate_like(const Buffer& like) { return allocate(like.type(), like.sizes()); }
  /// Launches a kernel: it runs now, or during recording it is captured and runs on every replay.
  /// A kernel must read and write only buffers (never host state that changes between replays).
  void launch(Kernel kernel);
  /// True while recording: kernels do not run now, so their results cannot be read yet.
  [[nodiscard]] bool is_capturing() const noexcept;
  /// Waits for the kernels launched so far, as code that reads a result on the host does (a
  /// `.item()`). Outside a recording it costs nothing here. In a recording it breaks the capture,
  /// as a synchronisation breaks a CUDA stream capture: the recording fails and that shape runs
  /// eagerly from then on (`Reason::capture_failed`), or, if it recorded without a warm-up of its
  /// own (`FunctionOptions::warm_up_each_shape = false`), it warms up and records again.
  void synchronize() noexcept;

  /// The body of a loop or branch decided where the kernels run: it launches its kernels on the
  /// context it is given (the same context; cgt.cuda's gives one on the body's stream).
  using Body = std::function<void(Context&)>;
  /// A loop whose iterations the kernels decide, as a CUDA WHILE node does on the GPU: while the
  /// one i32 element of `go_on` is non-zero (checked before each iteration, the first included),
  /// and at most `max_iterations` times, runs `body`, whose kernels write `go_on` to say whether
  /// to go on. In a recording the body is captured once, into one kernel that loops when the graph
  /// replays: each replay decides its iterations anew, and the host never reads `go_on`. Outside
  /// a recording (warm-up, eager) the loop runs now, reading `go_on` before each iteration, as a
  /// host loop does. Throws `InvalidArgument` (the call then fails with `invalid_argument`) when
  /// `go_on` is not one i32 element or `max_iterations` is 0.
  void loop_while(const Buffer& go_on, std::uint64_t max_iterations, const Body& body);
  /// A branch the kernels decide (a CUDA IF node): runs `body` when the one i32 element of
  /// `condition` is non-zero. Captured once in a recording and decided at each replay. Throws
  /// `InvalidArgument` when `condition` is not one i32 element.
  void if_then(const Buffer& condition, const Body& body);
  /// A choice the kernels make (a CUDA SWITCH node): runs `bodies[i]` for the one i32 element `i`
  /// of `index`, none when `i` is out of range. Captured once in a recording (every body) and
  /// decided at each replay. Throws `InvalidArgument` when `index` is not one i32 element.
  void switch_on(const Buffer& index, std::span<const Body> bodies);
  /// Runs `fn` on the host in stream order, as `cudaLaunchHostFunc` does on a CUDA stream: now,
  /// or, in a recording, at each replay. A graph may hold it, a conditional node's body may not:
  /// in a loop or branch of a recording it makes the pool record the shape next with the host
  /// deciding them (`Reason::control_flow_on_host`), as a host callback does on a GPU.
  void call_on_host(Kernel fn);

 private:
  friend class HostDevice;
  friend class HostCapture;
  enum class Target : std::uint8_t { heap, pool };
  Context(HostDevice& device, Target target) noexcept : device_(device), target_(target) {}
  /// In a warm-up: frees the pool blocks allocated since `from` (a loop's last iteration's).
  void free_allocations_since(std::size_t from);
  HostDevice& device_;
  Target target_;
  HostSegments* segments_ = nullptr;         // in a recording whose loops and branches the host decides
  std::vector<std::uintptr_t> allocations_;  // pool blocks allocated by this call
};

/// The inputs of a call, by position: `in[i]` is input `i` as a buffer (an empty buffer where the
/// call passed a scalar), `in.scalar(i)` as a scalar (0 where the call passed a buffer).
using Inputs = backend::Inputs<Buffer>;

/// What a pool function returns: its outputs (an empty buffer stands for "no value").
using Values = std::vector<Buffer>;
/// A host pool function.
using Callable = std::move_only_function<Values(Context&, Inputs)>;

/// How a host pool is made.
struct PoolOptions {
  cgt::Options tree;   ///< the tree's behaviour
  ArenaOptions arena;  ///< its memory
  /// Overwrite memory with 0xFF bytes (NaN for floats) when it dies or is reclaimed, so a stale
  /// view of it reads garbage at once instead of plausible old values (tests use this).
  bool poison_dead_memory = false;
};

/// The host device of one pool, as a program sees it: which device, its arena to look at, its
/// stream. Reach it with `pool.device()`; it is valid while the pool's engine lives (the `Pool`,
/// a `Function` or a lease keeps it). Not copyable: a reference to the pool's own view.
class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  /// The device's index: 0, the host.
  [[nodiscard]] std::int32_t index() const noexcept { return 0; }
  /// Whether `address` is memory of the pool's arena (false after `Pool::shutdown()`).
  [[nodiscard]] bool contains(std::uintptr_t address) const noexcept;
  /// The pool's memory, to look at (what is allocated, where): the engine's to change, not the
  /// program's. REQUIRES: the pool is not shut down (`shutdown()` releases the arena).
  [[nodiscard]] const Arena& arena() const noexcept;
  /// The stream the pool's work runs on.
  [[nodiscard]] Stream& stream() noexcept;
  /// Recordings for which the engine named the recording they redo because a static input moved
  /// (the host backend has no graph to share with it; cgt.cuda updates that one's in place).
  [[nodiscard]] std::size_t recordings_redoing_another() const noexcept;

 private:
  friend class HostDevice;
  explicit Device(HostDevice& device) noexcept : device_(&device) {}
  HostDevice* device_;
};

}  // namespace cgt::host

namespace cgt::host {

/// The host backend, as the handle templates of module cgt need it (modules/cgt.core.cppm lists
/// what they ask of it). Not exported: programs name the handles (`Pool`, ...) and never `Backend`,
/// whose members are the engine's side (backend::ArgDesc, backend::Invoker, backend::Device).
struct Backend {
  using Value = Buffer;
  using Callable = host::Callable;
  using Device = host::Device;
  /// Every call describes its arguments: defined here, so that it inlines into the call.
  [[nodiscard]] [[clang::always_inline]] static inline Result<void> describe(const Buffer& buffer,
                                                                             backend::ArgDesc& desc) noexcept {
    return backend::describe_buffer(buffer, 0, desc);  // host buffers are all memory of the one host device
  }
  [[nodiscard]] static Result<Buffer> take(const Buffer& buffer);
  [[nodiscard]] static std::unique_ptr<backend::Invoker> make_invoker(Callable&& fn);
  /// The program's view of the pool's device. REQUIRES: `device` is a host device (`make_pool`'s).
  [[nodiscard]] static Device& view(backend::Device& device) noexcept;
};

}  // namespace cgt::host

export namespace cgt::host {

using Pool = cgt::Pool<Backend>;
using Function = cgt::Function<Backend>;
using Outputs = cgt::Outputs<Backend>;
using OutputLease = cgt::OutputLease<Backend>;
using Arg = cgt::Arg<Backend>;

/// A pool over host memory: deterministic, for tests and dry runs of tree logic.
[[nodiscard]] Result<Pool> make_pool(PoolOptions options = {});

}  // namespace cgt::host
