// cgt.core:tree (internal) — the tree of recordings: the nodes, the nodes under each parent, and
// the storages (cells) their outputs view, with the leases on them. Which node the program is at
// is the path's (:path); how a call walks the tree is the engine's.
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include <gsl/pointers>

export module cgt.core:tree;
import cgt.vocabulary;
import :spi;
import :detail;

namespace cgt::detail {

class TreeNode;

/// One storage that outputs view. Liveness is the number of leases on it, nothing else: while a
/// lease exists the memory is live; when the last lease goes, it is dead. Its liveness changes
/// only through the methods below.
struct Cell {  // a struct: declared so in :detail
 public:
  inline Cell(backend::StorageHandle storage, std::uint32_t function) noexcept
      : storage(std::move(storage)), function(function) {}

  /// The device's handle on the memory (the device fills in its native record; who owns the
  /// block, the allocator or a replay, changes as the path does).
  backend::StorageHandle storage;
  const std::uint32_t function;  ///< function that produced it (for messages)

  [[nodiscard]] inline bool is_live() const noexcept { return leases_ > 0 && !reclaimed_; }
  [[nodiscard]] inline std::uint32_t leases() const noexcept { return leases_; }
  /// A new generation took the memory back while leases existed.
  [[nodiscard]] inline bool is_reclaimed() const noexcept { return reclaimed_; }
  /// Changes whenever the storage comes to life (its first lease after none): values handed out
  /// carry it (`Device::stamp`), so a copy kept past the memory's death is told from a live one.
  [[nodiscard]] inline std::uint64_t life() const noexcept { return life_; }
  /// Generation in which the storage was last handed out (for messages).
  [[nodiscard]] inline std::uint64_t generation() const noexcept { return generation_; }
  /// The memory copied out when it was reclaimed (`copy_out_on_new_step`), or null.
  [[nodiscard]] inline const std::shared_ptr<void>& copied_out() const noexcept { return copied_out_; }

  /// A lease on it is handed out in `generation`; the first after none brings the memory to life,
  /// with the next of the ledger's lives (`Ledger::take_lease`).
  inline void add_lease(std::uint64_t& lives, std::uint64_t generation) noexcept {
    ++refs_;
    if (leases_++ == 0) life_ = ++lives;
    generation_ = generation;
  }
  /// A lease on it goes (its reference is let go by the caller). True when it was the last: the
  /// memory dies now, and a copy kept for `copy_out_on_new_step` goes with it.
  [[nodiscard]] inline bool drop_lease() noexcept {
    if (--leases_ > 0) return false;
    copied_out_.reset();
    return true;
  }
  /// A new generation takes the memory back while leases hold it; from now on they read `copy` (or
  /// fail, where there is none).
  inline void mark_reclaimed(std::shared_ptr<void> copy) noexcept {
    reclaimed_ = true;
    copied_out_ = std::move(copy);
  }
  /// The call that began the generation failed before its work, with the memory never released: the
  /// leases read it again, and the copy goes (`Path::put_back_ended`).
  inline void unmark_reclaimed() noexcept {
    reclaimed_ = false;
    copied_out_.reset();
  }

 private:
  friend class CellRef;
  std::uint32_t refs_ = 0;    ///< owners of this object: leases and nodes
  std::uint32_t leases_ = 0;  ///< leases on the storage: live while > 0
  bool reclaimed_ = false;
  std::uint64_t generation_ = 0;
  std::uint64_t life_ = 0;
  std::shared_ptr<void> copied_out_;
};

/// Shared ownership of a cell by nodes (leases count their reference by hand).
class CellRef {
 public:
  CellRef() = default;
  inline explicit CellRef(Cell* cell) noexcept : cell_(cell) {
    if (cell_ != nullptr) ++cell_->refs_;
  }
  inline CellRef(const CellRef& other) noexcept : CellRef(other.cell_) {}
  inline CellRef(CellRef&& other) noexcept : cell_(std::exchange(other.cell_, nullptr)) {}
  CellRef& operator=(CellRef other) noexcept {
    std::swap(cell_, other.cell_);
    return *this;
  }
  inline ~CellRef() { unref(cell_); }
  [[nodiscard]] inline Cell* get() const noexcept { return cell_; }
  inline Cell* operator->() const noexcept { return cell_; }
  inline explicit operator bool() const noexcept { return cell_ != nullptr; }
  friend bool operator==(const CellRef& a, const CellRef& b) noexcept { return a.cell_ == b.cell_; }

