// cgt.core:engine (internal) — the tree engine's state: functions and their shape variants, the tree
// (its nodes and cells are :tree's), the path (:path), the ledger (:ledger). The per-call algorithm
// lives in the engine_*.cpp units beside this file.
module;
#include <expected>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gsl/pointers>

#include "capture_gate.hpp"
#include "generation_rule.hpp"

export module cgt.core:engine;
import cgt.vocabulary;
import :spi;
import :detail;
import :tree;
import :path;
import :ledger;
import :functions;
import :pool_memory;
import :budget;
import :events;

namespace cgt::detail {

/// The part `function` plays for the generation rule (its `FunctionOptions::mode`).
[[nodiscard]] inline CallRole role_of(const FunctionRecord& function) noexcept {
  switch (function.options.mode) {
    case FunctionMode::forward: return CallRole::forward;
    case FunctionMode::backward: return CallRole::backward;
    case FunctionMode::inference: break;
  }
  return CallRole::inference;
}

/// How a bucketed call padded its arguments (`CallFrame::padding`).
struct Padding {
  std::span<const backend::ArgSlot> caller_args;
  std::size_t dim = 0;
  std::int64_t rows = 0;  ///< the caller's size along `dim`
};

/// One call in flight: its arguments and what the engine learned about them.
struct CallFrame {
  std::span<const backend::ArgSlot> args;
  std::span<const backend::ArgDesc> descs;
  gsl::not_null<FunctionRecord*> function;
  Variant* variant = nullptr;  ///< null until the call's shape variant is chosen
  /// Recording because a static input moved: the node recorded at the old address, whose graph
  /// the backend may update for the new one instead of instantiating another.
  TreeNode* rerecording_of = nullptr;
  /// The generation at the call's start: a `mark_step_begin()` from inside the function belongs
  /// to the next call, which must see it.
  std::uint64_t generation = 0;
  /// The call's key is that of the function's last variant (`FunctionRecord::last_variant`): its
  /// signature and graph size are known good.
  bool same_shapes_as_last = false;
  /// Per input (empty: none), of a bucketed call: copied into a slot when recording even if it is
  /// an output of the path, so that a call at a bucket's own size and a padded one (whose padded
  /// copy is never pool memory) share one recording.
  std::span<const bool> always_copied;
  /// Of a padded call: the caller's own arguments and how they were padded. A write the function
  /// makes to a padded copy is copied back into the caller's input (`take_writes`).
  const Padding* padding = nullptr;
  /// Why no graph can serve the call's shape, where a stage that looks at it found that
  /// (`select_variant`: another device, a size not in `graph_sizes`, a key past the limit;
  /// `run_bucketed`: no bucket for its size, a mutated input it would pad), or that a recording
  /// given back found for this call only (`after_failed_recording`: out of memory; a conditional
  /// node that cannot be made). `eager_reason`, the one place that decides, runs the call eagerly
  /// for it.
  std::optional<Reason> unfit;
  /// Set by the tree when it gives the call back undone (`Engine::give_back`): a recording given
  /// up before its graph ran, or a re-record limit just passed, changed what `eager_reason` says
  /// of the variant. Nothing of the function's work ran then, so the next decision runs it once.
  bool given_back = false;
};

/// One caller of a pool at a time (`detail::call`, `PoolBase::shutdown`), from any thread: the busy
/// flag's owner. `Engine::add_function` refuses to run while it is taken.
class OneCaller {
 public:
  /// Takes the pool for a call or a shutdown; false while another caller has it (`concurrent_use`).
  [[nodiscard]] inline bool try_take() noexcept {
    bool idle = false;
    return taken_.compare_exchange_strong(idle, true, std::memory_order_acquire);
  }
  /// REQUIRES: this caller's `try_take` succeeded.
  inline void release() noexcept { taken_.store(false, std::memory_order_release); }
  /// A call or a shutdown is in flight, on some thread.
  [[nodiscard]] inline bool is_taken() const noexcept { return taken_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> taken_{false};
};

/// Gives the call back to `Engine::run_decided` undone (`CallFrame::given_back`). REQUIRES: nothing
/// of the function's work ran in this call.
[[nodiscard]] inline Result<CallOutputs> give_back(CallFrame& frame) {
  frame.given_back = true;
  return CallOutputs{};
}

/// Whether the call writes an input that a graph would copy into a slot, where the write would be
/// lost (declared mutated, or seen written, and neither usable in place nor an output of `path`);
/// says so once per function. (engine_eager.cpp)
[[nodiscard]] bool mutates_unmanaged_input(const CallFrame& frame, const Path& path, Events& events);

/// Fails for an output in pool memory that the call neither allocated nor received as an input
/// (a buffer the function kept from an earlier call): the pool may have given it to another lease.
/// (engine_eager.cpp)
[[nodiscard]] Result<void> check_outputs_are_ours(const backend::RunResult& result, const CallFrame& frame);

/// What `Engine::begin_generation` counts and warns about, when a forward began a generation or was
/// held: warns once per function when pending backwards make a forward repeat itself down `path`
/// instead of replaying (PyTorch's `check_warn_on_unable_to_start_executing`). (engine_generation.cpp)
void note_generation(const CallGeneration& call, FunctionRecord& function, Stats& stats, const Path& path,
                     const Functions& functions, Events& events);

/// Keeps in the variant that these shapes run eagerly from now on, for `reason` (the capture broke,
/// another pool was called, an output cannot be handed out), and says so once. (engine_record.cpp)
void run_eagerly_from_now_on(CallFrame& frame, const Error& error, Reason reason, Events& events);

/// The engine of one pool (PyTorch's `CUDAGraphTreeManager`). Its state and the steps of a call
/// (engine_*.cpp) are private; each step is a member only where it needs the state as a whole, and
/// each rule it applies is an owner's (functions, tree, path, pool memory, ledger, generation rule,
/// events). The public part is what the handles and the lease units reach: the handle count, the
/// one caller, the entry points, and read-only views; each says which lock it needs.
class Engine final {
 public:
  Engine(std::unique_ptr<backend::Device> device, Options options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // --- the handles sharing the engine (`retain`, `release`): any thread ---
  inline void add_references(std::uint32_t count) noexcept { refs_.fetch_add(count, std::memory_order_relaxed); }
  /// Drops `count` references; the last one deletes the engine. The one place that rule is
  /// written (`detail::release`, a call's hold and a call's leases all come here).
  inline void drop_references(std::uint32_t count) noexcept {
    // The last handle may go on any thread; acq_rel orders every use before the delete.
    if (refs_.fetch_sub(count, std::memory_order_acq_rel) == count) {
      delete this;  // NOLINT(cppcoreguidelines-owning-memory): counted ownership
    }
  }
  /// One caller at a time: any thread, no lock.
  [[nodiscard]] inline OneCaller& caller() noexcept { return caller_; }

  // --- what the handles do ---
  /// Runs a call of `function` (`call_locked`). REQUIRES: this caller took `caller()` and holds the
  /// state, as `detail::call` does.
  [[nodiscard]] inline Result<CallOutputs> call(std::uint32_t function, const ArgSource& source) {
    return call_locked(functions_[function], source);
  }
  /// Registers a function (`detail::add_function`). Fails with `concurrent_use` during a call,
  /// `pool_shut_down` after `shutdown()`, `invalid_argument` for buckets that cannot be meant.
  [[nodiscard]] Result<std::uint32_t> add_function(std::unique_ptr<backend::Invoker> invoker, FunctionOptions options);
  /// Frees the tree and the device's memory; returns the functions' callables, for the caller to
  /// destroy once it let go of the state. REQUIRES: this caller took `caller()`, and holds the state.
  [[nodiscard]] std::vector<std::unique_ptr<backend::Invoker>> shutdown();
  /// Gives the pool's memory back while its graphs stay recorded (`Pool::sleep`, engine_sleep.cpp):
  /// fails with `invalid_argument` while a lease holds pool memory, `pool_shut_down` after
  /// `shutdown()`. ENSURES on success: the path ended; the device asleep; the next call (or `wake`)
  /// takes the memory back first. REQUIRES: this caller took `caller()` and holds the state.
  [[nodiscard]] Result<std::size_t> sleep();
  /// Takes the memory back (`Pool::wake`); `out_of_memory` where the device refuses (still asleep).
  /// REQUIRES: as `sleep`.
  [[nodiscard]] Result<void> wake();
  [[nodiscard]] inline bool is_asleep() const noexcept { return asleep_; }
  /// A new step begins at the next call (`GenerationRule::mark_step_begin`): any thread, no lock.
  inline void mark_step_begin() noexcept { generation_rule_.mark_step_begin(); }

  // --- reads: any thread ---
  /// Fixed when the engine is made.
  [[nodiscard]] inline const Options& options() const noexcept { return options_; }
  /// For the backend's own members (`Pool::device()`). What changes the allocator needs the state.
  /// Const as `std::unique_ptr` is: a const engine's device is still the device.
  [[nodiscard]] inline backend::Device& device() const noexcept { return *device_; }
  /// The functions: a function's name is read without the state (`function_name`: a
  /// `concurrent_use` report names the function while another thread's call holds the state); the
  /// rest REQUIRES the state held.
  [[nodiscard]] inline const Functions& functions() const noexcept { return functions_; }

  // --- reads for the handles, the lease units and the tree views. REQUIRES: the state held ---
  [[nodiscard]] inline const Stats& stats() const noexcept { return stats_; }
  [[nodiscard]] inline bool is_shut_down() const noexcept { return shut_down_; }
  [[nodiscard]] inline const GenerationRule& generation_rule() const noexcept { return generation_rule_; }
  [[nodiscard]] inline const Tree& tree() const noexcept { return tree_; }
  [[nodiscard]] inline const Path& path() const noexcept { return path_; }
  /// The pool's memory as the path holds it (`PoolMemory::check` is PyTorch's `check_memory_pool`).
  [[nodiscard]] inline const PoolMemory& pool_memory() const noexcept { return memory_; }
  /// The ledger: the lease handles drop through it from any thread (it takes the state or defers
  /// the drop), and `StateLock` holds the state through it.
  [[nodiscard]] inline Ledger& ledger() noexcept { return ledger_; }

 private:
  // --- the per-call algorithm (engine_call.cpp). The steps a replay takes are always_inline
  // there: a replay runs them as one function. ---
  /// The call as a script: its generation, the path ended first where it must, its arguments read
  /// and checked, the call run (`run_call`); on failure the path is put back and the generation
  /// taken back (`abandon_call`).
  Result<CallOutputs> call_locked(FunctionRecord& function, const ArgSource& source);
  /// The call once its generation is known and the path ended where it must: reads and checks the
  /// arguments into `slots` and `descs`, then runs the call (its shape variant, then the tree).
  Result<CallOutputs> run_call(FunctionRecord& function, const ArgSource& source, std::span<backend::ArgSlot> slots,
                               std::span<backend::ArgDesc> descs, std::vector<std::shared_ptr<const void>>& keep,
                               std::uint64_t generation);
  /// After a call that failed: the ended path put back, and the generation taken back unless a
  /// reclaim (`Path::reclaims`) since `reclaims_before` made the new generation irreversible.
  void abandon_call(const CallGeneration& generation, std::uint64_t reclaims_before) noexcept;
  /// The call's shape variant (`Functions::select`), made on its first call; null, with
  /// `CallFrame::unfit` set, where no graph can serve the shape, and null for a call a stage found
  /// unfit already (`run_bucketed`). Warns once when a function's keys pass the warn limit.
  Variant* select_variant(CallFrame& frame);
  /// The one place that decides whether a call runs eagerly: picks its shape variant, asks
  /// `eager_reason`, then runs the call eagerly or in the tree (`run_tree`); when the tree gave the
  /// call back undone (`CallFrame::given_back`), decides again (`decide_again`). The function's work
  /// runs once: the tree gives a call back only before any of it ran. (Every call comes through here;
  /// a call with its function's last shape key, the common one, goes straight on.)
  [[clang::always_inline]] Result<CallOutputs> run_decided(CallFrame& frame);
  /// `run_decided` once more, for a call the tree gave back; a second give-back is a bug
  /// (`invariant_violation`): the variant's state said what to do.
  Result<CallOutputs> decide_again(CallFrame& frame);
  /// Why the call must run eagerly, or none: the shape's facts (`CallFrame::unfit`), then the
  /// variant's decisions kept (a capture that failed for good, a re-record limit passed), then
  /// this call's inputs (a mutated input that a graph would copy). Logs what it decides per call.
  [[clang::always_inline]] std::optional<Reason> eager_reason(CallFrame& frame);

  /// Starts a call of `function` in the generation the rule says (`GenerationRule::begin_call`),
  /// counts a generation a forward began, and warns once where a pending backward keeps a forward
  /// off the fast path.
  [[clang::always_inline]] CallGeneration begin_generation(FunctionRecord& function);

  // --- the tree's part of a call (engine_tree.cpp) ---
  /// Warm-up, replay or recording (PyTorch's `_run` after its fallbacks).
  Result<CallOutputs> run_tree(CallFrame& frame);

  // --- batch buckets (engine_buckets.cpp) ---
  /// A call of a function with `buckets`: runs eagerly above the largest bucket, else pads the
  /// inputs up to the next bucket, runs that, and slices the outputs back to the call's size.
  Result<CallOutputs> run_bucketed(CallFrame& frame);

  // --- eager runs (engine_eager.cpp) ---
  /// Runs the call eagerly, outside the pool, for `reason`. Called by `run_decided` only.
  Result<CallOutputs> run_eager(CallFrame& frame, Reason reason);

  // --- warm-ups (engine_warmup.cpp) ---
  Result<CallOutputs> warm_up(CallFrame& frame);
  /// The outputs of a run in the pool that is not a graph (a warm-up, or a recording whose graph
  /// ran once and is not kept) handed out as a warm-up node's, which the path enters.
  CallOutputs keep_as_warmup(CallFrame& frame, backend::RunResult& result, NodeReason reason);
  /// Runs `run` (a warm-up or a recording, returning `Result<T>`, whose outputs `outputs_of`
  /// reads) in the pool, and takes the writes it made to its inputs (`take_writes`). If it
  /// fails, or returns pool memory it cannot have made, the pool is put back as it was and the
  /// error, told in terms of the call `doing` what, returned. (Below.)
  template <class T, class Run, class OutputsOf>
  Result<T> run_in_pool(const CallFrame& frame, const char* doing, Run run, OutputsOf outputs_of);

  // --- a call's leases (below) ---
  /// The one way a call's outputs become leases: `count` leases made in place, lease `i` on
  /// `cell_of(i)` (null: not pool memory) handing out `value_of(i)`, kept alive by `owner` (a
  /// `std::shared_ptr<const void>`) where the engine does not own the values (`NoOwner`: a
  /// replay's, the recording's outputs); then the leases the call consumed are dropped (after the
  /// outputs that may alias them took theirs). Cannot fail once the array is allocated.
  template <class CellOf, class ValueOf, class Owner>
  CallOutputs lease_outputs(const CallFrame& frame, CallKind kind, std::int64_t node, std::size_t count,
                            const CellOf& cell_of, const ValueOf& value_of, const Owner& owner);

  // --- replay (engine_replay.cpp) ---
  Result<CallOutputs> replay(TreeNode& node, CallFrame& frame);

  // --- recording (engine_record.cpp) ---
  /// Captures the function into a graph in the pool (rolled back if it fails), checkpoints the
  /// allocator and adds the node to the tree under the current node.
  Result<CallOutputs> record(CallFrame& frame, NodeReason reason);
  /// After a recording that failed before its graph ran: a failure that will not go away at these
  /// shapes is kept in the variant (`run_eagerly_from_now_on`, or `needs_own_warmup` for a shape
  /// that recorded without its own warm-up) and the call is decided again; one that only its loops
  /// or branches broke, as conditional nodes, runs eagerly and the shape's next recording has the
  /// host decide them (`Variant::control_flow_on_host`); others fail the call.
  Result<CallOutputs> after_failed_recording(CallFrame& frame, Error error);
  /// A recording whose graph ran once but must not be kept (`Recorded::not_kept`): its outputs are
  /// the call's, handed out as a warm-up's, and the variant learns why.
  CallOutputs keep_first_run_only(CallFrame& frame, backend::Recorded& recorded, const Error& why);
  /// What recording the call as `plan` says would add to the pool, from its shape's warm-up (empty:
  /// unknown).
  [[nodiscard]] std::optional<std::size_t> predict_recording(const CallFrame& frame, const backend::RecordPlan& plan,
                                                             backend::GrowthFrom from) const;
  /// Before a recording under a budget: makes room as `Options::over_budget` says (`Budget::
  /// make_room`); where there is none, the call is marked to run eagerly (`Reason::over_budget`,
  /// warned once per shape) and false returned.
  [[nodiscard]] bool fits_budget(CallFrame& frame, const backend::RecordPlan& plan);

  // --- writes to inputs that the options do not declare (engine_writes.cpp) ---
  /// After a run that wrote `written` (`RunResult::written_inputs`): treats each as mutated from
  /// now on (`Functions::note_write`, said once), and copies each write to a padded copy back into
  /// the caller's input.
  Result<void> take_writes(const CallFrame& frame, std::span<const std::uint32_t> written);

  // --- the state: each field says who writes it. The ledger's state lock (`StateLock`) guards
  // all of it but `refs_`, `caller_`, what is fixed when the engine is made, and what the ledger
  // and the generation rule keep atomic themselves. ---

  /// Handles that share the engine (pool, functions, leases, node views, a call in flight):
  /// `add_references` and `drop_references`; the last one deletes the engine, on whatever thread
  /// drops it.
  std::atomic<std::uint32_t> refs_{0};
  // Declared first, destroyed last: every recording below uses the device.
  std::unique_ptr<backend::Device> device_;
  const Options options_;
  std::int32_t device_index_ = 0;  ///< the device's, read once
  bool stamps_values_ = false;     ///< the device's stamps_values(), read once
  bool scopes_calls_ = false;      ///< the device's scopes_calls(), read once
  /// Counted by the steps of a call (engine_*.cpp), each counter where its event happens; the
  /// handles read a copy (`stats()`).
  Stats stats_;
  /// What the steps tell the program (events.cppm, the reports' one owner).
  Events events_{options_.log_sink, stats_};
  /// Taken by a call or a shutdown (`OneCaller`).
  OneCaller caller_;
  bool shut_down_ = false;  ///< set by `shutdown()`, never cleared
  bool asleep_ = false;     ///< set by `sleep()`, cleared by `wake()` (which a call runs first)

  /// The leases on the cells, the lives of their storages, and the state lock (ledger.cppm, the
  /// ledger's one owner).
  Ledger ledger_;

  /// The functions and their variants (functions.cppm, their one owner): `add_function` adds,
  /// `shutdown()` takes the callables; the records' and variants' decisions are written by the
  /// steps each field names.
  Functions functions_;
  Tree tree_;  ///< the recordings, and which child a call replays: `add_to_tree` adds, `shutdown()` clears
  /// The node the program is at, its state and warm-up nodes, and the path a new generation ended
  /// (path.cppm, the path's one owner). Its ended record is set by `end_path_if_over` when a new
  /// generation ends a path with live outputs, and gone before the call does work that may reuse
  /// their memory (`PoolMemory::release_ended`: a replay, a recording's checkpoint, a warm-up or eager run
  /// that succeeded), or when the call fails before that (`PoolMemory::put_back_ended`).
  Path path_;
  /// What the path's changes do to the pool's memory, and what a death does (pool_memory.cppm, the
  /// owner): the ledger's effects. Shut down by `shutdown()`.
  PoolMemory memory_{path_, *device_, functions_, options_, stats_, ledger_};
  /// Whether a recording fits `Options::memory_budget_bytes`, the graphs' use counter, eviction
  /// (budget.cppm, the owner): asked by `record`, touched by `record` and `replay`.
  Budget budget_{options_, tree_, path_, *device_, stats_};

  /// When a call begins a new generation (generation_rule.hpp, the rule's one owner).
  GenerationRule generation_rule_;
};

// --- read-only views of an engine, for the handles' introspection. REQUIRES: the state held ---

/// The function whose variant `node` ran.
[[nodiscard]] inline std::uint32_t function_of(const Engine& engine, const TreeNode& node) noexcept {
  return engine.functions().variant(node.variant()).function;
}
/// A graph node of the tree or a warm-up node of the path, by id; null if there is none.
/// (introspection.cpp)
[[nodiscard]] const TreeNode* find_node(const Engine& engine, std::int64_t id) noexcept;
/// The tree, its warm-up nodes and the current path in Graphviz DOT. (introspection.cpp)
[[nodiscard]] std::string to_dot(const Engine& engine);

/// Marks the thread as recording `function` of `engine` while it lives (PyTorch's trees are one
/// per device and cannot nest; cgt's pools can be many). A call of another pool's function on
/// this thread meanwhile is refused (`other_recording`), and the scope remembers that it was:
/// the recording lacks that call's work, whatever the function made of the refusal.
/// What this thread records: set by a RecordingScope, read by calls of other pools (every call asks).
struct RecordingOnThread {
  const Engine* engine = nullptr;
  const FunctionRecord* function = nullptr;
  bool refused = false;  ///< a call of another pool was refused meanwhile
};
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): each thread's own, written by it only
inline thread_local constinit RecordingOnThread recording_on_this_thread{};

class RecordingScope {
 public:
  RecordingScope(const Engine& engine, const FunctionRecord& function) noexcept;
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;
  /// A call of another pool was refused during this scope.
  [[nodiscard]] bool refused_a_call() const noexcept;
  /// The function that another pool than `engine` records on this thread, or null; a non-null
  /// answer counts as a refused call of that recording.
  [[nodiscard]] inline static const FunctionRecord* other_recording(const Engine& engine) noexcept {
    RecordingOnThread& recording = recording_on_this_thread;
    if (recording.engine == nullptr || recording.engine == &engine) return nullptr;
    recording.refused = true;
    return recording.function;
  }

