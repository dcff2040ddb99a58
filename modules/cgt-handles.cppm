// cgt.core:handles — the handles a program holds: Pool, Function, Arg, Outputs, OutputLease, Node.
// They are templates over a backend (cgt::host, cgt::torch, ...); each backend module names them,
// e.g. `cgt::host::Pool`. A backend type `B` provides:
//   using Value    = ...;  // what a call takes and a lease hands out (a buffer view, an at::Tensor)
//   using Callable = ...;  // the user's function
//   static Result<void> describe(const Value&, backend::ArgDesc&);  // fails for unusable values
//   static Result<Value> take(const Value&);                        // copy out of the pool
//   static std::unique_ptr<backend::Invoker> make_invoker(Callable&&);
//   using Device = ...;                                              // the program's view of a pool's device
//   static Device& view(backend::Device&);                          // finds it (`Pool::device()`)
//
// Every handle, in every state, answers with a value or an `Errc`: a moved-from handle is empty
// (its calls fail with `invalid_argument`, its queries return empty values), and after
// `Pool::shutdown()` what needs the pool fails with `pool_shut_down`. Borrowing is checked by
// the compiler where it can be: a value cannot be borrowed from a temporary `Outputs` or
// `OutputLease` (it would dangle at the end of the statement); name the result first.
module;
#include <expected>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <climits>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// The deleted borrows below say why they are deleted (`= delete("...")`, C++26, which clang
// accepts earlier): the message is what a user who wrote a dangling borrow reads.
#pragma clang diagnostic ignored "-Wc++26-extensions"

export module cgt.core:handles;
import :error;
import :options;
import :info;
import :spi;
import :detail;

export namespace cgt {

template <class B>
class Function;
template <class B>
class Outputs;
template <class B>
class Pool;
class PoolBase;

namespace backend {
/// For backends: a new pool of backend `B` over `device` (what a backend's own `make_pool` returns
/// once it has made its device). Fails with `invalid_argument` for contradictory options.
template <class B>
[[nodiscard]] Result<Pool<B>> make_pool(std::unique_ptr<Device> device, Options options);
/// For backends and tests that stand a device in for one: the backend device under `pool`, which
/// its engine owns (a fake device may forward to it). REQUIRES: `pool` is not moved from.
[[nodiscard]] Device& device_of(PoolBase& pool) noexcept;
}  // namespace backend

/// A read-only reference to the value a lease hands out. It converts to `const T&`, and reads like
/// the value: `ref->numel()`, `(*ref).sizes()`, and a member `get` with arguments goes to the value
/// (`ref.get(3)` is element 3 of a host buffer), while `ref.get()` is the `const T&` itself.
///
///   auto y = *out->get(0);   // a Ref<Buffer>: y.get(3), y->numel(), const Buffer& b = y;
template <class T>
class Ref {
 public:
  Ref(const T& value) noexcept : value_(&value) {}        // NOLINT(google-explicit-constructor)
  Ref(const T&&) = delete;                                // no reference to a temporary
  operator const T&() const noexcept { return *value_; }  // NOLINT(google-explicit-constructor)
  [[nodiscard]] const T& get() const noexcept { return *value_; }
  [[nodiscard]] const T& operator*() const noexcept { return *value_; }
  [[nodiscard]] const T* operator->() const noexcept { return value_; }
  /// The value's own `get(args...)` (a host buffer's element).
  template <class First, class... Rest>
    requires requires(const T& value, First&& first, Rest&&... rest) {
      value.get(std::forward<First>(first), std::forward<Rest>(rest)...);
    }
  decltype(auto) get(First&& first, Rest&&... rest) const {
    return value_->get(std::forward<First>(first), std::forward<Rest>(rest)...);
  }

 private:
  const T* value_;
};

/// A caller's claim on one output of a call. While it exists, no replay or recording reuses the
/// memory behind it. Move-only; a moved-from lease is empty. Dropping it (destruction, `reset()`,
/// or a successful call it was moved into) is the moment the memory becomes dead. It keeps the
/// pool's memory alive, even past the `Pool` handle.
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
  /// `Pool::shutdown()`, `invalid_argument` for an empty (moved-from, reset or consumed) lease.
  [[nodiscard]] Result<Ref<Value>> get() const& [[clang::lifetimebound]] {
    auto value = detail::lease_value(core_);
    if (!value) return std::unexpected(std::move(value.error()));
    return Ref<Value>(*static_cast<const Value*>(*value));
  }
  // The lease dies at the end of the statement, and the borrowed value with it.
  [[nodiscard]] Result<Ref<Value>> get() const&& = delete(
      "borrowing from a temporary OutputLease dangles at the end of the statement: name the lease first, or "
      "take() a copy");

