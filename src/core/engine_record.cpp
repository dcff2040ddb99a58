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

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

std::string moved_message(NodeReason reason, const FunctionRecord& function) {
  const std::string what =
      reason == NodeReason::static_input_moved ? "a static input" : "an input from an earlier graph";
  return "re-recording '" + function.name + "': " + what + " is at a new address";
}

}  // namespace

RecordingScope::RecordingScope(const Engine& engine, const FunctionRecord& function) noexcept
    : previous_engine_(recording_on_this_thread.engine),
      previous_function_(recording_on_this_thread.function),
      previous_refused_(recording_on_this_thread.refused) {
  recording_on_this_thread = {.engine = &engine, .function = &function, .refused = false};
}

RecordingScope::~RecordingScope() {
  recording_on_this_thread = {.engine = previous_engine_, .function = previous_function_, .refused = previous_refused_};
}

bool RecordingScope::refused_a_call() const noexcept {
  return recording_on_this_thread.refused;
}

Result<CallOutputs> Engine::run_eagerly_from_now_on(CallFrame& frame, const Error& error, Reason reason) {
  frame.variant->capture_failure = error.message;
  frame.variant->capture_failure_reason = reason;
  log(EventKind::eager_fallback, reason, *frame.function,
      "skipping graphs for '" + frame.function->name + "' at these input shapes: " + error.message);
  return run_eager(frame, reason);
}

Result<CallOutputs> Engine::after_failed_capture(CallFrame& frame, const Error& error) {
  FunctionRecord& function = *frame.function;
  if (!frame.variant->warmed_up && !options_.skip_warmup) {
    // The shape recorded without a warm-up of its own (warm_up_each_shape = false): the failure
    // may be lazy set-up that this shape needs and the function's first shape did not (a new
    // kernel loaded, a workspace grown). Warm it up now, as the default would have; it records
    // at its next call, and a second failure is final.
    log(EventKind::warning, Reason::capture_failed, function,
        "the capture of '" + function.name +
            "' failed at input shapes that had not warmed up (warm_up_each_shape "
            "= false): warming them up, then recording again; " +
            error.message);
    return warm_up(frame);
  }
  // A capture that fails for a reason that will not change (the function synchronises with the
  // host, say) would fail on every call: run this shape eagerly from now on, and say why once.
  return run_eagerly_from_now_on(frame, error, Reason::capture_failed);
}

std::vector<InputUse> Engine::classify_inputs(const CallFrame& frame) const {
  // Outputs of the path are used in place (pool-managed), aligned static inputs are used in
  // place, everything else is copied into a pool slot on every replay.
  std::vector<InputUse> uses(frame.descs.size(), InputUse::scalar);
  for (std::size_t i = 0; i < frame.descs.size(); ++i) {
    const backend::ArgDesc& desc = frame.descs[i];
    if (desc.kind == backend::ArgKind::scalar) continue;
    const bool copied_anyway = !frame.always_copied.empty() && frame.always_copied[i];
    if (!copied_anyway && path_.is_output(desc.storage)) {
      uses[i] = InputUse::managed;
    } else if (is_usable_in_place(*frame.function, i, desc)) {
      uses[i] = InputUse::static_in_place;
    } else {
      uses[i] = InputUse::copied;
    }
  }
  return uses;
}

