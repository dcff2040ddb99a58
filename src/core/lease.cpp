// Leases: the only thing that makes pool memory live. Dropping the last lease on a storage is the
// moment its memory becomes dead. Leases may be dropped, and read, on any thread: what a drop
// changes in the pool is applied under the engine's state lock, or deferred to the thread holding it.
module;
#include <expected>
#include <atomic>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {

StateLock::StateLock(Engine& engine) noexcept : engine_(engine) {
  const std::thread::id self = std::this_thread::get_id();
  // Only this thread can have stored its own id: an equal id means it holds the state already.
  if (engine.holder.load(std::memory_order_relaxed) == self) {
    nested_ = true;
    return;
  }
  engine.state_mutex.lock();
  engine.holder.store(self, std::memory_order_relaxed);
  engine.apply_pending_drops_locked();
}

StateLock::~StateLock() {
  if (nested_) return;
  engine_.holder.store(std::thread::id(), std::memory_order_relaxed);
  engine_.state_mutex.unlock();
  // A drop deferred after the last look, before the unlock, is applied here.
  engine_.apply_pending_drops();
}

namespace {

// One lease on `cell` goes; the memory dies with the last one. Caller holds the state.
void apply_drop(Cell* cell) noexcept {
  if (cell->drop_lease() && !cell->is_reclaimed()) cell->engine->cell_died(*cell);
  CellRef::unref(cell);
}

}  // namespace

void Engine::drop_leases(std::span<Cell* const> cells) noexcept {
  const std::thread::id self = std::this_thread::get_id();
  if (holder.load(std::memory_order_relaxed) == self) {
    for (Cell* cell : cells) apply_drop(cell);  // inside a call on this thread (a pool function dropping a lease)
    return;
  }
  if (state_mutex.try_lock()) {
    holder.store(self, std::memory_order_relaxed);
    apply_pending_drops_locked();
    for (Cell* cell : cells) apply_drop(cell);
    holder.store(std::thread::id(), std::memory_order_relaxed);
    state_mutex.unlock();
    apply_pending_drops();
    return;
  }
  // Another thread holds the state (a call, most likely): never block a drop on it, which could
  // deadlock a function waiting for this thread. The holder applies the drop when it lets go.
  {
    const std::lock_guard pending(pending_mutex);
    pending_drops.insert(pending_drops.end(), cells.begin(), cells.end());
    has_pending_drops.store(true);
  }
  apply_pending_drops();
}

void Engine::apply_deferred_drops() noexcept {
  std::vector<Cell*> drops;
  {
    const std::lock_guard pending(pending_mutex);
    drops.swap(pending_drops);
    has_pending_drops.store(false);
  }
  for (Cell* cell : drops) apply_drop(cell);
}

void Engine::apply_pending_drops() noexcept {
  while (has_pending_drops.load()) {
    if (!state_mutex.try_lock()) return;  // its holder will apply them when it lets go
    const std::thread::id self = std::this_thread::get_id();
    holder.store(self, std::memory_order_relaxed);
    apply_pending_drops_locked();
    holder.store(std::thread::id(), std::memory_order_relaxed);
    state_mutex.unlock();
  }
}

LeaseCore& LeaseCore::operator=(LeaseCore&& other) noexcept {
  if (this != &other) {
    lease_drop(*this);
    engine = std::move(other.engine);
    cell = std::exchange(other.cell, nullptr);
    value = std::exchange(other.value, nullptr);
    owner = std::move(other.owner);
    function = other.function;
    output = other.output;
  }
  return *this;
}

void lease_drop(LeaseCore& lease) noexcept {
  if (Cell* cell = std::exchange(lease.cell, nullptr)) (*lease.engine).drop_leases({&cell, 1});
  lease.value = nullptr;
  lease.owner.reset();
  lease.engine = EngineRef();
}

