// cgt.core:node — a read-only view of one node of a pool's tree (`Node`), and a position in the current path.
module;
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

export module cgt.core:node;
import :info;
import :detail;

export namespace cgt {

class PoolBase;

/// One position in the current path: output `output` of the node `depth` steps below the root.
struct PathIndex {
  std::uint32_t depth = 0;
  std::uint32_t output = 0;
  friend bool operator==(const PathIndex&, const PathIndex&) = default;
};

/// A read-only view of one node of a pool's tree (a recording or a warm-up run), for
/// introspection and tests. Move-only. After `Pool::shutdown()`, and once moved from, a view is
/// empty: `exists()` is false and every accessor returns an empty value (`id()` keeps its id).
///
/// No accessor has a precondition: on an empty view each returns an empty value, never fails.
class Node {
 public:
  Node(Node&&) noexcept = default;
  Node& operator=(Node&&) noexcept = default;

  [[nodiscard]] bool exists() const;
  /// Graph nodes count up from 0 in recording order; warm-up nodes count down from -1.
  [[nodiscard]] std::int64_t id() const noexcept { return id_; }
  [[nodiscard]] NodeKind kind() const;
  [[nodiscard]] NodeReason reason() const;
  /// Name of the function this node ran.
  [[nodiscard]] std::string function() const;
  /// Distance from the root (roots are at depth 0).
  [[nodiscard]] std::size_t depth() const;
  /// Children recorded under this node, in recording order.
  [[nodiscard]] std::vector<Node> children() const;
  /// Number of nodes below this one (PyTorch's `num_descendants`).
  [[nodiscard]] std::size_t num_descendants() const;
  [[nodiscard]] std::size_t output_count() const;
  /// Outputs of this node that are live now (leased, in the current path's execution).
  [[nodiscard]] std::size_t live_outputs() const;
  /// Outputs of earlier nodes of the path that must be dead before this graph replays.
  [[nodiscard]] std::vector<PathIndex> expected_dead_before() const;
  /// Outputs of earlier nodes of the path that died while this graph was recorded (consumed inputs).
  [[nodiscard]] std::vector<PathIndex> expected_dead_after() const;
  /// Inputs copied into pool slots on every replay (neither static nor pool-managed).
  [[nodiscard]] std::vector<std::size_t> copied_inputs() const;

 private:
  friend class PoolBase;
  friend struct NodeAccess;
  Node(detail::EngineRef engine, std::int64_t id) noexcept : engine_(std::move(engine)), id_(id) {}
  detail::EngineRef engine_;
  std::int64_t id_ = 0;
};

}  // namespace cgt