Result<backend::Recorded> Engine::capture(const CallFrame& frame, std::span<const InputUse> uses) {
  const std::size_t inputs = uses.size();
  auto copy_input = std::make_unique<bool[]>(inputs);
  for (std::size_t i = 0; i < inputs; ++i) copy_input[i] = uses[i] == InputUse::copied;
  const backend::RecordPlan plan{
      .copy_input = std::span<const bool>(copy_input.get(), inputs),
      .replaces = frame.rerecording_of != nullptr ? frame.rerecording_of->recording() : nullptr};
  return run_in_pool<backend::Recorded>(
      frame, "recording",
      [&]() -> Result<backend::Recorded> {
        const RecordingScope scope(*this, *frame.function);
        auto recorded = record_graph(*device_, *frame.function->invoker, frame.args, plan);
        if (!scope.refused_a_call()) return recorded;
        recorded = Result<backend::Recorded>();  // without the inner call's work: given up
        return fail(Cause::nested_pool, Errc::function_failed,
                    "it called a function of another pool while its own pool recorded it (that call failed with "
                    "nested_capture); one pool's graph cannot hold another pool's call: give both functions one "
                    "pool to graph them together");
      },
      [](const backend::Recorded& recorded) -> const backend::RunResult& { return recorded.first_outputs; });
}

// Not const, though clang-tidy sees only `device->` calls: it changes the pool's allocator state.
Result<void> Engine::finish_recording(TreeNode& node,  // NOLINT(readability-make-member-function-const)
                                      const std::vector<std::vector<bool>>& liveness_before) {
  auto checkpoint = device_->checkpoint();
  if (!checkpoint) return std::unexpected(std::move(checkpoint.error()));
  node.mark_recorded(std::move(*checkpoint), liveness_before);
  return {};
}

void Engine::count_recording(NodeReason reason, FunctionRecord& function) {
  ++stats_.recordings;
  if (reason != NodeReason::static_input_moved && reason != NodeReason::managed_input_moved) return;
  ++stats_.rerecords;
  const Reason why =
      reason == NodeReason::static_input_moved ? Reason::static_input_moved : Reason::managed_input_moved;
  ++stats_.by_reason[static_cast<std::size_t>(why)];
  log(EventKind::rerecord, why, function, moved_message(reason, function));
}

TreeNode& Engine::add_to_tree(std::unique_ptr<TreeNode> node) {
  return tree_.add(std::move(node), path_.children(tree_.roots()));
}

Result<CallOutputs> Engine::record(CallFrame& frame, NodeReason reason) {
  FunctionRecord& function = *frame.function;
  if (auto held = hold_ended_path_memory(); !held) {
    return std::unexpected(in_call(std::move(held.error()), function, "restoring a checkpoint"));
  }
  auto node = std::make_unique<TreeNode>(NodeKind::graph, tree_.next_id(), reason, frame.variant->id, path_.node());
  const std::vector<InputUse> uses = classify_inputs(frame);
  node->take_inputs(uses, frame.descs);
  const std::vector<std::vector<bool>> liveness_before = path_.liveness();

  auto recorded = capture(frame, uses);
  if (!recorded) {
    // The function needs another pool's call, which cannot be part of this pool's graph (eagerly,
    // the inner call runs and graphs in its own pool), or returns what a graph cannot hand out:
    // either would fail the same way on every recording.
    if (recorded.error().cause == Cause::nested_pool) {
      return run_eagerly_from_now_on(frame, recorded.error(), Reason::nested_pool);
    }
    if (recorded.error().cause == Cause::unsupported_output) {
      return run_eagerly_from_now_on(frame, recorded.error(), Reason::unsupported_output);
    }
    if (backend::is_capture_failure(recorded.error())) return after_failed_capture(frame, recorded.error());
    if (backend::is_write_to_copy(recorded.error())) return after_write_to_copy(frame, recorded.error());
    return std::unexpected(std::move(recorded.error()));
  }
  release_ended_path();  // before the checkpoint below: the last generation's outputs are dead in it
  node->keep_recording(std::move(recorded->recording));
  node->take_outputs(recorded->first_outputs.outputs, function.id);
  CallOutputs out = hand_out(*node, recorded->first_outputs, frame, CallKind::recording);
  if (auto finished = finish_recording(*node, liveness_before); !finished) {
    return std::unexpected(in_call(std::move(finished.error()), function, "recording", node->id()));
  }
  count_recording(reason, function);
  path_.enter(add_to_tree(std::move(node)), PathState::recording, frame.generation);
  return out;
}

}  // namespace cgt::detail
