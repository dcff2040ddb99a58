// The generation a call runs in, the engine's side of the generation rule (generation_rule.hpp
// owns the rule itself): warning when pending backwards keep a forward off the fast path
// (PyTorch's "Backward Generation Handling"). `Engine::begin_generation` (engine.cppm) asks.
module;
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <set>
#include <string>

#include "generation_rule.hpp"

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

void warn_if_pending_backward_repeats(FunctionRecord& function, const Path& path, const Functions& functions,
                                      Events& events) {
  if (function.warned_pending_backward) return;
  // The function already ran more than once on this path, after parents that repeat: a loop of
  // forwards whose backwards never run, growing the path instead of replaying it. One earlier
  // occurrence, or each after a different function, is an ordinary path (layer 1, layer 2, ...).
  std::size_t occurrences = 0;
  std::set<std::uint32_t> parents;
  for (const TreeNode* node : path.nodes()) {
    if (functions.variant(node->variant()).function != function.id) continue;
    ++occurrences;
    if (node->parent() != nullptr) parents.insert(functions.variant(node->parent()->variant()).function);
  }
  if (occurrences <= 1) return;
  const TreeNode* parent = path.node()->parent();
  if (parent != nullptr) parents.insert(functions.variant(parent->variant()).function);
  if (parents.size() == occurrences) return;
  function.warned_pending_backward = true;
  events.count_and_say(
      EventKind::warning, Reason::pending_backward, function,
      "unable to replay '" + function.name +
          "': forwards ran whose backwards did not, so its call begins no new step and the path grows instead; "
          "call mark_step_begin() at the top of each step, or run forwards that need no backward as inference "
          "(under torch::NoGradGuard in cgt.torch)");
}

}  // namespace

void note_generation(const CallGeneration& call, FunctionRecord& function, Stats& stats, const Path& path,
                     const Functions& functions, Events& events) {
  if (call.begun_by_forward) ++stats.steps_begun_by_forward;
  // The outputs a backward will read stay live: the forward goes on down the path.
  if (call.held_by_pending_backward) warn_if_pending_backward_repeats(function, path, functions, events);
}

}  // namespace cgt::detail
