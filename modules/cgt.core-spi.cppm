// cgt.core:spi — the interface a backend (host, cuda, torch) implements for the tree engine.
// Users of cgt do not need anything here; backend authors do. The engine in src/core knows a
// device only through these types.
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

export module cgt.core:spi;
import cgt.vocabulary;
import :arena;

export namespace cgt::detail {
struct LeaseCore;  // a lease's state (:detail), for module cgt's handles
}

export namespace cgt::backend {

/// Is an argument a value (tensor, buffer) or an integer scalar?
enum class ArgKind : std::uint8_t { value, scalar };

/// One argument as the caller passed it: a native value (`Backend::Value`) or a scalar.
struct ArgSlot {
  const void* value = nullptr;  ///< the native value, for `ArgKind::value`
  std::int64_t scalar = 0;      ///< for `ArgKind::scalar`
  ArgKind kind = ArgKind::value;
  detail::LeaseCore* consumed = nullptr;  ///< a lease moved into the call: released by it
  // Trivially destructible: a call makes one per argument. A value that a lease's owner owns (an
  // eager or warm-up output) is kept alive for the call by the engine (`ArgSource::describe`).
};

/// What the engine needs to know of one argument; the typed layer fills it from the native value.
struct ArgDesc {
  std::uintptr_t storage = 0;           ///< base address of the memory the value views: its identity
  std::uintptr_t data = 0;              ///< address of the first element (alignment)
  const std::int64_t* sizes = nullptr;  ///< `rank` sizes, valid during the call
  /// `rank` strides in elements, valid during the call. Part of the shape key: a graph reads a
  /// static or pool input with the layout it was recorded with.
  const std::int64_t* strides = nullptr;
  std::uint32_t expanded = 0;  ///< bit d set: dimension d has stride 0 (broadcast)
  /// Backend-defined bits that change what the memory's bytes mean (a lazily conjugated or
  /// negated view). Part of the shape key: a graph reads a static or pool input's bytes as it was
  /// recorded, so the same address with another bit needs a graph of its own.
  std::uint8_t view = 0;
  std::int64_t scalar = 0;
  std::uint16_t dtype = 0;  ///< backend's element-type code
  std::uint8_t rank = 0;
  ArgKind kind = ArgKind::value;
  std::int32_t device = 0;  ///< index of the device holding the memory; -1: host memory
  /// The life number the value was handed out in (`Device::stamp`); 0 where the backend keeps none.
  std::uint64_t life = 0;
};

/// What the engine knows of one output storage; shared by all outputs that view it.
/// The backend may keep its own record of the storage in `native` (a libtorch StorageImpl, say).
struct StorageHandle {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
  void* native = nullptr;
  std::shared_ptr<void> native_owner;  ///< keeps `native` alive while the handle exists
  /// The pool's allocator counts the block as allocated: it must be freed when the storage dies.
  /// True for outputs of warm-ups and recordings and after a checkpoint restore; false for replays.
  bool owned_by_allocator = false;
};

/// Is an output a value, or nothing (an undefined tensor, an empty buffer)?
enum class OutputKind : std::uint8_t { value, none };

/// One output of an eager run, a warm-up or a recording, as the backend reports it.
struct OutputDesc {
  OutputKind kind = OutputKind::value;
  std::uintptr_t storage = 0;  ///< base address of its memory
  std::size_t storage_bytes = 0;
  bool in_pool = false;  ///< its memory is a block of this pool (else: caller's or constant memory)
  /// With `in_pool`: the call itself allocated the block (false: pool memory it was given, or kept
  /// from an earlier call). The engine refuses pool memory that is neither this nor a live output.
  bool allocated_in_call = true;
  void* native = nullptr;              ///< backend's storage record, becomes `StorageHandle::native`
  std::shared_ptr<void> native_owner;  ///< owner of `native`
};

/// Outputs of a run: descriptions, native values, and the owner that keeps the values alive.
struct RunResult {
  std::vector<OutputDesc> outputs;
  std::vector<const void*> values;    ///< `Backend::Value*` per output
  std::shared_ptr<const void> owner;  ///< owns `values`
  /// Inputs the function wrote to, as far as the backend can tell (cgt.torch: a tensor's version
  /// counter; the host backend: the bytes of inputs outside the pool). The engine treats them as
  /// mutated inputs from then on, whether `FunctionOptions::mutated_inputs` lists them or not.
  /// A backend that reports any must report the writes to memory that is not the pool's (the
  /// caller's inputs, padded copies); writes to pool memory it may leave out. Empty where the
  /// backend cannot tell (cgt.cuda).
  std::vector<std::uint32_t> written_inputs;
  /// Set by a warm-up (`RunMode::warmup`) whose outputs a graph could not hand out
  /// (`Cause::unsupported_output`: cgt.torch's sparse, nested or mkldnn tensors). The backend has
  /// copied those outputs out of the pool, so `values` are the call's to hand out as they are; the
  /// engine does, and runs these shapes eagerly from then on, without running the function again.
  std::optional<Error> ungraphable;
  /// What a warm-up (`RunMode::warmup`) asked of the pool's arena, in order (null: a backend
  /// without an arena, or another mode): the engine keeps the last one per shape, and the device
  /// predicts from it what the shape's recording will add to the pool (`Device::predict_growth`).
  std::shared_ptr<const ArenaTrace> allocations;
};

/// The user's callable, type-erased by the backend; only the backend that made it calls it.
class Invoker {
 public:
  virtual ~Invoker() = default;
};

/// Book-keeping of the pool's allocator at one moment (`getCheckpointState`).
class Checkpoint {
 public:
  virtual ~Checkpoint() = default;
};

/// One captured graph with its input slots and the outputs it hands out on replay.
class Recording {
 public:
  virtual ~Recording() = default;
  /// Whether `check` can refuse anything (read once, when the recording is kept; the engine skips
  /// `check` otherwise). Default: no.
  [[nodiscard]] virtual bool checks_arguments() const noexcept { return false; }
  /// Whether `replay(args)` takes these arguments: what a replay would refuse for the caller's
  /// reasons (an input layout its copies cannot read), checked before the engine releases the
  /// memory the replay overwrites, so that a refused call changes nothing. ENSURES on success:
  /// `replay(args)` fails only for the device's reasons. Default: nothing is refused.
  [[nodiscard]] virtual Result<void> check(std::span<const ArgSlot> /*args*/) const { return {}; }
  /// Copies the copied inputs of `args` into the graph's input slots (an expanded dimension once)
  /// and launches the graph. REQUIRES: `check(args)` succeeded.
  [[nodiscard]] virtual Result<void> replay(std::span<const ArgSlot> args) = 0;
  /// Makes output `i` view the storage `storages[i]` (null: an output that is not pool memory).
  /// Called before handing out outputs whenever a storage handle changed since the last call.
  virtual void bind_outputs(std::span<StorageHandle* const> storages) = 0;
  /// The native value of output `i` after a replay; its address is stable while the recording lives.
  [[nodiscard]] virtual const void* output(std::size_t i) const = 0;
  /// Device memory its executable took when it was instantiated and uploaded (measured; 0 where
  /// it shares an earlier recording's executable, or the backend cannot tell).
  [[nodiscard]] virtual std::size_t executable_bytes() const noexcept { return 0; }
  /// Pool bytes of its input slots (the copied inputs' blocks, allocated while it lives).
  [[nodiscard]] virtual std::size_t slot_bytes() const noexcept { return 0; }
  /// What owns the values `output(i)` points to, where that is not the recording itself: the
  /// leases of its past replays read them (they do not own them), so an evicted recording
  /// (`OverBudget::evict_coldest`) is destroyed, its executable and memory given back, while this
  /// is kept. Null (the default): the recording owns them, and an evicted one is kept whole.
  [[nodiscard]] virtual std::shared_ptr<const void> outputs_owner() const { return nullptr; }
};

/// How a recording makes the function's loops and branches (`loop_while`, `if_then`, `switch_on`).
enum class ControlFlow : std::uint8_t {
  /// Conditional graph nodes: the GPU decides at each replay, in one launch. A body that cannot be
  /// one gives the recording up with `CaptureOutcome::needs_host_decisions`.
  on_device,
  /// Segments of the graph between the decisions, launched one by one at each replay, the host
  /// reading each decision between them (:host_decisions).
  on_host,
};

/// Where `Device::predict_growth` starts from.
enum class GrowthFrom : std::uint8_t {
  now,         ///< the pool as it is: what the recording would add
  empty_pool,  ///< a pool with no memory: the least the recording takes
};

/// What a recording needs to know besides the function and its arguments.
struct RecordPlan {
  std::span<const bool> copy_input;  ///< per input: copy into a pool slot (else pass as is)
  /// When re-recording because a static input moved: the recording made for the old address
  /// (same function, same place in the tree). It stays in the tree and may replay again; the
  /// capture pipeline may load the new graph into its executable (`Capture::load_into`).
  Recording* replaces = nullptr;
  ControlFlow control_flow = ControlFlow::on_device;
};

/// Failures the pool acts on carry their kind in `Error::cause`, never in the message. The
/// capture pipeline (src/core/capture_pipeline.cpp) makes the two below from what the backend's
/// `Capture` reports:
///  * `Cause::uncapturable`: the capture itself broke for a reason that will not change on another
///    call (an operation that cannot be captured, such as a synchronisation with the host); the
///    engine runs that function at those shapes eagerly from then on;
///  * `Cause::wrote_copied_input`, with `Error::input` set, in `Recorded::not_kept`: the function
///    wrote to an input it was given as a copy (a pool slot, `RecordPlan::copy_input`); its graph
///    ran once and the write was copied back to the caller's input (`Capture::write_back`), but a
///    replay would write the slot only: the graph is not kept, and the input counts as mutated.
[[nodiscard]] inline bool is_capture_failure(const Error& error) noexcept {
  return error.cause == Cause::uncapturable;
}

/// A recording and the outputs of its first run.
struct Recorded {
  std::unique_ptr<Recording> recording;
  RunResult first_outputs;
  /// Set when the graph ran once, for this call, but must not be replayed (the capture pipeline's
  /// verdict): `Cause::wrote_copied_input` (the function wrote an input it reads through a slot;
  /// the write was copied back to the caller's input) or `Cause::nested_pool` (another pool ran on
  /// another thread during the capture: the graph may hold what that call computed). The engine
  /// hands `first_outputs` out as a warm-up's and drops the recording: the function's work ran
  /// once, and runs no second time in this call.
  std::optional<Error> not_kept;
};

/// How a capture went (`Capture::capture`). Two facts, because the pipeline decides on both: a
/// broken capture is `uncapturable` whatever the function returned; a function that failed in an
/// intact capture fails the call with its own error.
struct CaptureOutcome {
  /// The captured work's result: the function's error (it threw, ran out of pool memory), or the
  /// device's where it failed at work of its own in the capture (beginning it, the input copies).
  Result<void> work;
  /// The capture itself broke or cannot end: the function did something a graph cannot hold.
  bool broken = false;
  /// With `broken`: what the device saw, in words for the message ("cudaErrorStreamCaptureInvalidated
  /// (...): the function's work cannot be captured ..."); the pipeline prefixes "capture failed: ".
  std::string broken_because;
  /// With `broken`, in a `ControlFlow::on_device` recording: only a loop or branch broke it (its
  /// body cannot be a conditional node, or the device has none). The pipeline makes it
  /// `Cause::conditional_unavailable`: the engine records the shape next with `ControlFlow::on_host`.
  bool needs_host_decisions = false;
};

/// `result` without its value: its error, or success (a capture's `CaptureOutcome::work` from the
/// function's outputs, say).
template <class T>
[[nodiscard]] Result<void> status_of(const Result<T>& result) {
  if (result) return {};
  return std::unexpected(result.error());
}

/// When a backend knows which inputs a recording's function wrote (`Capture::written_inputs`).
enum class WritesKnown : std::uint8_t {
  never,            ///< it cannot tell (cgt.cuda): `written_inputs` is empty
  at_capture,       ///< once the capture ended, before anything ran (cgt.torch: version counters)
  after_first_run,  ///< only once the graph ran (the host: bytes compared)
};

/// Nodes of a captured graph replaced by kernel nodes before instantiation, and those kept
/// (`Capture::rewrite_nodes`); the pipeline adds them to the device's `GraphCounts`.
struct NodeRewrites {
  std::uint64_t memsets_rewritten = 0;
  std::uint64_t memsets_kept = 0;
  std::uint64_t memcpys_rewritten = 0;
  std::uint64_t memcpys_kept = 0;
};

/// One recording in progress (`Device::begin_recording`): the device's primitives, which the
/// capture pipeline in src/core calls in this order, each at most once, stopping at the first
/// failure: `make_slots`, `capture`, `written_inputs` (when `writes_known()` is `at_capture`),
/// `settle_outputs`, `rewrite_nodes`, `load_into` (for a re-recording the device lets update in
/// place) or else `instantiate`, `run_first`, `written_inputs` (when it is `after_first_run`),
/// `write_back` (when the function wrote a copied input), `finish`. The decisions between the steps (which failure is
/// which `Cause`, update in place or instantiate, what is counted) are the pipeline's; a primitive does its one piece
/// of device work and reports what happened.
///
/// Destroying a capture that did not finish discards everything it allocated or captured: its
/// slots, the function's outputs and temporaries, its graph and any executable, so that the
/// pool's allocator holds only what it held before `begin_recording` (the engine then restores
/// its checkpoint). A failure of any step is therefore just an error returned.
class Capture {
 public:
  virtual ~Capture() = default;

