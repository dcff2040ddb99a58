// cgt.core:detail — the engine's side of the handles of module cgt (modules/cgt.cppm): the
// reference-counted engine handle, the state of a lease, one call's outputs, the arguments'
// source, and the functions the handles' members forward to. Exported so that module cgt can
// reach it; module cgt does not export it, so a program that imports only `cgt` and a backend
// module cannot name any of it (tests/compile_fail/backend_names_hidden.cpp). Backends use
// `backend::make_pool` and `backend::device_of` below; the rest is for module cgt alone.
module;
#include <expected>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

export module cgt.core:detail;
import cgt.vocabulary;
import :spi;

export namespace cgt::detail {

class Engine;  // the tree and its state, defined in src/core
struct Cell;   // one output storage and the leases on it

void retain(Engine& engine, std::uint32_t count = 1) noexcept;
void release(Engine& engine, std::uint32_t count = 1) noexcept;

/// Shared ownership of an engine: every handle that needs the pool's memory holds one.
/// (Members are declared `inline`: in a named module, in-class definitions are not implicitly
/// inline, and these run several times per call.)
class EngineRef {
 public:
  inline EngineRef() = default;
  inline explicit EngineRef(Engine* engine) noexcept : engine_(engine) {
    if (engine_ != nullptr) retain(*engine_);
  }
  inline EngineRef(const EngineRef& other) noexcept : EngineRef(other.engine_) {}
  inline EngineRef(EngineRef&& other) noexcept : engine_(std::exchange(other.engine_, nullptr)) {}
  /// Takes over a reference the caller counted already (`retain(engine, n)` for n handles at once).
  [[nodiscard]] inline static EngineRef adopt(Engine* engine) noexcept {
    EngineRef ref;
    ref.engine_ = engine;
    return ref;
  }
  /// Lets go of the engine without counting the reference down: the caller does, for several at once.
  inline Engine* forget() noexcept { return std::exchange(engine_, nullptr); }
  inline EngineRef& operator=(EngineRef other) noexcept {
    std::swap(engine_, other.engine_);
    return *this;
  }
  inline ~EngineRef() {
    if (engine_ != nullptr) release(*engine_);
  }
  [[nodiscard]] inline Engine* get() const noexcept { return engine_; }
  [[nodiscard]] inline Engine& operator*() const noexcept { return *engine_; }
  inline explicit operator bool() const noexcept { return engine_ != nullptr; }

 private:
  Engine* engine_ = nullptr;
};

struct LeaseCore;
/// Drops the lease (the memory may become dead); leaves it empty.
void lease_drop(LeaseCore& lease) noexcept;
/// Drops every lease of `leases` (one call's: one engine), holding the pool's state once.
void leases_drop(std::span<LeaseCore> leases) noexcept;

/// The state of one lease: the engine, the storage it keeps live, and the value it hands out.
struct LeaseCore {
  EngineRef engine;
  Cell* cell = nullptr;  ///< holds one lease on the cell; null for values that are not pool memory
  const void* value = nullptr;
  std::shared_ptr<const void> owner;  ///< owns `value` when the engine does not
  std::uint32_t function = 0;
  std::uint32_t output = 0;

