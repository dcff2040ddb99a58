// cgt:handles — the handles a program holds: Pool, Function, Arg, Outputs, OutputLease, Node.
// They are templates over a backend (cgt::host, cgt::torch, ...); each backend module names them,
// e.g. `cgt::host::Pool`. A backend type `B` provides:
//   using Value    = ...;  // what a call takes and a lease hands out (a buffer view, an at::Tensor)
//   using Callable = ...;  // the user's function
//   static Result<void> describe(const Value&, backend::ArgDesc&);  // fails for unusable values
//   static Result<Value> take(const Value&);                        // copy out of the pool
//   static std::unique_ptr<backend::Invoker> make_invoker(Callable&&);
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

export module cgt:handles;
import :error;
import :options;
import :info;
import :backend;
import :detail;

export namespace cgt {

template <class B>
class Function;
template <class B>
class Outputs;

/// A read-only reference to the value a lease hands out: converts to `const Value&`.
template <class T>
using Ref = std::reference_wrapper<const T>;

/// A caller's claim on one output of a call. While it exists, no replay or recording reuses the
/// memory behind it. Move-only; dropping it (destruction, `reset()`, or moving it into a call) is
/// the moment the memory becomes dead. It keeps the pool's memory alive, even past the `Pool`.
template <class B>
class OutputLease {
 public:
  using Value = typename B::Value;

  OutputLease() = default;
  OutputLease(OutputLease&&) noexcept = default;
  OutputLease& operator=(OutputLease&&) noexcept = default;

  /// The value, borrowed: valid while this lease lives and no new step reclaimed it.
  /// Fails with `output_overwritten` after a new step reclaimed the memory (keep the value with
  /// `take()`, or call `mark_step_begin()` only when done with it), `pool_shut_down` after
  /// `Pool::shutdown()`, `invalid_argument` for an empty (moved-from) lease.
  [[nodiscard]] Result<Ref<Value>> get() const [[clang::lifetimebound]] {
    auto value = detail::lease_value(core_);
    if (!value) return std::unexpected(std::move(value.error()));
    return std::cref(*static_cast<const Value*>(*value));
  }

  /// A copy of the value in ordinary memory, independent of the pool; fails like `get()`.
  [[nodiscard]] Result<Value> take() const {
    auto value = get();
    if (!value) return std::unexpected(std::move(value.error()));
    return B::take(value->get());
  }

  /// True while `get()` would succeed.
  [[nodiscard]] bool is_valid() const noexcept { return detail::lease_is_valid(core_); }
  /// Drops the claim now; the lease becomes empty.
  void reset() noexcept { detail::lease_drop(core_); }

 private:
  friend class Outputs<B>;
  friend class Function<B>;
  template <class>
  friend class Arg;
  explicit OutputLease(detail::LeaseCore&& core) noexcept : core_(std::move(core)) {}
  mutable detail::LeaseCore core_;
};

/// One argument of a call. A value is borrowed (the caller keeps it valid through the call). A
/// lease passed as an lvalue is borrowed too: its output stays live through the call. A lease
/// moved in is consumed: the call may reuse its memory, as if the caller dropped it mid-call.
template <class B>
class Arg {
 public:
  using Value = typename B::Value;

  Arg(const Value& value) noexcept : value_(&value) {}                      // NOLINT(google-explicit-constructor)
  Arg(Ref<Value> value) noexcept : value_(&value.get()) {}                  // NOLINT(google-explicit-constructor)
  Arg(const OutputLease<B>& lease) noexcept : borrowed_(&lease) {}          // NOLINT(google-explicit-constructor)
  Arg(OutputLease<B>&& lease) noexcept : consumed_(std::move(lease)) {}     // NOLINT(google-explicit-constructor)
  Arg(std::int64_t scalar) noexcept : scalar_(scalar), is_scalar_(true) {}  // NOLINT(google-explicit-constructor)
  Arg(int scalar) noexcept : Arg(static_cast<std::int64_t>(scalar)) {}      // NOLINT(google-explicit-constructor)

 private:
  friend class Function<B>;

  // Fills the engine's view of this argument; fails for a lease that cannot hand out its value.
  Result<void> describe(backend::ArgSlot& slot, backend::ArgDesc& desc) const {
    if (is_scalar_) {
      slot.kind = desc.kind = backend::ArgKind::scalar;
      slot.scalar = desc.scalar = scalar_;
      return {};
    }
    const Value* value = value_;
    if (value == nullptr) {
      const OutputLease<B>& lease = borrowed_ != nullptr ? *borrowed_ : consumed_;
      auto got = lease.get();
      if (!got) return std::unexpected(std::move(got.error()));
      value = &got->get();
      if (borrowed_ == nullptr) slot.consumed = &consumed_.core_;
    }
    slot.value = value;
    return B::describe(*value, desc);
  }