  /// A copy of the value in ordinary memory, independent of the pool; fails like `get()`.
  /// Safe on a temporary lease: the copy is the caller's.
  [[nodiscard]] Result<Value> take() const {
    auto value = detail::lease_value(core_);
    if (!value) return std::unexpected(std::move(value.error()));
    return B::take(*static_cast<const Value*>(*value));
  }

  /// True while `get()` would succeed.
  [[nodiscard]] bool is_valid() const noexcept { return detail::lease_is_valid(core_); }
  /// Drops the claim now; the lease becomes empty. A no-op on an empty lease.
  void reset() noexcept { detail::lease_drop(core_); }

  /// What `->` reaches on a temporary `Owning<OutputLease>`: only what is safe on a temporary.
  class Temporary {
   public:
    explicit Temporary(const std::expected<OutputLease, Error>& lease) noexcept : lease_(&lease) {}
    [[nodiscard]] const Temporary* operator->() const noexcept { return this; }
    /// `OutputLease::take()`, or the error of the result.
    [[nodiscard]] Result<Value> take() const {
      if (!lease_->has_value()) return std::unexpected(lease_->error());
      return (**lease_).take();
    }
    /// `OutputLease::is_valid()`; false for an error.
    [[nodiscard]] bool is_valid() const noexcept { return lease_->has_value() && (**lease_).is_valid(); }
    [[nodiscard]] Result<Ref<Value>> get() const = delete(
        "borrowing from a temporary OutputLease dangles at the end of the statement: name the result first, or "
        "take() a copy");

   private:
    const std::expected<OutputLease, Error>* lease_;
  };

 private:
  friend class Outputs<B>;
  friend class Function<B>;
  template <class>
  friend class Arg;
  explicit OutputLease(detail::LeaseCore&& core) noexcept : core_(std::move(core)) {}
  mutable detail::LeaseCore core_;
};

/// One argument of a call. An `Arg` borrows what it is given, so build it in the call expression
/// (`(*f)({x, lease, std::move(other)})`), where everything it names outlives the call.
///  * A value is borrowed: the caller keeps it valid through the call.
///  * A lease passed as an lvalue is borrowed too: its output stays live through the call as
///    long as the lease does. Code the call runs (the function, a kernel, the log sink) that
///    resets it kills that memory at once, as a drop anywhere does: the call then reads dead
///    memory (poisoned where the backend poisons), though never a freed value object.
///  * A lease moved in (`std::move(lease)`) is consumed by a call that succeeds: the call may
///    reuse its memory, as if the caller dropped it mid-call, and the lease is empty afterwards.
///    A call that fails leaves it untouched: still holding its value.
template <class B>
class Arg {
 public:
  using Value = typename B::Value;

  Arg(const Value& value) noexcept : value_(&value) {}                          // NOLINT(google-explicit-constructor)
  Arg(Ref<Value> value) noexcept : value_(&value.get()) {}                      // NOLINT(google-explicit-constructor)
  Arg(const OutputLease<B>& lease) noexcept : lease_(&lease) {}                 // NOLINT(google-explicit-constructor)
  Arg(OutputLease<B>&& lease) noexcept : lease_(&lease), is_consumed_(true) {}  // NOLINT(google-explicit-constructor)
  /// An integer scalar, of any integer type (baked into the graph: each value is a shape key). An
  /// unsigned one above INT64_MAX fails the call with `invalid_argument`.
  template <std::integral Integer>
    requires(!std::same_as<Integer, bool>)
  Arg(Integer scalar) noexcept  // NOLINT(google-explicit-constructor)
      : scalar_(static_cast<std::int64_t>(scalar)),
        is_scalar_(true),
        scalar_too_large_(std::is_unsigned_v<Integer> &&
                          static_cast<std::uint64_t>(scalar) > static_cast<std::uint64_t>(INT64_MAX)) {}

 private:
  friend class Function<B>;

