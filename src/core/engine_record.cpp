// Recording a new node: classify the inputs, capture the function into a graph in the pool, work
// out how its outputs alias other memory, checkpoint the allocator, and hand out the outputs.
module;
#include <expected>
#include <functional>
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

std::vector<InputUse> classify_inputs(const CallFrame& frame, const Path& path) {
  // Outputs of the path are used in place (pool-managed), aligned static inputs are used in
  // place, everything else is copied into a pool slot on every replay.
  std::vector<InputUse> uses(frame.descs.size(), InputUse::scalar);
  for (std::size_t i = 0; i < frame.descs.size(); ++i) {
    const backend::ArgDesc& desc = frame.descs[i];
    if (desc.kind == backend::ArgKind::scalar) continue;
    const bool copied_anyway = !frame.always_copied.empty() && frame.always_copied[i];
    if (!copied_anyway && path.is_output(desc.storage)) {
      uses[i] = InputUse::managed;
    } else if (is_usable_in_place(*frame.function, i, desc)) {
      uses[i] = InputUse::static_in_place;
    } else {
      uses[i] = InputUse::copied;
    }
  }
  return uses;
}

bool host_decides(const FunctionRecord& function, const Variant& variant) noexcept {
  return function.options.control_flow_on_host || variant.control_flow_on_host;
}

