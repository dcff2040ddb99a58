// Replay: find the child of the current node whose invariants hold for this call, then hand its
// outputs out as leases. This is the hot path of a pool.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {

Result<CallOutputs> Engine::replay(TreeNode& node, CallFrame& frame) {
  const FunctionRecord& function = *frame.function;
  backend::Recording& recording = *node.recording();
  // What the replay would refuse for the caller's reasons is refused before anything changes:
  // the last generation's outputs are still held, and the generation can still be taken back.
  if (node.checks_arguments()) [[unlikely]] {
    if (auto takes = recording.check(frame.args); !takes) {
      return std::unexpected(in_call(std::move(takes.error()), function, "replaying", node.id()));
    }
  }
  memory_.release_ended();  // the graph writes where the last generation's outputs were
  node.bind_outputs_for_replay(*device_, function.id);
  if (auto replayed = recording.replay(frame.args); !replayed) [[unlikely]] {
    return std::unexpected(in_call(std::move(replayed.error()), function, "replaying", node.id()));
  }
  const TreeNode& ran = node;
  CallOutputs out = lease_outputs(
      frame, CallKind::replay, ran.id(), ran.output_count(), [&](std::size_t i) { return ran.cells()[i].get(); },
      [&](std::size_t i) { return ran.output_value(i); }, NoOwner{});
  path_.enter(node, PathState::execution, frame.generation);
  ++stats_.replays;
  budget_.touch(node);
  return out;
}

}  // namespace cgt::detail
