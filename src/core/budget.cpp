// The budget: evicting the coldest graphs until a recording fits (budget.cppm has the contract).
module;
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

module cgt.core;
import :budget;

namespace cgt::detail {
namespace {

// Whether `node` is `descendant` or one of its ancestors.
bool is_on_path_to(const TreeNode& node, const TreeNode* descendant) noexcept {
  if (descendant == nullptr) return false;
  return std::ranges::find(descendant->path(), &node) != descendant->path().end();
}

}  // namespace

std::size_t Budget::budgeted_bytes() const {
  std::size_t executables = 0;
  for (const TreeNode* node : tree_.nodes()) {
    if (node != nullptr) executables += node->memory().executable_bytes;
  }
  return device_.memory().reserved_bytes + executables;
}

bool Budget::make_room(const std::function<std::optional<std::size_t>()>& predict, std::optional<std::size_t> least,
                       const TreeNode* keep) {
  if (!active()) return true;
  const std::size_t budget = options_.memory_budget_bytes;
  auto fits = [&] {
    const std::size_t now = budgeted_bytes();
    const std::size_t adds = predict().value_or(0);
    return now <= budget && adds <= budget - now;
  };
  if (fits()) return true;
  // Segments no graph or checkpoint holds (a warm-up's temporaries) go first: nothing recorded
  // needs them.
  if (device_.release_unused() != 0 && fits()) return true;
  if (options_.over_budget != OverBudget::evict_coldest) return false;
  if (least.value_or(0) > budget) return false;  // futile: even alone it would not fit
  while (TreeNode* node = coldest(keep)) {
    evict(*node);
    if (fits()) return true;
  }
  return false;
}

bool Budget::settle() {
  // Room for nothing more: what is held now must fit.
  return make_room([] { return std::optional<std::size_t>{0}; }, std::nullopt, nullptr);
}

void Budget::keep_husks(TreeNode& node) {
  ++stats_.evictions;
  if (std::unique_ptr<backend::Recording> recording = node.take_recording()) {
    stats_.evicted_bytes += recording->executable_bytes();
    std::shared_ptr<const void> outputs = recording->outputs_owner();
    evicted_.push_back(outputs ? std::move(outputs) : std::shared_ptr<const void>(std::move(recording)));
  }
  node.children().each([&](TreeNode& child) { keep_husks(child); });
}

TreeNode* Budget::coldest(const TreeNode* keep) const {
  TreeNode* found = nullptr;
  for (TreeNode* node : tree_.nodes()) {
    if (node == nullptr || is_on_path_to(*node, path_.node()) || is_on_path_to(*node, path_.ended_node()) ||
        is_on_path_to(*node, keep)) {
      continue;
    }
    if (found == nullptr || node->last_use() < found->last_use()) found = node;
  }
  return found;
}

void Budget::evict(TreeNode& node) {
  std::unique_ptr<TreeNode> gone = tree_.evict(node);
  keep_husks(*gone);  // counts the graphs and their executables
  gone.reset();       // their checkpoints (and their segment holds) go
  stats_.evicted_bytes += device_.release_unused();
}

}  // namespace cgt::detail