  /// Drops one reference, deleting the cell when none is left.
  inline static void unref(Cell* cell) noexcept {
    if (cell != nullptr && --cell->refs_ == 0) delete cell;  // NOLINT(cppcoreguidelines-owning-memory): intrusive count
  }

 private:
  Cell* cell_ = nullptr;
};

[[nodiscard]] CellRef make_cell(const backend::StorageHandle& storage, std::uint32_t function);

/// Splits the path liveness into the indices where two snapshots differ (PyTorch's
/// `_get_different_indices`): outputs live in `before` and dead in `after`.
[[nodiscard]] std::vector<PathIndex> differing_indices(const std::vector<std::vector<bool>>& before,
                                                       const std::vector<std::vector<bool>>& after);

/// How an output of a recording relates to other memory (PyTorch's `OutputAliasInfo`).
enum class AliasKind : std::uint8_t {
  none,             ///< no value (undefined tensor, empty buffer)
  new_storage,      ///< a storage this graph allocated
  alias_of_output,  ///< views the storage of an earlier output of the same call
  alias_of_prior,   ///< views the storage of an output of an earlier graph of the path
  external,         ///< not pool memory (a static input, a constant): returned as recorded
};

struct OutputAlias {
  AliasKind kind = AliasKind::none;
  std::uint32_t output = 0;  ///< for alias_of_output
  PathIndex prior;           ///< for alias_of_prior
};

/// Per (node, function variant) facts: PyTorch's `num_rerecord`. (Whether a call mutates an input
/// that is not pool memory is decided for every call from its own inputs, never cached: a cached
/// answer went stale when a recording failed and a later call passed a caller's buffer.)
struct ChildFacts {
  std::uint32_t rerecords = 0;
};

/// How a graph reads one input.
enum class InputUse : std::uint8_t {
  scalar,           ///< baked into the graph (a scalar is part of the shape key)
  managed,          ///< pool-managed: an output of an earlier graph of the path, read in place
  static_in_place,  ///< a static input, aligned: read in place
  copied,           ///< copied into a pool slot on every replay
};

/// The nodes under one parent (or the roots of the tree), by variant, with per-variant facts.
/// A flat list sorted by variant: a parent has few variants under it, and a replay looks them up
/// two or three times (a hash map cost more than the rest of the search).
class Children {
 public:
  /// The nodes of `variant`, in the order they were recorded (empty: none).
  [[nodiscard]] inline std::span<const std::unique_ptr<TreeNode>> of(std::uint32_t variant) const noexcept {
    const Entry* entry = find(variant);
    if (entry == nullptr) return {};
    return entry->nodes;
  }
  [[nodiscard]] inline bool has(std::uint32_t variant) const noexcept { return !of(variant).empty(); }
  /// Variants in the order their first node was added.
  [[nodiscard]] inline const std::vector<std::uint32_t>& order() const noexcept { return order_; }
  /// Adds `node` after the others of its variant; returns it.
  TreeNode& add(std::unique_ptr<TreeNode> node);
  /// What is known of `variant` at this place of the tree, whether or not a node of it exists.
  [[nodiscard]] ChildFacts& facts(std::uint32_t variant);
  [[nodiscard]] std::size_t count_descendants() const;
  /// Calls `visit(node)` for each node here (not their children), variant by variant.
  template <class Visit>
  void each(Visit visit) const {
    for (const Entry& entry : entries_) {
      for (const auto& node : entry.nodes) visit(*node);
    }
  }
  /// Takes `node` (one of these) out, with its subtree; the variant's facts stay.
  [[nodiscard]] std::unique_ptr<TreeNode> take(const TreeNode* node);
  void clear() noexcept;

