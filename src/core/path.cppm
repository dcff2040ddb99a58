// cgt.core:path (internal) — the path: the node of the tree the program is at, its state, the
// generation it last ran in, its warm-up nodes, and the path a new generation ended while the call
// that began that generation runs (PyTorch's `current_node`, `path_state`, `current_gen`). This
// file and path.cpp are the path's only writers. What a change of the path does to the device
// (copying outputs out, releasing their memory, restoring a checkpoint) is PoolMemory's, through
// this API (src/core/pool_memory.cppm).
module;
#include <expected>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

export module cgt.core:path;
import cgt.vocabulary;
import :tree;

namespace cgt::detail {

/// Where the current path is (PyTorch's ExecutionState).
enum class PathState : std::uint8_t { none, warmup, recording, execution };

/// The path a new generation ended, while the call that began the generation has not done its work
/// yet (`Path::end_for_new_generation`). Its live outputs already read as reclaimed, but their
/// memory is still allocated: a warm-up or a recording allocates around it, and a failing call puts
/// the path back as it was (`Path::put_back_ended`), so that a call that fails changes nothing the
/// caller holds.
struct EndedPath {
  TreeNode* current = nullptr;
  PathState state = PathState::none;
  std::uint64_t generation = 0;
  std::vector<std::unique_ptr<TreeNode>> warmup_chain;
  std::vector<CellRef> cells;           ///< the outputs live when the path ended
  std::uint64_t leases_copied_out = 0;  ///< leases on them then, for `Stats` once released
  std::uint64_t leases_invalidated = 0;
  bool memory_held = false;  ///< `Path::hold_ended_memory` ran
};

/// The chain of nodes the program is walking: the current node and its ancestors, root first.
/// Used under the engine's state lock only.
///
/// Invariants:
///  * `node() == nullptr` exactly when `state() == PathState::none` (but while
///    `hold_ended_memory` runs its `restore`, which sees the ended node with state `none`).
///  * Warm-up nodes sit only at the tail of the path, and the path owns them (never a parent):
///    they live while their path does, or while the ended record that holds them does.
///  * The ended record exists only inside a call: set by `end_for_new_generation` at its start,
///    gone by `take_ended` (its memory released) or `put_back_ended` before it returns.
class Path {
 public:
  Path() = default;
  Path(const Path&) = delete;
  Path& operator=(const Path&) = delete;

  // --- queries ---

  /// The current node (null: no path).
  [[nodiscard]] inline TreeNode* node() const noexcept { return current_; }
  [[nodiscard]] inline PathState state() const noexcept { return state_; }
  /// The generation of the last call that entered the path: the path is over for a call in
  /// another one (`GenerationRule::is_new_generation`).
  [[nodiscard]] inline std::uint64_t generation() const noexcept { return generation_; }
  /// Root first, ending with the current node (empty: no path).
  [[nodiscard]] std::span<TreeNode* const> nodes() const noexcept;
  /// The warm-up nodes of the path, in the order they ran (for introspection).
  [[nodiscard]] inline std::span<const std::unique_ptr<TreeNode>> warmup_nodes() const noexcept {
    return warmup_chain_;
  }
  /// The nodes a call is matched against, and a new recording goes under: the current node's
  /// children, or `roots` with no path.
  [[nodiscard]] inline Children& children(Children& roots) const noexcept {
    return current_ != nullptr ? current_->children() : roots;
  }
  [[nodiscard]] inline const Children& children(const Children& roots) const noexcept {
    return current_ != nullptr ? current_->children() : roots;
  }

  // --- liveness of the path's outputs ---

