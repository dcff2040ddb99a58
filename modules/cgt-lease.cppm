// cgt:lease — a claim on one output of a call (`OutputLease`), and the reference it lends (`Ref`).
module;
#include <expected>
#include <type_traits>
#include <utility>

// Its deleted borrows say why they are deleted (`= delete("...")`, C++26, which clang accepts
// earlier): the message is what a user who wrote a dangling borrow reads.
#pragma clang diagnostic ignored "-Wc++26-extensions"

export module cgt:lease;
import cgt.vocabulary;
import cgt.core;

export namespace cgt {

template <class B>
class Function;
template <class B>
class Outputs;
template <class B>
class Arg;

/// A read-only reference to the value a lease hands out. It converts to `const T&`, and reads like
/// the value: `ref->numel()`, `(*ref).sizes()`, and a member `get` with arguments goes to the value
/// (`ref.get(3)` is element 3 of a host buffer), while `ref.get()` is the `const T&` itself.
///
///   auto y = *out->get(0);   // a Ref<Buffer>: y.get(3), y->numel(), const Buffer& b = y;
///
/// REQUIRES: the lease or bundle it came from lives and no new step reclaimed its memory while the
/// `Ref` is used (it checks nothing: it is the borrow `get()` checked once).
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

  /// The value, borrowed. Fails with `output_overwritten` after a new step reclaimed the memory (keep the value with
  /// `take()`, or call `mark_step_begin()` only when done with it), `pool_shut_down` after
  /// `Pool::shutdown()`, `invalid_argument` for an empty (moved-from, reset or consumed) lease.
  /// ENSURES: on success, the value is valid while this lease lives and no new step reclaims its
  /// memory (`is_valid()` says which).
  [[nodiscard]] Result<Ref<Value>> get() const& [[clang::lifetimebound]] {
    auto value = detail::lease_value(core_);
    if (!value) return std::unexpected(std::move(value.error()));
    return Ref<Value>(*static_cast<const Value*>(*value));
  }
  // The lease dies at the end of the statement, and the borrowed value with it.
  [[nodiscard]] Result<Ref<Value>> get() const&& = delete(
      "borrowing from a temporary OutputLease dangles at the end of the statement: name the lease first, or "
      "take() a copy");

  /// A copy of the value in ordinary memory; fails like `get()`. Safe on a temporary lease.
  /// ENSURES: on success, the copy is the caller's: no step, drop or shutdown of the pool changes it.
  [[nodiscard]] Result<Value> take() const {
    auto value = detail::lease_value(core_);
    if (!value) return std::unexpected(std::move(value.error()));
    return B::take(*static_cast<const Value*>(*value));
  }

  /// True while `get()` would succeed.
  [[nodiscard]] bool is_valid() const noexcept { return detail::lease_is_valid(core_); }
  /// Drops the claim now. A no-op on an empty lease.
  /// ENSURES: the lease is empty (`is_valid()` is false); its memory is dead unless another lease
  /// holds it.
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

}  // namespace cgt