  /// Copies the inputs that `RecordPlan::copy_input` marks into new slots in the pool; the
  /// function then sees the slots in their place. ENSURES on failure: nothing captured.
  [[nodiscard]] virtual Result<void> make_slots() = 0;
  /// Captures the function (with the slots' input copies, where the graph makes them) into a
  /// graph in the pool, allocating there. REQUIRES: `make_slots` succeeded. ENSURES: the stream
  /// is no longer capturing, whatever happened; with `work` failed or `broken`, there is no graph.
  [[nodiscard]] virtual CaptureOutcome capture() = 0;
  /// When `written_inputs` knows the inputs the function wrote. Read once, after `capture`.
  [[nodiscard]] virtual WritesKnown writes_known() const noexcept { return WritesKnown::never; }
  /// The inputs the function wrote in place, by index, as far as the device can tell: every input
  /// it copied (a write to a slot), and every input outside the pool; writes to pool memory it may
  /// leave out (as `RunResult::written_inputs`). REQUIRES: the moment `writes_known()` names.
  [[nodiscard]] virtual std::vector<std::uint32_t> written_inputs() const { return {}; }
  /// Settles the function's outputs: refuses a value the pool cannot hand out (an `Error` with
  /// `Cause::unsupported_output`, or `invalid_argument` for a view outside its storage) and frees
  /// the call's pool memory that no output views. REQUIRES: a graph (`capture` neither failed nor broke).
  [[nodiscard]] virtual Result<void> settle_outputs() = 0;
  /// Replaces the graph's nodes that cost launch time (memset, and one-row memcpy nodes where the
  /// device's options ask) by kernel nodes, before anything compares or instantiates the graph.
  /// Default: a device without such nodes, nothing. ENSURES on failure: the graph is unusable.
  [[nodiscard]] virtual Result<NodeRewrites> rewrite_nodes() { return NodeRewrites{}; }
  /// The device's option to update an earlier recording's executable in place
  /// (`PoolOptions::update_graphs_in_place`). Default: no executables to update.
  [[nodiscard]] virtual bool allows_update_in_place() const noexcept { return false; }
  /// Loads the graph into the executable of `earlier` (`RecordPlan::replaces`) when it can hold it
  /// (same topology; cgt.torch: and `earlier` draws no random numbers); the two recordings then
  /// share that executable, and `earlier` loads its own graph back before its next replay.
  /// Returns whether it did. REQUIRES: `earlier` is a recording of this device.
  [[nodiscard]] virtual Result<bool> load_into(Recording& /*earlier*/) { return false; }
  /// Makes the graph's own executable (and uploads it where the device does). Default: a device
  /// whose graphs need none (the host).
  [[nodiscard]] virtual Result<void> instantiate() { return {}; }
  /// Runs the graph once (capture ran nothing): it copies the inputs and produces the first
  /// outputs. REQUIRES: `load_into` returned true or `instantiate` succeeded.
  [[nodiscard]] virtual Result<void> run_first() = 0;
  /// Copies what the first run wrote to the slots of `inputs` (copied inputs the function wrote in
  /// place) back into the caller's inputs, ordered after that run: the write reaches the caller's
  /// input once, as an eager run's would. The pipeline then hands the run's outputs out without
  /// keeping the graph (a replay would write the slot only). REQUIRES: `run_first` succeeded; each
  /// of `inputs` is copied. Default: a device that sees no writes (it is never asked).
  [[nodiscard]] virtual Result<void> write_back(std::span<const std::uint32_t> /*inputs*/) { return {}; }
  /// The recording and the outputs of its first run (`written_inputs` left empty: the pipeline
  /// fills it). REQUIRES: `run_first` succeeded. ENSURES: the capture holds nothing any more.
  [[nodiscard]] virtual Result<Recorded> finish() = 0;
  /// Where the device counts how its graphs came to be (its `graph_counts()`), which the pipeline
  /// updates; null for a device without executables (the host).
  [[nodiscard]] virtual GraphCounts* counts() noexcept { return nullptr; }
};

/// Why the engine gives up a storage.
enum class Release : std::uint8_t {
  dead,       ///< the last lease on it was dropped
  reclaimed,  ///< a new step reclaimed it while leases may still exist
};

/// How a call runs without recording.
enum class RunMode : std::uint8_t {
  eager,   ///< plain execution outside the pool
  warmup,  ///< execution allocating in the pool, on the pool's stream
};

/// A backend's callable as the engine holds it (`Backend::make_invoker`).
template <class Callable>
struct InvokerOf final : Invoker {
  explicit InvokerOf(Callable&& callable) : fn(std::move(callable)) {}
  Callable fn;
};

/// The inputs of a call, by position, as a backend's function receives them: values, and scalars
/// where the call passed integers. `cgt::host::Inputs`, `cgt::cuda::Inputs` and `cgt::torch::Inputs`
/// are this over their value type. A view: valid during the call.
template <class Value>
class Inputs {
 public:
  Inputs(std::span<const Value> values, std::span<const std::int64_t> scalars) noexcept
      : values_(values), scalars_(scalars) {}
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }
  /// Input `i` as a value (an empty buffer, an undefined tensor, where the call passed a scalar).
  [[nodiscard]] const Value& operator[](std::size_t i) const noexcept { return values_[i]; }
  /// Input `i` as a scalar (0 where the call passed a value).
  [[nodiscard]] std::int64_t scalar(std::size_t i) const noexcept { return scalars_[i]; }
  /// All inputs as a vector, so a function may be written over `std::vector<Value>`.
  operator std::vector<Value>() const {
    return {values_.begin(), values_.end()};
  }  // NOLINT(google-explicit-constructor)

