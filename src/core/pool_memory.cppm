// cgt.core:pool_memory (internal) — what the path's changes do to the pool's memory: a path a new
// generation ends (its outputs reclaimed or copied out, their memory released once the call's work
// may reuse it, or put back when the call fails), the allocator restored to a node's checkpoint or
// to a snapshot taken before a warm-up or recording, a cell's death (the ledger's effect), and the
// check that the allocator's blocks are exactly the memory of live leases. The path itself is
// path.cppm's; the cells' counts are the ledger's.
module;
#include <expected>
#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "generation_rule.hpp"

export module cgt.core:pool_memory;
import cgt.vocabulary;
import :spi;
import :tree;
import :path;
import :ledger;
import :functions;

namespace cgt::detail {

/// The allocator as it was before a warm-up or recording: what a failed one puts back.
struct PoolSnapshot {
  std::unique_ptr<backend::Checkpoint> checkpoint;
  std::vector<std::uintptr_t> owned_live;  ///< storages the allocator owned for live leases then
};

/// When the engine asks whether the current path is over.
enum class PathCheck : std::uint8_t {
  call_start,     ///< before a call: a replaying path is kept, since a child of it may follow
  no_child_fits,  ///< no child of the current node fits the call: a replaying path may end too
};

/// Owns the pool's memory as the path holds it: every change of the device's allocator that a
/// change of the path makes, and what a death does (`LedgerEffects`). Its own state is whether the
/// pool is shut down (then deaths free nothing: the device's memory went with it); everything else
/// it changes is the path's (through its API), the cells' storage handles and the device's
/// allocator, and it counts what it does in the pool's `Stats`.
///
/// Invariants (with `Options::debug_checks`, `check` verifies the first): the allocator's live
/// blocks are exactly the allocator-owned storages of the path's live cells and of its ended
/// record. An ended record exists only inside a call, between `end_path_if_over` at its start and
/// `release_ended` or `put_back_ended` before it returns.
class PoolMemory final : public LedgerEffects {
 public:
  PoolMemory(Path& path, backend::Device& device, const Functions& functions, const Options& options, Stats& stats,
             const Ledger& ledger) noexcept
      : path_(path), device_(device), functions_(functions), options_(options), stats_(stats), ledger_(ledger) {}
  PoolMemory(const PoolMemory&) = delete;
  PoolMemory& operator=(const PoolMemory&) = delete;
  ~PoolMemory() override = default;

  /// Ends the current path if it is over: for a new generation (`generation` past the path's),
  /// `end_for_new_generation`; otherwise, if no output of the path is live, `Path::end` (at
  /// `call_start`, only a path warming up or recording: a replaying path ends lazily, when no
  /// child fits). (Inline: a call asks at its start, where a replaying path of this generation is
  /// kept at once.)
  [[clang::always_inline]] inline void end_path_if_over(std::uint64_t generation, PathCheck when) {
    if (path_.node() == nullptr) return;
    if (GenerationRule::is_new_generation(path_.generation(), generation)) {
      end_for_new_generation();
      return;
    }
    if (when == PathCheck::call_start && path_.state() == PathState::execution) return;
    if (path_.all_outputs_dead()) path_.end();
  }
  /// Ends the path for a new generation (`Path::end_for_new_generation`): its live outputs read as
  /// reclaimed from now on, or as their copies (`copy_out_on_new_step`); their memory stays
  /// allocated until `release_ended`.
  void end_for_new_generation();
  /// Releases the memory of the path a new generation ended, if any (`Release::reclaimed`): the
  /// call's work may reuse it now. (Inline: every call asks.)
  inline void release_ended() noexcept {
    if (path_.has_ended()) release_ended_now();
  }
  /// The call that began a new generation failed before `release_ended`: the path and its leases
  /// are as they were before the call (`Path::put_back_ended`); a cell whose last lease went
  /// meanwhile dies now.
  void put_back_ended() noexcept;
  /// Reclaims the whole path now (`shutdown()`): leases read as reclaimed, memory released.
  void reclaim_path();
  /// Before a warm-up or recording while the path has an ended record: its outputs' memory made
  /// allocated, so that the call's work allocates around it (`Path::hold_ended_memory`).
  [[nodiscard]] Result<void> hold_ended();
  /// REQUIRES: a current graph node. ENSURES: the allocator is at its checkpoint, with the path's
  /// storages live then and now allocated (owned by the allocator from now on) and those dead
  /// since freed.
  [[nodiscard]] Result<void> restore_checkpoint();
  /// The allocator now, before a warm-up or recording of `function` (`doing` says which), with
  /// the storages it owns for live leases; checked first with `debug_checks`.
  [[nodiscard]] Result<PoolSnapshot> snapshot(const FunctionRecord& function, const char* doing);
  /// Puts the allocator back to `before` after a warm-up or recording that failed (its outputs
  /// gone): a storage live then that died during the call (a lease dropped inside the function) is
  /// freed.
  [[nodiscard]] Result<void> roll_back(const PoolSnapshot& before);
  /// PyTorch's `check_memory_pool`: `invariant_violation`, naming the blocks, where the allocator's
  /// live blocks are not exactly the allocator-owned storages of live leases.
  [[nodiscard]] Result<void> check() const;
  /// `check`, where `Options::debug_checks` asks for it, its message prefixed with `where`.
  [[nodiscard]] Result<void> debug_check(const char* where) const;
  /// The ledger's effect of a death: releases the memory to the device (`Release::dead`), unless
  /// the pool is shut down or nothing is there to free.
  void cell_died(Cell& cell) noexcept override;
  /// The pool is shut down: deaths free nothing from now on.
  inline void shut_down() noexcept { shut_down_ = true; }
  /// Bytes of the copies `copy_out_on_new_step` made that leases still read (any thread).
  [[nodiscard]] inline std::size_t copied_out_bytes() const noexcept {
    return copied_out_bytes_->load(std::memory_order_relaxed);
  }

 private:
  void release_ended_now() noexcept;
  /// The one way the allocator goes back to an earlier state: ENSURES: the allocator is at
  /// `checkpoint`, in which the path's storages `allocated_then` were allocated; each of them that
  /// is live now stays allocated (owned by the allocator from now on), each that is not is freed
  /// once, and a live storage the checkpoint does not hold (a replay's output) is left as it is.
  [[nodiscard]] Result<void> restore(const backend::Checkpoint& checkpoint,
                                     std::span<const std::uintptr_t> allocated_then);

  Path& path_;
  backend::Device& device_;
  const Functions& functions_;  ///< the functions' names, for what a release names
  const Options& options_;
  Stats& stats_;
  const Ledger& ledger_;    ///< whether the device hears of a death (`Ledger::device_hears_of_death`)
  bool shut_down_ = false;  ///< set by `shut_down`, never cleared
  /// Counted up when a copy is made, down when the last lease reading it goes (on any thread):
  /// shared with each copy's deleter, which may outlive the pool.
  std::shared_ptr<std::atomic<std::size_t>> copied_out_bytes_ = std::make_shared<std::atomic<std::size_t>>(0);
};

}  // namespace cgt::detail