  // Fills the engine's view of this argument; fails for a lease that cannot hand out its value.
  // A consumed lease is handed to the engine, which drops it only once the call has succeeded.
  // Inlined into the call's loop over its arguments (`Function::Source`): each level of returned
  // `Result` cost a replay about 20 instructions per argument.
  [[clang::always_inline]] Result<void> describe(backend::ArgSlot& slot, backend::ArgDesc& desc, bool consume,
                                                 std::vector<std::shared_ptr<const void>>& keep) const {
    if (is_scalar_) {
      if (scalar_too_large_) {
        return fail(Errc::invalid_argument, "an unsigned scalar above INT64_MAX: scalars are 64-bit signed");
      }
      slot.kind = desc.kind = backend::ArgKind::scalar;
      slot.scalar = desc.scalar = scalar_;
      return {};
    }
    const Value* value = value_;
    if (value == nullptr) {
      auto got = lease_->get();
      if (!got) return std::unexpected(std::move(got.error()));
      value = &got->get();
      if (consume) slot.consumed = &lease_->core_;
      if (lease_->core_.owner) keep.push_back(lease_->core_.owner);  // the value outlives a drop mid-call
    }
    slot.value = value;
    return B::describe(*value, desc);
  }

  const Value* value_ = nullptr;
  const OutputLease<B>* lease_ = nullptr;
  std::int64_t scalar_ = 0;
  bool is_consumed_ = false;
  bool is_scalar_ = false;
  bool scalar_too_large_ = false;
};

/// A `Result<T>` of a handle that owns pool memory: the outputs of a call (`Function::operator()`)
/// and a lease released from them (`Outputs::release`). It is a `Result<T>` (a `std::expected`)
/// in every way, but borrowing from a temporary one does not compile, because the borrow would
/// dangle at the end of the statement:
///
///   const Buffer& y = *(*f)({x})->get(0);   // error: call to deleted member function 'get'
///   auto out = (*f)({x});                   // fine: name the result,
///   if (!out) return out.error();           //       check it,
///   const Buffer& y = *out->get(0);         //       and borrow while `out` lives
///   auto copy = (*f)({x})->take(0);         // fine: a copy (or the call's error) is the caller's
///
/// On a temporary, `->` reaches `T::Temporary`: the members that are safe there, which return the
/// result's error when it holds one; `*` and `value()` move the `T` out, a temporary whose
/// borrowing members are deleted (and `const Outputs& out = *(*f)({x});` keeps it alive: safe).
template <class T>
class Owning : public std::expected<T, Error> {
  using Base = std::expected<T, Error>;

 public:
  using Base::Base;
  Owning(Base&& result) noexcept(std::is_nothrow_move_constructible_v<Base>)  // NOLINT(google-explicit-constructor)
      : Base(std::move(result)) {}

  [[nodiscard]] T* operator->() & noexcept { return Base::operator->(); }
  [[nodiscard]] const T* operator->() const& noexcept { return Base::operator->(); }
  [[nodiscard]] typename T::Temporary operator->() && noexcept { return typename T::Temporary(*this); }
  [[nodiscard]] const T* operator->() const&& =
      delete("borrowing from a temporary result dangles at the end of the statement: name the result first");

  // On a temporary, `*` and `value()` move the handle out: a reference bound to it keeps it alive,
  // where a reference into the dying result would dangle.
  [[nodiscard]] T& operator*() & noexcept { return Base::operator*(); }
  [[nodiscard]] const T& operator*() const& noexcept { return Base::operator*(); }
  [[nodiscard]] T operator*() && noexcept(std::is_nothrow_move_constructible_v<T>) {
    return std::move(Base::operator*());
  }
  [[nodiscard]] const T& operator*() const&& =
      delete("borrowing from a temporary result dangles at the end of the statement: name the result first");
  [[nodiscard]] T& value() & { return Base::value(); }
  [[nodiscard]] const T& value() const& { return Base::value(); }
  [[nodiscard]] T value() && { return std::move(Base::value()); }
  [[nodiscard]] const T& value() const&& =
      delete("borrowing from a temporary result dangles at the end of the statement: name the result first");
};

/// The outputs of one call, each held by a lease. Move-only; a moved-from `Outputs` is empty
/// (`size() == 0`: every index is out of range).
template <class B>
class Outputs {
 public:
  using Value = typename B::Value;