 private:
  std::span<const Value> values_;
  std::span<const std::int64_t> scalars_;
};

/// The arguments of a call as a backend's function sees them: the values (default where the call
/// passed a scalar) and the scalars (0 where it passed a value). `view()` is the function's `Inputs`.
template <class Value>
struct CallInputs {
  explicit CallInputs(std::span<const ArgSlot> args) : values(args.size()), scalars(args.size(), 0) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args[i].kind == ArgKind::scalar) {
        scalars[i] = args[i].scalar;
      } else {
        values[i] = *static_cast<const Value*>(args[i].value);
      }
    }
  }
  [[nodiscard]] Inputs<Value> view() const noexcept { return {values, scalars}; }
  std::vector<Value> values;
  std::vector<std::int64_t> scalars;
};

/// Thrown by an arena backend's `Context::allocate` when the pool is exhausted; the call then fails
/// with `out_of_memory` (`call_function`). `cgt::host::OutOfMemory` and `cgt::cuda::OutOfMemory`.
class OutOfMemory : public std::exception {
 public:
  explicit OutOfMemory(std::string message) : message_(std::move(message)) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// Thrown by an arena backend's `Context::allocate` for sizes no buffer can have (negative, too many
/// dimensions, a byte count that overflows); the call then fails with `invalid_argument`.
class InvalidArgument : public std::exception {
 public:
  explicit InvalidArgument(std::string message) : message_(std::move(message)) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// Calls a user's pool function, turning what it throws into an error: `OutOfMemory` into
/// `out_of_memory`, `InvalidArgument` into `invalid_argument`, anything else into `function_failed`.
template <class Function, class... Args>
Result<std::invoke_result_t<Function&, Args...>> call_function(Function& fn, Args&&... args) {
  try {
    return fn(std::forward<Args>(args)...);
  } catch (const OutOfMemory& error) {
    return fail(Errc::out_of_memory, std::string("the pool's memory is exhausted: ") + error.what());
  } catch (const InvalidArgument& error) {
    return fail(Errc::invalid_argument, std::string("the function allocated a buffer with bad sizes: ") + error.what());
  } catch (const std::exception& error) {
    return fail(Errc::function_failed, std::string("the function threw: ") + error.what());
  } catch (...) {
    return fail(Errc::function_failed, "the function threw an exception that is not a std::exception");
  }
}

/// The address of memory, as the engine identifies storages and blocks.
inline std::uintptr_t address_of(const void* pointer) noexcept {
  return reinterpret_cast<std::uintptr_t>(pointer);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

/// The memory at `address` (the inverse of `address_of`).
inline std::byte* pointer_to(std::uintptr_t address) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast,performance-no-int-to-ptr): inverse of address_of
  return reinterpret_cast<std::byte*>(address);
}

/// An input padded for a bucketed call (`Device::pad`): a new native value in memory of its own
/// (not the pool's), which `owner` keeps alive, and its description, whose sizes and strides point
/// into that value.
struct Padded {
  std::shared_ptr<const void> owner;
  const void* value = nullptr;
  ArgDesc desc;
};

/// A device with a checkpointable memory pool, a stream that runs or captures, and graphs.
/// These members are the engine's: a backend's device class declares its overrides, and
/// using-declarations of those it does not override, private, so that the device a program
/// reaches with `pool.device()` offers only the backend's own members (tests/device_surface.hpp
/// checks each backend against the members a program could name).
class Device {
 public:
  virtual ~Device() = default;

