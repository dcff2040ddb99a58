// cgt.core:ledger (internal) — the ledger: who holds which output storage (cells and the leases on
// them), when a storage comes to life and when it dies, and the engine's state lock, which every
// drop of a lease on any thread either takes or leaves its work to (PyTorch probes weak references
// to storages instead; cgt counts leases, so the moment of death is a known call). This file and
// ledger.cpp are the ledger's only writers; each cell's own count is `Cell`'s (:tree). What a death
// does to the device is the engine's, through `LedgerEffects`.
module;
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

export module cgt.core:ledger;
import :spi;
import :detail;
import :tree;

namespace cgt::detail {

/// The engine's state lock. Every call and most lease drops take it, uncontended: an atomic flag
/// makes that one atomic exchange and one store, where a pthread mutex cost ~50 instructions each
/// way on the replay path. A thread that must wait sleeps on the flag (C++20 atomic wait).
class StateMutex {
 public:
  [[nodiscard]] inline bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  inline void lock() noexcept {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      waiters_.fetch_add(1);
      locked_.wait(true);  // returns at once if the holder let go meanwhile
      waiters_.fetch_sub(1);
    }
  }
  inline void unlock() noexcept {
    locked_.store(false);  // seq_cst, ordered before the read of waiters_ (see lock)
    if (waiters_.load() > 0) locked_.notify_all();
  }

 private:
  std::atomic<bool> locked_{false};
  std::atomic<std::uint32_t> waiters_{0};
};

/// What the ledger's rules do to the device, supplied by the engine (which is one).
class LedgerEffects {
 public:
  virtual ~LedgerEffects() = default;
  /// The last lease on `cell` went and no new generation had reclaimed it: its memory is dead from
  /// now on, and the next replay or allocation may reuse it. Called under the state, for deaths
  /// the device hears of: a storage the allocator owns or the device keeps a record of, or any
  /// storage where the device releases unowned ones (`Device::releases_unowned_storage`). The
  /// others (a replay's output on the host) change nothing outside the cell.
  virtual void cell_died(Cell& cell) noexcept = 0;

 protected:
  LedgerEffects() = default;
  LedgerEffects(const LedgerEffects&) = default;
  LedgerEffects& operator=(const LedgerEffects&) = default;
};

/// The engine's ledger (`Engine::ledger`): hands out leases on cells, drops them from any thread,
/// and owns the state lock that orders both.
///
/// Invariants:
///  * A cell is live exactly when it has a lease and is not reclaimed (`Cell::is_live`). Its memory
///    dies at the drop of its last lease, and at no other moment (`LedgerEffects::cell_died`).
///  * A cell's life (`Cell::life`) is the last life the ledger gave out when the cell went from no
///    lease to one; lives only grow, so a value stamped with an older life is a stale copy.
///  * A drop is never lost and never waits: it is applied on the thread that holds the state, or
///    deferred to it and applied before that thread lets go (or by the dropping thread, if the
///    state is free by then). Deferred drops exist only while some thread holds the state.
class Ledger {
 public:
  /// A ledger whose deaths `effects` (the engine's device side) hears of; `effects` outlives it.
  /// `stamper`: the device where it stamps the values handed out (`Device::stamps_values`), or null.
  /// `releases_unowned`: the device's `releases_unowned_storage()` (see `LedgerEffects::cell_died`).
  inline Ledger(LedgerEffects& effects, backend::Device* stamper, bool releases_unowned) noexcept
      : effects_(&effects), stamper_(stamper), releases_unowned_(releases_unowned) {}
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // --- the state (StateLock takes it through these) ---

  /// Whether this thread holds the state. Only this thread can have stored its own id.
  [[nodiscard]] inline bool is_held_here() const noexcept {
    return holder_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }
  /// ENSURES: this thread holds the state (waiting for another holder to let go), and the drops
  /// deferred until then are applied. Returns false where it held the state already: nested use
  /// (a pool function dropping a lease, or reading stats) passes through, with nothing to let go.
  [[nodiscard]] inline bool hold() noexcept {
    const std::thread::id self = std::this_thread::get_id();
    if (holder_.load(std::memory_order_relaxed) == self) return false;
    state_mutex_.lock();
    holder_.store(self, std::memory_order_relaxed);
    apply_deferred_locked();
    return true;
  }
  /// REQUIRES: this thread holds the state (`hold` returned true). ENSURES: it does not; drops deferred while
  /// it did are applied, here or by the next holder.
  inline void let_go() noexcept {
    holder_.store(std::thread::id(), std::memory_order_relaxed);
    state_mutex_.unlock();
    apply_deferred();  // a drop deferred after the last look, before the unlock, is applied here
  }