  Outputs(Outputs&&) noexcept = default;
  Outputs& operator=(Outputs&& other) noexcept {
    if (this != &other) {
      leases_ = std::move(other.leases_);  // drops the leases this bundle held
      kind_ = other.kind_;
      node_ = other.node_;
    }
    return *this;
  }
  Outputs(const Outputs&) = delete;
  Outputs& operator=(const Outputs&) = delete;
  /// Drops the leases still in the bundle (all at once: one hold of the pool's state).
  ~Outputs() = default;

  [[nodiscard]] std::size_t size() const noexcept { return leases_.size(); }
  /// What the call did: warm-up, recording, replay or eager fallback.
  [[nodiscard]] CallKind kind() const noexcept { return kind_; }
  /// Id of the tree node the call ran: recordings and replays give the graph's id (0, 1, ... in
  /// recording order), warm-ups their own (-1, -2, ... in warm-up order); an eager call gives -1,
  /// like the first warm-up: `kind()` tells them apart.
  [[nodiscard]] std::int64_t node() const noexcept { return node_; }

  /// Output `i`, borrowed: valid while this bundle (or the lease released from it) lives; see
  /// `OutputLease::get`. `invalid_argument` if `i >= size()` or the lease was released.
  [[nodiscard]] Result<Ref<Value>> get(std::size_t i) const& [[clang::lifetimebound]] {
    if (i >= leases_.size()) return index_error(i);
    auto value = detail::lease_value(leases_[i]);
    if (!value) return std::unexpected(std::move(value.error()));
    return Ref<Value>(*static_cast<const Value*>(*value));
  }
  // The bundle dies at the end of the statement, and the borrowed value with it.
  [[nodiscard]] Result<Ref<Value>> get(std::size_t i) const&& = delete(
      "borrowing from a temporary Outputs dangles at the end of the statement: name the result first, or take() a "
      "copy");
  /// Output `i`, copied out of the pool; see `OutputLease::take`. Safe on a temporary bundle.
  [[nodiscard]] Result<Value> take(std::size_t i) const {
    if (i >= leases_.size()) return index_error(i);
    auto value = detail::lease_value(leases_[i]);
    if (!value) return std::unexpected(std::move(value.error()));
    return B::take(*static_cast<const Value*>(*value));
  }
  /// Moves the lease of output `i` out of the bundle (to keep or to pass into another call); the
  /// bundle's lease `i` is empty afterwards. `invalid_argument` if `i >= size()`.
  [[nodiscard]] Owning<OutputLease<B>> release(std::size_t i) {
    if (i >= leases_.size()) return index_error(i);
    return OutputLease<B>(std::move(leases_[i]));
  }
  /// Drops every lease still in the bundle.
  void reset() noexcept { detail::leases_drop(leases_.span()); }

  /// What `->` reaches on a temporary `Owning<Outputs>` (`(*f)({x})->take(0)`): only what is safe
  /// on a temporary. `take` and `release` return the call's error when it failed; `size`, `kind`
  /// and `node` require a value, as `std::expected::operator->` does.
  class Temporary {
   public:
    explicit Temporary(std::expected<Outputs, Error>& outputs) noexcept : outputs_(&outputs) {}
    [[nodiscard]] const Temporary* operator->() const noexcept { return this; }
    [[nodiscard]] std::size_t size() const noexcept { return (**outputs_).size(); }
    [[nodiscard]] CallKind kind() const noexcept { return (**outputs_).kind(); }
    [[nodiscard]] std::int64_t node() const noexcept { return (**outputs_).node(); }
    [[nodiscard]] Result<Value> take(std::size_t i) const {
      if (!outputs_->has_value()) return std::unexpected(outputs_->error());
      return (**outputs_).take(i);
    }
    [[nodiscard]] Owning<OutputLease<B>> release(std::size_t i) const {
      if (!outputs_->has_value()) return std::unexpected(outputs_->error());
      return (**outputs_).release(i);
    }
    [[nodiscard]] Result<Ref<Value>> get(std::size_t i) const = delete(
        "borrowing from a temporary Outputs dangles at the end of the statement: name the result first, or take() "
        "a copy");

   private:
    std::expected<Outputs, Error>* outputs_;
  };