  /// The name of the backend's element-type code `dtype` (`ArgDesc::dtype`), for messages: "f32".
  [[nodiscard]] virtual std::string type_name(std::uint16_t dtype) const { return "type " + std::to_string(dtype); }

  /// Index of the device whose memory the pool manages; inputs elsewhere run eagerly.
  [[nodiscard]] virtual std::int32_t device_index() const noexcept = 0;

  /// Whether `begin_call` and `end_call` do anything (read once; the engine skips them otherwise).
  [[nodiscard]] virtual bool scopes_calls() const noexcept { return false; }
  /// At the start of every call, before anything changes: refuses a call that the device cannot
  /// serve from where it is made (cgt.torch: the caller's current stream is capturing a graph of
  /// the program's own, which would take the pool's work into that graph: `Errc::nested_capture`),
  /// and makes what the call's work needs current (cgt.torch: the pool's context, whatever the
  /// caller's is). ENSURES on success: `end_call` follows, once, when the call is done, on this
  /// thread; on failure nothing changed. Default: nothing.
  [[nodiscard]] virtual Result<void> begin_call() { return {}; }
  /// The call that `begin_call` began is done, whatever it did: puts back what it changed (the
  /// caller's context).
  virtual void end_call() noexcept {}

  /// Runs the function once, eagerly or as a warm-up in the pool.
  [[nodiscard]] virtual Result<RunResult> run(Invoker& fn, std::span<const ArgSlot> args, RunMode mode) = 0;
  /// Starts recording `fn` over `args` as `plan` says: a `Capture` whose primitives the capture
  /// pipeline then calls (see there). REQUIRES: `fn`, `args` and `plan` outlive the capture.
  /// ENSURES: nothing allocated or captured yet, or on failure.
  [[nodiscard]] virtual Result<std::unique_ptr<Capture>> begin_recording(Invoker& fn, std::span<const ArgSlot> args,
                                                                         const RecordPlan& plan) = 0;

