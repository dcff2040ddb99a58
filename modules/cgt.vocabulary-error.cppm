// cgt.vocabulary:error — how every fallible operation of cgt reports failure.
module;
#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

export module cgt.vocabulary:error;

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
  /// A function of this pool was called while another pool recorded a function on the same
  /// thread (a pool function calling another pool's): one pool's graph cannot hold another
  /// pool's call and its leases. The recording pool runs its function eagerly instead
  /// (`Reason::nested_pool`), where this call then succeeds: call the inner function before or
  /// after the outer one, or give both functions one pool.
  nested_capture,
};

/// The name of a code, e.g. "output_overwritten".
[[nodiscard]] std::string_view to_string(Errc code) noexcept;

/// What kind of failure an error is, where the pool acts on the difference. Set by whoever
/// failed (a backend, the engine); the pool decides on this field alone, never on the message.
enum class Cause : std::uint8_t {
  /// Nothing the pool treats apart: the call fails with the error.
  unspecified = 0,
  /// The function did something a graph cannot hold (a synchronisation with the host, a copy to
  /// it, work on a stream it did not join back): its recording broke, and would again at these
  /// shapes, so they run eagerly from then on (`Reason::capture_failed`).
  uncapturable,
  /// The function wrote an input that its graph reads through a copy (`Error::input` says which):
  /// a replay's write would never reach the caller. The recording's one run is the call's (its
  /// write copied back to the caller's input), the graph is not kept, and the input counts as
  /// mutated from then on.
  wrote_copied_input,
  /// The function called a function of another pool while this pool recorded it: one pool's
  /// graph cannot hold another pool's call with its leases. On the recording's thread the inner
  /// call fails (`Errc::nested_capture`) and the outer function runs eagerly at those shapes
  /// (`Reason::nested_pool`); on another thread (a helper the function waits for) the inner call
  /// runs, and the outer graph runs once for its call and is not kept.
  nested_pool,
  /// The function returned a value the pool cannot hand out from its memory (cgt.torch: a sparse,
  /// nested or mkldnn tensor): those shapes run eagerly from then on (`Reason::unsupported_output`),
  /// where any value is the caller's.
  unsupported_output,
  /// A loop or branch of the function could not be made a conditional graph node (its body holds
  /// what CUDA forbids there: a host callback, an event, an allocation node; or the driver has
  /// none): the call runs eagerly, and the shape's next recording has its loops and branches
  /// decided by the host between segments of the graph (`Reason::control_flow_on_host`).
  conditional_unavailable,
};

/// A failure: the code, a message that says what happened and what to do, and where it happened.
struct Error {
  Errc code{};
  std::string message;
  Cause cause = Cause::unspecified;  ///< what the pool makes of it (see `Cause`)
  std::string function;              ///< name of the function involved, if any
  std::int64_t node = -1;            ///< id of the tree node involved, or -1
  std::int32_t input = -1;           ///< index of the input involved, or -1

  /// One line with all of the above, for logs.
  [[nodiscard]] std::string describe() const;
};

/// The result of every cgt operation that can fail.
template <class T>
using Result = std::expected<T, Error>;

/// Shorthand for returning an error: `return cgt::fail(Errc::wrong_shape, "...")`.
[[nodiscard]] inline std::unexpected<Error> fail(Errc code, std::string message, std::string function = {},
                                                 std::int64_t node = -1, std::int32_t input = -1) {
  return std::unexpected(Error{.code = code,
                               .message = std::move(message),
                               .cause = Cause::unspecified,
                               .function = std::move(function),
                               .node = node,
                               .input = input});
}

/// An error of a kind the pool acts on: `return cgt::fail(Cause::uncapturable, Errc::function_failed, "...")`.
[[nodiscard]] inline std::unexpected<Error> fail(Cause cause, Errc code, std::string message, std::int32_t input = -1) {
  return std::unexpected(Error{.code = code, .message = std::move(message), .cause = cause, .input = input});
}

}  // namespace cgt
