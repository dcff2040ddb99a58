// Calls that do not replay or record: eager fallbacks (outside the pool) and warm-ups (in the pool).
module;
#include <expected>
#include <functional>
#include <cstdint>
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

std::string fallback_message(Reason reason, const std::string& function) {
  const std::string name = "'" + function + "'";
  switch (reason) {
    case Reason::mutated_input:
      return "skipping graphs for " + name + ": it mutates an input that is neither static nor pool memory";
    case Reason::rerecord_limit:
      return "skipping graphs for " + name + ": it exceeded the re-record limit on this node";
    case Reason::shape_key_limit:
      return "skipping graphs for " + name +
             ": its input shapes (sizes, strides and integer scalar values) are a new key past shape_key_limit";
    case Reason::size_not_graphed:
      return "skipping graphs for " + name +
             ": the call's size is not in its graph_sizes allow-list (or is 0, which no bucket pads from)";
    case Reason::size_above_buckets:
      return "skipping graphs for " + name +
             ": the call's size is above its largest bucket; add a larger size to buckets.sizes to graph it";
    case Reason::input_on_other_device:
      return "skipping graphs for " + name + ": an input is on another device or in host memory";
    case Reason::capture_failed:
      return "skipping graphs for " + name + " at these input shapes: its capture failed earlier";
    case Reason::nested_pool:
      return "skipping graphs for " + name + " at these input shapes: it calls a function of another pool";
    case Reason::unsupported_output:
      return "skipping graphs for " + name + " at these input shapes: it returns a value a graph cannot hand out";
    default: return "skipping graphs for " + name + ": " + std::string(to_string(reason));
  }
}

}  // namespace

// snapshot_pool and roll_back change the pool through `device` (a checkpoint, frees): not const,
// whatever clang-tidy infers from the pointer.
Result<PoolSnapshot> Engine::snapshot_pool(  // NOLINT(readability-make-member-function-const)
    const FunctionRecord& function, const char* doing) {
  if (auto checked = debug_check(options_.debug_checks ? ("before " + std::string(doing)).c_str() : doing); !checked) {
    return std::unexpected(in_call(std::move(checked.error()), function, "checking the pool"));
  }
  auto checkpoint = device_->checkpoint();
  if (!checkpoint) return std::unexpected(in_call(std::move(checkpoint.error()), function, doing));
  PoolSnapshot snapshot{.checkpoint = std::move(*checkpoint), .owned_live = {}};
  for (const Cell* cell : path_.live_cells()) {
    if (cell->storage.owned_by_allocator) snapshot.owned_live.push_back(cell->storage.address);
  }
  return snapshot;
}

Error Engine::roll_back(const PoolSnapshot& before, Error error) {  // NOLINT(readability-make-member-function-const)
  std::vector<backend::StorageHandle*> live;
  for (Cell* cell : path_.live_cells()) {
    if (cell->storage.owned_by_allocator) live.push_back(&cell->storage);
  }
  // A lease dropped inside the function freed its block, which `before` still counts as allocated.
  std::vector<std::uintptr_t> died;
  for (const std::uintptr_t address : before.owned_live) {
    if (std::ranges::none_of(live, [address](const backend::StorageHandle* h) { return h->address == address; })) {
      died.push_back(address);
    }
  }
  if (auto restored = device_->restore(*before.checkpoint, live, died); !restored) {
    error.message += "; restoring the pool also failed: " + restored.error().message;
  }
  return error;
}

CallOutputs Engine::hand_out(const TreeNode& node, const backend::RunResult& result, const CallFrame& frame,
                             CallKind kind) {
  const FunctionRecord& function = *frame.function;
  CallOutputs out;
  out.kind = kind;
  out.node = node.id();
  out.leases = LeaseArray(node.output_count());
  for (std::size_t i = 0; i < node.output_count(); ++i) {
    out.leases[i] = ledger_.make_lease(node.cells()[i].get(), result.values[i], result.owner, function.id,
                                       static_cast<std::uint32_t>(i), generation_rule_.current());
  }
  // Leases the call consumed die now, after the outputs that may alias them took their leases.
  Ledger::consume(frame.args);
  return out;
}