  /// The allocator's book-keeping now.
  [[nodiscard]] virtual Result<std::unique_ptr<Checkpoint>> checkpoint() = 0;
  /// Puts the allocator back to `checkpoint`, keeps the blocks of `live` allocated (and owned by
  /// the allocator again), then frees the blocks at `dead` (each once).
  [[nodiscard]] virtual Result<void> restore(const Checkpoint& checkpoint, std::span<StorageHandle* const> live,
                                             std::span<const std::uintptr_t> dead) = 0;
  /// Gives up a storage: frees its block if the allocator owns it, and makes any native value
  /// that escaped its lease unusable (libtorch: poisons the storage, naming `function`).
  virtual void release(StorageHandle& storage, Release why, std::string_view function) = 0;
  /// Whether `release` must be called for a storage the allocator does not own and that has no
  /// native record (the host backend: only to poison dead memory). Read once.
  [[nodiscard]] virtual bool releases_unowned_storage() const noexcept { return true; }
  /// Prepares a handle for a storage that a replay hands out afresh (e.g. a non-owning storage).
  virtual void adopt(StorageHandle& storage) = 0;

  /// Copies a storage out of the pool, for `Options::copy_out_on_new_step`.
  [[nodiscard]] virtual Result<std::shared_ptr<void>> rescue(const StorageHandle& storage) = 0;
  /// A value like `value`, viewing the rescued copy of `from` instead of pool memory.
  [[nodiscard]] virtual std::shared_ptr<const void> rebase(const void* value, const StorageHandle& from,
                                                           const std::shared_ptr<void>& rescued) = 0;