 private:
  const Engine* previous_engine_;
  const FunctionRecord* previous_function_;
  bool previous_refused_;
};

/// `Engine::lease_outputs`' owner for values the engine owns itself (a replay's).
struct NoOwner {};

/// What a capture cannot see: calls of other pools while the function ran under it.
enum class OtherPoolCalls : std::uint8_t {
  none,
  /// On the capture's thread: refused (`nested_capture`), so the graph lacks that call's work.
  refused_here,
  /// On another thread, after waiting its limit at the gate (`CaptureGate`): the call ran, and the
  /// graph may read what it computed this once.
  overlapped,
};

/// The function under capture, watched for calls of other pools from construction to `finish`:
/// on this thread by a `RecordingScope`, on the others through the process's `CaptureGate`.
class WatchedCapture {
 public:
  WatchedCapture(const Engine& engine, const FunctionRecord& function)
      : scope_(engine, function), ticket_(CaptureGate::process().begin(&engine)) {}
  ~WatchedCapture() {
    if (!finished_) (void)finish();
  }
  WatchedCapture(const WatchedCapture&) = delete;
  WatchedCapture& operator=(const WatchedCapture&) = delete;
  /// The capture ended: what other pools' calls did meanwhile. Call once.
  [[nodiscard]] OtherPoolCalls finish() noexcept {
    finished_ = true;
    const bool overlapped = CaptureGate::process().end(ticket_);
    if (scope_.refused_a_call()) return OtherPoolCalls::refused_here;
    return overlapped ? OtherPoolCalls::overlapped : OtherPoolCalls::none;
  }