  const Value* value_ = nullptr;
  const OutputLease<B>* borrowed_ = nullptr;
  mutable OutputLease<B> consumed_;
  std::int64_t scalar_ = 0;
  bool is_scalar_ = false;
};

/// The outputs of one call, each held by a lease. Move-only.
template <class B>
class Outputs {
 public:
  using Value = typename B::Value;

  Outputs(Outputs&&) noexcept = default;
  Outputs& operator=(Outputs&&) noexcept = default;

  [[nodiscard]] std::size_t size() const noexcept { return leases_.size(); }
  /// What the call did: warm-up, recording, replay or eager fallback.
  [[nodiscard]] CallKind kind() const noexcept { return kind_; }
  /// Id of the tree node the call ran (negative for warm-ups), -1 for eager calls.
  [[nodiscard]] std::int64_t node() const noexcept { return node_; }

  /// Output `i`, borrowed; see `OutputLease::get`. `invalid_argument` if `i >= size()` or the
  /// lease was moved out.
  [[nodiscard]] Result<Ref<Value>> get(std::size_t i) const [[clang::lifetimebound]] {
    if (i >= leases_.size()) return index_error(i);
    auto value = detail::lease_value(leases_[i]);
    if (!value) return std::unexpected(std::move(value.error()));
    return std::cref(*static_cast<const Value*>(*value));
  }
  /// Output `i`, copied out of the pool; see `OutputLease::take`.
  [[nodiscard]] Result<Value> take(std::size_t i) const {
    auto value = get(i);
    if (!value) return std::unexpected(std::move(value.error()));
    return B::take(value->get());
  }
  /// Moves the lease of output `i` out of the bundle (to keep or to pass into another call).
  [[nodiscard]] Result<OutputLease<B>> release(std::size_t i) {
    if (i >= leases_.size()) return index_error(i);
    return OutputLease<B>(std::move(leases_[i]));
  }
  /// Drops every lease still in the bundle.
  void reset() noexcept {
    for (auto& lease : leases_) detail::lease_drop(lease);
  }

 private:
  friend class Function<B>;
  explicit Outputs(detail::CallOutputs&& out) noexcept
      : leases_(std::move(out.leases)), kind_(out.kind), node_(out.node) {}
  std::unexpected<Error> index_error(std::size_t i) const {
    return fail(Errc::invalid_argument, "output index " + std::to_string(i) + " is out of range: the call has " +
                                            std::to_string(leases_.size()) + " outputs");
  }

  mutable std::vector<detail::LeaseCore> leases_;
  CallKind kind_ = CallKind::eager;
  std::int64_t node_ = -1;
};

/// A function registered with a pool. Calling it warms it up, records it, replays it, or runs it
/// eagerly with a stated reason. Move-only; it keeps the pool's memory alive.
template <class B>
class Function {
 public:
  Function(Function&&) noexcept = default;
  Function& operator=(Function&&) noexcept = default;

  /// Calls the function. Fails with `wrong_input_count` / `wrong_input_type` / `wrong_shape` when
  /// the inputs do not match its first call, `output_overwritten` for a stale lease argument,
  /// `pool_shut_down`, `concurrent_use`, `function_failed` (the function threw; the pool is
  /// restored), `out_of_memory`, `static_input_moved`, `graph_unavailable` (with `or_error`),
  /// `backend_error`. On failure nothing the caller holds is changed.
  [[nodiscard]] Result<Outputs<B>> operator()(std::span<const Arg<B>> args) const {
    const Source source(args);
    auto out = detail::call(*engine_, id_, source);
    if (!out) return std::unexpected(std::move(out.error()));
    return Outputs<B>(std::move(*out));
  }
  [[nodiscard]] Result<Outputs<B>> operator()(std::initializer_list<Arg<B>> args) const {
    return (*this)(std::span<const Arg<B>>(args.begin(), args.size()));
  }

  /// The name given in `FunctionOptions` (or "function<id>").
  [[nodiscard]] std::string_view name() const noexcept { return detail::function_name(*engine_, id_); }
  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }

 private:
  template <class>
  friend class Pool;
  Function(detail::EngineRef engine, std::uint32_t id) noexcept : engine_(std::move(engine)), id_(id) {}

  class Source final : public detail::ArgSource {
   public:
    explicit Source(std::span<const Arg<B>> args) noexcept : args_(args) {}
    [[nodiscard]] std::size_t size() const noexcept override { return args_.size(); }
    [[nodiscard]] Result<void> describe(std::size_t i, backend::ArgSlot& slot, backend::ArgDesc& desc) const override {
      return args_[i].describe(slot, desc);
    }

   private:
    std::span<const Arg<B>> args_;
  };

  detail::EngineRef engine_;
  std::uint32_t id_ = 0;
};

/// One position in the current path: output `output` of the node `depth` steps below the root.
struct PathIndex {
  std::uint32_t depth = 0;
  std::uint32_t output = 0;
  friend bool operator==(const PathIndex&, const PathIndex&) = default;
};