  /// Whether `storage` (a value's base address) is memory of this pool. The engine refuses an input
  /// in pool memory that no live lease holds (an escaped value whose memory was reclaimed).
  /// Backends whose stale values fail on their own (libtorch's poisoned storages) may answer false.
  [[nodiscard]] virtual bool owns(std::uintptr_t /*storage*/) const noexcept { return false; }

  /// Records in a value the pool hands out the life number of its memory (a number that
  /// changes whenever that memory dies and lives again). Backends whose values carry one (host,
  /// cuda) let the engine tell a live value from an escaped copy of a dead one at the same
  /// address; `owns` must then answer for their memory. The value is the backend's own object.
  virtual void stamp(const void* /*value*/, std::uint64_t /*life*/) const noexcept {}
  /// Whether `stamp` does anything (read once; the engine skips the call otherwise).
  [[nodiscard]] virtual bool stamps_values() const noexcept { return false; }

  // --- batch buckets (`FunctionOptions::buckets`); a backend without them says why ---
  /// Empty when `pad` and `slice` work; else why they do not, for the `invalid_argument` error of
  /// `add_function` with buckets.
  [[nodiscard]] virtual std::string why_no_buckets() const { return "this backend cannot pad inputs or slice outputs"; }
  /// A contiguous copy of `value` (described by `desc`, whose size along `dim` is smaller than
  /// `size`) grown along `dim` to `size`, the added elements filled as `pad` says, in memory
  /// outside the pool (the engine copies it into the graph's input slot like any caller's input).
  [[nodiscard]] virtual Result<Padded> pad(const void* /*value*/, const ArgDesc& /*desc*/, std::size_t /*dim*/,
                                           std::int64_t /*size*/, Pad /*pad*/) {
    return fail(Errc::invalid_argument, why_no_buckets());
  }
  /// Copies the first `rows` elements along `dim` of `padded` (a value `pad` made) into `original`
  /// (the input it was made from, `rows` long along `dim`): a function wrote to a padded copy,
  /// and the write must reach the caller's input. Ordered after the call's work.
  [[nodiscard]] virtual Result<void> write_back(const void* /*padded*/, const void* /*original*/, std::size_t /*dim*/,
                                                std::int64_t /*rows*/) {
    return fail(Errc::invalid_argument, why_no_buckets());
  }
  /// A view of `value`'s first `size` elements along `dim` when its size along `dim` is `bucket`;
  /// null when it is not (or it has no `dim`): the engine then hands it out whole. `storage` is
  /// the handle of the pool memory it views (null: not pool memory): a view the backend tracks
  /// (libtorch's escape check) is registered with it, as the value itself is.
  [[nodiscard]] virtual Result<std::shared_ptr<const void>> slice(const void* /*value*/,
                                                                  const StorageHandle* /*storage*/, std::size_t /*dim*/,
                                                                  std::int64_t /*bucket*/, std::int64_t /*size*/) {
    return fail(Errc::invalid_argument, why_no_buckets());
  }

