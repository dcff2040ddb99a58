// cgt.core:budget (internal) — keeping a pool inside `Options::memory_budget_bytes`: whether a
// recording fits, which graphs go first when it does not (`OverBudget::evict_coldest`), and the
// use counter that says which graphs are cold.
module;
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

export module cgt.core:budget;
import cgt.vocabulary;
import :spi;
import :tree;
import :path;

namespace cgt::detail {

/// Owns the budget's rule and the graphs' use counter. Its state: the counter. It changes the tree
/// (evicting nodes), the device's segments (`Device::release_unused`) and the eviction counters of
/// `Stats`.
///
/// Contract:
///  * `touch(node)`: at each replay and recording. ENSURES: `node` is the hottest graph.
///  * `budgeted_bytes()`: the pool's reserved bytes plus the executables of the graphs in the tree.
///  * `settle()`: after a recording, which may have taken more than predicted. ENSURES: as
///    `make_room` with nothing to add, the new graph (on the path) kept.
///  * `make_room(predict, keep)`: before a recording, `predict()` giving what it would add from the
///    pool's state now (empty: unknown, counted as 0). ENSURES: true when budgeted bytes plus the
///    prediction fit the budget (always, without one); the segments nothing holds were given back
///    first (`Device::release_unused`: a warm-up's temporaries); under `evict_coldest`, graphs were evicted
///    coldest first, each with its subtree, until they fit or no graph is left that may go. A graph
///    on the current path, on the path a new generation ended in this call, or `keep` and its
///    ancestors never goes: the call's work or its replay needs them. Nothing is evicted when
///    `least` (what the recording takes from an empty pool) is past the budget: no eviction could
///    make room, and dropping graphs would only cost re-recordings.
///
/// Invariant: a node's `last_use` is at most the counter; the tree's nodes after an eviction
/// reach only segments held by their recordings and checkpoints (the arena's holds).
class Budget {
 public:
  Budget(const Options& options, Tree& tree, const Path& path, backend::Device& device, Stats& stats) noexcept
      : options_(options), tree_(tree), path_(path), device_(device), stats_(stats) {}
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  /// Whether the pool has a budget (read on every recording only).
  [[nodiscard]] inline bool active() const noexcept { return options_.memory_budget_bytes != 0; }
  inline void touch(TreeNode& node) noexcept { node.touch(++clock_); }
  [[nodiscard]] std::size_t budgeted_bytes() const;
  [[nodiscard]] bool make_room(const std::function<std::optional<std::size_t>()>& predict,
                               std::optional<std::size_t> least, const TreeNode* keep);
  /// After a recording (the path at its node): past the budget, the segments nothing holds go
  /// back and, under `evict_coldest`, the coldest graphs off the path, until the pool fits or
  /// none is left. Returns whether it fits.
  bool settle();

 private:
  /// The coldest node that may go, or null.
  [[nodiscard]] TreeNode* coldest(const TreeNode* keep) const;
  /// Takes `node` and its subtree out of the tree and gives back the memory only they used.
  void evict(TreeNode& node);
  /// Destroys the recordings of `node` and its subtree, keeping what their outputs need
  /// (`Recording::outputs_owner`, or the recording whole where it owns them) in `evicted_`;
  /// counts each graph and its executable in `Stats`.
  void keep_husks(TreeNode& node);

  const Options& options_;
  Tree& tree_;
  const Path& path_;
  backend::Device& device_;
  Stats& stats_;
  std::uint64_t clock_ = 0;  ///< counts replays and recordings
  /// Evicted recordings, their executables and memory given back: leases of their past replays
  /// may still read the output values they handed out (a replay's leases do not own them). Kept
  /// until the engine goes.
  std::vector<std::shared_ptr<const void>> evicted_;
};

}  // namespace cgt::detail