  // --- leases ---

  /// The cell's side of a new lease on `cell` (null: a value that is not pool memory) handing out
  /// `value` in `generation`; the engine makes the `LeaseCore` beside it (`Engine::lease_outputs`).
  /// REQUIRES: the state is held. ENSURES: the cell has one lease more; the first lease after none
  /// gives it the next life, which is stamped on `value` where the device stamps values. (Inline: a
  /// replay takes one lease per output.)
  inline void take_lease(Cell* cell, const void* value, std::uint64_t generation) noexcept {
    if (cell == nullptr) return;
    cell->add_lease(lives_, generation);
    if (stamper_ != nullptr) stamper_->stamp(value, cell->life());
  }
  /// Drops one lease on each of `cells`, any thread, never waiting. ENSURES: applied now if this
  /// thread holds the state or can take it; otherwise deferred to the holder, which applies it
  /// when it lets go. Applying a drop lets go of the lease's reference on the cell, and the last
  /// lease on a cell not reclaimed is its memory's death (`LedgerEffects::cell_died`).
  void drop(std::span<Cell* const> cells) noexcept;
  /// Whether the device is told of `cell`'s death (`LedgerEffects::cell_died`): a storage the
  /// allocator owns or the device keeps a record of, or any storage where the device releases
  /// unowned ones. The others (a replay's output on the host) change nothing outside the cell.
  [[nodiscard]] inline bool device_hears_of_death(const Cell& cell) const noexcept {
    return releases_unowned_ || cell.storage.owned_by_allocator || cell.storage.native != nullptr;
  }
  /// Drops one lease on `cell` now. REQUIRES: this thread holds the state. ENSURES: as `drop`.
  inline void drop_locked(Cell* cell) noexcept { apply_drop(cell); }
  /// Drops the leases moved into a call (`ArgSlot::consumed`), each into its own engine's ledger.
  /// REQUIRES: the call succeeded and its outputs took their leases (an output that aliases a
  /// consumed input keeps the memory). A failing call never calls it: its leases stay valid.
  static inline void consume(std::span<const backend::ArgSlot> args) noexcept {
    for (const backend::ArgSlot& slot : args) {
      if (slot.consumed != nullptr) lease_drop(*slot.consumed);
    }
  }
  /// Applies the drops other threads deferred. REQUIRES: this thread holds the state, or no thread
  /// can (the engine is being destroyed). (Inline: every call and drop asks, and there is rarely
  /// anything to do.)
  inline void apply_deferred_locked() noexcept {
    if (has_deferred_.load()) apply_deferred_drops();
  }
  /// Takes the state if it is free and applies deferred drops, until none is left (or another
  /// thread holds the state: it applies them when it lets go).
  void apply_deferred() noexcept;

 private:
  // One lease on `cell` goes, under the state.
  inline void apply_drop(Cell* cell) noexcept {
    if (cell->drop_lease() && !cell->is_reclaimed() && device_hears_of_death(*cell)) effects_->cell_died(*cell);
    CellRef::unref(cell);
  }
  void apply_deferred_drops() noexcept;

  LedgerEffects* effects_;    ///< the engine's device effects
  backend::Device* stamper_;  ///< stamps the values handed out, or null
  bool releases_unowned_;     ///< the device's `releases_unowned_storage()`, read once
  std::uint64_t lives_ = 0;   ///< the last `Cell::life` given out; by `take_lease` only

  StateMutex state_mutex_;                 ///< by `hold`/`let_go`, `drop`, `apply_deferred`
  std::atomic<std::thread::id> holder_{};  ///< the thread holding state_mutex_, if any; set with it
  std::mutex deferred_mutex_;              ///< guards deferred_
  /// Leases dropped on another thread while the state was held: appended by `drop`, taken by the
  /// holder (`apply_deferred_locked`, `hold`, `let_go`).
  std::vector<Cell*> deferred_;
  std::atomic<bool> has_deferred_{false};  ///< `deferred_` is not empty; set and cleared with it
};

}  // namespace cgt::detail
