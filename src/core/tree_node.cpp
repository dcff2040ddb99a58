// The tree's nodes: how a node takes its inputs, outputs and recorded state, keeping the fields
// that derive from one another consistent.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

module cgt.core;
import :tree;

namespace cgt::detail {

CellRef make_cell(const backend::StorageHandle& storage, std::uint32_t function) {
  return CellRef(new Cell(storage, function));  // NOLINT(cppcoreguidelines-owning-memory): owned by CellRef counting
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

Children::Entry& Children::entry_of(std::uint32_t variant) {
  const auto at = std::ranges::lower_bound(entries_, variant, {}, &Entry::variant);
  if (at != entries_.end() && at->variant == variant) return *at;
  return *entries_.insert(at, Entry{.variant = variant, .nodes = {}, .facts = {}});
}

TreeNode& Children::add(std::unique_ptr<TreeNode> node) {
  auto& list = entry_of(node->variant()).nodes;
  if (list.empty()) order_.push_back(node->variant());
  list.push_back(std::move(node));
  return *list.back();
}

ChildFacts& Children::facts(std::uint32_t variant) {
  return entry_of(variant).facts;
}

std::size_t Children::count_descendants() const {
  std::size_t count = 0;
  for (const Entry& entry : entries_) {
    for (const auto& child : entry.nodes) count += 1 + child->num_descendants();
  }
  return count;
}

std::unique_ptr<TreeNode> Children::take(const TreeNode* node) {
  for (Entry& entry : entries_) {
    auto found = std::ranges::find_if(entry.nodes, [node](const auto& child) { return child.get() == node; });
    if (found == entry.nodes.end()) continue;
    std::unique_ptr<TreeNode> taken = std::move(*found);
    entry.nodes.erase(found);
    if (entry.nodes.empty()) std::erase(order_, entry.variant);
    return taken;
  }
  return nullptr;
}

NodeMemory TreeNode::memory() const noexcept {
  return {.predicted_pool_bytes = predicted_growth_,
          .pool_bytes = pool_growth_,
          .slot_bytes = recording_ ? recording_->slot_bytes() : 0,
          .executable_bytes = recording_ ? recording_->executable_bytes() : 0};
}

void Children::clear() noexcept {
  entries_.clear();
  order_.clear();
}

TreeNode::TreeNode(NodeKind kind, std::int64_t id, NodeReason reason, std::uint32_t variant, TreeNode* parent)
    : id_(id), kind_(kind), reason_(reason), variant_(variant), parent_(parent) {
  if (parent != nullptr) path_ = parent->path_;
  path_.push_back(this);
}

TreeNode::~TreeNode() = default;

void TreeNode::take_inputs(std::span<const InputUse> uses, std::span<const backend::ArgDesc> descs) {
  managed_inputs_.clear();
  static_inputs_.clear();
  recorded_data_.assign(uses.size(), 0);
  copied_to_slot_.assign(uses.size(), false);
  for (std::size_t i = 0; i < uses.size(); ++i) {
    const auto index = static_cast<std::uint32_t>(i);
    switch (uses[i]) {
      case InputUse::scalar: break;
      case InputUse::managed:
        managed_inputs_.push_back(index);
        recorded_data_[i] = descs[i].data;
        break;
      case InputUse::static_in_place:
        static_inputs_.push_back(index);
        recorded_data_[i] = descs[i].data;
        break;
      case InputUse::copied: copied_to_slot_[i] = true; break;
    }
  }
  decide_fits_every_call();
}

std::optional<PathIndex> TreeNode::live_output_at(std::uintptr_t storage) const noexcept {
  for (std::size_t d = 0; d < path_.size(); ++d) {
    const TreeNode& node = *path_[d];
    for (std::size_t i = 0; i < node.output_count_; ++i) {
      const CellRef& cell = node.cells_[i];
      if (cell && cell->is_live() && cell->storage.address == storage) {
        return PathIndex{.depth = static_cast<std::uint32_t>(d), .output = static_cast<std::uint32_t>(i)};
      }
    }
  }
  return std::nullopt;
}

void TreeNode::take_outputs(std::span<const backend::OutputDesc> outputs, std::uint32_t function) {
  const std::size_t count = outputs.size();
  output_count_ = count;
  aliases_.assign(count, OutputAlias{});
  cells_.assign(count, CellRef());
  output_storage_.assign(count, 0);
  output_bytes_.assign(count, 0);
  bound_.clear();
  bound_native_.clear();
  for (std::size_t i = 0; i < count; ++i) {
    const backend::OutputDesc& desc = outputs[i];
    OutputAlias& alias = aliases_[i];
    if (desc.kind == backend::OutputKind::none) continue;
    if (!desc.in_pool) {
      alias.kind = AliasKind::external;  // a static input or a constant: always live, never ours
      continue;
    }
    output_storage_[i] = desc.storage;
    output_bytes_[i] = desc.storage_bytes;
    if (auto prior = parent_ != nullptr ? parent_->live_output_at(desc.storage) : std::nullopt) {
      alias = OutputAlias{.kind = AliasKind::alias_of_prior, .output = 0, .prior = *prior};
      cells_[i] = parent_->cell_at(*prior);
      continue;
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (aliases_[j].kind == AliasKind::new_storage && output_storage_[j] == desc.storage) {
        alias = OutputAlias{.kind = AliasKind::alias_of_output, .output = static_cast<std::uint32_t>(j), .prior = {}};
        cells_[i] = cells_[j];
        break;
      }
    }
    if (alias.kind == AliasKind::alias_of_output) continue;
    alias.kind = AliasKind::new_storage;
    const backend::StorageHandle storage{.address = desc.storage,
                                         .bytes = desc.storage_bytes,
                                         .native = desc.native,
                                         .native_owner = desc.native_owner,
                                         .owned_by_allocator = true};
    cells_[i] = make_cell(storage, function);
  }
  outputs_own_storage_ =
      std::ranges::all_of(aliases_, [](const OutputAlias& alias) { return alias.kind == AliasKind::new_storage; });
  decide_fits_every_call();
}

void TreeNode::mark_recorded(std::unique_ptr<backend::Checkpoint> checkpoint,
                             const std::vector<std::vector<bool>>& liveness_before) {
  checkpoint_ = std::move(checkpoint);
  liveness_after_ = liveness_of(path_);
  if (parent_ != nullptr) {
    expected_dead_before_ = differing_indices(parent_->liveness_after_, liveness_before);
    // `liveness_after_` has a row more (this node): the comparison stops at the shorter.
    expected_dead_after_ = differing_indices(liveness_before, liveness_after_);
  }
  live_after_.clear();
  for (std::size_t d = 0; d < liveness_after_.size(); ++d) {
    for (std::size_t i = 0; i < liveness_after_[d].size(); ++i) {
      if (liveness_after_[d][i]) live_after_.push_back({static_cast<std::uint32_t>(d), static_cast<std::uint32_t>(i)});
    }
  }
  bound_.clear();
  bound_native_.clear();
  output_values_.assign(output_count_, nullptr);
  for (std::size_t i = 0; recording_ != nullptr && i < output_count_; ++i) output_values_[i] = recording_->output(i);
  decide_fits_every_call();
}

void TreeNode::decide_fits_every_call() noexcept {
  fits_every_call_ =
      managed_inputs_.empty() && static_inputs_.empty() && expected_dead_before_.empty() &&
      expected_dead_after_.empty() &&
      std::ranges::none_of(aliases_, [](const OutputAlias& alias) { return alias.kind == AliasKind::alias_of_prior; });
}

std::vector<std::vector<bool>> liveness_of(std::span<TreeNode* const> nodes) {
  std::vector<std::vector<bool>> liveness;
  liveness.reserve(nodes.size());
  for (const TreeNode* node : nodes) {
    std::vector<bool> outputs(node->output_count(), false);
    for (std::size_t i = 0; i < node->output_count(); ++i) {
      const CellRef& cell = node->cells()[i];
      outputs[i] = cell && cell->is_live();
    }
    liveness.push_back(std::move(outputs));
  }
  return liveness;
}

void TreeNode::rebind_outputs(backend::Device& device, std::uint32_t function) {
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
          cells_[i] = make_cell(storage, function);
          device.adopt(cells_[i]->storage);
        } else {
          cell->storage.owned_by_allocator = false;  // a replay allocates nothing
          if (cell->storage.native == nullptr) device.adopt(cell->storage);
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

}  // namespace cgt::detail