  /// Each node's outputs along the path, root first: live or not.
  [[nodiscard]] std::vector<std::vector<bool>> liveness() const;
  /// The live output of the path whose storage is `storage`, if any.
  [[nodiscard]] std::optional<PathIndex> live_alias(std::uintptr_t storage) const;
  /// The cell of the live output of the path whose storage is `storage`, or null.
  [[nodiscard]] Cell* live_cell(std::uintptr_t storage) const;
  /// Whether an output of the path, live or not, was made at `storage` (never for 0).
  [[nodiscard]] bool is_output(std::uintptr_t storage) const;
  /// The live cells of the path, each once, root first.
  [[nodiscard]] std::vector<Cell*> live_cells() const;
  /// Whether no output of the path is live (true with no path). Inline for a graph node (a replay
  /// asks on every call): everything live after its recording is listed, and what was dead then
  /// cannot revive.
  [[nodiscard]] [[clang::always_inline]] inline bool all_outputs_dead() const {
    if (current_ == nullptr) return true;
    if (current_->kind() != NodeKind::graph) return live_cells().empty();
    // NOLINTNEXTLINE(readability-use-anyofallof): a loop; ranges::none_of is a call here, on every replay
    for (const PathIndex& index : current_->live_after()) {
      const CellRef& cell = current_->cell_at(index);
      if (cell && cell->is_live()) return false;
    }
    return true;
  }
  /// Whether `storage` is the memory of an output of the ended path.
  [[nodiscard]] bool is_output_of_ended(std::uintptr_t storage) const noexcept;
  /// The outputs of the ended path whose memory is still allocated (empty: no ended record).
  [[nodiscard]] std::span<const CellRef> ended_cells() const noexcept;

  // --- transitions ---

  /// The call in `generation` goes on at `node`. REQUIRES: `node` is a child of the current node
  /// (a root with no path) that the tree or the path owns, and `state` is not `none`. ENSURES:
  /// `node()`, `state()` and `generation()` are those given.
  inline void enter(TreeNode& node, PathState state, std::uint64_t generation) noexcept {
    current_ = &node;
    state_ = state;
    generation_ = generation;
  }
  /// A warm-up node for a call of `variant` after the current node, numbered next (-1, -2, ...).
  /// ENSURES: not on the path until `enter_warmup`.
  [[nodiscard]] std::unique_ptr<TreeNode> make_warmup_node(NodeReason reason, std::uint32_t variant);
  /// The call in `generation` warmed up as `node`. REQUIRES: `node` came from `make_warmup_node`
  /// and the path has not changed since. ENSURES: the path owns `node` and is at it, warming up.
  TreeNode& enter_warmup(std::unique_ptr<TreeNode> node, std::uint64_t generation);
  /// ENSURES: no path (`node()` null, state `none`) and its warm-up nodes are gone. An ended
  /// record stays.
  [[clang::always_inline]] inline void end() noexcept {
    current_ = nullptr;
    state_ = PathState::none;
    warmup_chain_.clear();
  }
  /// Ends the path for a new generation. REQUIRES: no ended record.
  /// ENSURES: with no live output, as `end()`. Otherwise every live cell of the path reads as
  /// reclaimed, or as the copy `copy_out(Cell&)` returns where that is not null; the path, those
  /// cells and its warm-up nodes are kept in the ended record; their memory stays allocated.
  template <class CopyOut>
  void end_for_new_generation(CopyOut copy_out);
  /// Before a warm-up or recording of the call that ended a path: makes the ended outputs'
  /// memory allocated in the pool's allocator, so that the call's work allocates around it.
  /// REQUIRES: `restore()` puts the allocator at the current node's checkpoint with the path's
  /// live storages allocated, and returns `Result<void>`. ENSURES: runs `restore` once per ended
  /// record, and only for a replayed path (a warm-up's or recording's outputs are allocated
  /// already; a replay's are its graphs' memory, which the allocator counts as free), with the
  /// ended path shown as the current one and its outputs live; then the path is ended again, the
  /// outputs whose last lease went meanwhile dropped from the record (the call may allocate their
  /// memory, and nothing of the record may release it again). Returns `restore`'s result.
  template <class Restore>
  Result<void> hold_ended_memory(Restore restore);
  /// The call that began the new generation failed before its work. ENSURES: the path is as it
  /// was before the call (node, state, generation, warm-up nodes: whatever the call made died with
  /// its failure); the ended outputs read their memory again, and `died(Cell&)` runs for each
  /// whose last lease went during the call; no ended record.
  template <class Died>
  void put_back_ended(Died died) noexcept;
  /// The ended record, for the caller to release its memory: the call's work may reuse it now.
  /// ENSURES: no ended record; its warm-up nodes go with the returned one; `reclaims()` counts it.
  [[nodiscard]] std::optional<EndedPath> take_ended() noexcept;
  /// Whether a new generation ended a path that the call has not released yet (inline: every
  /// call asks, twice).
  [[nodiscard]] inline bool has_ended() const noexcept { return ended_.has_value(); }
  /// The node the ended path was at (null: no ended record, or it was at no graph node).
  [[nodiscard]] inline const TreeNode* ended_node() const noexcept { return ended_ ? ended_->current : nullptr; }
  /// Ended records taken so far (`take_ended`): paths whose outputs' memory a new generation
  /// reclaimed. A call that failed after one was taken cannot give its generation back.
  [[nodiscard]] inline std::uint64_t reclaims() const noexcept { return reclaims_; }