void count_recording(NodeReason reason, FunctionRecord& function, Stats& stats, Events& events) {
  ++stats.recordings;
  if (reason != NodeReason::static_input_moved && reason != NodeReason::managed_input_moved) return;
  ++stats.rerecords;
  const Reason why =
      reason == NodeReason::static_input_moved ? Reason::static_input_moved : Reason::managed_input_moved;
  events.count_and_say(EventKind::rerecord, why, function, moved_message(reason, function));
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

void run_eagerly_from_now_on(CallFrame& frame, const Error& error, Reason reason, Events& events) {
  frame.variant->capture_failure = error.message;
  frame.variant->capture_failure_reason = reason;
  events.say(EventKind::eager_fallback, reason, *frame.function,
             "skipping graphs for '" + frame.function->name + "' at these input shapes: " + error.message);
}

Result<CallOutputs> Engine::after_failed_recording(CallFrame& frame, Error error) {
  // The pipeline failed before the graph ran: nothing of the function's work ran, and the call
  // is decided again once the variant knows what the failure means for these shapes.
  if (error.code == Errc::out_of_memory && error.cause == Cause::unspecified) {
    // The capture, its slots or its executable found no memory; run_in_pool put the pool back.
    // This call runs eagerly, outside the pool; the shape tries again at its next call, when the
    // program may have given memory back. Not kept: the shortage may pass.
    frame.unfit = Reason::out_of_memory;
    return give_back(frame);
  }
  switch (error.cause) {
    case Cause::conditional_unavailable:
      // Only its loops or branches, as conditional nodes, broke the capture. The shape's next
      // recording has the host decide them; this call runs eagerly (a second capture now would be
      // the body's third run in this call, were it to fail too).
      frame.variant->control_flow_on_host = true;
      events_.say(EventKind::warning, Reason::control_flow_on_host, *frame.function,
                  "the loops or branches of " + in_quotes(frame.function->name) +
                      " cannot be conditional graph nodes at these input shapes: this call runs eagerly, and their "
                      "next recording is made as segments the host decides between at each replay (a wait per "
                      "decision); " +
                      error.message);
      frame.unfit = Reason::control_flow_on_host;
      return give_back(frame);
    case Cause::nested_pool:
      // The function needs another pool's call, which cannot be part of this pool's graph; eagerly,
      // the inner call runs (and graphs in its own pool).
      run_eagerly_from_now_on(frame, error, Reason::nested_pool, events_);
      return give_back(frame);
    case Cause::unsupported_output:
      run_eagerly_from_now_on(frame, error, Reason::unsupported_output, events_);
      return give_back(frame);
    case Cause::uncapturable:
      if (!frame.variant->warmed_up && !options_.skip_warmup) {
        // The shape recorded without a warm-up of its own (warm_up_each_shape = false): the
        // failure may be lazy set-up that this shape needs and the function's first shape did not
        // (a new kernel loaded, a workspace grown). It warms up now, as the default would have; it
        // records at its next call, and a second failure is final.
        events_.say(
            EventKind::warning, Reason::capture_failed, *frame.function,
            "the capture of '" + frame.function->name +
                "' failed at input shapes that had not warmed up (warm_up_each_shape = false): warming them up, "
                "then recording again; " +
                error.message);
        frame.variant->needs_own_warmup = true;
        return give_back(frame);
      }
      // A capture that fails for a reason that will not change (the function synchronises with
      // the host, say) would fail on every call: these shapes run eagerly from now on.
      run_eagerly_from_now_on(frame, error, Reason::capture_failed, events_);
      return give_back(frame);
    default: return std::unexpected(std::move(error));
  }
}

CallOutputs Engine::keep_first_run_only(CallFrame& frame, backend::Recorded& recorded, const Error& why) {
  ++stats_.recordings_not_kept;
  ++stats_.warmups;
  // A write to a copied input was noted (`take_writes`): the input counts as mutated. Another pool
  // ran on another thread during the capture: the graph may read its result, here and every time.
  if (why.cause == Cause::nested_pool) run_eagerly_from_now_on(frame, why, Reason::nested_pool, events_);
  recorded.recording.reset();  // never replayed
  return keep_as_warmup(frame, recorded.first_outputs, NodeReason::recording_not_kept);
}

std::optional<std::size_t> Engine::predict_recording(const CallFrame& frame, const backend::RecordPlan& plan,
                                                     backend::GrowthFrom from) const {
  const std::shared_ptr<const ArenaTrace>& warmup = frame.variant->warmup_allocations;
  if (!warmup) return std::nullopt;
  return device_->predict_growth(*warmup, frame.args, plan, from);
}

bool Engine::fits_budget(CallFrame& frame, const backend::RecordPlan& plan) {
  if (!budget_.active()) return true;
  const auto predict = [&] { return predict_recording(frame, plan, backend::GrowthFrom::now); };
  const std::optional<std::size_t> least = predict_recording(frame, plan, backend::GrowthFrom::empty_pool);
  if (budget_.make_room(predict, least, frame.rerecording_of)) return true;
  frame.unfit = Reason::over_budget;
  if (!std::exchange(frame.variant->warned_over_budget, true)) {
    const std::optional<std::size_t> adds = predict_recording(frame, plan, backend::GrowthFrom::now);
    events_.say(EventKind::warning, Reason::over_budget, *frame.function,
                "recording " + in_quotes(frame.function->name) + " at these input shapes would add " +
                    (adds ? std::to_string(*adds) + " bytes" : std::string("an unknown amount")) +
                    " to a pool that holds " + std::to_string(budget_.budgeted_bytes()) + " of its budget of " +
                    std::to_string(options_.memory_budget_bytes) +
                    " bytes (Options::memory_budget_bytes): these calls run eagerly until it fits");
  }
  return false;
}

Result<CallOutputs> Engine::record(CallFrame& frame, NodeReason reason) {
  FunctionRecord& function = *frame.function;
  if (auto held = memory_.hold_ended(); !held) {
    return std::unexpected(in_call(std::move(held.error()), function, "restoring a checkpoint"));
  }
  auto node = std::make_unique<TreeNode>(NodeKind::graph, tree_.next_id(), reason, frame.variant->id, path_.node());
  const std::vector<InputUse> uses = classify_inputs(frame, path_);
  node->take_inputs(uses, frame.descs);
  const std::vector<std::vector<bool>> liveness_before = path_.liveness();

  // The capture, in the pool: rolled back if it fails.
  auto copy_input = std::make_unique<bool[]>(uses.size());
  for (std::size_t i = 0; i < uses.size(); ++i) copy_input[i] = uses[i] == InputUse::copied;
  const backend::RecordPlan plan{
      .copy_input = std::span<const bool>(copy_input.get(), uses.size()),
      .replaces = frame.rerecording_of != nullptr ? frame.rerecording_of->recording() : nullptr,
      .control_flow =
          host_decides(function, *frame.variant) ? backend::ControlFlow::on_host : backend::ControlFlow::on_device};
  if (!fits_budget(frame, plan)) return give_back(frame);
  const std::optional<std::size_t> predicted = predict_recording(frame, plan, backend::GrowthFrom::now);
  const std::size_t reserved_before = device_->memory().reserved_bytes;
  auto recorded = run_in_pool<backend::Recorded>(
      frame, "recording", [&] { return record_graph(*device_, *function.invoker, frame.args, plan, *this, function); },
      [](const backend::Recorded& made) -> const backend::RunResult& { return made.first_outputs; });
  if (!recorded) return after_failed_recording(frame, std::move(recorded.error()));
  if (const std::optional<Error>& not_kept = recorded->not_kept)
    return keep_first_run_only(frame, *recorded, *not_kept);

  memory_.release_ended();  // before the checkpoint below: the last generation's outputs are dead in it
  node->keep_recording(std::move(recorded->recording), plan.control_flow);
  node->take_outputs(recorded->first_outputs.outputs, function.id);
  const TreeNode& made = *node;
  const backend::RunResult& first = recorded->first_outputs;
  CallOutputs out = lease_outputs(
      frame, CallKind::recording, made.id(), made.output_count(), [&](std::size_t i) { return made.cells()[i].get(); },
      [&](std::size_t i) { return first.values[i]; }, first.owner);
  auto checkpoint = device_->checkpoint();
  if (!checkpoint) return std::unexpected(in_call(std::move(checkpoint.error()), function, "recording", node->id()));
  node->mark_recorded(std::move(*checkpoint), liveness_before);
  const std::size_t reserved_after = device_->memory().reserved_bytes;
  node->note_growth(predicted, reserved_after > reserved_before ? reserved_after - reserved_before : 0);
  budget_.touch(*node);
  count_recording(reason, function, stats_, events_);
  path_.enter(tree_.add(std::move(node), path_.children(tree_.roots())), PathState::recording, frame.generation);
  // A capture that took more than its warm-up did (memory it allocates only while capturing) may
  // have taken the pool past the budget: other graphs make room now, as the policy allows.
  budget_.settle();
  return out;
}

}  // namespace cgt::detail