 private:
  RecordingScope scope_;
  std::uint64_t ticket_;
  bool finished_ = false;
};

/// Holds an engine's state for the current thread: a call, a handle drop, a read of a lease or
/// of introspection (`Ledger::hold`, ledger.cpp). Nested use on the thread that holds it (a pool
/// function dropping a lease, or reading stats) passes through. Letting go applies the drops other
/// threads deferred meanwhile (`Ledger::let_go`).
class StateLock {
 public:
  // Inline: every call takes it, and most lease drops.
  inline explicit StateLock(Engine& engine) noexcept : engine_(engine), nested_(!engine.ledger().hold()) {}
  inline ~StateLock() {
    if (!nested_) engine_.ledger().let_go();
  }
  StateLock(const StateLock&) = delete;
  StateLock& operator=(const StateLock&) = delete;

 private:
  Engine& engine_;
  bool nested_ = false;
};

/// Runs `read` on the engine of a handle under its state lock; `empty` for a moved-from handle.
template <class R, class Read>
R read_engine(const EngineRef& ref, R empty, Read read) {
  if (!ref) return empty;
  const StateLock lock(*ref);
  return read(*ref);
}

/// The capture pipeline (capture_pipeline.cpp): records `fn` over `args` into a graph on `device`,
/// as `plan` says, and runs it once. Every backend's recording takes these decisions here, once:
/// a broken capture fails with `Cause::uncapturable`; a function that failed in an intact capture
/// fails with its own error; a write to an input the plan copies is carried to the caller's input
/// after the first run and the graph is not kept (`Cause::wrote_copied_input`); a
/// re-recording updates the earlier executable in place when the device allows it and can, else
/// the graph is instantiated; node rewrites, instantiations and updates are counted in the
/// device's `GraphCounts`. The device supplies the primitives (`backend::Capture`).
/// ENSURES on failure: the capture is discarded (the caller restores the allocator's checkpoint).
/// `engine` and `function` are whose capture it is: while the function runs under capture, a
/// call of another pool on this thread is refused (`Cause::nested_pool`, before the graph ran), and
/// one on another thread that overlaps it makes the graph run once and not be kept
/// (`Recorded::not_kept`, as a write to a copied input does, once `Capture::write_back` carried it
/// to the caller's input). ENSURES: an error means nothing of the function's work ran, unless the
/// graph's first run or what follows it failed (a device error).
[[nodiscard]] Result<backend::Recorded> record_graph(backend::Device& device, backend::Invoker& fn,
                                                     std::span<const backend::ArgSlot> args,
                                                     const backend::RecordPlan& plan, const Engine& engine,
                                                     const FunctionRecord& function);

template <class T, class Run, class OutputsOf>
Result<T> Engine::run_in_pool(const CallFrame& frame, const char* doing, Run run, OutputsOf outputs_of) {
  auto before = memory_.snapshot(*frame.function, doing);
  if (!before) return std::unexpected(std::move(before.error()));
  Result<T> ran = run();
  Result<void> ours = ran ? check_outputs_are_ours(outputs_of(*ran), frame) : Result<void>();
  // Writes to inputs read in place (caller's, static, pool memory): the graph, if any, makes them too.
  if (ran && ours) ours = take_writes(frame, outputs_of(*ran).written_inputs);
  if (ran && ours) return ran;
  Error error = !ran ? in_call(std::move(ran.error()), *frame.function, doing) : std::move(ours.error());
  ran = Result<T>();  // the outputs go before the pool is put back
  // A lease dropped inside the function freed its block, which the snapshot still counts.
  if (auto restored = memory_.roll_back(*before); !restored) {
    error.message += "; restoring the pool also failed: " + restored.error().message;
  }
  return std::unexpected(std::move(error));
}

template <class CellOf, class ValueOf, class Owner>
CallOutputs Engine::lease_outputs(const CallFrame& frame, CallKind kind, std::int64_t node, std::size_t count,
                                  const CellOf& cell_of, const ValueOf& value_of, const Owner& owner) {
  const std::uint32_t function = frame.function->id;
  const std::uint64_t generation = generation_rule_.current();
  CallOutputs out;
  out.kind = kind;
  out.node = node;
  out.leases = LeaseArray(count, [&](LeaseCore* at, std::size_t i) noexcept {
    Cell* cell = cell_of(i);
    const void* value = value_of(i);
    ledger_.take_lease(cell, value, generation);
    ::new (at) LeaseCore(EngineRef::adopt(this), cell, value, function, static_cast<std::uint32_t>(i));
    if constexpr (!std::is_same_v<Owner, NoOwner>) at->owner = owner;
  });
  // Every lease's reference, counted at once, once the array exists (its allocation may throw; the
  // call's own reference keeps the engine meanwhile).
  add_references(static_cast<std::uint32_t>(count));
  // Leases the call consumed die now, after the outputs that may alias them took their leases.
  Ledger::consume(frame.args);
  return out;
}

}  // namespace cgt::detail