 private:
  TreeNode* current_ = nullptr;        ///< `enter`, `enter_warmup`; null after `end`
  PathState state_ = PathState::none;  ///< with `current_`
  std::uint64_t generation_ = 0;       ///< by `enter`, `enter_warmup`, `put_back_ended`
  /// The warm-up nodes of the path: appended by `enter_warmup`, gone with `end` (or moved into
  /// the ended record, and back by `put_back_ended`).
  std::vector<std::unique_ptr<TreeNode>> warmup_chain_;
  std::int64_t next_warmup_id_ = -1;  ///< by `make_warmup_node`
  /// Set by `end_for_new_generation`; gone by `take_ended` or `put_back_ended`. Never set between calls.
  std::optional<EndedPath> ended_;
  std::uint64_t reclaims_ = 0;  ///< by `take_ended`
};

template <class CopyOut>
void Path::end_for_new_generation(CopyOut copy_out) {
  const std::vector<Cell*> live = live_cells();
  if (live.empty()) {
    end();
    return;
  }
  EndedPath ended{
      .current = current_, .state = state_, .generation = generation_, .warmup_chain = std::move(warmup_chain_)};
  ended.cells.reserve(live.size());
  for (Cell* cell : live) {
    std::shared_ptr<void> copy = copy_out(*cell);
    (copy != nullptr ? ended.leases_copied_out : ended.leases_invalidated) += cell->leases();
    cell->mark_reclaimed(std::move(copy));
    ended.cells.emplace_back(cell);
  }
  end();
  ended_ = std::move(ended);
}

template <class Restore>
Result<void> Path::hold_ended_memory(Restore restore) {
  if (!ended_ || ended_->memory_held) return {};
  ended_->memory_held = true;
  if (ended_->state != PathState::execution) return {};  // warm-ups and recordings allocated it
  // The path's checkpoint, restored as if it had not ended (its outputs live), then ended again.
  EndedPath ended = std::move(*ended_);
  ended_.reset();
  std::vector<std::shared_ptr<void>> copies;
  copies.reserve(ended.cells.size());
  for (const CellRef& cell : ended.cells) {
    copies.push_back(cell->copied_out());
    cell->unmark_reclaimed();
  }
  current_ = ended.current;
  Result<void> restored = restore();
  current_ = nullptr;
  for (std::size_t i = 0; i < copies.size(); ++i) ended.cells[i]->mark_reclaimed(std::move(copies[i]));
  // Outputs whose last lease went since the path ended are free in the checkpoint restored: the
  // call may allocate their memory, and nothing of the ended path may release it again.
  std::erase_if(ended.cells, [](const CellRef& cell) { return cell->leases() == 0; });
  ended_ = std::move(ended);
  return restored;
}

template <class Died>
void Path::put_back_ended(Died died) noexcept {
  if (!ended_) return;
  EndedPath ended = std::move(*ended_);
  ended_.reset();
  // Nothing of the call is on the path any more: whatever it made died with its failure.
  current_ = ended.current;
  state_ = ended.state;
  generation_ = ended.generation;
  warmup_chain_ = std::move(ended.warmup_chain);
  for (const CellRef& cell : ended.cells) {
    cell->unmark_reclaimed();
    if (cell->leases() == 0) died(*cell.get());  // its last lease went during the call
  }
}

}  // namespace cgt::detail