void leases_drop(std::span<LeaseCore> leases) noexcept {
  // A call's leases share one engine: their cells go under one hold of its state (eight at a time),
  // and their references to it in one count. A lease of another engine (none of a call's) is
  // dropped on its own.
  Engine* engine = nullptr;
  std::array<Cell*, 8> cells{};
  std::size_t count = 0;
  for (LeaseCore& lease : leases) {
    if (!lease.engine) continue;
    if (engine == nullptr) engine = lease.engine.get();
    if (lease.engine.get() != engine) {
      lease_drop(lease);
      continue;
    }
    Cell* cell = std::exchange(lease.cell, nullptr);
    if (cell == nullptr) continue;
    cells[count++] = cell;  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index): count < 8 here
    if (count == cells.size()) {
      engine->drop_leases(cells);
      count = 0;
    }
  }
  if (count > 0) engine->drop_leases({cells.data(), count});
  std::uint32_t references = 0;
  for (LeaseCore& lease : leases) {  // engine references last: they may be the engine's last
    lease.value = nullptr;
    lease.owner.reset();
    if (lease.engine.forget() != nullptr) ++references;
  }
  if (references > 0) release(*engine, references);
}

namespace {

// The lease blocks this thread freed (`LeaseAllocator`), freed at its exit. A lease array freed
// after that (a static holding outputs, destroyed after the thread's locals) is freed at once.
class LeaseBlocks {
 public:
  LeaseBlocks() = default;
  LeaseBlocks(const LeaseBlocks&) = delete;
  LeaseBlocks& operator=(const LeaseBlocks&) = delete;
  ~LeaseBlocks() {
    for (std::size_t i = 0; i < count_; ++i) {
      std::allocator<LeaseCore>().deallocate(static_cast<LeaseCore*>(kept_.at(i)), kLeaseBlock);
    }
    count_ = 0;
    closed_ = true;
  }
  [[nodiscard]] void* take() noexcept { return count_ > 0 ? kept_.at(--count_) : nullptr; }
  [[nodiscard]] bool keep(void* block) noexcept {
    if (closed_ || count_ == kept_.size()) return false;
    kept_.at(count_++) = block;
    return true;
  }

 private:
  std::array<void*, 4> kept_{};  // a program holding a few calls' outputs at a time
  std::size_t count_ = 0;
  bool closed_ = false;
};

LeaseBlocks& lease_blocks() noexcept {
  thread_local LeaseBlocks blocks;
  return blocks;
}

}  // namespace

void* take_lease_block() noexcept {
  return lease_blocks().take();
}

bool keep_lease_block(void* block) noexcept {
  return lease_blocks().keep(block);
}

bool lease_is_valid(const LeaseCore& lease) noexcept {
  if (!lease.engine) return false;
  Engine& engine = *lease.engine;
  const StateLock lock(engine);
  if (engine.shut_down) return false;
  return lease.cell == nullptr || !lease.cell->is_reclaimed() || lease.cell->copied_out() != nullptr;
}

Result<const void*> lease_value(LeaseCore& lease) {
  if (!lease.engine) {
    return fail(Errc::invalid_argument, "the lease is empty: it was moved from, reset, or moved into a call");
  }
  Engine& engine = *lease.engine;
  const StateLock lock(engine);
  const std::string& name = engine.functions[lease.function]->name;
  if (engine.shut_down) {
    return fail(Errc::pool_shut_down,
                "output " + std::to_string(lease.output) + " of '" + name +
                    "' is gone: its pool was shut down; take() values you need before shutdown()",
                name);
  }
  Cell* cell = lease.cell;
  if (cell != nullptr && cell->is_reclaimed()) {
    if (cell->copied_out() == nullptr) {
      return fail(Errc::output_overwritten, engine.overwritten_message(*cell, lease.output), name);
    }
    // Options::copy_out_on_new_step kept a copy: from now on this lease views the copy.
    lease.owner = engine.device->rebase(lease.value, cell->storage, cell->copied_out());
    lease.value = lease.owner.get();
    lease.cell = nullptr;
    apply_drop(cell);  // the lease no longer needs the cell: the last one frees the cell's copy
  }
  return lease.value;
}

}  // namespace cgt::detail
