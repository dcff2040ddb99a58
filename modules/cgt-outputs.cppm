// cgt:outputs — the outputs of one call (`Outputs`), and the result that holds them (`Owning`).
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

// Its deleted borrows say why they are deleted (`= delete("...")`, C++26, which clang accepts
// earlier): the message is what a user who wrote a dangling borrow reads.
#pragma clang diagnostic ignored "-Wc++26-extensions"

export module cgt:outputs;
import cgt.vocabulary;
import cgt.core;
import :lease;

export namespace cgt {

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
///
/// `->` and `*` on a named result REQUIRE `has_value()`, as `std::expected`'s do.
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

  /// Output `i`, borrowed; see `OutputLease::get`. Fails with `invalid_argument` if `i >= size()`
  /// or the lease was released, and as `OutputLease::get` does.
  /// ENSURES: on success, the value is valid while this bundle lives and no new step reclaims its
  /// memory (a lease released from the bundle takes that over).
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
  /// Moves the lease of output `i` out of the bundle (to keep or to pass into another call).
  /// Fails with `invalid_argument` if `i >= size()`.
  /// ENSURES: on success, the bundle's lease `i` is empty (its `get(i)` fails with `invalid_argument`).
  [[nodiscard]] Owning<OutputLease<B>> release(std::size_t i) {
    if (i >= leases_.size()) return index_error(i);
    return OutputLease<B>(std::move(leases_[i]));
  }
  /// Drops every lease still in the bundle. ENSURES: every `get(i)` fails with `invalid_argument`.
  void reset() noexcept { detail::leases_drop(leases_.span()); }

  /// What `->` reaches on a temporary `Owning<Outputs>` (`(*f)({x})->take(0)`): only what is safe
  /// on a temporary. `take` and `release` return the call's error when it failed.
  /// `size`, `kind` and `node` REQUIRE: the call succeeded (`has_value()`), as
  /// `std::expected::operator->` does.
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

}  // namespace cgt
