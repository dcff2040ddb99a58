// cgt:arg — one argument of a call (`Arg`): a value, a lease (borrowed or moved in), an integer.
module;
#include <expected>
#include <climits>
#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

export module cgt:arg;
import cgt.vocabulary;
import cgt.core;
import :lease;

export namespace cgt {

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
///
/// REQUIRES: what it names (a value, a lease) outlives the call.
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

}  // namespace cgt
