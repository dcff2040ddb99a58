// Recording a new node: classify the inputs, capture the function into a graph in the pool, work
// out how its outputs alias other memory, checkpoint the allocator, and hand out the outputs.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt;
import :engine;

namespace cgt::detail {
namespace {

std::string moved_message(NodeReason reason, const FunctionRecord& function) {
  const std::string what =
      reason == NodeReason::static_input_moved ? "a static input" : "an input from an earlier graph";
  return "re-recording '" + function.name + "': " + what + " is at a new address";
}

}  // namespace

Result<CallOutputs> Engine::give_up_capture(CallFrame& frame, const Error& error) {
  // A capture that fails for a reason that will not change (the function synchronises with the
  // host, say) would fail on every call: run this shape eagerly from now on, and say why once.
  FunctionRecord& function = *frame.function;
  frame.variant->capture_failure = error.message;
  log(EventKind::eager_fallback, Reason::capture_failed, function,
      "skipping graphs for '" + function.name + "' at these input shapes: " + error.message);
  return run_eager(frame, Reason::capture_failed);
}

void Engine::compute_aliases(TreeNode& node, const backend::RunResult& first, const CallFrame& frame) {
  const std::size_t count = first.outputs.size();
  node.output_count = count;
  node.aliases.assign(count, OutputAlias{});
  node.cells.assign(count, CellRef());
  node.output_storage.assign(count, 0);
  node.output_bytes.assign(count, 0);
  for (std::size_t i = 0; i < count; ++i) {
    const backend::OutputDesc& desc = first.outputs[i];
    OutputAlias& alias = node.aliases[i];
    if (desc.kind == backend::OutputKind::none) continue;
    if (!desc.in_pool) {
      alias.kind = AliasKind::external;  // a static input or a constant: always live, never ours
      continue;
    }
    node.output_storage[i] = desc.storage;
    node.output_bytes[i] = desc.storage_bytes;
    if (auto prior = live_alias_in_path(desc.storage)) {
      alias.kind = AliasKind::alias_of_prior;
      alias.prior = *prior;
      node.cells[i] = current->path[prior->depth]->cells[prior->output];
      continue;
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (node.aliases[j].kind == AliasKind::new_storage && node.output_storage[j] == desc.storage) {
        alias.kind = AliasKind::alias_of_output;
        alias.output = static_cast<std::uint32_t>(j);
        node.cells[i] = node.cells[j];
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
    node.cells[i] = make_cell(*this, storage, frame.function->id);
  }
}

Result<CallOutputs> Engine::record(CallFrame& frame, NodeReason reason) {
  FunctionRecord& function = *frame.function;
  if (auto checked = debug_check("before a recording"); !checked) {
    return std::unexpected(in_call(std::move(checked.error()), function, "checking the pool"));
  }

  auto node = std::make_unique<TreeNode>();
  node->id = static_cast<std::int64_t>(graph_nodes.size());
  node->kind = NodeKind::graph;
  node->reason = reason;
  node->variant = frame.variant->id;
  node->parent = current;
  node->path = current != nullptr ? current->path : std::vector<TreeNode*>{};
  node->path.push_back(node.get());

  // Inputs: outputs of the path are used in place (pool-managed), aligned static inputs are used
  // in place, everything else is copied into a pool slot on every replay.
  const std::size_t inputs = frame.descs.size();
  node->recorded_data.assign(inputs, 0);
  node->copied_to_slot.assign(inputs, false);
  auto copy_input = std::make_unique<bool[]>(inputs);
  for (std::size_t i = 0; i < inputs; ++i) {
    const backend::ArgDesc& desc = frame.descs[i];
    if (desc.kind == backend::ArgKind::scalar) continue;
    const auto index = static_cast<std::uint32_t>(i);
    if (is_path_output(desc.storage)) {
      node->managed_inputs.push_back(index);
      node->recorded_data[i] = desc.data;
    } else if (is_usable_in_place(function, i, desc)) {
      node->static_inputs.push_back(index);
      node->recorded_data[i] = desc.data;
    } else {
      node->copied_to_slot[i] = true;
      copy_input[i] = true;
    }
  }
  if (current != nullptr) {
    node->liveness_before = path_liveness();
    node->expected_dead_before = differing_indices(current->liveness_after, node->liveness_before);
  }

  auto before = device->checkpoint();
  if (!before) return std::unexpected(in_call(std::move(before.error()), function, "recording"));
  const std::vector<std::uintptr_t> owned_before = owned_live_storages();
  const backend::RecordPlan plan{
      .copy_input = std::span<const bool>(copy_input.get(), inputs),
      .replaces = frame.rerecording_of != nullptr ? frame.rerecording_of->recording.get() : nullptr};
  auto recorded = device->record(*function.invoker, frame.args, plan);
  Result<void> ours = recorded ? check_outputs_are_ours(recorded->first_outputs, frame) : Result<void>();
  if (!recorded || !ours) {
    Error error = !recorded ? in_call(std::move(recorded.error()), function, "recording") : std::move(ours.error());
    recorded = {};  // the recording and its outputs go before the pool is put back
    if (auto restored = roll_back(**before, owned_before); !restored) {
      error.message += "; restoring the pool also failed: " + restored.error().message;
    }
    if (backend::is_capture_failure(error)) return give_up_capture(frame, error);
    return std::unexpected(std::move(error));
  }
  node->recording = std::move(recorded->recording);
  const backend::RunResult& first = recorded->first_outputs;
  compute_aliases(*node, first, frame);

  CallOutputs out;
  out.kind = CallKind::recording;
  out.node = node->id;
  out.leases.reserve(node->output_count);
  for (std::size_t i = 0; i < node->output_count; ++i) {
    out.leases.push_back(make_lease(*this, node->cells[i].get(), first.values[i], first.owner, function.id,
                                    static_cast<std::uint32_t>(i)));
  }
  consume_arguments(frame);

  // What died during the call (leases the call consumed) must die during every replay too.
  if (current != nullptr) node->expected_dead_after = differing_indices(node->liveness_before, path_liveness());
  node->liveness_after = liveness_of(node->path);
  for (std::size_t d = 0; d < node->path.size(); ++d) {
    for (std::size_t i = 0; i < node->liveness_after[d].size(); ++i) {
      if (node->liveness_after[d][i])
        node->live_after.push_back({static_cast<std::uint32_t>(d), static_cast<std::uint32_t>(i)});
    }
  }
  auto checkpoint = device->checkpoint();
  if (!checkpoint) return std::unexpected(in_call(std::move(checkpoint.error()), function, "recording", node->id));
  node->checkpoint = std::move(*checkpoint);
  node->bound.clear();
  node->outputs_own_storage =
      std::ranges::all_of(node->aliases, [](const OutputAlias& alias) { return alias.kind == AliasKind::new_storage; });

  ++stats.recordings;
  if (reason == NodeReason::static_input_moved || reason == NodeReason::managed_input_moved) {
    ++stats.rerecords;
    const Reason why =
        reason == NodeReason::static_input_moved ? Reason::static_input_moved : Reason::managed_input_moved;
    ++stats.by_reason[static_cast<std::size_t>(why)];
    log(EventKind::rerecord, why, function, moved_message(reason, function));
  }
  TreeNode* added = node.get();
  graph_nodes.push_back(added);
  auto& siblings = current != nullptr ? current->children : roots;
  auto& order = current != nullptr ? current->child_order : root_order;
  auto& list = siblings[frame.variant->id];
  if (list.empty()) order.push_back(frame.variant->id);
  list.push_back(std::move(node));
  enter(*added, PathState::recording, frame);
  return out;
}

}  // namespace cgt::detail
