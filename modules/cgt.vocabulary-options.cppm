// cgt.vocabulary:options — how a pool and its functions behave, and how the pool reports its decisions.
module;
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

export module cgt.vocabulary:options;

export namespace cgt {

/// Why a call did not replay a graph, or why the pool warns. Each decision is counted in `Stats`
/// and sent to the log sink with a message.
enum class Reason : std::uint8_t {
  // Eager fallbacks: the call runs as plain code, outside the pool.
  mutated_input,          ///< the function mutates an input that is neither static nor pool-managed
  rerecord_limit,         ///< the function was re-recorded on this node more than `rerecord_limit` times
  shape_key_limit,        ///< the call's input shapes are a new key past `shape_key_limit`
  size_not_graphed,       ///< the call's size is not in the function's `graph_sizes` allow-list (or is 0,
                          ///< for a bucketed function: there is nothing to pad from)
  size_above_buckets,     ///< the call's size is above the largest of the function's `buckets.sizes`
  input_on_other_device,  ///< an input is on another device or in host memory
  capture_failed,         ///< its capture failed for a reason that will not change (a synchronisation
                          ///< inside the function): that shape runs eagerly from then on
  nested_pool,            ///< it called a function of another pool while this pool recorded it (that
                          ///< call fails with `Errc::nested_capture`): that shape runs eagerly from then
                          ///< on, where the inner call works; give both functions one pool to graph them
  unsupported_output,     ///< it returned a value a graph cannot hand out (cgt.torch: a sparse, nested or
                          ///< mkldnn tensor): that shape runs eagerly from then on, its values the caller's
  out_of_memory,          ///< its recording ran out of pool memory (nothing of its work ran, the pool was
                          ///< put back as it was): this call ran eagerly; the shape records again later
  // Re-recordings: the call records a new graph instead of replaying one.
  static_input_moved,   ///< a static input is at a new address
  managed_input_moved,  ///< an input that is an output of an earlier graph is at a new address
  // Warnings: nothing changes, but the program is probably not doing what it wants.
  many_shape_keys,  ///< the function has more distinct shape keys than `shape_key_warn_limit`
  /// A forward keeps recording deeper instead of replaying, because a forward whose backward never
  /// ran holds off the new step it would otherwise begin (PyTorch's "pending, uninvoked backwards")
  pending_backward,
  /// The function wrote to an input that `FunctionOptions::mutated_inputs` does not list (the
  /// backend saw it): the input counts as mutated from then on, so calls that would copy it into
  /// a graph's slot run eagerly (`mutated_input`). Once per input.
  undeclared_write,
  /// A padded call of a bucketed function handed out an output that `Buckets::output_dims` does
  /// not declare and that has the bucket's size on a dimension other than the one sliced: its
  /// padded rows may be in it (a transpose, a [seq, batch] or [n, n] output). Declare where its
  /// batch is (`output_dims`) or that it has none (`whole_outputs`). Once per function.
  padded_output,
  /// A loop or branch of the function (`loop_while`, `if_then`, `switch_on`) could not be a
  /// conditional graph node (a body holds what CUDA forbids there: a host callback, an event, an
  /// allocation node; a driver without them): that call runs eagerly, and the shape's next
  /// recording is made as segments replayed one after another, the host reading each decision
  /// between them (a wait each). Counted for that eager call; warned once per shape key.
  /// (`FunctionOptions::control_flow_on_host` records this way from the start.)
  control_flow_on_host,
  /// Recording these shapes would take the pool past `Options::memory_budget_bytes` (what the
  /// recording would add predicted from their warm-up), and evicting graphs (`OverBudget::
  /// evict_coldest`) was not asked for or not enough: the call runs eagerly; the shapes try again
  /// at their next call. Warned once per shape key.
  over_budget,
  count_,  ///< number of reasons (not a reason)
};

/// What a pool does when a recording would take it past `Options::memory_budget_bytes`.
enum class OverBudget : std::uint8_t {
  /// The call runs eagerly (`Reason::over_budget`); nothing recorded is touched.
  run_eagerly,
  /// The graphs replayed (or recorded) longest ago are dropped first, each with the graphs
  /// recorded after it on its path: their executables go, and the pool's segments that only they
  /// used are given back. Each is recorded again at its next call. Graphs on the current path
  /// stay. Eagerly (`Reason::over_budget`) only when dropping every other graph is not enough.
  evict_coldest,
};

/// The name of a reason, e.g. "mutated_input".
[[nodiscard]] std::string_view to_string(Reason reason) noexcept;

/// What a logged decision did.
enum class EventKind : std::uint8_t { eager_fallback, rerecord, warning };

/// One decision of the pool, as the log sink receives it.
struct Event {
  EventKind kind{};
  Reason reason{};
  std::string_view function;  ///< name of the function concerned
  std::string_view message;   ///< a sentence for humans, with what to do about it
};

/// Receives every fallback / re-record / warning decision. Called on the thread making the call.
using LogSink = std::function<void(const Event&)>;

/// What to do when a static input is not at the address a graph was recorded with.
enum class OnStaticInputMoved : std::uint8_t {
  rerecord,  ///< record a new graph for the new address (does not count toward `rerecord_limit`)
  error,     ///< fail the call with `Errc::static_input_moved`
};

/// Behaviour of one pool; the names follow PyTorch's `torch._inductor.config.triton` knobs.
struct Options {
  /// Record on the first call instead of warming up first (`skip_cudagraph_warmup`).
  bool skip_warmup = false;
  /// Warm up on every call: never record (`force_cudagraphs_warmup`); useful for debugging.
  bool force_warmup = false;
  /// Re-recordings of one function under one node, caused by pool-managed inputs at new
  /// addresses, before that function falls back to eager there (`cudagraph_unexpected_rerecord_limit`).
  std::uint32_t rerecord_limit = 128;
  /// What to do when a static input moved.
  OnStaticInputMoved on_static_input_moved = OnStaticInputMoved::rerecord;
  /// After every step, check that the pool's live blocks are exactly the memory of live leases,
  /// and check the tree's invariants before and after every replay; a difference fails the call
  /// with `Errc::invariant_violation` naming the block (`fast/slow_path_cudagraph_asserts`).
  bool debug_checks = false;
  /// Fail with `Errc::graph_unavailable` where the call would fall back to eager execution.
  bool or_error = false;
  /// When a new step reclaims the memory of outputs that are still leased, copy those values out
  /// of the pool (leases stay valid, at the cost of a copy) instead of invalidating the leases.
  bool copy_out_on_new_step = false;
  /// Warn once when a function has seen more distinct shape keys than this
  /// (`cudagraph_dynamic_shape_warn_limit`); 0 disables the warning. A shape key is the inputs'
  /// sizes and strides and the value of every integer scalar argument: pass values that change
  /// every call (positions) as tensors.
  std::uint32_t shape_key_warn_limit = 50;
  /// Run new shape keys past this many eagerly (`Reason::shape_key_limit`); 0 means no limit.
  std::uint32_t shape_key_limit = 0;
  /// How long a call of this pool waits while another pool records a graph on another thread. A
  /// capture sees only its own thread's work: a pool function that has a helper thread call
  /// another pool would bake that call's one result into its graph. So a call of another pool
  /// waits for captures in progress elsewhere (they last milliseconds, at a program's first
  /// calls); one that waited this long (the capture is waiting for it: it is that function's own)
  /// goes on, and the graph it overlapped runs once for its call and is not kept: that function
  /// runs eagerly at those shapes from then on (`Reason::nested_pool`). Raise it if recordings of
  /// a large model take longer, so that an independent thread's call is not mistaken for one.
  std::chrono::milliseconds wait_for_other_captures{1000};
  /// Most bytes of device memory the pool's graphs may take: the pool's segments (cgt.host and
  /// cgt.cuda: its arena's reserved bytes) plus the graphs' executables. Before each recording
  /// the pool predicts what it will add (from the shape's warm-up: `Node::memory()`); one that
  /// would go past the budget is not made, as `over_budget` says. 0: no budget. Backends that
  /// cannot predict a recording (cgt.torch) refuse a budget at `make_pool`.
  std::size_t memory_budget_bytes = 0;
  /// What a recording that would go past `memory_budget_bytes` does instead.
  OverBudget over_budget = OverBudget::run_eagerly;
  /// Where decisions go. Empty: stderr, once per function and reason.
  LogSink log_sink;
};

/// What a function is for, in training (PyTorch's `CompilationMode`). Forwards and backwards are
/// nodes of the same tree: layer 1's forward, layer 2's forward, layer 2's backward, layer 1's
/// backward form one path, replayed as a whole on later steps.
enum class FunctionMode : std::uint8_t {
  inference,  ///< no backward follows: steps begin only at `mark_step_begin()`
  /// The forward half of a trained function. Until `mark_step_begin()` is first called on its
  /// pool, a call of a forward begins a new step by itself (PyTorch's generation per compiled
  /// call) unless a forward already ran whose backward has not: the outputs a backward will read
  /// stay live. (One backward call clears that: a backward that is never called must not hold
  /// off steps forever.) Once the program calls `mark_step_begin()`, steps are its alone.
  forward,
  /// The backward half: its call marks the pending backwards as run (whether it replays, records,
  /// warms up or falls back to eager).
  backward,
};

/// The name of a mode, e.g. "forward".
[[nodiscard]] std::string_view to_string(FunctionMode mode) noexcept;

/// Which input dimension a function's `graph_sizes` allow-list or `buckets` is compared with. For
/// buckets, the input is one they pad: neither static nor in `unpadded_inputs` (else `add_function`
/// fails with `invalid_argument`).
struct SizeSource {
  std::size_t input = 0;
  std::size_t dim = 0;
};

/// How the rows a bucketed call adds to an input are filled (`Buckets`).
enum class PadMode : std::uint8_t {
  constant,   ///< every added element is `Pad::value`, which the input's element type must hold (a
              ///< whole number in range for an integer type), else the call fails with `invalid_argument`
  replicate,  ///< every added row repeats the call's last row (its finite values stay finite)
};

/// The padding of one input: a number, or the last row again.
struct Pad {
  PadMode mode = PadMode::constant;
  double value = 0.0;

