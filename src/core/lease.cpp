// Leases: the only thing that makes pool memory live. Dropping the last lease on a storage is the
// moment its memory becomes dead. Leases may be dropped, and read, on any thread: what a drop
// changes in the pool is the ledger's (ledger.cppm), applied under the engine's state lock or
// deferred to the thread holding it. Here: the lease handles' side, and the lease arrays kept per thread.
module;
#include <expected>
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "generation_rule.hpp"

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

// What a lease on `cell`, reclaimed by a new step, says (`output_overwritten`).
std::string overwritten_message(const Engine& engine, const Cell& cell, std::uint32_t output) {
  // Until the program marks generations, only a forward's call begins them (`FunctionMode::forward`).
  const bool by_forward = !engine.generation_rule().program_marks_generations();
  return "output " + std::to_string(output) + " of '" + engine.functions().name(cell.function) +
         "' was reclaimed when a new step began (" +
         (by_forward ? "a forward function was called, with no backward pending," : "mark_step_begin was called") +
         " after it was produced in step " + std::to_string(cell.generation()) +
         "); to keep a value across steps, take() it before the next step, set Options::copy_out_on_new_step "
         "(a new step then copies held outputs out of the pool), or " +
         (by_forward ? "call the next step's forward" : "call mark_step_begin()") + " only after you are done with it";
}

}  // namespace

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
  if (Cell* cell = std::exchange(lease.cell, nullptr)) (*lease.engine).ledger().drop({&cell, 1});
  lease.value = nullptr;
  lease.owner.reset();
  lease.engine = EngineRef();
}

namespace {

// `leases_drop`; with `Discard` the leases are about to be freed without their destructors
// (`LeaseArray::free_leases`), and are not emptied one by one.
template <bool Discard>
void drop_leases(std::span<LeaseCore> leases) noexcept {
  // A call's leases share one engine: their cells go under one hold of its state (eight at a time),
  // and their references to it in one count, in one pass over the leases. A lease of another
  // engine (none of a call's) is dropped on its own.
  Engine* engine = nullptr;
  std::array<Cell*, 8> cells;  // NOLINT(cppcoreguidelines-pro-type-member-init): only [0, count) is read
  std::size_t count = 0;
  std::uint32_t references = 0;
  bool owners = false;
  for (LeaseCore& lease : leases) {
    Engine* own = lease.engine.get();
    if (own == nullptr) continue;
    if (engine == nullptr) engine = own;
    if (own != engine) {
      lease_drop(lease);
      continue;
    }
    if (Cell* cell = Discard ? lease.cell : std::exchange(lease.cell, nullptr)) {
      cells[count++] = cell;  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index): count < 8 here
      if (count == cells.size()) {
        engine->ledger().drop(cells);
        count = 0;
      }
    }
    owners = owners || lease.owner != nullptr;
    if (!Discard) {
      lease.value = nullptr;
      (void)lease.engine.forget();
    }
    ++references;
  }
  if (count > 0) engine->ledger().drop({cells.data(), count});
  if (owners) {  // the values the engine does not own go after the cells' drops, as a lease's do
    for (LeaseCore& lease : leases) lease.owner.reset();
  }
  // Last: they may be the engine's last references.
  if (references > 0) engine->drop_references(references);
}

}  // namespace

void leases_drop(std::span<LeaseCore> leases) noexcept {
  drop_leases<false>(leases);
}

namespace {

// Frees this thread's kept lease blocks when the thread exits, and closes the list.
class LeaseBlocksAtExit {
 public:
  LeaseBlocksAtExit() = default;
  LeaseBlocksAtExit(const LeaseBlocksAtExit&) = delete;
  LeaseBlocksAtExit& operator=(const LeaseBlocksAtExit&) = delete;
  ~LeaseBlocksAtExit() {
    LeaseBlocks& blocks = lease_blocks;
    for (std::size_t i = 0; i < blocks.count; ++i) {
      std::allocator<LeaseCore>().deallocate(static_cast<LeaseCore*>(blocks.kept.at(i)), kLeaseBlock);
    }
    blocks.count = 0;
    blocks.closed = true;
  }
  void touch() noexcept {}
};

}  // namespace

void watch_lease_blocks() noexcept {
  thread_local LeaseBlocksAtExit at_exit;
  at_exit.touch();  // constructs it (and registers its destructor) on the thread's first use
  lease_blocks.watched = true;
}

void LeaseArray::free_leases() noexcept {
  drop_leases<true>(span());
  if (size_ > kLeaseBlock) {
    std::allocator<LeaseCore>().deallocate(data_, size_);
  } else if (!keep_lease_block(data_)) {
    std::allocator<LeaseCore>().deallocate(data_, kLeaseBlock);
  }
  data_ = nullptr;
  size_ = 0;
}

bool lease_is_valid(const LeaseCore& lease) noexcept {
  if (!lease.engine) return false;
  Engine& engine = *lease.engine;
  const StateLock lock(engine);
  if (engine.is_shut_down()) return false;
  return lease.cell == nullptr || !lease.cell->is_reclaimed() || lease.cell->copied_out() != nullptr;
}

Result<const void*> lease_value(LeaseCore& lease) {
  if (!lease.engine) {
    return fail(Errc::invalid_argument, "the lease is empty: it was moved from, reset, or moved into a call");
  }
  Engine& engine = *lease.engine;
  const StateLock lock(engine);
  if (engine.is_shut_down()) {
    const std::string& name = function_name(engine, lease.function);
    return fail(Errc::pool_shut_down,
                "output " + std::to_string(lease.output) + " of '" + name +
                    "' is gone: its pool was shut down; take() values you need before shutdown()",
                name);
  }
  Cell* cell = lease.cell;
  if (cell != nullptr && cell->is_reclaimed()) {
    if (cell->copied_out() == nullptr) {
      return fail(Errc::output_overwritten, overwritten_message(engine, *cell, lease.output),
                  function_name(engine, lease.function));
    }
    // Options::copy_out_on_new_step kept a copy: from now on this lease views the copy.
    lease.owner = engine.device().rebase(lease.value, cell->storage, cell->copied_out());
    lease.value = lease.owner.get();
    lease.cell = nullptr;
    engine.ledger().drop_locked(cell);  // the lease no longer needs the cell: the last one frees the cell's copy
  }
  return lease.value;
}

}  // namespace cgt::detail
