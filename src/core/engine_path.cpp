// The current path of a pool: its liveness, ending it, reclaiming it for a new generation, and restoring
// the allocator to a node's checkpoint so that a warm-up or recording can follow a replay.
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

CellRef make_cell(Engine& engine, const backend::StorageHandle& storage, std::uint32_t function) {
  return CellRef(
      new Cell(engine, storage, function));  // NOLINT(cppcoreguidelines-owning-memory): owned by CellRef counting
}

void lease_to(LeaseCore& lease, Engine& engine, Cell* cell, const void* value, std::uint32_t function,
              std::uint32_t output) noexcept {
  lease.engine = EngineRef::adopt(&engine);
  if (cell != nullptr) {
    cell->add_lease(engine.lives, engine.generation_rule.current());
    if (engine.stamps_values) engine.device->stamp(value, cell->life());
    lease.cell = cell;
  }
  lease.value = value;
  lease.function = function;
  lease.output = output;
}

LeaseCore make_lease(Engine& engine, Cell* cell, const void* value, std::shared_ptr<const void> owner,
                     std::uint32_t function, std::uint32_t output) {
  LeaseCore lease;
  retain(engine);
  lease_to(lease, engine, cell, value, function, output);
  lease.owner = std::move(owner);
  return lease;
}

std::vector<PathIndex> differing_indices(const std::vector<std::vector<bool>>& before,
                                         const std::vector<std::vector<bool>>& after) {
  std::vector<PathIndex> indices;
  const std::size_t depth = std::min(before.size(), after.size());
  for (std::size_t d = 0; d < depth; ++d) {
    const std::size_t outputs = std::min(before[d].size(), after[d].size());
    for (std::size_t i = 0; i < outputs; ++i) {
      if (before[d][i] != after[d][i]) {
        indices.push_back({static_cast<std::uint32_t>(d), static_cast<std::uint32_t>(i)});
      }
    }
  }
  return indices;
}

std::span<TreeNode* const> Engine::path() const noexcept {
  if (current == nullptr) return {};
  return current->path();
}

std::vector<std::vector<bool>> Engine::path_liveness() const {
  return liveness_of(path());
}

std::optional<PathIndex> Engine::live_alias_in_path(std::uintptr_t storage) const {
  if (current == nullptr) return std::nullopt;
  return current->live_output_at(storage);
}

Cell* Engine::live_cell_in_path(std::uintptr_t storage) const {
  const auto alias = live_alias_in_path(storage);
  return alias ? current->cell_at(*alias).get() : nullptr;
}

bool Engine::is_path_output(std::uintptr_t storage) const {
  if (current == nullptr || storage == 0) return false;
  return std::ranges::any_of(current->path(), [storage](const TreeNode* node) {
    return std::ranges::find(node->output_storage(), storage) != node->output_storage().end();
  });
}

std::vector<Cell*> Engine::live_path_cells() const {
  std::vector<Cell*> live;
  if (current == nullptr) return live;
  for (const TreeNode* node : current->path()) {
    for (const CellRef& cell : node->cells()) {
      if (cell && cell->is_live() && std::ranges::find(live, cell.get()) == live.end()) {
        live.push_back(cell.get());
      }
    }
  }
  return live;
}

bool Engine::all_outputs_dead() const {
  if (current == nullptr) return true;
  if (current->kind() == NodeKind::graph) {
    // Everything live after the recording is listed; what was dead then cannot revive.
    return std::ranges::none_of(current->live_after(), [this](const PathIndex& index) {
      const CellRef& cell = current->cell_at(index);
      return cell && cell->is_live();
    });
  }
  return live_path_cells().empty();
}

void Engine::enter(TreeNode& node, PathState new_state, const CallFrame& frame) {
  current = &node;
  state = new_state;
  path_generation = frame.generation;
}

void Engine::end_path() {
  current = nullptr;
  state = PathState::none;
  warmup_chain.clear();
}

void Engine::end_path_if_over(std::uint64_t generation, PathCheck when) {
  if (current == nullptr) return;
  if (GenerationRule::is_new_generation(path_generation, generation)) {
    end_path_for_new_generation();
    return;
  }
  // A replaying path ends lazily (when no child fits); warm-ups and recordings are checked up front.
  if (when == PathCheck::call_start && state == PathState::execution) return;
  if (all_outputs_dead()) end_path();
}

void Engine::reclaim_path() {
  end_path_for_new_generation();
  release_ended_path();
}