 private:
  friend class Function<B>;
  explicit Outputs(detail::CallOutputs&& out) noexcept
      : leases_(std::move(out.leases)), kind_(out.kind), node_(out.node) {}
  std::unexpected<Error> index_error(std::size_t i) const {
    return fail(Errc::invalid_argument, "output index " + std::to_string(i) + " is out of range: the bundle holds " +
                                            std::to_string(leases_.size()) + " outputs (none if it was moved from)");
  }

  mutable detail::LeaseArray leases_;
  CallKind kind_ = CallKind::eager;
  std::int64_t node_ = -1;
};

/// A function registered with a pool. Calling it warms it up, records it, replays it, or runs it
/// eagerly with a stated reason. Move-only; it keeps the pool's memory alive (not past
/// `Pool::shutdown()`). A moved-from `Function` is empty: its calls fail with `invalid_argument`.
template <class B>
class Function {
 public:
  Function(Function&&) noexcept = default;
  Function& operator=(Function&&) noexcept = default;

  /// Calls the function. Fails with `wrong_input_count` / `wrong_input_type` / `wrong_shape` when
  /// the inputs do not match its first call, `output_overwritten` for a stale lease argument,
  /// `pool_shut_down`, `concurrent_use`, `function_failed` (the function threw; the pool is
  /// restored), `out_of_memory`, `static_input_moved`, `graph_unavailable` (with `or_error`),
  /// `backend_error`, `invalid_argument` (an empty lease argument, an empty `Function`).
  /// On failure nothing the caller holds is changed: a lease moved in still holds its value
  /// (except after a `backend_error` or `invariant_violation` found once the work was done).
  /// The outputs are an `Owning` result: name it before borrowing from it.
  [[nodiscard]] Owning<Outputs<B>> operator()(std::span<const Arg<B>> args) const {
    if (!engine_) {
      return fail(Errc::invalid_argument,
                  "call of an empty Function handle (moved from); call the handle it was "
                  "moved into");
    }
    const Source source(args);
    auto out = detail::call(*engine_, id_, source);
    if (!out) return std::unexpected(std::move(out.error()));
    return Outputs<B>(std::move(*out));
  }
  [[nodiscard]] Owning<Outputs<B>> operator()(std::initializer_list<Arg<B>> args) const {
    return (*this)(std::span<const Arg<B>>(args.begin(), args.size()));
  }

  /// The name given in `FunctionOptions` (or "function<id>"); empty for an empty `Function`.
  [[nodiscard]] std::string_view name() const noexcept {
    return engine_ ? std::string_view(detail::function_name(*engine_, id_)) : std::string_view();
  }
  /// The id the pool gave the function, in registration order (kept by a moved-from handle).
  [[nodiscard]] std::uint32_t id() const noexcept { return id_; }

 private:
  template <class>
  friend class Pool;
  Function(detail::EngineRef engine, std::uint32_t id) noexcept : engine_(std::move(engine)), id_(id) {}

  class Source final : public detail::ArgSource {
   public:
    explicit Source(std::span<const Arg<B>> args) noexcept : args_(args) {}
    [[nodiscard]] std::size_t size() const noexcept override { return args_.size(); }
    [[nodiscard]] Result<void> describe(std::span<backend::ArgSlot> slots, std::span<backend::ArgDesc> descs,
                                        std::vector<std::shared_ptr<const void>>& keep) const override {
      for (std::size_t i = 0; i < args_.size(); ++i) {
        if (auto described = args_[i].describe(slots[i], descs[i], is_first_consumer(i), keep); !described)
            [[unlikely]] {
          described.error().input = static_cast<std::int32_t>(i);
          return described;
        }
      }
      return {};
    }

   private:
    // A lease moved into two arguments is consumed once: the engine counts consumed leases
    // against the leases on a storage, and one lease counted twice would make a storage that
    // another lease holds look dead.
    [[nodiscard]] bool is_first_consumer(std::size_t i) const noexcept {
      if (!args_[i].is_consumed_) return false;
      for (std::size_t j = 0; j < i; ++j) {
        if (args_[j].is_consumed_ && args_[j].lease_ == args_[i].lease_) return false;
      }
      return true;
    }

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
/// introspection and tests. Move-only. After `Pool::shutdown()`, and once moved from, a view is
/// empty: `exists()` is false and every accessor returns an empty value (`id()` keeps its id).
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

/// What every pool can do, whatever its backend. A moved-from pool is empty: its queries return
/// empty values (`options()` the defaults), `mark_step_begin()` does nothing, and what would
/// change it (`shutdown()`, `add_function`, `device()`) fails with `invalid_argument`.
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
  /// leases still held keep working. A second `shutdown()` succeeds and does nothing. Fails with
  /// `concurrent_use` during a call, `invalid_argument` on a moved-from pool.
  [[nodiscard]] Result<void> shutdown();
  /// True when a forward function ran and no backward function has since (PyTorch's
  /// `running_forwards_with_pending_backwards`): until one does, forwards begin no new step.
  [[nodiscard]] bool has_pending_backward() const noexcept;
  /// True after `shutdown()`, and for a moved-from pool (which can run nothing either).
  [[nodiscard]] bool is_shut_down() const noexcept;

