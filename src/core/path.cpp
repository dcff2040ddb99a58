// The path's queries over its nodes' outputs, and its transitions that need no template (path.cppm
// has the contract of each).
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
import :path;

namespace cgt::detail {

std::span<TreeNode* const> Path::nodes() const noexcept {
  if (current_ == nullptr) return {};
  return current_->path();
}

std::vector<std::vector<bool>> Path::liveness() const {
  return liveness_of(nodes());
}

std::optional<PathIndex> Path::live_alias(std::uintptr_t storage) const {
  if (current_ == nullptr) return std::nullopt;
  return current_->live_output_at(storage);
}

Cell* Path::live_cell(std::uintptr_t storage) const {
  const auto alias = live_alias(storage);
  return alias ? current_->cell_at(*alias).get() : nullptr;
}

bool Path::is_output(std::uintptr_t storage) const {
  if (current_ == nullptr || storage == 0) return false;
  return std::ranges::any_of(current_->path(), [storage](const TreeNode* node) {
    return std::ranges::find(node->output_storage(), storage) != node->output_storage().end();
  });
}

std::vector<Cell*> Path::live_cells() const {
  std::vector<Cell*> live;
  if (current_ == nullptr) return live;
  for (const TreeNode* node : current_->path()) {
    for (const CellRef& cell : node->cells()) {
      if (cell && cell->is_live() && std::ranges::find(live, cell.get()) == live.end()) {
        live.push_back(cell.get());
      }
    }
  }
  return live;
}

bool Path::is_output_of_ended(std::uintptr_t storage) const noexcept {
  return ended_ && std::ranges::any_of(ended_->cells,
                                       [storage](const CellRef& cell) { return cell->storage.address == storage; });
}

std::span<const CellRef> Path::ended_cells() const noexcept {
  if (!ended_) return {};
  return ended_->cells;
}

std::unique_ptr<TreeNode> Path::make_warmup_node(NodeReason reason, std::uint32_t variant) {
  return std::make_unique<TreeNode>(NodeKind::warmup, next_warmup_id_--, reason, variant, current_);
}

TreeNode& Path::enter_warmup(std::unique_ptr<TreeNode> node, std::uint64_t generation) {
  warmup_chain_.push_back(std::move(node));
  enter(*warmup_chain_.back(), PathState::warmup, generation);
  return *warmup_chain_.back();
}

std::optional<EndedPath> Path::take_ended() noexcept {
  if (ended_) ++reclaims_;
  return std::exchange(ended_, std::nullopt);
}

}  // namespace cgt::detail