  inline LeaseCore() = default;
  /// A lease on `cell` (or on no cell) handing out `value`, holding `engine`'s reference.
  inline LeaseCore(EngineRef engine, Cell* cell, const void* value, std::uint32_t function,
                   std::uint32_t output) noexcept
      : engine(std::move(engine)), cell(cell), value(value), function(function), output(output) {}
  LeaseCore(const LeaseCore&) = delete;
  LeaseCore& operator=(const LeaseCore&) = delete;
  inline LeaseCore(LeaseCore&& other) noexcept
      : engine(std::move(other.engine)),
        cell(std::exchange(other.cell, nullptr)),
        value(std::exchange(other.value, nullptr)),
        owner(std::move(other.owner)),
        function(other.function),
        output(other.output) {}
  LeaseCore& operator=(LeaseCore&& other) noexcept;
  inline ~LeaseCore() {
    if (engine) lease_drop(*this);
  }
};

/// The value of a lease, or why it is not available.
[[nodiscard]] Result<const void*> lease_value(LeaseCore& lease);
/// True while the lease can hand out its value.
[[nodiscard]] bool lease_is_valid(const LeaseCore& lease) noexcept;

inline constexpr std::size_t kLeaseBlock = 8;

/// The lease blocks this thread freed (`LeaseArray`), kept for its next calls: a program calling
/// in a loop takes one and gives it back per call. Trivially destructible, so that a call reaches
/// it inline; the blocks are freed at the thread's exit by an object that the thread's first kept
/// block registers (`watch_lease_blocks`, lease.cpp), which closes it: a lease array freed after
/// that (a static holding outputs, destroyed after the thread's locals) is freed at once.
struct LeaseBlocks {
  std::array<void*, 4> kept{};  // a program holding a few calls' outputs at a time
  std::uint8_t count = 0;
  bool watched = false;  ///< `watch_lease_blocks` ran on this thread
  bool closed = false;   ///< the thread is exiting: keep nothing more
};
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): each thread's own, written by it only
inline thread_local constinit LeaseBlocks lease_blocks{};
/// Registers the freeing of this thread's kept blocks at its exit (once per thread; lease.cpp).
void watch_lease_blocks() noexcept;
/// A block for up to `kLeaseBlock` leases that this thread freed before, or null.
[[nodiscard]] inline void* take_lease_block() noexcept {
  LeaseBlocks& blocks = lease_blocks;
  return blocks.count > 0 ? blocks.kept[--blocks.count]
                          : nullptr;  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index): count <= 4
}
/// Keeps a block of `kLeaseBlock` leases for the thread's next call; false when the thread keeps
/// enough already, or is exiting (the caller frees it).
[[nodiscard]] inline bool keep_lease_block(void* block) noexcept {
  LeaseBlocks& blocks = lease_blocks;
  if (blocks.closed || blocks.count == blocks.kept.size()) return false;
  if (!blocks.watched) watch_lease_blocks();
  blocks.kept[blocks.count++] = block;  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index): count < 4
  return true;
}

