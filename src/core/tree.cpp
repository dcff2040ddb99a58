// The tree of recordings: its graph nodes by id, and the rule that picks the child a call replays
// (PyTorch's CUDAGraphNode.check_invariants, applied to each child of the current node in turn).
module;
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

module cgt.core;
import :tree;

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
                               std::span<const backend::ArgDesc> descs) noexcept {
  for (const std::uint32_t input : inputs) {
    if (descs[input].data != child.recorded_data()[input]) return static_cast<std::int32_t>(input);
  }
  return -1;
}

// Leases the call itself gives up on `cell` (leases it consumed: arguments moved into it).
std::uint32_t consumed_leases(std::span<const backend::ArgSlot> args, const Cell* cell) noexcept {
  std::uint32_t count = 0;
  for (const backend::ArgSlot& slot : args) count += slot.consumed != nullptr && slot.consumed->cell == cell;
  return count;
}

bool liveness_allows(const TreeNode& child, std::span<const backend::ArgSlot> args) noexcept {
  // An output that views an earlier graph's output must find that storage live.
  for (const OutputAlias& alias : child.aliases()) {
    if (alias.kind != AliasKind::alias_of_prior) continue;
    const CellRef& cell = child.cell_at(alias.prior);
    if (!cell || !cell->is_live()) return false;
  }
  // Storages that died during the recording (leases the call consumed) must die during this call too,
  // or the graph would overwrite memory the caller still holds.
  return std::ranges::none_of(child.expected_dead_after(), [&child, args](const PathIndex& index) {
    const CellRef& cell = child.cell_at(index);
    return cell && cell->is_live() && cell->leases() > consumed_leases(args, cell.get());
  });
}

}  // namespace

TreeNode& Tree::add(std::unique_ptr<TreeNode> node, Children& siblings) {
  nodes_.emplace_back(node.get());
  return siblings.add(std::move(node));
}

std::unique_ptr<TreeNode> Tree::evict(TreeNode& node) {
  auto forget = [this](auto& self, const TreeNode& gone) -> void {
    nodes_[static_cast<std::size_t>(gone.id())] = nullptr;
    gone.children().each([&](const TreeNode& child) { self(self, child); });
  };
  forget(forget, node);
  Children& siblings = node.parent() != nullptr ? node.parent()->children() : roots_;
  return siblings.take(&node);
}

void Tree::clear() noexcept {
  nodes_.clear();  // views first: the roots own the nodes
  roots_.clear();
}

bool Tree::search_ends_at(TreeNode& child, std::span<const backend::ArgDesc> descs,
                          std::span<const backend::ArgSlot> args, OnStaticInputMoved on_moved, Match& match) noexcept {
  // Outputs of earlier graphs are baked into this graph at their recorded addresses.
  if (const std::int32_t moved = first_moved_input(child.managed_inputs(), child, descs); moved >= 0) {
    match.moved_managed_input = moved;
    return false;
  }
  // Memory this graph reuses must be dead now, as it was when the graph was recorded.
  if (!all_dead(child, child.expected_dead_before())) {
    match.liveness_differs = true;
    return false;
  }
  const std::int32_t moved_static = first_moved_input(child.static_inputs(), child, descs);
  if (moved_static >= 0 && on_moved == OnStaticInputMoved::rerecord) {
    if (match.static_moved_child == nullptr) {
      match.static_moved_child = &child;
      match.moved_static_input = moved_static;
    }
    return false;
  }
  if (!liveness_allows(child, args)) {
    match.liveness_differs = true;
    return false;
  }
  if (moved_static >= 0) {  // OnStaticInputMoved::error: the call fails on this child
    match.static_moved_child = &child;
    match.moved_static_input = moved_static;
  } else {
    match.replayable = &child;
  }
  return true;
}

}  // namespace cgt::detail
