// The names of the vocabulary's values (`to_string`) and an error's description.
module;
#include <string>
#include <string_view>

module cgt.vocabulary;

namespace cgt {

std::string_view to_string(Errc code) noexcept {
  switch (code) {
    case Errc::wrong_input_count: return "wrong_input_count";
    case Errc::wrong_input_type: return "wrong_input_type";
    case Errc::wrong_shape: return "wrong_shape";
    case Errc::output_overwritten: return "output_overwritten";
    case Errc::pool_shut_down: return "pool_shut_down";
    case Errc::static_input_moved: return "static_input_moved";
    case Errc::graph_unavailable: return "graph_unavailable";
    case Errc::function_failed: return "function_failed";
    case Errc::out_of_memory: return "out_of_memory";
    case Errc::backend_error: return "backend_error";
    case Errc::concurrent_use: return "concurrent_use";
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::invariant_violation: return "invariant_violation";
    case Errc::nested_capture: return "nested_capture";
  }
  return "unknown";
}

std::string Error::describe() const {
  std::string text = std::string(to_string(code)) + ": " + message;
  if (!function.empty()) text += " [function '" + function + "']";
  if (node >= 0) text += " [node " + std::to_string(node) + "]";
  if (input >= 0) text += " [input " + std::to_string(input) + "]";
  return text;
}

std::string_view to_string(Reason reason) noexcept {
  switch (reason) {
    case Reason::mutated_input: return "mutated_input";
    case Reason::rerecord_limit: return "rerecord_limit";
    case Reason::shape_key_limit: return "shape_key_limit";
    case Reason::size_not_graphed: return "size_not_graphed";
    case Reason::size_above_buckets: return "size_above_buckets";
    case Reason::input_on_other_device: return "input_on_other_device";
    case Reason::static_input_moved: return "static_input_moved";
    case Reason::managed_input_moved: return "managed_input_moved";
    case Reason::many_shape_keys: return "many_shape_keys";
    case Reason::capture_failed: return "capture_failed";
    case Reason::nested_pool: return "nested_pool";
    case Reason::unsupported_output: return "unsupported_output";
    case Reason::out_of_memory: return "out_of_memory";
    case Reason::pending_backward: return "pending_backward";
    case Reason::undeclared_write: return "undeclared_write";
    case Reason::padded_output: return "padded_output";
    case Reason::control_flow_on_host: return "control_flow_on_host";
    case Reason::over_budget: return "over_budget";
    case Reason::count_: break;
  }
  return "unknown";
}

std::string_view to_string(FunctionMode mode) noexcept {
  switch (mode) {
    case FunctionMode::inference: return "inference";
    case FunctionMode::forward: return "forward";
    case FunctionMode::backward: return "backward";
  }
  return "unknown";
}

std::string_view to_string(CallKind kind) noexcept {
  switch (kind) {
    case CallKind::warmup: return "warm-up";
    case CallKind::recording: return "recording";
    case CallKind::replay: return "replay";
    case CallKind::eager: return "eager";
  }
  return "unknown";
}

std::string_view to_string(NodeReason reason) noexcept {
  switch (reason) {
    case NodeReason::first_call: return "first_call";
    case NodeReason::new_liveness_pattern: return "new_liveness_pattern";
    case NodeReason::static_input_moved: return "static_input_moved";
    case NodeReason::managed_input_moved: return "managed_input_moved";
    case NodeReason::path_warming_up: return "path_warming_up";
    case NodeReason::forced_warmup: return "forced_warmup";
    case NodeReason::recording_not_kept: return "recording_not_kept";
  }
  return "unknown";
}

}  // namespace cgt
