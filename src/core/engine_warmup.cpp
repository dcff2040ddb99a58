// Warm-ups: the function run plainly in the pool, its outputs handed out from a warm-up node of
// the path; and what warm-ups and recordings share (the pool's snapshot for a roll-back).
module;
#include <expected>
#include <functional>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {

namespace {

NodeReason warmup_reason(const Variant& variant, const Path& path) noexcept {
  if (!variant.warmed_up) return NodeReason::first_call;
  return path.state() == PathState::warmup ? NodeReason::path_warming_up : NodeReason::forced_warmup;
}

}  // namespace

Result<CallOutputs> Engine::warm_up(CallFrame& frame) {
  FunctionRecord& function = *frame.function;
  if (auto held = memory_.hold_ended(); !held) {
    return std::unexpected(in_call(std::move(held.error()), function, "restoring a checkpoint"));
  }
  auto result = run_in_pool<backend::RunResult>(
      frame, "warming up", [&] { return device_->run(*function.invoker, frame.args, backend::RunMode::warmup); },
      std::identity{});  // a warm-up's result is its outputs
  if (!result) return std::unexpected(std::move(result.error()));
  // Outputs a graph could not hand out: the backend copied them out of the pool, and this run is
  // the call's; later calls at these shapes run eagerly. The function is not run again.
  if (const std::optional<Error>& ungraphable = result->ungraphable) {
    run_eagerly_from_now_on(frame, *ungraphable, Reason::unsupported_output, events_);
  }
  if (result->allocations) frame.variant->warmup_allocations = result->allocations;
  const NodeReason reason = warmup_reason(*frame.variant, path_);
  ++stats_.warmups;
  return keep_as_warmup(frame, *result, reason);
}

CallOutputs Engine::keep_as_warmup(CallFrame& frame, backend::RunResult& result, NodeReason reason) {
  Variant& variant = *frame.variant;
  memory_.release_ended();  // the run allocated around the last generation's outputs: free them now
  std::unique_ptr<TreeNode> node = path_.make_warmup_node(reason, variant.id);
  node->take_outputs(result.outputs, frame.function->id);
  const TreeNode& made = *node;
  CallOutputs out = lease_outputs(
      frame, CallKind::warmup, made.id(), made.output_count(), [&](std::size_t i) { return made.cells()[i].get(); },
      [&](std::size_t i) { return result.values[i]; }, result.owner);
  variant.warmed_up = true;
  variant.needs_own_warmup = false;
  frame.function->warmed_up_once = true;
  path_.enter_warmup(std::move(node), frame.generation);
  return out;
}

}  // namespace cgt::detail
