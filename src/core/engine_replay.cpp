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

module cgt;
import :engine;

namespace cgt::detail {
namespace {

bool all_dead(const TreeNode& node, std::span<const PathIndex> indices) noexcept {
  return std::ranges::none_of(indices, [&node](const PathIndex& index) {
    const CellRef& cell = node.path[index.depth]->cells[index.output];
    return cell && cell->is_live();
  });
}

// The first of `inputs` (read in place by `child`) that is not at the address it was recorded
// with, or -1.
std::int32_t first_moved_input(std::span<const std::uint32_t> inputs, const TreeNode& child,
                               const CallFrame& frame) noexcept {
  for (const std::uint32_t input : inputs) {
    if (frame.descs[input].data != child.recorded_data[input]) return static_cast<std::int32_t>(input);
  }
  return -1;
}

// Leases the call itself gives up on `cell` (leases it consumed: arguments moved into it).
std::uint32_t consumed_leases(const CallFrame& frame, const Cell* cell) noexcept {
  std::uint32_t count = 0;
  for (const backend::ArgSlot& slot : frame.args) count += slot.consumed != nullptr && slot.consumed->cell == cell;
  return count;
}

// True when every output has a storage of its own whose cell (dead since the last execution of the
// node, so not owned by the allocator) can be handed out again as it is: the common replay.
bool outputs_reusable_as_bound(const TreeNode& node) noexcept {
  if (!node.outputs_own_storage || node.bound.size() != node.output_count) return false;
  for (std::size_t i = 0; i < node.output_count; ++i) {
    const Cell* cell = node.cells[i].get();
    if (cell == nullptr || cell->reclaimed || cell->leases > 0 || cell->storage.native != node.bound_native[i]) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool Engine::liveness_allows(const TreeNode& child, const CallFrame& frame) const {
  // An output that views an earlier graph's output must find that storage live.
  for (const OutputAlias& alias : child.aliases) {
    if (alias.kind != AliasKind::alias_of_prior) continue;
    const CellRef& cell = child.path[alias.prior.depth]->cells[alias.prior.output];
    if (!cell || !cell->is_live()) return false;
  }
  // Storages that died during the recording (leases the call consumed) must die during this call too,
  // or the graph would overwrite memory the caller still holds.
  return std::ranges::none_of(child.expected_dead_after, [&child, &frame](const PathIndex& index) {
    const CellRef& cell = child.path[index.depth]->cells[index.output];
    return cell && cell->is_live() && cell->leases > consumed_leases(frame, cell.get());
  });
}

Match Engine::find_replayable_child(CallFrame& frame) {
  Match match;
  auto& siblings = current != nullptr ? current->children : roots;
  const auto found = siblings.find(frame.variant->id);
  if (found == siblings.end()) return match;
  for (const auto& owned : found->second) {
    TreeNode& child = *owned;
    // Outputs of earlier graphs are baked into this graph at their recorded addresses.
    if (const std::int32_t moved = first_moved_input(child.managed_inputs, child, frame); moved >= 0) {
      match.moved_managed_input = moved;
      continue;
    }
    // Memory this graph reuses must be dead now, as it was when the graph was recorded.
    if (!all_dead(child, child.expected_dead_before)) {
      match.liveness_differs = true;
      continue;
    }
    const std::int32_t moved_static = first_moved_input(child.static_inputs, child, frame);
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

void Engine::bind_output_cells(TreeNode& node) {
  if (outputs_reusable_as_bound(node)) return;
  bool changed = node.bound.size() != node.output_count;
  node.bound.resize(node.output_count, nullptr);
  node.bound_native.resize(node.output_count, nullptr);
  for (std::size_t i = 0; i < node.output_count; ++i) {
    const OutputAlias& alias = node.aliases[i];
    switch (alias.kind) {
      case AliasKind::new_storage: {
        Cell* cell = node.cells[i].get();
        // A storage reclaimed by a new step may still be referenced by stale leases: use a new cell.
        if (cell == nullptr || cell->reclaimed || cell->leases > 0) {
          const backend::StorageHandle storage{
              .address = node.output_storage[i], .bytes = node.output_bytes[i], .owned_by_allocator = false};
          node.cells[i] = make_cell(*this, storage, variants[node.variant]->function);
          device->adopt(node.cells[i]->storage);
        } else {
          cell->storage.owned_by_allocator = false;  // a replay allocates nothing
          if (cell->storage.native == nullptr) device->adopt(cell->storage);
        }
        break;
      }
      case AliasKind::alias_of_output: node.cells[i] = node.cells[alias.output]; break;
      case AliasKind::alias_of_prior: node.cells[i] = node.path[alias.prior.depth]->cells[alias.prior.output]; break;
      case AliasKind::external:
      case AliasKind::none: node.cells[i] = CellRef(); break;
    }
    backend::StorageHandle* storage = node.cells[i] ? &node.cells[i]->storage : nullptr;
    const void* native = storage != nullptr ? storage->native : nullptr;
    if (node.bound[i] != storage || node.bound_native[i] != native) changed = true;
    node.bound[i] = storage;
    node.bound_native[i] = native;
  }
  if (changed) node.recording->bind_outputs(node.bound);
}

Result<CallOutputs> Engine::replay(TreeNode& node, CallFrame& frame) {
  const FunctionRecord& function = *frame.function;
  bind_output_cells(node);
  if (auto replayed = node.recording->replay(frame.args); !replayed) {
    return std::unexpected(in_call(std::move(replayed.error()), function, "replaying", node.id));
  }
  CallOutputs out;
  out.kind = CallKind::replay;
  out.node = node.id;
  out.leases.reserve(node.output_count);
  for (std::size_t i = 0; i < node.output_count; ++i) {
    LeaseCore& lease = out.leases.emplace_back();
    lease_to(lease, *this, node.cells[i].get(), node.recording->output(i), function.id, static_cast<std::uint32_t>(i));
  }
  // Leases the call consumed die now, after the outputs that may alias them took their leases.
  consume_arguments(frame);
  enter(node, PathState::execution, frame);
  ++stats.replays;
  return out;
}

}  // namespace cgt::detail