  /// Added rows hold `value`: 0 for activations, a padding token id, an ignored position.
  [[nodiscard]] static constexpr Pad constant(double value) noexcept {
    return {.mode = PadMode::constant, .value = value};
  }
  /// Added rows repeat the last real row: for inputs where any constant could make a row-wise op
  /// produce NaN or infinity (a log, a division by a norm) and the program checks for those.
  [[nodiscard]] static constexpr Pad replicate() noexcept { return {.mode = PadMode::replicate, .value = 0.0}; }
};

/// Batch buckets (what vLLM and TensorRT-LLM do): graphs are recorded only at these sizes of one
/// input dimension (`FunctionOptions::size_source`). A call whose size `n` lies between two
/// buckets is padded up to the next bucket `b`, replays (or records) the graph of `b`, and its
/// outputs are handed out sliced back to `n` rows:
///  * padded: every input that is neither static nor a scalar and whose size along the dimension
///    is `n` (the others, weights and tables, are passed as they are);
///  * sliced: every output whose size along the dimension is `b`, to its first `n` rows (a view:
///    its lease keeps the whole bucket's memory live); other outputs are handed out whole. An
///    output whose batch is on another dimension (a transpose, an RNN's [seq, batch] output, an
///    [n, n] attention map) is declared in `output_dims`: sliced there (on every dimension listed
///    for it). An undeclared output that still has `b` elements on another dimension may carry the
///    padded rows: the call warns once (`Reason::padded_output`).
/// The rules go by size: an input or output that is not batch-shaped but has the batch's size by
/// coincidence (a [64] mean over the batch with a bucket of 64, a table of n rows) would be
/// padded or sliced too. Name those in `unpadded_inputs` and `whole_outputs`.
/// A call at a bucket size is neither padded nor sliced. Sizes above the largest bucket run
/// eagerly (`Reason::size_above_buckets`), as do calls of size 0 (`Reason::size_not_graphed`), and
/// calls that would pad an input the function mutates (`Reason::mutated_input`: the write would
/// land in the padded copy; make it static, as a KV cache is). Scalars are never padded: an
/// integer argument that carries `n` is part of the graph's key, one graph per `n`.
/// Padded rows are computed like real ones: functions whose outputs mix rows (a mean over the
/// batch, attention across it) see them; pick pad values that make them harmless (a mask of 0).
struct Buckets {
  /// Strictly increasing, each at least 1 (else `add_function` fails with `invalid_argument`).
  std::vector<std::int64_t> sizes;
  /// The padding of every padded input that `per_input` does not name.
  Pad pad;
  /// Padding for particular inputs, by input index (token ids padded with a pad token, say).
  std::vector<std::pair<std::size_t, Pad>> per_input;
  /// Inputs passed as they are, whatever their size (an index past the call's inputs fails the
  /// call with `invalid_argument`).
  std::vector<std::size_t> unpadded_inputs;
  /// Outputs handed out whole, never sliced, whatever their size (an index past the function's
  /// outputs fails the call with `invalid_argument`).
  std::vector<std::size_t> whole_outputs;
  /// Where an output's batch is, as (output, dimension) pairs: the output is sliced to the call's
  /// size on each dimension listed for it, and on no other. An output listed here must have the
  /// bucket's size there at a padded call, else the call fails with `invalid_argument` (as for an
  /// index past the function's outputs, or an output that `whole_outputs` lists too).
  std::vector<std::pair<std::size_t, std::size_t>> output_dims;