 private:
  struct Entry {
    std::uint32_t variant = 0;
    std::vector<std::unique_ptr<TreeNode>> nodes;
    ChildFacts facts;
  };
  [[nodiscard]] inline const Entry* find(std::uint32_t variant) const noexcept {
    // A short list (most parents have one or two variants): a scan beats a binary search.
    for (const Entry& entry : entries_) {
      if (entry.variant >= variant) return entry.variant == variant ? &entry : nullptr;
    }
    return nullptr;
  }
  /// The entry of `variant`, made (empty) where there is none.
  Entry& entry_of(std::uint32_t variant);

  std::vector<Entry> entries_;  ///< sorted by variant
  std::vector<std::uint32_t> order_;
};

/// A node of the tree: a recording or a warm-up run (PyTorch's CUDAGraphNode / CUDAWarmupNode). The
/// public `cgt::Node` is a read-only view of one, by id. Its fields derive from one another (a
/// cell per output, aliases that share cells, liveness snapshots): they change only through the
/// methods below, each of which keeps them consistent.
class TreeNode {
 public:
  /// A node for a call of `variant` right after `parent` (null: a root). Graph nodes are numbered
  /// from 0 in recording order, warm-up nodes count down from -1.
  TreeNode(NodeKind kind, std::int64_t id, NodeReason reason, std::uint32_t variant, TreeNode* parent);
  TreeNode(const TreeNode&) = delete;
  TreeNode& operator=(const TreeNode&) = delete;
  ~TreeNode();

  // --- identity, fixed when made ---
  [[nodiscard]] inline std::int64_t id() const noexcept { return id_; }
  [[nodiscard]] inline NodeKind kind() const noexcept { return kind_; }
  [[nodiscard]] inline NodeReason reason() const noexcept { return reason_; }
  [[nodiscard]] inline std::uint32_t variant() const noexcept { return variant_; }
  [[nodiscard]] inline TreeNode* parent() const noexcept { return parent_; }
  /// Root first, ending with this node (PyTorch's path_weakrefs).
  [[nodiscard]] inline const std::vector<TreeNode*>& path() const noexcept { return path_; }
  [[nodiscard]] inline std::size_t depth() const noexcept { return path_.size() - 1; }
  [[nodiscard]] inline Children& children() noexcept { return children_; }
  [[nodiscard]] inline const Children& children() const noexcept { return children_; }
  [[nodiscard]] inline std::size_t num_descendants() const { return children_.count_descendants(); }

  // --- inputs (graph nodes) ---
  /// Records how the graph reads each input, and the address of those it reads in place.
  void take_inputs(std::span<const InputUse> uses, std::span<const backend::ArgDesc> descs);
  [[nodiscard]] inline const std::vector<std::uint32_t>& managed_inputs() const noexcept { return managed_inputs_; }
  [[nodiscard]] inline const std::vector<std::uint32_t>& static_inputs() const noexcept { return static_inputs_; }
  /// Per input: the data address it was recorded with, if read in place (else 0).
  [[nodiscard]] inline const std::vector<std::uintptr_t>& recorded_data() const noexcept { return recorded_data_; }
  /// Per input: copied into a pool slot on every replay.
  [[nodiscard]] inline const std::vector<bool>& copied_to_slot() const noexcept { return copied_to_slot_; }

  // --- outputs (both kinds) ---
  /// Takes the outputs of the node's warm-up or recording: where each lives, and how it aliases
  /// other memory (`AliasKind`): an output viewing a live output of the path or an earlier output
  /// of this call shares that one's cell; a new storage of the pool gets a new cell. Called before
  /// the node is entered: the path searched is its parent's.
  void take_outputs(std::span<const backend::OutputDesc> outputs, std::uint32_t function);
  [[nodiscard]] inline std::size_t output_count() const noexcept { return output_count_; }
  /// Per output: the storage it views in the current execution (null: not pool memory).
  [[nodiscard]] inline const std::vector<CellRef>& cells() const noexcept { return cells_; }
  [[nodiscard]] inline const std::vector<OutputAlias>& aliases() const noexcept { return aliases_; }
  /// Per output: the storage address it was made at (0: not pool memory).
  [[nodiscard]] inline const std::vector<std::uintptr_t>& output_storage() const noexcept { return output_storage_; }
  /// The cell of output `index.output` of the node at `index.depth` of this node's path.
  [[nodiscard]] inline const CellRef& cell_at(PathIndex index) const noexcept {
    return path_[index.depth]->cells_[index.output];
  }
  /// The live output of this node's path (root to this node) at `storage`, if any.
  [[nodiscard]] std::optional<PathIndex> live_output_at(std::uintptr_t storage) const noexcept;

