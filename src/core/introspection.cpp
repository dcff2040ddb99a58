// Read-only views of the tree, and its Graphviz DOT dump.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <span>
#include <sstream>
#include <string>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {

namespace {

// The ids of `children` in recording order (a `Node` view is made of an id by module cgt).
std::vector<std::int64_t> ids_of(const Children& children) {
  std::vector<const TreeNode*> nodes;
  for (const std::uint32_t variant : children.order()) {
    for (const auto& node : children.of(variant)) nodes.push_back(node.get());
  }
  std::ranges::sort(nodes, {}, &TreeNode::id);
  std::vector<std::int64_t> ids;
  ids.reserve(nodes.size());
  for (const TreeNode* node : nodes) ids.push_back(node->id());
  return ids;
}

// Reads node `id` under the engine's state lock (another thread may be dropping handles);
// `empty` for a moved-from view (a null `pool`), or a node gone with a shutdown or its path.
template <class R, class Read>
R read_node(const EngineRef& pool, std::int64_t id, R empty, Read read) {
  if (!pool) return empty;
  const StateLock lock(*pool);
  const TreeNode* node = find_node(*pool, id);
  if (node == nullptr) return empty;
  return read(*pool, *node);
}

}  // namespace

namespace node_view {

bool exists(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, false, [](const Engine&, const TreeNode&) { return true; });
}

NodeKind kind(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, NodeKind::graph, [](const Engine&, const TreeNode& node) { return node.kind(); });
}

NodeMemory memory(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, NodeMemory{}, [](const Engine&, const TreeNode& node) { return node.memory(); });
}

bool control_flow_on_host(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, false, [](const Engine&, const TreeNode& node) {
    return node.control_flow() == backend::ControlFlow::on_host;
  });
}

NodeReason reason(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, NodeReason::first_call, [](const Engine&, const TreeNode& node) { return node.reason(); });
}

std::string function(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::string(), [](const Engine& engine, const TreeNode& node) {
    return engine.functions().name(function_of(engine, node));
  });
}

std::size_t depth(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::size_t{0}, [](const Engine&, const TreeNode& node) { return node.depth(); });
}

std::vector<std::int64_t> children(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::vector<std::int64_t>{},
                   [](const Engine&, const TreeNode& node) { return ids_of(node.children()); });
}

std::size_t num_descendants(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::size_t{0},
                   [](const Engine&, const TreeNode& node) { return node.num_descendants(); });
}

std::size_t output_count(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::size_t{0}, [](const Engine&, const TreeNode& node) { return node.output_count(); });
}

std::size_t live_outputs(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::size_t{0}, [](const Engine&, const TreeNode& node) {
    return static_cast<std::size_t>(
        std::ranges::count_if(node.cells(), [](const CellRef& cell) { return cell && cell->is_live(); }));
  });
}

std::vector<PathIndex> expected_dead_before(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::vector<PathIndex>{},
                   [](const Engine&, const TreeNode& node) { return node.expected_dead_before(); });
}

std::vector<PathIndex> expected_dead_after(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::vector<PathIndex>{},
                   [](const Engine&, const TreeNode& node) { return node.expected_dead_after(); });
}

std::vector<std::size_t> copied_inputs(const EngineRef& pool, std::int64_t id) {
  return read_node(pool, id, std::vector<std::size_t>{}, [](const Engine&, const TreeNode& node) {
    std::vector<std::size_t> copied;
    for (std::size_t i = 0; i < node.copied_to_slot().size(); ++i) {
      if (node.copied_to_slot()[i]) copied.push_back(i);
    }
    return copied;
  });
}

}  // namespace node_view

namespace pool_view {

std::vector<std::int64_t> roots(const EngineRef& pool) {
  return read_engine(pool, std::vector<std::int64_t>{},
                     [](const Engine& engine) { return ids_of(engine.tree().roots()); });
}

std::vector<std::int64_t> current_path(const EngineRef& pool) {
  return read_engine(pool, std::vector<std::int64_t>{}, [](const Engine& engine) {
    std::vector<std::int64_t> ids;  // NOLINT(misc-const-correctness)
    for (const TreeNode* node : engine.path().nodes()) ids.push_back(node->id());
    return ids;
  });
}

std::string to_dot(const EngineRef& pool) {
  return read_engine(pool, std::string("digraph cgt {\n}\n"),
                     [](const Engine& engine) { return detail::to_dot(engine); });
}

}  // namespace pool_view

}  // namespace cgt::detail

namespace cgt::detail {

const TreeNode* find_node(const Engine& engine, std::int64_t id) noexcept {
  if (id >= 0) return engine.tree().find(id);
  for (const auto& node : engine.path().warmup_nodes()) {
    if (node->id() == id) return node.get();
  }
  return nullptr;
}

std::string to_dot(const Engine& engine) {
  std::ostringstream dot;
  dot << "digraph cgt {\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n";
  const Tree& tree = engine.tree();
  const Path& path = engine.path();
  const std::span<TreeNode* const> on_path = path.nodes();
  auto is_on_path = [&](const TreeNode* node) { return std::ranges::find(on_path, node) != on_path.end(); };
  auto name_of = [&](const TreeNode* node) -> const std::string& {
    return engine.functions().name(function_of(engine, *node));
  };
  auto emit = [&](const TreeNode* node) {
    const char* label = node->kind() == NodeKind::graph ? "graph" : "warm-up";
    dot << "  n" << (node->id() < 0 ? "w" : "") << (node->id() < 0 ? -node->id() : node->id()) << " [label=\""
        << name_of(node) << "\\n#" << node->id() << " " << label << "\\n"
        << to_string(node->reason()) << "\\noutputs: " << node->output_count();
    if (node->control_flow() == backend::ControlFlow::on_host) dot << "\\nloops and branches: host-decided";
    if (node->kind() == NodeKind::graph) {
      const NodeMemory memory = node->memory();
      dot << "\\npool +" << memory.pool_bytes << " B";
      if (memory.predicted_pool_bytes) dot << " (predicted " << *memory.predicted_pool_bytes << ")";
      if (memory.slot_bytes != 0) dot << ", slots " << memory.slot_bytes << " B";
      if (memory.executable_bytes != 0) dot << ", executable " << memory.executable_bytes << " B";
    }
    std::size_t live = 0;
    for (const auto& cell : node->cells()) live += cell && cell->is_live();
    if (live > 0) dot << " (" << live << " live)";
    dot << "\"";
    if (node->kind() == NodeKind::warmup) dot << ", style=dashed";
    if (is_on_path(node)) dot << ", penwidth=2, color=blue";
    if (node == path.node()) dot << ", style=\"bold" << (node->kind() == NodeKind::warmup ? ",dashed" : "") << "\"";
    dot << "];\n";
  };
  auto id_of = [](const TreeNode* node) {
    return std::string("n") + (node->id() < 0 ? "w" + std::to_string(-node->id()) : std::to_string(node->id()));
  };
  for (const TreeNode* node : tree.nodes()) {
    if (node == nullptr) continue;  // evicted
    emit(node);
    if (node->parent() != nullptr) dot << "  " << id_of(node->parent()) << " -> " << id_of(node) << ";\n";
  }
  for (const auto& node : path.warmup_nodes()) {
    emit(node.get());
    if (node->parent() != nullptr)
      dot << "  " << id_of(node->parent()) << " -> " << id_of(node.get()) << " [style=dashed];\n";
  }
  dot << "}\n";
  return dot.str();
}

}  // namespace cgt::detail
