// Replay: find the child of the current node whose invariants hold for this call, then hand its
// outputs out as leases. This is the hot path of a pool.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

bool all_dead(const TreeNode& node, std::span<const PathIndex> indices) noexcept {
  return std::ranges::none_of(indices, [&node](const PathIndex& index) {
    const CellRef& cell = node.cell_at(index);
    return cell && cell->is_live();
  });
}

// The first of `inputs` (read in place by `child`) that is not at the address it was recorded
// with, or -1.
std::int32_t first_moved_input(std::span<const std::uint32_t> inputs, const TreeNode& child,
                               const CallFrame& frame) noexcept {
  for (const std::uint32_t input : inputs) {
    if (frame.descs[input].data != child.recorded_data()[input]) return static_cast<std::int32_t>(input);
  }
  return -1;
}

// Leases the call itself gives up on `cell` (leases it consumed: arguments moved into it).
std::uint32_t consumed_leases(const CallFrame& frame, const Cell* cell) noexcept {
  std::uint32_t count = 0;
  for (const backend::ArgSlot& slot : frame.args) count += slot.consumed != nullptr && slot.consumed->cell == cell;
  return count;
}

}  // namespace

bool Engine::liveness_allows(const TreeNode& child, const CallFrame& frame) const {
  // An output that views an earlier graph's output must find that storage live.
  for (const OutputAlias& alias : child.aliases()) {
    if (alias.kind != AliasKind::alias_of_prior) continue;
    const CellRef& cell = child.cell_at(alias.prior);
    if (!cell || !cell->is_live()) return false;
  }
  // Storages that died during the recording (leases the call consumed) must die during this call too,
  // or the graph would overwrite memory the caller still holds.
  return std::ranges::none_of(child.expected_dead_after(), [&child, &frame](const PathIndex& index) {
    const CellRef& cell = child.cell_at(index);
    return cell && cell->is_live() && cell->leases() > consumed_leases(frame, cell.get());
  });
}

Match Engine::find_replayable_child(CallFrame& frame) {
  Match match;
  const Children& siblings = path.children(roots);
  for (const auto& owned : siblings.of(frame.variant->id)) {
    TreeNode& child = *owned;
    // Outputs of earlier graphs are baked into this graph at their recorded addresses.
    if (const std::int32_t moved = first_moved_input(child.managed_inputs(), child, frame); moved >= 0) {
      match.moved_managed_input = moved;
      continue;
    }
    // Memory this graph reuses must be dead now, as it was when the graph was recorded.
    if (!all_dead(child, child.expected_dead_before())) {
      match.liveness_differs = true;
      continue;
    }
    const std::int32_t moved_static = first_moved_input(child.static_inputs(), child, frame);
    if (moved_static >= 0 && options.on_static_input_moved == OnStaticInputMoved::rerecord) {
      if (match.static_moved_child == nullptr) {
        match.static_moved_child = &child;
        match.moved_static_input = moved_static;
      }
      continue;
    }
    if (!liveness_allows(child, frame)) {
      match.liveness_differs = true;
      continue;
    }
    if (moved_static >= 0) {  // OnStaticInputMoved::error: the call fails on this child
      match.static_moved_child = &child;
      match.moved_static_input = moved_static;
    } else {
      match.replayable = &child;
    }
    return match;
  }
  return match;
}

// True when every output has a storage of its own whose cell (dead since the last execution of the
// node, so not owned by the allocator) can be handed out again as it is: the common replay.
bool TreeNode::is_bound_as_is() const noexcept {
  if (!outputs_own_storage_ || bound_.size() != output_count_) return false;
  for (std::size_t i = 0; i < output_count_; ++i) {
    const Cell* cell = cells_[i].get();
    if (cell == nullptr || cell->is_reclaimed() || cell->leases() > 0 || cell->storage.native != bound_native_[i]) {
      return false;
    }
  }
  return true;
}

void TreeNode::bind_outputs_for_replay(Engine& engine) {
  if (is_bound_as_is()) return;
  bool changed = bound_.size() != output_count_;
  bound_.resize(output_count_, nullptr);
  bound_native_.resize(output_count_, nullptr);
  for (std::size_t i = 0; i < output_count_; ++i) {
    const OutputAlias& alias = aliases_[i];
    switch (alias.kind) {
      case AliasKind::new_storage: {
        Cell* cell = cells_[i].get();
        // A storage reclaimed by a new generation may still be referenced by stale leases: use a new cell.
        if (cell == nullptr || cell->is_reclaimed() || cell->leases() > 0) {
          const backend::StorageHandle storage{
              .address = output_storage_[i], .bytes = output_bytes_[i], .owned_by_allocator = false};
          cells_[i] = make_cell(engine, storage, engine.variants[variant_]->function);
          engine.device->adopt(cells_[i]->storage);
        } else {
          cell->storage.owned_by_allocator = false;  // a replay allocates nothing
          if (cell->storage.native == nullptr) engine.device->adopt(cell->storage);
        }
        break;
      }
      case AliasKind::alias_of_output: cells_[i] = cells_[alias.output]; break;
      case AliasKind::alias_of_prior: cells_[i] = cell_at(alias.prior); break;
      case AliasKind::external:
      case AliasKind::none: cells_[i] = CellRef(); break;
    }
    backend::StorageHandle* storage = cells_[i] ? &cells_[i]->storage : nullptr;
    const void* native = storage != nullptr ? storage->native : nullptr;
    if (bound_[i] != storage || bound_native_[i] != native) changed = true;
    bound_[i] = storage;
    bound_native_[i] = native;
  }
  if (changed) recording_->bind_outputs(bound_);
}

Result<CallOutputs> Engine::replay(TreeNode& node, CallFrame& frame) {
  const FunctionRecord& function = *frame.function;
  release_ended_path();  // the graph writes where the last generation's outputs were
  node.bind_outputs_for_replay(*this);
  backend::Recording& recording = *node.recording();
  if (auto replayed = recording.replay(frame.args); !replayed) {
    return std::unexpected(in_call(std::move(replayed.error()), function, "replaying", node.id()));
  }
  CallOutputs out;
  out.kind = CallKind::replay;
  out.node = node.id();
  const std::size_t count = node.output_count();
  out.leases.reserve(count);
  retain(*this, static_cast<std::uint32_t>(count));  // every lease's reference, counted at once
  for (std::size_t i = 0; i < count; ++i) {
    ledger.lease_to(out.leases.emplace_back(), node.cells()[i].get(), recording.output(i), function.id,
                    static_cast<std::uint32_t>(i), generation_rule.current());
  }
  // Leases the call consumed die now, after the outputs that may alias them took their leases.
  Ledger::consume(frame.args);
  path.enter(node, PathState::execution, frame.generation);
  ++stats.replays;
  return out;
}

}  // namespace cgt::detail
