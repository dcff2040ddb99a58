// The pool's memory as the path holds it (pool_memory.cppm has the owner's contract).
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :pool_memory;

namespace cgt::detail {
namespace {

std::string hex(std::uintptr_t address) {
  std::ostringstream text;
  text << "0x" << std::hex << address;
  return text.str();
}

}  // namespace

void PoolMemory::end_for_new_generation() {
  // Marked now: the call's arguments are read after this, and a held output passed in must read
  // as reclaimed (or as its copy). Released once the call's work may reuse the memory.
  path_.end_for_new_generation([this](const Cell& cell) -> std::shared_ptr<void> {
    if (!options_.copy_out_on_new_step) return nullptr;
    auto rescued = device_.rescue(cell.storage);
    if (!rescued || *rescued == nullptr) return nullptr;
    // The copy is counted while leases read it: its deleter keeps the backend's copy and counts down.
    const std::size_t bytes = cell.storage.bytes;
    copied_out_bytes_->fetch_add(bytes, std::memory_order_relaxed);
    void* copy = rescued->get();
    return {copy, [kept = std::move(*rescued), counter = copied_out_bytes_, bytes](void*) mutable {
              counter->fetch_sub(bytes, std::memory_order_relaxed);
              kept.reset();
            }};
  });
}

void PoolMemory::release_ended_now() noexcept {
  const std::optional<EndedPath> ended = path_.take_ended();  // its warm-up nodes go at the end
  if (!ended) return;
  ++stats_.steps_reclaimed;
  stats_.leases_copied_out += ended->leases_copied_out;
  stats_.leases_invalidated += ended->leases_invalidated;
  for (const CellRef& cell : ended->cells) {
    device_.release(cell->storage, backend::Release::reclaimed, functions_[cell->function].name);
    cell->storage.owned_by_allocator = false;
  }
}

void PoolMemory::put_back_ended() noexcept {
  path_.put_back_ended([this](Cell& cell) { cell_died(cell); });
}

void PoolMemory::reclaim_path() {
  end_for_new_generation();
  release_ended();
}

Result<void> PoolMemory::hold_ended() {
  return path_.hold_ended_memory([this] { return restore_checkpoint(); });
}

Result<void> PoolMemory::restore_checkpoint() {
  const TreeNode& node = *path_.node();
  ++stats_.checkpoint_restores;
  // What was live right after the recording is allocated in the checkpoint.
  std::vector<std::uintptr_t> allocated_then;
  const std::vector<std::vector<bool>>& liveness = node.liveness_after();
  for (std::size_t d = 0; d < liveness.size() && d < node.path().size(); ++d) {
    const TreeNode& owner = *node.path()[d];
    for (std::size_t i = 0; i < liveness[d].size(); ++i) {
      const std::uintptr_t address = owner.output_storage()[i];
      if (liveness[d][i] && address != 0) allocated_then.push_back(address);
    }
  }
  if (auto restored = restore(node.checkpoint(), allocated_then); !restored) {
    Error error = std::move(restored.error());
    error.node = node.id();
    return std::unexpected(std::move(error));
  }
  return debug_check("after restoring a checkpoint");
}

Result<PoolSnapshot> PoolMemory::snapshot(const FunctionRecord& function, const char* doing) {
  if (auto checked = debug_check(options_.debug_checks ? ("before " + std::string(doing)).c_str() : doing); !checked) {
    return std::unexpected(in_call(std::move(checked.error()), function, "checking the pool"));
  }
  auto checkpoint = device_.checkpoint();
  if (!checkpoint) return std::unexpected(in_call(std::move(checkpoint.error()), function, doing));
  PoolSnapshot snapshot{.checkpoint = std::move(*checkpoint), .owned_live = {}};
  for (const Cell* cell : path_.live_cells()) {
    if (cell->storage.owned_by_allocator) snapshot.owned_live.push_back(cell->storage.address);
  }
  return snapshot;
}

Result<void> PoolMemory::roll_back(const PoolSnapshot& before) {
  return restore(*before.checkpoint, before.owned_live);
}

Result<void> PoolMemory::restore(const backend::Checkpoint& checkpoint,
                                 std::span<const std::uintptr_t> allocated_then) {
  // Live now and allocated then: kept allocated (the allocator owns them from now on). A live
  // storage the checkpoint does not hold (a replay's output, which the allocator counts as free)
  // stays as it is: marking it owned would free a block the allocator never gave out.
  const auto held_then = [allocated_then](const Cell* cell) {
    return std::ranges::find(allocated_then, cell->storage.address) != allocated_then.end();
  };
  std::vector<Cell*> kept;
  for (Cell* cell : path_.live_cells()) {
    if (held_then(cell)) kept.push_back(cell);
  }
  std::vector<backend::StorageHandle*> handles;
  handles.reserve(kept.size());
  for (Cell* cell : kept) handles.push_back(&cell->storage);
  // Allocated then, not live now: it died since (a lease dropped, inside a function or between
  // calls), and the checkpoint still counts it. Aliases share a storage: each is freed once.
  std::vector<std::uintptr_t> dead;
  for (const std::uintptr_t address : allocated_then) {
    const bool lives =
        std::ranges::any_of(kept, [address](const Cell* cell) { return cell->storage.address == address; });
    if (!lives && std::ranges::find(dead, address) == dead.end()) dead.push_back(address);
  }
  if (auto restored = device_.restore(checkpoint, handles, dead); !restored) return restored;
  for (Cell* cell : kept) cell->storage.owned_by_allocator = true;
  return {};
}

void PoolMemory::cell_died(Cell& cell) noexcept {
  if (shut_down_) return;
  // A replay's output on the host: nothing to free, nothing to poison (the ledger's rule).
  if (!ledger_.device_hears_of_death(cell)) return;
  device_.release(cell.storage, backend::Release::dead, functions_[cell.function].name);
  cell.storage.owned_by_allocator = false;
}

Result<void> PoolMemory::check() const {
  // Blocks the allocator counts as allocated must be exactly the storages that live leases hold
  // and the allocator owns (PyTorch's check_memory_pool).
  std::vector<std::uintptr_t> expected;
  for (const Cell* cell : path_.live_cells()) {
    if (cell->storage.owned_by_allocator) expected.push_back(cell->storage.address);
  }
  // A path a new generation ended: its memory is released once the call does its work.
  for (const CellRef& cell : path_.ended_cells()) {
    if (cell->storage.owned_by_allocator) expected.push_back(cell->storage.address);
  }
  std::vector<std::string> problems;
  for (const Block& block : device_.live_blocks()) {
    auto found = std::ranges::find(expected, block.address);
    if (found == expected.end()) {
      problems.push_back("block " + hex(block.address) + " (" + std::to_string(block.bytes) +
                         " bytes) is allocated in the pool, but no live lease holds it");
    } else {
      expected.erase(found);
    }
  }
  for (const std::uintptr_t address : expected) {
    problems.push_back("storage " + hex(address) + " is held by a live lease, but is not allocated in the pool");
  }
  if (problems.empty()) return {};
  std::string message = "the pool's memory does not match its leases: ";
  for (std::size_t i = 0; i < problems.size(); ++i) message += (i > 0 ? "; " : "") + problems[i];
  return fail(Errc::invariant_violation, message + ". This is a bug in cgt or its backend: please report it");
}

Result<void> PoolMemory::debug_check(const char* where) const {
  if (!options_.debug_checks) return {};
  auto checked = check();
  if (!checked) checked.error().message = std::string(where) + ": " + checked.error().message;
  return checked;
}

}  // namespace cgt::detail
