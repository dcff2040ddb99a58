// cgt.backend:error — how every fallible operation of cgt reports failure.
module;
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

export module cgt.backend:error;

export namespace cgt {

/// What went wrong. Every code has a test that triggers it; the message of the `Error` says what to do.
enum class Errc : std::uint8_t {
  /// The call passed a different number of inputs than the function's first call (or its declaration).
  wrong_input_count = 1,
  /// An input's element type or kind (value vs. scalar) differs from the function's first call.
  wrong_input_type,
  /// An input's rank differs from the function's first call, or its layout cannot be used.
  wrong_shape,
  /// The lease's memory was reclaimed when a new step began (`Pool::mark_step_begin`).
  output_overwritten,
  /// `Pool::shutdown()` was called; the pool's functions and leases no longer work.
  pool_shut_down,
  /// A static input is not at the address it was recorded with and the pool is set to fail on that.
  static_input_moved,
  /// `Options::or_error` is set and the call would have fallen back to eager execution.
  graph_unavailable,
  /// The user's function threw (or reported failure) while running, warming up or recording.
  function_failed,
  /// The pool's memory is exhausted.
  out_of_memory,
  /// The device runtime (CUDA, libtorch) reported an error.
  backend_error,
  /// A second call entered the pool while one was in flight (another thread, or a nested call).
  concurrent_use,
  /// A bad argument to a cgt operation: an index out of range, an empty lease, inconsistent options.
  invalid_argument,
  /// An internal consistency check failed (only with `Options::debug_checks`); please report it.
  invariant_violation,
};

/// The name of a code, e.g. "output_overwritten".
[[nodiscard]] std::string_view to_string(Errc code) noexcept;

/// A failure: the code, a message that says what happened and what to do, and where it happened.
struct Error {
  Errc code{};
  std::string message;
  std::string function;     ///< name of the function involved, if any
  std::int64_t node = -1;   ///< id of the tree node involved, or -1
  std::int32_t input = -1;  ///< index of the input involved, or -1

  /// One line with all of the above, for logs.
  [[nodiscard]] std::string describe() const;
};

/// The result of every cgt operation that can fail.
template <class T>
using Result = std::expected<T, Error>;

/// Shorthand for returning an error: `return cgt::fail(Errc::wrong_shape, "...")`.
[[nodiscard]] inline std::unexpected<Error> fail(Errc code, std::string message, std::string function = {},
                                                 std::int64_t node = -1, std::int32_t input = -1) {
  return std::unexpected(Error{
      .code = code, .message = std::move(message), .function = std::move(function), .node = node, .input = input});
}

}  // namespace cgt