  // --- recording (graph nodes) ---
  inline void keep_recording(std::unique_ptr<backend::Recording> recording,
                             backend::ControlFlow control_flow = backend::ControlFlow::on_device) noexcept {
    checks_arguments_ = recording != nullptr && recording->checks_arguments();
    recording_ = std::move(recording);
    control_flow_ = control_flow;
  }
  /// How its recording makes the function's loops and branches: conditional nodes, or segments
  /// the host decides between (the fallback).
  [[nodiscard]] inline backend::ControlFlow control_flow() const noexcept { return control_flow_; }
  /// Whether a replay asks the recording to check the call's arguments first (`Recording::check`).
  [[nodiscard]] inline bool checks_arguments() const noexcept { return checks_arguments_; }
  /// Marks the graph recorded, its outputs handed out: keeps `checkpoint` (the allocator right
  /// after) and derives, from the path's liveness before the call (`liveness_before`, without this
  /// node) and now, what must be dead before and after each replay.
  void mark_recorded(std::unique_ptr<backend::Checkpoint> checkpoint,
                     const std::vector<std::vector<bool>>& liveness_before);
  [[nodiscard]] inline backend::Recording* recording() const noexcept { return recording_.get(); }
  /// Takes the recording out (an evicted node's: its output values must outlive the node).
  [[nodiscard]] inline std::unique_ptr<backend::Recording> take_recording() noexcept { return std::move(recording_); }
  /// The native value of output `i` that a replay hands out (`Recording::output`, whose address is
  /// stable while the recording lives), asked once when the node is marked recorded.
  [[nodiscard]] inline const void* output_value(std::size_t i) const noexcept { return output_values_[i]; }
  [[nodiscard]] inline const backend::Checkpoint& checkpoint() const noexcept { return *checkpoint_; }
  /// Path liveness right after recording (with this node).
  [[nodiscard]] inline const std::vector<std::vector<bool>>& liveness_after() const noexcept { return liveness_after_; }
  /// Outputs of the path live when the parent was recorded but dead when this was: they must be
  /// dead before a replay, which reuses their memory.
  [[nodiscard]] inline const std::vector<PathIndex>& expected_dead_before() const noexcept {
    return expected_dead_before_;
  }
  /// Outputs of the path that died during the recording (leases the call consumed): they must die
  /// during every replay too.
  [[nodiscard]] inline const std::vector<PathIndex>& expected_dead_after() const noexcept {
    return expected_dead_after_;
  }
  /// Everything live right after recording.
  [[nodiscard]] inline const std::vector<PathIndex>& live_after() const noexcept { return live_after_; }
  /// Nothing of the call or the path can keep the graph from replaying: no input read in place, no
  /// output of the path that must be dead before or die during a replay, no output aliasing an
  /// earlier graph's (`Tree::match` takes such a child at once: a root, most often).
  [[nodiscard]] inline bool fits_every_call() const noexcept { return fits_every_call_; }

  // --- memory and eviction (graph nodes) ---
  /// What the pool predicted the recording would add to its reserved bytes, and what it added.
  inline void note_growth(std::optional<std::size_t> predicted, std::size_t added) noexcept {
    predicted_growth_ = predicted;
    pool_growth_ = added;
  }
  /// Its memory: the growth noted, and its recording's slots and executable.
  [[nodiscard]] NodeMemory memory() const noexcept;
  /// The engine's use counter at its last replay (or its recording): the coldest go first when
  /// the pool evicts (`OverBudget::evict_coldest`).
  inline void touch(std::uint64_t tick) noexcept { last_use_ = tick; }
  [[nodiscard]] inline std::uint64_t last_use() const noexcept { return last_use_; }

