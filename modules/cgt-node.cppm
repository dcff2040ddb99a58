// cgt:node — a read-only view of one node of a pool's tree (`Node`).
module;
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

export module cgt:node;
import cgt.vocabulary;
import cgt.core;

export namespace cgt {

class PoolBase;

/// A read-only view of one node of a pool's tree (a recording or a warm-up run), for
/// introspection and tests. Move-only. After `Pool::shutdown()`, and once moved from, a view is
/// empty: `exists()` is false and every accessor returns an empty value (`id()` keeps its id).
///
/// No accessor has a precondition: on an empty view each returns an empty value, never fails.
class Node {
 public:
  Node(Node&&) noexcept = default;
  Node& operator=(Node&&) noexcept = default;

  [[nodiscard]] bool exists() const { return detail::node_view::exists(engine_, id_); }
  /// Graph nodes count up from 0 in recording order; warm-up nodes count down from -1.
  [[nodiscard]] std::int64_t id() const noexcept { return id_; }
  [[nodiscard]] NodeKind kind() const { return detail::node_view::kind(engine_, id_); }
  [[nodiscard]] NodeReason reason() const { return detail::node_view::reason(engine_, id_); }
  /// Name of the function this node ran.
  [[nodiscard]] std::string function() const { return detail::node_view::function(engine_, id_); }
  /// Distance from the root (roots are at depth 0).
  [[nodiscard]] std::size_t depth() const { return detail::node_view::depth(engine_, id_); }
  /// Children recorded under this node, in recording order.
  [[nodiscard]] std::vector<Node> children() const { return views(engine_, detail::node_view::children(engine_, id_)); }
  /// Number of nodes below this one (PyTorch's `num_descendants`).
  [[nodiscard]] std::size_t num_descendants() const { return detail::node_view::num_descendants(engine_, id_); }
  [[nodiscard]] std::size_t output_count() const { return detail::node_view::output_count(engine_, id_); }
  /// Outputs of this node that are live now (leased, in the current path's execution).
  [[nodiscard]] std::size_t live_outputs() const { return detail::node_view::live_outputs(engine_, id_); }
  /// Outputs of earlier nodes of the path that must be dead before this graph replays.
  [[nodiscard]] std::vector<PathIndex> expected_dead_before() const {
    return detail::node_view::expected_dead_before(engine_, id_);
  }
  /// Outputs of earlier nodes of the path that died while this graph was recorded (consumed inputs).
  [[nodiscard]] std::vector<PathIndex> expected_dead_after() const {
    return detail::node_view::expected_dead_after(engine_, id_);
  }
  /// Whether its loops and branches (`loop_while`, `if_then`, `switch_on`) are decided by the host
  /// between segments of its graph at each replay (`Reason::control_flow_on_host`: they could not
  /// be conditional graph nodes, or `FunctionOptions::control_flow_on_host`), not by the GPU.
  [[nodiscard]] bool control_flow_on_host() const { return detail::node_view::control_flow_on_host(engine_, id_); }
  /// What its graph's memory is: what the pool predicted its recording would add (from the
  /// shape's warm-up), what it added, its input slots, its executable.
  [[nodiscard]] NodeMemory memory() const { return detail::node_view::memory(engine_, id_); }
  /// Inputs copied into pool slots on every replay (neither static nor pool-managed).
  [[nodiscard]] std::vector<std::size_t> copied_inputs() const {
    return detail::node_view::copied_inputs(engine_, id_);
  }

 private:
  friend class PoolBase;
  Node(detail::EngineRef engine, std::int64_t id) noexcept : engine_(std::move(engine)), id_(id) {}
  /// Views of the nodes `ids` of the pool's engine.
  static std::vector<Node> views(const detail::EngineRef& engine, const std::vector<std::int64_t>& ids) {
    std::vector<Node> views;
    views.reserve(ids.size());
    for (const std::int64_t id : ids) views.push_back(Node(engine, id));
    return views;
  }
  detail::EngineRef engine_;
  std::int64_t id_ = 0;
};

}  // namespace cgt
