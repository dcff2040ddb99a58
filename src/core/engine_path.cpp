// What the path's changes do to the device (path.cppm owns the path itself): ending it when it is
// over, copying out and releasing the memory of a path a new generation ended, restoring the
// allocator to a node's checkpoint so that a warm-up or recording can follow a replay; making a
// cell, and what a cell's death does to the device (the ledger's effect).
module;
#include <expected>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "generation_rule.hpp"

module cgt.core;
import :engine;

namespace cgt::detail {

void Engine::reclaim_path() {
  end_path_for_new_generation();
  release_ended_path();
}

void Engine::end_path_for_new_generation() {
  // Marked now: the call's arguments are read after this, and a held output passed in must read
  // as reclaimed (or as its copy). Released once the call's work may reuse the memory.
  path_.end_for_new_generation([this](const Cell& cell) -> std::shared_ptr<void> {
    if (!options_.copy_out_on_new_step) return nullptr;
    auto rescued = device_->rescue(cell.storage);
    return rescued ? std::move(*rescued) : nullptr;
  });
}

Result<void> Engine::hold_ended_path_memory() {
  return path_.hold_ended_memory([this] { return restore_checkpoint(); });
}

void Engine::release_ended_path_now() noexcept {
  const std::optional<EndedPath> ended = path_.take_ended();  // its warm-up nodes go at the end
  if (!ended) return;
  ++stats_.steps_reclaimed;
  stats_.leases_copied_out += ended->leases_copied_out;
  stats_.leases_invalidated += ended->leases_invalidated;
  for (const CellRef& cell : ended->cells) {
    device_->release(cell->storage, backend::Release::reclaimed, functions_[cell->function].name);
    cell->storage.owned_by_allocator = false;
  }
}

void Engine::restore_ended_path() noexcept {
  path_.put_back_ended([this](Cell& cell) { cell_died(cell); });
}

Result<void> Engine::restore_checkpoint() {
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
  if (auto restored = restore_pool(node.checkpoint(), allocated_then); !restored) {
    Error error = std::move(restored.error());
    error.node = node.id();
    return std::unexpected(std::move(error));
  }
  return debug_check("after restoring a checkpoint");
}

Result<void> Engine::restore_pool(  // NOLINT(readability-make-member-function-const): it changes the pool
    const backend::Checkpoint& checkpoint, std::span<const std::uintptr_t> allocated_then) {
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
  if (auto restored = device_->restore(checkpoint, handles, dead); !restored) return restored;
  for (Cell* cell : kept) cell->storage.owned_by_allocator = true;
  return {};
}

void Engine::cell_died(Cell& cell) noexcept {  // NOLINT(readability-make-member-function-const): frees pool memory
  if (shut_down_) return;
  // A replay's output on the host: nothing to free, nothing to poison (the ledger's rule).
  if (!ledger_.device_hears_of_death(cell)) return;
  device_->release(cell.storage, backend::Release::dead, functions_[cell.function].name);
  cell.storage.owned_by_allocator = false;
}

ChildFacts& Engine::facts_for(std::uint32_t variant) {
  return path_.children(tree_.roots()).facts(variant);
}

}  // namespace cgt::detail
