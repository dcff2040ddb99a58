// The ledger's rules that are not inline (ledger.cppm has the contract of each), and the state lock
// that calls, reads and drops take through it.
module;
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

module cgt.core;
import :ledger;

namespace cgt::detail {

void Ledger::drop(std::span<Cell* const> cells) noexcept {
  const std::thread::id self = std::this_thread::get_id();
  if (holder_.load(std::memory_order_relaxed) == self) {
    for (Cell* cell : cells) apply_drop(cell);  // inside a call on this thread (a pool function dropping a lease)
    return;
  }
  if (state_mutex_.try_lock()) {
    holder_.store(self, std::memory_order_relaxed);
    apply_deferred_locked();
    for (Cell* cell : cells) apply_drop(cell);
    holder_.store(std::thread::id(), std::memory_order_relaxed);
    state_mutex_.unlock();
    apply_deferred();
    return;
  }
  // Another thread holds the state (a call, most likely): never block a drop on it, which could
  // deadlock a function waiting for this thread. The holder applies the drop when it lets go.
  {
    const std::lock_guard deferred(deferred_mutex_);
    deferred_.insert(deferred_.end(), cells.begin(), cells.end());
    has_deferred_.store(true);
  }
  apply_deferred();
}

void Ledger::apply_deferred_drops() noexcept {
  std::vector<Cell*> drops;
  {
    const std::lock_guard deferred(deferred_mutex_);
    drops.swap(deferred_);
    has_deferred_.store(false);
  }
  for (Cell* cell : drops) apply_drop(cell);
}

void Ledger::apply_deferred() noexcept {
  while (has_deferred_.load()) {
    if (!state_mutex_.try_lock()) return;  // its holder will apply them when it lets go
    const std::thread::id self = std::this_thread::get_id();
    holder_.store(self, std::memory_order_relaxed);
    apply_deferred_locked();
    holder_.store(std::thread::id(), std::memory_order_relaxed);
    state_mutex_.unlock();
  }
}

}  // namespace cgt::detail
