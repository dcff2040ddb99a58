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

namespace cgt {

// Builds views for the engine; Node's constructor is private to keep views read-only.
struct NodeAccess {
  static Node make(const detail::EngineRef& engine, std::int64_t id) { return {engine, id}; }
  static detail::Engine* engine(const Node& view) { return view.engine_.get(); }
  static const detail::EngineRef& ref(const Node& view) { return view.engine_; }
};

namespace {

std::vector<Node> children_views(const detail::EngineRef& engine, const detail::Children& children) {
  std::vector<const detail::TreeNode*> nodes;
  for (const std::uint32_t variant : children.order()) {
    for (const auto& node : children.of(variant)) nodes.push_back(node.get());
  }
  std::ranges::sort(nodes, {}, &detail::TreeNode::id);
  std::vector<Node> views;
  views.reserve(nodes.size());
  for (const detail::TreeNode* node : nodes) views.push_back(NodeAccess::make(engine, node->id()));
  return views;
}

// Reads the node a view names under the engine's state lock (another thread may be dropping
// handles); `empty` for a moved-from view, or a node gone with a shutdown or its path.
template <class R, class Read>
R read_node(const Node& view, R empty, Read read) {
  detail::Engine* engine = NodeAccess::engine(view);
  if (engine == nullptr) return empty;
  const detail::StateLock lock(*engine);
  const detail::TreeNode* node = detail::find_node(*engine, view.id());
  if (node == nullptr) return empty;
  return read(*engine, *node);
}

}  // namespace

bool Node::exists() const {
  return read_node(*this, false, [](const detail::Engine&, const detail::TreeNode&) { return true; });
}

NodeKind Node::kind() const {
  return read_node(*this, NodeKind::graph,
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.kind(); });
}

NodeReason Node::reason() const {
  return read_node(*this, NodeReason::first_call,
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.reason(); });
}

std::string Node::function() const {
  return read_node(*this, std::string(), [](const detail::Engine& engine, const detail::TreeNode& node) {
    return engine.functions().name(detail::function_of(engine, node));
  });
}

std::size_t Node::depth() const {
  return read_node(*this, std::size_t{0},
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.depth(); });
}

std::vector<Node> Node::children() const {
  return read_node(*this, std::vector<Node>{}, [this](const detail::Engine&, const detail::TreeNode& node) {
    return children_views(NodeAccess::ref(*this), node.children());
  });
}

std::size_t Node::num_descendants() const {
  return read_node(*this, std::size_t{0},
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.num_descendants(); });
}

std::size_t Node::output_count() const {
  return read_node(*this, std::size_t{0},
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.output_count(); });
}

std::size_t Node::live_outputs() const {
  return read_node(*this, std::size_t{0}, [](const detail::Engine&, const detail::TreeNode& node) {
    return static_cast<std::size_t>(
        std::ranges::count_if(node.cells(), [](const detail::CellRef& cell) { return cell && cell->is_live(); }));
  });
}

std::vector<PathIndex> Node::expected_dead_before() const {
  return read_node(*this, std::vector<PathIndex>{},
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.expected_dead_before(); });
}

std::vector<PathIndex> Node::expected_dead_after() const {
  return read_node(*this, std::vector<PathIndex>{},
                   [](const detail::Engine&, const detail::TreeNode& node) { return node.expected_dead_after(); });
}

std::vector<std::size_t> Node::copied_inputs() const {
  return read_node(*this, std::vector<std::size_t>{}, [](const detail::Engine&, const detail::TreeNode& node) {
    std::vector<std::size_t> copied;
    for (std::size_t i = 0; i < node.copied_to_slot().size(); ++i) {
      if (node.copied_to_slot()[i]) copied.push_back(i);
    }
    return copied;
  });
}

std::vector<Node> PoolBase::roots() const {
  return detail::read_engine(engine_, std::vector<Node>{}, [this](const detail::Engine& engine) {
    return children_views(engine_, engine.tree().roots());
  });
}

std::vector<Node> PoolBase::current_path() const {
  return detail::read_engine(engine_, std::vector<Node>{}, [this](const detail::Engine& engine) {
    std::vector<Node> views;  // NOLINT(misc-const-correctness)
    for (const detail::TreeNode* node : engine.path().nodes()) views.push_back(NodeAccess::make(engine_, node->id()));
    return views;
  });
}

std::string PoolBase::to_dot() const {
  return detail::read_engine(engine_, std::string("digraph cgt {\n}\n"),
                             [](const detail::Engine& engine) { return detail::to_dot(engine); });
}

}  // namespace cgt

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