  /// The sizes of a value the pool hands out (empty: none, or not known to the backend): the
  /// engine looks for a bucket's size on the dimensions it does not slice.
  [[nodiscard]] virtual std::vector<std::int64_t> sizes_of(const void* /*value*/) const { return {}; }

  /// What recording `args` as `plan` says will add to the pool's reserved memory, given what the
  /// shape's warm-up asked (`RunResult::allocations`): its input slots first, then the function's
  /// work as the warm-up did it; from the pool's state now (`GrowthFrom::now`), or from a pool with
  /// no memory (`GrowthFrom::empty_pool`: the least the recording takes). Empty where the backend
  /// cannot tell.
  [[nodiscard]] virtual std::optional<std::size_t> predict_growth(const ArenaTrace& /*warmup*/,
                                                                  std::span<const ArgSlot> /*args*/,
                                                                  const RecordPlan& /*plan*/,
                                                                  GrowthFrom /*from*/) const {
    return std::nullopt;
  }
  /// Gives back to the system the pool memory that no allocated block, kept checkpoint or living
  /// recording uses (after the engine dropped recordings); returns the bytes. Default: none.
  virtual std::size_t release_unused() { return 0; }

  /// Gives back the physical memory of the pool's segments while its graphs stay recorded over
  /// their addresses (`Pool::sleep`); returns the bytes given back. REQUIRES (the engine's): no
  /// lease holds pool memory. Default: `invalid_argument`, the backend cannot.
  [[nodiscard]] virtual Result<std::size_t> sleep() {
    return fail(Errc::invalid_argument, "this backend cannot give a pool's memory back while keeping its graphs");
  }
  /// Takes the memory `sleep` gave back again, at the same addresses. Fails with `out_of_memory`
  /// where the system refuses (still asleep then). Default: nothing to do.
  [[nodiscard]] virtual Result<void> wake() { return {}; }
  /// Whether `sleep` gave the memory back and no `wake` took it since.
  [[nodiscard]] virtual bool asleep() const noexcept { return false; }
  /// The bytes `sleep` gave back (0 while awake).
  [[nodiscard]] virtual std::size_t asleep_bytes() const noexcept { return 0; }

  /// Allocated blocks of the pool.
  [[nodiscard]] virtual std::vector<Block> live_blocks() const = 0;
  [[nodiscard]] virtual MemoryInfo memory() const = 0;
  /// Releases graphs' device resources and the pool's memory that nothing holds.
  virtual void shutdown() = 0;
};

}  // namespace cgt::backend
