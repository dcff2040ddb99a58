// Training: forward and backward functions (PyTorch's CompilationMode and its "Backward Generation
// Handling"). A forward's call begins a new step unless a backward is pending; a backward's call
// clears what is pending.
module;
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <set>
#include <string>

module cgt.backend;
import :engine;

namespace cgt::detail {

bool Engine::forward_steps_here(const FunctionRecord& function) const noexcept {
  // Only until the program marks steps itself: then steps are its own (PyTorch: once
  // `cudagraph_mark_step_begin` was called, the generation is the mark-step counter alone).
  // Without a path there is nothing to reclaim.
  return function.options.mode == FunctionMode::forward && !user_marks_steps.load() && current != nullptr;
}

bool Engine::begin_step_for_forward(FunctionRecord& function) {
  if (!forward_steps_here(function)) return false;
  if (pending_backward) {
    // The outputs a backward will read stay live: the forward goes on down the path.
    warn_if_pending_backward_repeats(function);
    return false;
  }
  step.fetch_add(1);
  ++stats.steps_begun_by_forward;
  return true;
}

void Engine::take_back_step(std::uint64_t begun) noexcept {
  // A mark_step_begin() since (from the function, another thread) stands: so does this step then.
  std::uint64_t expected = begun;
  if (step.compare_exchange_strong(expected, begun - 1)) --stats.steps_begun_by_forward;
}

void Engine::warn_if_pending_backward_repeats(FunctionRecord& function) {
  if (function.warned_pending_backward) return;
  // The function already ran more than once on this path, after parents that repeat: a loop of
  // forwards whose backwards never run, growing the path instead of replaying it. One earlier
  // occurrence, or each after a different function, is an ordinary path (layer 1, layer 2, ...).
  std::size_t occurrences = 0;
  std::set<std::uint32_t> parents;
  for (const TreeNode* node : current->path()) {
    if (variants[node->variant()]->function != function.id) continue;
    ++occurrences;
    if (node->parent() != nullptr) parents.insert(variants[node->parent()->variant()]->function);
  }
  if (occurrences <= 1) return;
  if (current->parent() != nullptr) parents.insert(variants[current->parent()->variant()]->function);
  if (parents.size() == occurrences) return;
  function.warned_pending_backward = true;
  ++stats.by_reason[static_cast<std::size_t>(Reason::pending_backward)];
  log(EventKind::warning, Reason::pending_backward, function,
      "unable to replay '" + function.name +
          "': forwards ran whose backwards did not, so its call begins no new step and the path grows instead; "
          "call mark_step_begin() at the top of each step, or run forwards that need no backward as inference "
          "(under torch::NoGradGuard in cgt.torch)");
}

void Engine::note_mode_ran(const FunctionRecord& function) noexcept {
  // After the call, as the reference does: a forward's backward is pending only once it ran.
  if (function.options.mode == FunctionMode::forward) {
    pending_backward = true;
  } else if (function.options.mode == FunctionMode::backward) {
    pending_backward = false;
  }
}

}  // namespace cgt::detail