  // --- replay (the hot path) ---
  /// Points each output at the storage this replay writes (a new cell of `function`'s where the
  /// last one is still held or was reclaimed, prepared by `device`), and tells the recording if
  /// that changed.
  inline void bind_outputs_for_replay(backend::Device& device, std::uint32_t function) {
    if (!is_bound_as_is()) rebind_outputs(device, function);
  }

 private:
  /// True when every output has a storage of its own whose cell (dead since the last execution
  /// of the node, so not owned by the allocator) can be handed out again as it is: the common replay.
  [[nodiscard]] inline bool is_bound_as_is() const noexcept {
    if (!outputs_own_storage_ || bound_.size() != output_count_) return false;
    for (std::size_t i = 0; i < output_count_; ++i) {
      const Cell* cell = cells_[i].get();
      if (cell == nullptr || cell->is_reclaimed() || cell->leases() > 0 || cell->storage.native != bound_native_[i]) {
        return false;
      }
    }
    return true;
  }
  void rebind_outputs(backend::Device& device, std::uint32_t function);
  /// Sets `fits_every_call_` from the inputs, aliases and liveness taken so far.
  void decide_fits_every_call() noexcept;

  std::int64_t id_;
  NodeKind kind_;
  NodeReason reason_;
  std::uint32_t variant_;
  TreeNode* parent_;
  std::vector<TreeNode*> path_;
  Children children_;

  std::unique_ptr<backend::Recording> recording_;
  std::optional<std::size_t> predicted_growth_;  ///< by `note_growth`
  std::size_t pool_growth_ = 0;                  ///< by `note_growth`
  std::uint64_t last_use_ = 0;                   ///< by `touch`
  bool checks_arguments_ = false;                ///< `Recording::checks_arguments()`, by `keep_recording`
  backend::ControlFlow control_flow_ = backend::ControlFlow::on_device;  ///< by `keep_recording`
  std::vector<const void*> output_values_;                               ///< `Recording::output(i)`, by `mark_recorded`
  std::unique_ptr<backend::Checkpoint> checkpoint_;
  std::vector<std::uint32_t> managed_inputs_;
  std::vector<std::uint32_t> static_inputs_;
  std::vector<std::uintptr_t> recorded_data_;
  std::vector<bool> copied_to_slot_;
  std::vector<std::vector<bool>> liveness_after_;
  std::vector<PathIndex> expected_dead_before_;
  std::vector<PathIndex> expected_dead_after_;
  std::vector<PathIndex> live_after_;

  std::size_t output_count_ = 0;
  std::vector<OutputAlias> aliases_;
  std::vector<CellRef> cells_;
  std::vector<std::uintptr_t> output_storage_;
  std::vector<std::size_t> output_bytes_;
  bool outputs_own_storage_ = false;            ///< every output is new_storage: a replay may skip rebinding
  bool fits_every_call_ = false;                ///< by `decide_fits_every_call`, after each of the three takes
  std::vector<backend::StorageHandle*> bound_;  ///< storages the recording's outputs view now
  std::vector<const void*> bound_native_;       ///< and their native records at that time
};

/// Each node's outputs along `nodes`: live or not.
[[nodiscard]] std::vector<std::vector<bool>> liveness_of(std::span<TreeNode* const> nodes);

/// What a search among the children of the current node found (`Tree::match`). Each field says
/// one thing, whatever the others hold.
struct Match {
  /// A child whose recorded invariants all hold for this call: replay it.
  TreeNode* replayable = nullptr;
  /// The first child that fits but for a static input at a new address. Under
  /// `OnStaticInputMoved::error` the call fails naming it (it fit in every other way); under
  /// `rerecord` the new recording replaces it.
  TreeNode* static_moved_child = nullptr;
  std::int32_t moved_static_input = -1;  ///< that input of `static_moved_child` (-1: none)
  /// A pool-managed input (an output of an earlier graph) at a new address for some child (-1: none).
  std::int32_t moved_managed_input = -1;
  /// Some child fit but for which outputs of the path are live.
  bool liveness_differs = false;
};

/// The tree of recordings (PyTorch's `roots` and the graph nodes under them): every graph node by
/// id, the roots by variant, and the rule that picks the child a call replays. Graph nodes are
/// added, never removed, until `clear`; warm-up nodes belong to the path (:path), not to the tree.
/// Used under the engine's state lock only.
class Tree {
 public:
  Tree() = default;
  Tree(const Tree&) = delete;
  Tree& operator=(const Tree&) = delete;