void Engine::end_path_for_new_generation() {
  const std::vector<Cell*> live = live_path_cells();
  if (live.empty()) {
    end_path();
    return;
  }
  // Marked now: the call's arguments are read after this, and a held output passed in must read
  // as reclaimed (or as its copy). Released once the call's work may reuse the memory.
  EndedPath ended{
      .current = current, .state = state, .generation = path_generation, .warmup_chain = std::move(warmup_chain)};
  ended.cells.reserve(live.size());
  for (Cell* cell : live) {
    std::shared_ptr<void> copy;
    if (options.copy_out_on_new_step) {
      if (auto rescued = device->rescue(cell->storage)) copy = std::move(*rescued);
    }
    (copy != nullptr ? ended.leases_copied_out : ended.leases_invalidated) += cell->leases();
    cell->mark_reclaimed(std::move(copy));
    ended.cells.emplace_back(cell);
  }
  end_path();
  ended_path = std::move(ended);
}

Result<void> Engine::hold_ended_path_memory() {
  if (!ended_path || ended_path->memory_held) return {};
  ended_path->memory_held = true;
  if (ended_path->state != PathState::execution) return {};  // warm-ups and recordings allocated it
  // The path's checkpoint, restored as if it had not ended (its outputs live), then ended again.
  EndedPath ended = std::move(*ended_path);
  ended_path.reset();
  std::vector<std::shared_ptr<void>> copies;
  copies.reserve(ended.cells.size());
  for (const CellRef& cell : ended.cells) {
    copies.push_back(cell->copied_out());
    cell->unmark_reclaimed();
  }
  current = ended.current;
  auto restored = restore_checkpoint();
  current = nullptr;
  for (std::size_t i = 0; i < copies.size(); ++i) ended.cells[i]->mark_reclaimed(std::move(copies[i]));
  // Outputs whose last lease went since the path ended are free in the checkpoint restored: the
  // call may allocate their memory, and nothing of the ended path may release it again.
  std::erase_if(ended.cells, [](const CellRef& cell) { return cell->leases() == 0; });
  ended_path = std::move(ended);
  return restored;
}

bool Engine::is_output_of_ended_path(std::uintptr_t storage) const noexcept {
  return ended_path && std::ranges::any_of(ended_path->cells,
                                           [storage](const CellRef& cell) { return cell->storage.address == storage; });
}

void Engine::release_ended_path() noexcept {
  if (!ended_path) return;
  ++stats.steps_reclaimed;
  stats.leases_copied_out += ended_path->leases_copied_out;
  stats.leases_invalidated += ended_path->leases_invalidated;
  for (const CellRef& cell : ended_path->cells) {
    device->release(cell->storage, backend::Release::reclaimed, functions[cell->function]->name);
    cell->storage.owned_by_allocator = false;
  }
  ended_path.reset();  // the warm-up nodes of the ended path go with it
}

void Engine::restore_ended_path() noexcept {
  if (!ended_path) return;
  EndedPath ended = std::move(*ended_path);
  ended_path.reset();
  // Nothing of the call is on the path any more: whatever it made died with its failure.
  current = ended.current;
  state = ended.state;
  path_generation = ended.generation;
  warmup_chain = std::move(ended.warmup_chain);
  for (const CellRef& cell : ended.cells) {
    cell->unmark_reclaimed();
    if (cell->leases() == 0) cell_died(*cell.get());  // its last lease went during the call
  }
}

Result<void> Engine::restore_checkpoint() {
  const TreeNode& node = *current;
  ++stats.checkpoint_restores;
  const std::vector<Cell*> live = live_path_cells();
  std::vector<backend::StorageHandle*> handles;
  handles.reserve(live.size());
  for (Cell* cell : live) handles.push_back(&cell->storage);

  // What was live right after recording is allocated in the checkpoint; what died since must
  // be freed again (aliases share a storage: free it once).
  std::vector<std::uintptr_t> dead;
  for (const PathIndex& index : differing_indices(node.liveness_after(), path_liveness())) {
    const std::uintptr_t address = node.path()[index.depth]->output_storage()[index.output];
    if (address != 0 && std::ranges::find(dead, address) == dead.end()) dead.push_back(address);
  }
  if (auto restored = device->restore(node.checkpoint(), handles, dead); !restored) {
    Error error = std::move(restored.error());
    error.node = node.id();
    return std::unexpected(std::move(error));
  }
  for (Cell* cell : live) cell->storage.owned_by_allocator = true;
  return debug_check("after restoring a checkpoint");
}

void Engine::cell_died(Cell& cell) noexcept {  // NOLINT(readability-make-member-function-const): frees pool memory
  if (shut_down) return;
  // A replay's output on the host: nothing to free, nothing to poison; skip the call.
  if (!cell.storage.owned_by_allocator && cell.storage.native == nullptr && !releases_unowned) return;
  device->release(cell.storage, backend::Release::dead, functions[cell.function]->name);
  cell.storage.owned_by_allocator = false;
}

void Engine::consume_arguments(const CallFrame& frame) noexcept {
  for (const backend::ArgSlot& slot : frame.args) {
    if (slot.consumed != nullptr) lease_drop(*slot.consumed);
  }
}

ChildFacts& Engine::facts_for(std::uint32_t variant) {
  return (current != nullptr ? current->children() : roots).facts(variant);
}

}  // namespace cgt::detail