/// A read-only view of one node of a pool's tree (a recording or a warm-up run), for
/// introspection and tests. Move-only. After `Pool::shutdown()` a view is empty: `exists()` is
/// false and every accessor returns an empty value.
class Node {
 public:
  Node(Node&&) noexcept = default;
  Node& operator=(Node&&) noexcept = default;

  [[nodiscard]] bool exists() const;
  /// Graph nodes count up from 0 in recording order; warm-up nodes count down from -1.
  [[nodiscard]] std::int64_t id() const noexcept { return id_; }
  [[nodiscard]] NodeKind kind() const;
  [[nodiscard]] NodeReason reason() const;
  /// Name of the function this node ran.
  [[nodiscard]] std::string function() const;
  /// Distance from the root (roots are at depth 0).
  [[nodiscard]] std::size_t depth() const;
  /// Children recorded under this node, in recording order.
  [[nodiscard]] std::vector<Node> children() const;
  /// Number of nodes below this one (PyTorch's `num_descendants`).
  [[nodiscard]] std::size_t num_descendants() const;
  [[nodiscard]] std::size_t output_count() const;
  /// Outputs of this node that are live now (leased, in the current path's execution).
  [[nodiscard]] std::size_t live_outputs() const;
  /// Outputs of earlier nodes of the path that must be dead before this graph replays.
  [[nodiscard]] std::vector<PathIndex> expected_dead_before() const;
  /// Outputs of earlier nodes of the path that died while this graph was recorded (consumed inputs).
  [[nodiscard]] std::vector<PathIndex> expected_dead_after() const;
  /// Inputs copied into pool slots on every replay (neither static nor pool-managed).
  [[nodiscard]] std::vector<std::size_t> copied_inputs() const;

 private:
  friend class PoolBase;
  friend struct NodeAccess;
  Node(detail::EngineRef engine, std::int64_t id) noexcept : engine_(std::move(engine)), id_(id) {}
  detail::EngineRef engine_;
  std::int64_t id_ = 0;
};

/// What every pool can do, whatever its backend.
class PoolBase {
 public:
  PoolBase(PoolBase&&) noexcept = default;
  PoolBase& operator=(PoolBase&&) noexcept = default;

  /// A new step begins: at the next call, the memory of every output of earlier calls may be
  /// reclaimed, and leases still held on it report `output_overwritten` (or keep a copy, with
  /// `Options::copy_out_on_new_step`). Call it at the top of each training or inference step.
  void mark_step_begin() noexcept;
  /// Ends the pool: frees its graphs and memory; later calls fail with `pool_shut_down`, and
  /// leases report it too. Dropping the `Pool` handle alone is not a shutdown: functions and
  /// leases still held keep working. Fails with `concurrent_use` during a call.
  [[nodiscard]] Result<void> shutdown();
  [[nodiscard]] bool is_shut_down() const noexcept;

  [[nodiscard]] const Options& options() const noexcept;
  [[nodiscard]] Stats stats() const noexcept;
  [[nodiscard]] MemoryInfo memory() const;
  /// Allocated blocks of the pool now (PyTorch's tests count these as "live blocks").
  [[nodiscard]] std::vector<Block> live_blocks() const;
  /// Root recordings, in recording order.
  [[nodiscard]] std::vector<Node> roots() const;
  /// The nodes of the current path, root first (empty when no path is being executed).
  [[nodiscard]] std::vector<Node> current_path() const;
  /// The tree as a Graphviz DOT graph: recordings, warm-ups of the current path, why each was made.
  [[nodiscard]] std::string to_dot() const;
  /// Checks now that the pool's live blocks are exactly the memory of live leases; the check
  /// `Options::debug_checks` runs after every call. Fails with `invariant_violation`.
  [[nodiscard]] Result<void> check_memory() const;

 protected:
  explicit PoolBase(detail::EngineRef engine) noexcept : engine_(std::move(engine)) {}
  detail::EngineRef engine_;
};

/// One graph tree and its memory pool, for one device and stream. Made by a backend
/// (`cgt::host::make_pool`, `cgt::torch::make_pool`). Move-only. Used by one thread at a time.
template <class B>
class Pool : public PoolBase {
 public:
  /// Registers a function. Fails with `pool_shut_down`.
  [[nodiscard]] Result<Function<B>> add_function(typename B::Callable fn, FunctionOptions options = {}) {
    auto id = detail::add_function(*engine_, B::make_invoker(std::move(fn)), std::move(options));
    if (!id) return std::unexpected(std::move(id.error()));
    return Function<B>(engine_, *id);
  }

  /// The backend's device (its stream, its allocator), for code that needs it.
  [[nodiscard]] typename B::Device& device() noexcept {
    return static_cast<typename B::Device&>(detail::device(*engine_));
  }

  /// For backends: wraps a new engine.
  [[nodiscard]] static Pool adopt(detail::EngineRef engine) noexcept { return Pool(std::move(engine)); }

 private:
  explicit Pool(detail::EngineRef engine) noexcept : PoolBase(std::move(engine)) {}
};

}  // namespace cgt