  [[nodiscard]] inline Children& roots() noexcept { return roots_; }
  [[nodiscard]] inline const Children& roots() const noexcept { return roots_; }
  /// The id of the next graph node: graph nodes are numbered from 0 in recording order.
  [[nodiscard]] inline std::int64_t next_id() const noexcept { return static_cast<std::int64_t>(nodes_.size()); }
  /// Adds a recorded node among `siblings` (its parent's children, or `roots()`).
  /// REQUIRES: `node->id() == next_id()`, and `siblings` are those of the node's parent (the
  /// roots for a root). ENSURES: `find(node->id())` is the node, the last of its variant there.
  TreeNode& add(std::unique_ptr<TreeNode> node, Children& siblings);
  /// The graph node `id`, or null (a warm-up node's negative id, an id not given out, an evicted
  /// node, or after `clear`).
  [[nodiscard]] inline const TreeNode* find(std::int64_t id) const noexcept {
    return id >= 0 && static_cast<std::size_t>(id) < nodes_.size() ? nodes_[static_cast<std::size_t>(id)] : nullptr;
  }
  /// Every graph node ever recorded, by id: null where it was evicted.
  [[nodiscard]] inline std::span<TreeNode* const> nodes() const noexcept { return nodes_; }
  /// Takes `node` out of the tree with its subtree (`find` answers null for their ids from now on);
  /// the caller destroys them. REQUIRES: a graph node of this tree.
  [[nodiscard]] std::unique_ptr<TreeNode> evict(TreeNode& node);
  /// ENSURES: no node (the roots own them all; a parent owns its children).
  void clear() noexcept;

  /// The child of `candidates` (one variant's children, in recording order) that a call with
  /// `descs` and `args` replays: PyTorch's `check_invariants`. ENSURES: `replayable` is the first
  /// child whose pool-managed and static inputs are at their recorded addresses, whose memory to
  /// reuse is dead (`expected_dead_before`), whose aliases of earlier outputs find them live, and
  /// whose consumed outputs die with this call (`expected_dead_after`: the leases `args` consume
  /// are the only ones left). Under `on_moved == error` a child that fits but for a moved static
  /// input ends the search as `static_moved_child`; under `rerecord` the first such child is
  /// noted and the search goes on. The other fields say why the rest did not fit.
  /// (Inline: the first candidate that fits every call is the common replay, a root most often.)
  [[nodiscard]] static inline Match match(std::span<const std::unique_ptr<TreeNode>> candidates,
                                          std::span<const backend::ArgDesc> descs,
                                          std::span<const backend::ArgSlot> args,
                                          OnStaticInputMoved on_moved) noexcept {
    Match match;
    for (const auto& child : candidates) {
      if (child->fits_every_call()) {  // every check of `search_ends_at` would pass
        match.replayable = child.get();
        return match;
      }
      if (search_ends_at(*child, descs, args, on_moved, match)) return match;
    }
    return match;
  }

 private:
  /// `match`'s checks of one child that does not fit every call: true when the search ends at it
  /// (`match.replayable`, or `static_moved_child` under `error`); false when it goes on, with the
  /// reason the child did not fit noted in `match`.
  [[nodiscard]] static bool search_ends_at(TreeNode& child, std::span<const backend::ArgDesc> descs,
                                           std::span<const backend::ArgSlot> args, OnStaticInputMoved on_moved,
                                           Match& match) noexcept;

  Children roots_;
  std::vector<TreeNode*> nodes_;  ///< by id: every graph node, owned by roots_ and below; null: evicted
};

}  // namespace cgt::detail
