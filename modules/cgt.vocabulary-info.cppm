// cgt.vocabulary:info — what a pool can tell about itself: counters, memory, kinds of calls and nodes.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <optional>
#include <vector>

export module cgt.vocabulary:info;
import :options;

export namespace cgt {

/// What one call did.
enum class CallKind : std::uint8_t {
  warmup,     ///< ran eagerly, allocating in the pool (first call of a function, or path warming up), or
              ///< recorded a graph that ran once and was not kept (`NodeReason::recording_not_kept`)
  recording,  ///< recorded a new graph (its outputs come from running that graph once)
  replay,     ///< replayed a recorded graph
  eager,      ///< fell back to plain execution outside the pool (see `Reason`)
};

/// The name of a call kind, e.g. "replay".
[[nodiscard]] std::string_view to_string(CallKind kind) noexcept;

/// What a node of the tree is.
enum class NodeKind : std::uint8_t {
  graph,   ///< a recording, replayed by later calls
  warmup,  ///< one warm-up run; lives on the current path until the path ends
};

/// Why a node was made.
enum class NodeReason : std::uint8_t {
  first_call,            ///< no node for this function existed at this place of the tree
  new_liveness_pattern,  ///< the outputs alive before or after the call differ from every sibling
  static_input_moved,    ///< a static input is at a new address
  managed_input_moved,   ///< an input from an earlier graph is at a new address
  path_warming_up,       ///< warm-up because an earlier call of this path was warming up
  forced_warmup,         ///< warm-up because `Options::force_warmup` is set
  /// A recording whose graph ran once, for its call, and was not kept (`Stats::recordings_not_kept`):
  /// the function wrote an input the graph reads through a copy (the write was copied back to the
  /// caller's input), or another pool ran on another thread during the capture. Its outputs are
  /// those of a warm-up node.
  recording_not_kept,
};

/// The name of a node reason, e.g. "new_liveness_pattern".
[[nodiscard]] std::string_view to_string(NodeReason reason) noexcept;

/// Counters of one pool since it was made.
struct Stats {
  std::uint64_t calls = 0;
  std::uint64_t warmups = 0;
  std::uint64_t recordings = 0;
  std::uint64_t replays = 0;
  std::uint64_t eager_calls = 0;  ///< fallbacks, all reasons
  /// Allocator checkpoints restored, to warm up or record after a replay (PyTorch's
  /// `debug_checkpointing_counter`).
  std::uint64_t checkpoint_restores = 0;
  /// Calls that found no replayable child and so recorded (PyTorch's `debug_fail_counter`).
  std::uint64_t failed_matches = 0;
  std::uint64_t rerecords = 0;  ///< recordings caused by static or managed inputs that moved
  /// Recordings whose graph ran once for its call and was not kept (`NodeReason::recording_not_kept`):
  /// counted as warm-ups too, since their outputs are handed out as a warm-up's.
  std::uint64_t recordings_not_kept = 0;
  std::uint64_t steps_reclaimed = 0;  ///< new steps that reclaimed outputs still leased
  /// Steps that a forward function began by itself (`FunctionMode::forward`), not `mark_step_begin()`.
  std::uint64_t steps_begun_by_forward = 0;
  std::uint64_t leases_invalidated = 0;  ///< leases turned `output_overwritten` by a new step
  std::uint64_t leases_copied_out = 0;   ///< leases rescued by `Options::copy_out_on_new_step`
  /// Calls of a bucketed function padded up to a bucket (`FunctionOptions::buckets`), whatever
  /// they then did (warm-up, recording, replay, eager fallback).
  std::uint64_t padded_calls = 0;
  /// Fallback decisions that were logged as a warning (PyTorch's `cudagraph_skips`): a function
  /// that mutates an input is logged once, however many calls fall back.
  std::uint64_t fallback_warnings = 0;
  /// Graphs dropped to stay inside `Options::memory_budget_bytes` (`OverBudget::evict_coldest`),
  /// and the bytes of pool memory and executables that gave back.
  std::uint64_t evictions = 0;
  std::uint64_t evicted_bytes = 0;
  /// `Pool::sleep()` calls that gave the memory back, and wakes that took it back (`Pool::wake()`
  /// or the next call).
  std::uint64_t sleeps = 0;
  std::uint64_t wakes = 0;
  /// Reports the log sink threw on (the call went on; the decision is still counted).
  std::uint64_t log_sink_failures = 0;
  /// Calls per reason (`Reason` as index); for warnings, the number of warnings.
  std::array<std::uint64_t, static_cast<std::size_t>(Reason::count_)> by_reason{};