/// The leases of one call's outputs: as many as the call has outputs, fixed when made. A program
/// calling in a loop makes and frees one array per call: arrays of up to `kLeaseBlock` leases are
/// kept per thread for the next call, where malloc and free cost a tenth of a replay's bookkeeping.
/// Destroying the array drops the leases it still holds, all at once (`leases_drop`).
class LeaseArray {
 public:
  inline LeaseArray() = default;
  /// `count` empty leases.
  inline explicit LeaseArray(std::size_t count)
      : LeaseArray(count, [](LeaseCore* at, std::size_t /*i*/) noexcept { ::new (at) LeaseCore(); }) {}
  /// `count` leases, each made in place by `make(at, i)`, which constructs lease `i` at `at` and
  /// cannot fail (a replay's: no empty lease is written first).
  template <class Make>
    requires std::is_nothrow_invocable_v<const Make&, LeaseCore*, std::size_t>
  inline LeaseArray(std::size_t count, const Make& make) : size_(count) {
    if (count == 0) return;
    data_ = count > kLeaseBlock ? std::allocator<LeaseCore>().allocate(count) : small_block();
    for (std::size_t i = 0; i < count; ++i)
      make(data_ + i, i);  // NOLINT(cppcoreguidelines-pro-bounds-pointer-arithmetic)
  }
  LeaseArray(const LeaseArray&) = delete;
  LeaseArray& operator=(const LeaseArray&) = delete;
  inline LeaseArray(LeaseArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  inline LeaseArray& operator=(LeaseArray&& other) noexcept {
    if (this != &other) {
      free();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  inline ~LeaseArray() { free(); }

  [[nodiscard]] inline std::size_t size() const noexcept { return size_; }
  [[nodiscard]] inline LeaseCore& operator[](std::size_t i) noexcept { return data_[i]; }
  [[nodiscard]] inline const LeaseCore& operator[](std::size_t i) const noexcept { return data_[i]; }
  [[nodiscard]] inline std::span<LeaseCore> span() noexcept { return {data_, size_}; }

 private:
  [[nodiscard]] inline static LeaseCore* small_block() {
    if (void* kept = take_lease_block()) return static_cast<LeaseCore*>(kept);
    return std::allocator<LeaseCore>().allocate(kLeaseBlock);  // any small array gets a whole block
  }
  // Inline for a moved-from or empty array (every call's results are moved a few times).
  inline void free() noexcept {
    if (data_ != nullptr) free_leases();
  }
  /// Drops the leases and gives the memory back (lease.cpp): every lease is empty then (no engine,
  /// cell or owner), their destructors would do nothing, and the memory goes without running them.
  void free_leases() noexcept;

  LeaseCore* data_ = nullptr;
  std::size_t size_ = 0;
};

/// What one call produced.
struct CallOutputs {
  LeaseArray leases;
  CallKind kind = CallKind::eager;
  std::int64_t node = -1;
};

/// A new engine over `device`; fails with `invalid_argument` for contradictory options.
[[nodiscard]] Result<EngineRef> make_engine(std::unique_ptr<backend::Device> device, Options options);
[[nodiscard]] Result<std::uint32_t> add_function(Engine& engine, std::unique_ptr<backend::Invoker> invoker,
                                                 FunctionOptions options);
/// The arguments of a call, described one by one once the pool is ready to read them (a new
/// step may have reclaimed, or copied out, the memory of a lease passed as an argument).
class ArgSource {
 public:
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
  /// Describes every argument into `slots` and `descs` (`size()` of each), in one call: a replay
  /// describes them all. An error has `Error::input` set to the argument that failed. The owner of
  /// a value that a lease's owner owns (an eager or warm-up output) is added to `keep`: code the
  /// call runs (the function, the log sink) may drop that lease, and the call may still read the
  /// value after (it runs the function again when a capture fails).
  [[nodiscard]] virtual Result<void> describe(std::span<backend::ArgSlot> slots, std::span<backend::ArgDesc> descs,
                                              std::vector<std::shared_ptr<const void>>& keep) const = 0;

 protected:
  ~ArgSource() = default;
};

[[nodiscard]] Result<CallOutputs> call(Engine& engine, std::uint32_t function, const ArgSource& args);
[[nodiscard]] const std::string& function_name(Engine& engine, std::uint32_t function) noexcept;
[[nodiscard]] backend::Device& device(Engine& engine) noexcept;

/// What `PoolBase`'s members ask of the engine (src/core/pool.cpp, introspection.cpp). A null
/// `pool` is a moved-from handle's: queries return empty values, changes fail with `invalid_argument`.
namespace pool_view {
void mark_step_begin(const EngineRef& pool) noexcept;
[[nodiscard]] Result<void> shutdown(const EngineRef& pool);
[[nodiscard]] bool has_pending_backward(const EngineRef& pool) noexcept;
[[nodiscard]] bool is_shut_down(const EngineRef& pool) noexcept;
[[nodiscard]] const Options& options(const EngineRef& pool) noexcept;
[[nodiscard]] Stats stats(const EngineRef& pool) noexcept;
[[nodiscard]] MemoryInfo memory(const EngineRef& pool);
[[nodiscard]] std::vector<Block> live_blocks(const EngineRef& pool);
[[nodiscard]] MemoryReport memory_report(const EngineRef& pool);
[[nodiscard]] Result<std::size_t> sleep(const EngineRef& pool);
[[nodiscard]] Result<void> wake(const EngineRef& pool);
[[nodiscard]] bool is_asleep(const EngineRef& pool) noexcept;
[[nodiscard]] Result<void> check_memory(const EngineRef& pool);
/// The ids of the root recordings, and of the current path's nodes, for `Node` views.
[[nodiscard]] std::vector<std::int64_t> roots(const EngineRef& pool);
[[nodiscard]] std::vector<std::int64_t> current_path(const EngineRef& pool);
[[nodiscard]] std::string to_dot(const EngineRef& pool);
}  // namespace pool_view

/// What `Node`'s members ask of the engine about node `id` (src/core/introspection.cpp): each
/// returns an empty value for a null `pool` or a node that no longer exists.
namespace node_view {
[[nodiscard]] bool exists(const EngineRef& pool, std::int64_t id);
[[nodiscard]] NodeKind kind(const EngineRef& pool, std::int64_t id);
[[nodiscard]] NodeReason reason(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::string function(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::size_t depth(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::vector<std::int64_t> children(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::size_t num_descendants(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::size_t output_count(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::size_t live_outputs(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::vector<PathIndex> expected_dead_before(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::vector<PathIndex> expected_dead_after(const EngineRef& pool, std::int64_t id);
[[nodiscard]] std::vector<std::size_t> copied_inputs(const EngineRef& pool, std::int64_t id);
[[nodiscard]] bool control_flow_on_host(const EngineRef& pool, std::int64_t id);
[[nodiscard]] NodeMemory memory(const EngineRef& pool, std::int64_t id);
}  // namespace node_view

/// How code outside module cgt makes a handle of an engine and reaches a handle's engine: each
/// handle class of module cgt befriends its own `HandleAccess<Handle>` (a class template of
/// another module cannot be befriended whole), and `backend::make_pool` and `backend::device_of`
/// below are its only users.
template <class Handle>
struct HandleAccess {
  [[nodiscard]] static Handle make(EngineRef engine) noexcept { return Handle(std::move(engine)); }
  [[nodiscard]] static const EngineRef& engine(const Handle& handle) noexcept { return handle.engine_; }
};

/// A fixed-capacity array on the stack that spills to the heap: calls with few arguments
/// allocate nothing for their argument descriptions.
template <class T, std::size_t Inline>
class SmallArray {
 public:
  inline explicit SmallArray(std::size_t size) : size_(size) {
    if (size > Inline) {
      heap_ = std::make_unique<T[]>(size);
    } else {
      std::uninitialized_default_construct_n(inline_.data(), size);  // NOLINT(cppcoreguidelines-pro-type-union-access)
    }
  }
  SmallArray(const SmallArray&) = delete;
  SmallArray& operator=(const SmallArray&) = delete;
  inline ~SmallArray() {
    if (size_ <= Inline) std::destroy_n(inline_.data(), size_);  // NOLINT(cppcoreguidelines-pro-type-union-access)
  }
  [[nodiscard]] inline std::span<T> span() noexcept {
    return {size_ > Inline ? heap_.get() : inline_.data(), size_};  // NOLINT(cppcoreguidelines-pro-type-union-access)
  }

 private:
  // Only the first `size` elements are constructed: a call with few arguments touches only those.
  union {
    std::array<T, Inline> inline_;
  };
  std::unique_ptr<T[]> heap_;
  std::size_t size_;
};

}  // namespace cgt::detail

export namespace cgt::backend {

/// A pool handle (`cgt::Pool<B>` of the backend, e.g. `cgt::host::Pool`) over a new engine that
/// owns `device`. Fails with `invalid_argument` for contradictory options.
template <class PoolHandle>
[[nodiscard]] Result<PoolHandle> make_pool(std::unique_ptr<Device> device, Options options) {
  auto engine = detail::make_engine(std::move(device), std::move(options));
  if (!engine) return std::unexpected(std::move(engine.error()));
  return detail::HandleAccess<PoolHandle>::make(std::move(*engine));
}

/// The engine's side of a pool's device (what the backend gave `make_pool`).
/// REQUIRES: `pool` is not moved from.
template <class PoolHandle>
[[nodiscard]] Device& device_of(PoolHandle& pool) noexcept {
  return detail::device(*detail::HandleAccess<PoolHandle>::engine(pool));
}

}  // namespace cgt::backend