  /// The options the pool was made with (the defaults for a moved-from pool).
  [[nodiscard]] const Options& options() const noexcept;
  [[nodiscard]] Stats stats() const noexcept;
  /// The pool's memory now; all zero after `shutdown()` or once moved from.
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
  /// `Options::debug_checks` runs after every call. Fails with `invariant_violation`,
  /// `pool_shut_down`, `concurrent_use` from inside a call of the pool (its function, a kernel,
  /// the log sink: the call is halfway done), `invalid_argument` on a moved-from pool.
  [[nodiscard]] Result<void> check_memory() const;

 protected:
  explicit PoolBase(detail::EngineRef engine) noexcept : engine_(std::move(engine)) {}
  detail::EngineRef engine_;

 private:
  friend backend::Device& backend::device_of(PoolBase& pool) noexcept;
};

/// One graph tree and its memory pool, for one device and stream. Made by a backend
/// (`cgt::host::make_pool`, `cgt::torch::make_pool`). Move-only. Used by one thread at a time.
template <class B>
class Pool : public PoolBase {
 public:
  /// Registers a function. Fails with `pool_shut_down`, `invalid_argument` on a moved-from pool.
  /// The pool keeps `fn`, and what it captures, until every graph recorded from its functions is
  /// destroyed (at `shutdown()`, or when the last handle of the pool goes): what the graphs use
  /// besides their inputs (an NCCL communicator, a library handle, a workspace) outlives them when
  /// `fn` owns it, by a `std::shared_ptr` whose deleter frees it (`ncclCommDestroy`).
  [[nodiscard]] Result<Function<B>> add_function(typename B::Callable fn, FunctionOptions options = {}) {
    if (!engine_) return moved_from("add_function");
    auto id = detail::add_function(*engine_, B::make_invoker(std::move(fn)), std::move(options));
    if (!id) return std::unexpected(std::move(id.error()));
    return Function<B>(engine_, *id);
  }

  /// The program's view of the pool's device (`B::Device`: its index, its memory to look at, its
  /// stream), never the engine's side of it; valid while the pool's engine lives (this handle, a
  /// function or a lease keeps it). Fails with
  /// `pool_shut_down` after `shutdown()`, `invalid_argument` on a moved-from pool.
  [[nodiscard]] Result<std::reference_wrapper<typename B::Device>> device() & [[clang::lifetimebound]] {
    if (!engine_) return moved_from("device()");
    if (is_shut_down()) {
      return fail(Errc::pool_shut_down, "device() after the pool was shut down: its device is released");
    }
    return std::ref(B::view(detail::device(*engine_)));
  }
  // A temporary pool may be the last handle on the engine: the device would die with it.
  [[nodiscard]] Result<std::reference_wrapper<typename B::Device>> device() && =
      delete("the device of a temporary Pool dies with it at the end of the statement: name the pool first");

 private:
  friend Result<Pool> backend::make_pool<B>(std::unique_ptr<backend::Device> device, Options options);
  explicit Pool(detail::EngineRef engine) noexcept : PoolBase(std::move(engine)) {}
  static std::unexpected<Error> moved_from(const char* what) {
    return fail(Errc::invalid_argument,
                std::string(what) + " on an empty Pool handle (moved from); use the handle it was moved into");
  }
};

template <class B>
Result<Pool<B>> backend::make_pool(std::unique_ptr<Device> device, Options options) {
  auto engine = detail::make_engine(std::move(device), std::move(options));
  if (!engine) return std::unexpected(std::move(engine.error()));
  return Pool<B>(std::move(*engine));
}

}  // namespace cgt