  /// Calls (or warnings) counted for one reason.
  [[nodiscard]] std::uint64_t count(Reason reason) const noexcept {
    return by_reason[static_cast<std::size_t>(reason)];
  }
};

/// The counters as one line of text, for logs: "calls 18, warm-ups 3, recordings 3, replays 12,
/// eager 0", then each other counter that is not zero, and the count of each reason that has any
/// ("mutated_input 3").
[[nodiscard]] std::string to_string(const Stats& stats);

/// How a pool's CUDA graphs came to be (cgt.cuda and cgt.torch): for tests, benchmarks and tuning.
struct GraphCounts {
  std::uint64_t instantiated = 0;      ///< executables instantiated (cudaGraphInstantiate)
  std::uint64_t updated_in_place = 0;  ///< re-recordings that updated an earlier recording's executable
  std::uint64_t switched = 0;          ///< replays that loaded their graph back into a shared executable
  /// Memset nodes of recorded graphs replaced by kernel nodes (`rewrite_memset_nodes`), and those
  /// left as they were (the option off, or memory of another device or of the host).
  std::uint64_t memset_nodes_rewritten = 0;
  std::uint64_t memset_nodes_kept = 0;
  /// Memcpy nodes of recorded graphs replaced by kernel nodes (`rewrite_memcpy_nodes`: one row of
  /// bytes between memory of the pool's device), and those left as they were (the option off,
  /// host memory, 2D or 3D).
  std::uint64_t memcpy_nodes_rewritten = 0;
  std::uint64_t memcpy_nodes_kept = 0;
};

/// One allocated block of the pool.
struct Block {
  std::uintptr_t address = 0;
  std::size_t bytes = 0;
};

/// The pool's memory (`Pool::memory()`); all zero after `shutdown()`.
struct MemoryInfo {
  /// Device memory the pool holds from the system (its segments), whether in use or cached for
  /// later calls. The graphs' temporaries live here between replays: they are not "allocated" in
  /// the allocator's sense, but this memory stays reserved for them until `shutdown()`.
  std::size_t reserved_bytes = 0;
  /// Bytes in use now: blocks the pool's allocator counts as allocated (outputs of warm-ups and
  /// recordings still leased, and any block a function kept), plus, in cgt.torch, the storages of
  /// replay outputs still leased (a replay allocates nothing, so the allocator counts their memory
  /// as free; each is counted once, rounded up to 512 bytes as the allocator rounds a block).
  /// Outputs that are not pool memory (inputs, constants, eager calls' outputs) are not counted.
  std::size_t allocated_bytes = 0;
  /// The most `allocated_bytes` seen at once. cgt.host and cgt.cuda track it at every allocation;
  /// cgt.torch takes it after every warm-up and recording and at every `memory()` call, so a
  /// function's temporaries (freed inside the call) are not in it: they are in `reserved_bytes`.
  std::size_t peak_allocated_bytes = 0;
  /// Blocks counted in `allocated_bytes`: allocated blocks, plus (cgt.torch) one per replay output
  /// storage still leased. `Pool::live_blocks()` lists the allocator's blocks only.
  std::size_t live_blocks = 0;
};

/// What one recorded graph's memory is (`Node::memory()`).
struct NodeMemory {
  /// What the pool predicted, before recording, the recording would add to its reserved bytes
  /// (from the shape's warm-up); empty where it could not (no warm-up, or cgt.torch).
  std::optional<std::size_t> predicted_pool_bytes;
  /// What the recording did add to the pool's reserved bytes (new segments).
  std::size_t pool_bytes = 0;
  /// Pool bytes of its input slots (blocks it keeps allocated while it lives).
  std::size_t slot_bytes = 0;
  /// Device memory its executable took (measured at instantiation; cgt.cuda: 0 where it shares an
  /// earlier recording's executable; cgt.host and cgt.torch: 0).
  std::size_t executable_bytes = 0;
};

/// The memory of one function's graphs, summed over its nodes (`MemoryReport::functions`).
struct FunctionMemory {
  std::string function;
  std::size_t graphs = 0;            ///< recorded graphs alive
  std::size_t pool_bytes = 0;        ///< what their recordings added to the pool
  std::size_t slot_bytes = 0;        ///< their input slots
  std::size_t executable_bytes = 0;  ///< their executables
};

/// The pool's memory by owner (`Pool::memory_report()`).
struct MemoryReport {
  /// The pool's segments, held from the system: `live_bytes` + `cached_bytes`.
  std::size_t reserved_bytes = 0;
  /// Of them, blocks leases hold now (`MemoryInfo::allocated_bytes`).
  std::size_t live_bytes = 0;
  /// Of them, the rest: the graphs' temporaries and input slots between replays, dead outputs'
  /// blocks, space not used yet. Given back only by eviction (`OverBudget::evict_coldest`) and
  /// `shutdown()`.
  std::size_t cached_bytes = 0;
  /// Of the reserved bytes, the input slots of the recorded graphs.
  std::size_t slot_bytes = 0;
  /// Copies of outputs kept for leases past a new step (`Options::copy_out_on_new_step`): memory
  /// outside the pool, alive while those leases are.
  std::size_t copied_out_bytes = 0;
  /// The graphs' executables, outside the pool (what `memory_budget_bytes` counts with the segments).
  std::size_t executable_bytes = 0;
  /// Of the reserved bytes, those given back to the system while the pool sleeps (`Pool::sleep`):
  /// their addresses stay reserved for the graphs. 0 while awake.
  std::size_t asleep_bytes = 0;
  /// Per function with graphs, in registration order.
  std::vector<FunctionMemory> functions;

  /// What the budget counts: the segments and the executables.
  [[nodiscard]] std::size_t budgeted_bytes() const noexcept { return reserved_bytes + executable_bytes; }
};

/// The memory as one line of text, for logs: "1048576 bytes reserved, 0 allocated in 0 blocks,
/// peak 1024".
[[nodiscard]] std::string to_string(const MemoryInfo& memory);

/// One position in the current path: output `output` of the node `depth` steps below the root.
struct PathIndex {
  std::uint32_t depth = 0;
  std::uint32_t output = 0;
  friend bool operator==(const PathIndex&, const PathIndex&) = default;
};

}  // namespace cgt