Result<void> Engine::check_outputs_are_ours(const backend::RunResult& result, const CallFrame& frame) const {
  const FunctionRecord& function = *frame.function;
  for (std::size_t i = 0; i < result.outputs.size(); ++i) {
    const backend::OutputDesc& desc = result.outputs[i];
    if (desc.kind != backend::OutputKind::value || !desc.in_pool || desc.allocated_in_call) continue;
    // Pool memory the call received: a view of an input (that is a live output of the path).
    const bool received = std::ranges::any_of(frame.descs, [&desc](const backend::ArgDesc& input) {
      return input.kind == backend::ArgKind::value && input.storage == desc.storage;
    });
    if (received) continue;
    return fail(Errc::function_failed,
                "output " + std::to_string(i) + " of '" + function.name +
                    "' is pool memory that this call neither allocated nor received as an input (a buffer kept from "
                    "an earlier call?); the pool may have handed that memory to another output since: allocate "
                    "outputs in the call, or return a copy",
                function.name);
  }
  return {};
}

Result<CallOutputs> Engine::run_eager(CallFrame& frame, Reason reason) {
  FunctionRecord& function = *frame.function;
  const std::string message = fallback_message(reason, function.name);
  if (options_.or_error) {
    return fail(Errc::graph_unavailable, message + " (or_error is set, so the call fails instead)", function.name);
  }
  ++stats_.eager_calls;
  ++stats_.by_reason[static_cast<std::size_t>(reason)];
  // A mutation, an exceeded re-record limit or a capture that failed is a decision kept, logged when made;
  // the other reasons are decided, and logged, per call.
  if (reason != Reason::mutated_input && reason != Reason::rerecord_limit && reason != Reason::capture_failed &&
      reason != Reason::nested_pool && reason != Reason::unsupported_output) {
    log(EventKind::eager_fallback, reason, function, message);
  }

  auto result = device_->run(*function.invoker, frame.args, backend::RunMode::eager);
  if (!result) return std::unexpected(in_call(std::move(result.error()), function, "running eagerly"));
  if (auto taken = take_writes(frame, result->written_inputs); !taken) return std::unexpected(std::move(taken.error()));
  if (auto ours = check_outputs_are_ours(*result, frame); !ours) return std::unexpected(std::move(ours.error()));
  release_ended_path();
  CallOutputs out;
  out.kind = CallKind::eager;
  out.leases = LeaseArray(result->values.size());
  for (std::size_t i = 0; i < result->values.size(); ++i) {
    // An eager run allocates outside the pool, but may return a view of an input that is a pool
    // output: its lease shares that output's cell, so it keeps the memory live and is reclaimed
    // with it, like any other lease on it.
    const backend::OutputDesc& desc = result->outputs[i];
    Cell* cell = desc.kind == backend::OutputKind::value && desc.in_pool ? path_.live_cell(desc.storage) : nullptr;
    out.leases[i] = ledger_.make_lease(cell, result->values[i], result->owner, function.id,
                                       static_cast<std::uint32_t>(i), generation_rule_.current());
  }
  Ledger::consume(frame.args);
  return out;
}

NodeReason Engine::warmup_reason(const Variant& variant) const noexcept {
  if (!variant.warmed_up) return NodeReason::first_call;
  return path_.state() == PathState::warmup ? NodeReason::path_warming_up : NodeReason::forced_warmup;
}

Result<CallOutputs> Engine::warm_up(CallFrame& frame) {
  FunctionRecord& function = *frame.function;
  Variant& variant = *frame.variant;
  if (auto held = hold_ended_path_memory(); !held) {
    return std::unexpected(in_call(std::move(held.error()), function, "restoring a checkpoint"));
  }
  auto result = run_in_pool<backend::RunResult>(
      frame, "warming up", [&] { return device_->run(*function.invoker, frame.args, backend::RunMode::warmup); },
      std::identity{});  // a warm-up's result is its outputs
  if (!result) {
    if (result.error().cause == Cause::unsupported_output) {
      return run_eagerly_from_now_on(frame, result.error(), Reason::unsupported_output);
    }
    return std::unexpected(std::move(result.error()));
  }
  release_ended_path();  // the warm-up allocated around the last generation's outputs: free them now

  std::unique_ptr<TreeNode> node = path_.make_warmup_node(warmup_reason(variant), variant.id);
  node->take_outputs(result->outputs, function.id);
  CallOutputs out = hand_out(*node, *result, frame, CallKind::warmup);
  variant.warmed_up = true;
  function.warmed_up_once = true;
  ++stats_.warmups;
  path_.enter_warmup(std::move(node), frame.generation);
  return out;
}

}  // namespace cgt::detail