  /// The padding of input `input`.
  [[nodiscard]] Pad pad_of(std::size_t input) const noexcept {
    for (const auto& [index, special] : per_input) {
      if (index == input) return special;
    }
    return pad;
  }
};

/// Static facts about one function, given when it is added to a pool.
struct FunctionOptions {
  /// A name for messages, the log and the DOT dump.
  std::string name;
  /// Inputs at a stable address (weights, buffers): never copied; a graph is recorded for the
  /// address it saw (see `Options::on_static_input_moved`).
  std::vector<std::size_t> static_inputs;
  /// Inputs the function writes to. A call that mutates an input which is neither static nor an
  /// output of an earlier graph of this pool runs eagerly (`Reason::mutated_input`). A write to an
  /// input not listed here, where the backend sees it (cgt.torch: version counters; the host
  /// backend), adds the input with a warning; a recording that wrote a copy of it is given up and
  /// the call runs eagerly. Writes through raw pointers (cgt.cuda, AOTInductor) are not seen.
  std::vector<std::size_t> mutated_inputs;
  /// If not empty, only calls whose size (see `size_source`) is listed are graphed; others run
  /// eagerly (`Reason::size_not_graphed`), like PyTorch's `cudagraph_capture_sizes`.
  std::vector<std::int64_t> graph_sizes;
  /// Batch buckets with padding (see `Buckets`); exclusive with `graph_sizes`.
  Buckets buckets;
  /// Which input dimension `graph_sizes` or `buckets` is compared with.
  SizeSource size_source;
  /// Inference, or the forward or backward half of a trained function.
  FunctionMode mode = FunctionMode::inference;
  /// Warm up every new shape key before recording it, as PyTorch's trees do (each shape is a new
  /// function there). False: only the function's first shape warms up; a later shape records at
  /// its first call, one eager run fewer per size (capture time for many batch sizes). For code
  /// whose lazy set-up does not depend on the shape (an AOTInductor package, raw kernels). A
  /// shape whose capture fails without a warm-up of its own (set-up that it needs and the first
  /// shape did not, done inside the capture) warms up instead, with a warning
  /// (`Reason::capture_failed`), and records at its next call; only a second failure makes it run
  /// eagerly for good.
  bool warm_up_each_shape = true;
  /// Record the function's loops and branches (`loop_while`, `if_then`, `switch_on`) as segments
  /// the host decides between at each replay (a wait per decision), not as conditional graph
  /// nodes the GPU decides. For bodies known to hold what a conditional node cannot (NCCL
  /// collectives, host callbacks) or drivers without them: cgt otherwise finds that out at the
  /// first recording, gives it up and records again this way (`Reason::control_flow_on_host`).
  bool control_flow_on_host = false;
};

}  // namespace cgt
