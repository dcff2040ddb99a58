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

void TreeNode::rebind_outputs(Engine& engine) {
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
          cells_[i] = make_cell(storage, engine.function_of(*this));
          engine.device().adopt(cells_[i]->storage);
        } else {
          cell->storage.owned_by_allocator = false;  // a replay allocates nothing
          if (cell->storage.native == nullptr) engine.device().adopt(cell->storage);
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
  backend::Recording& recording = *node.recording();
  // What the replay would refuse for the caller's reasons is refused before anything changes:
  // the last generation's outputs are still held, and the generation can still be taken back.
  if (node.checks_arguments()) [[unlikely]] {
    if (auto takes = recording.check(frame.args); !takes) {
      return std::unexpected(in_call(std::move(takes.error()), function, "replaying", node.id()));
    }
  }
  release_ended_path();  // the graph writes where the last generation's outputs were
  node.bind_outputs_for_replay(*this);
  if (auto replayed = recording.replay(frame.args); !replayed) [[unlikely]] {
    return std::unexpected(in_call(std::move(replayed.error()), function, "replaying", node.id()));
  }
  const TreeNode& ran = node;
  CallOutputs out = lease_outputs(
      frame, CallKind::replay, ran.id(), ran.output_count(), [&](std::size_t i) { return ran.cells()[i].get(); },
      [&](std::size_t i) { return ran.output_value(i); }, NoOwner{});
  path_.enter(node, PathState::execution, frame.generation);
  ++stats_.replays;
  return out;
}

}  // namespace cgt::detail
