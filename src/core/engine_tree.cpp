// The tree's part of a call (PyTorch's `_run` after its fallbacks): warm up, replay the child of
// the current node that fits the call, or record a new node; the path ended first where no child
// fits and the function is also a root.
module;
#include <expected>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

bool needs_warmup(const FunctionRecord& function, const Variant& variant, const Path& path,
                  const Options& options) noexcept {
  // A warm-up allocates at addresses the caching state of that moment decides, so a recording
  // cannot follow it on the same path: once warming up, the path warms up until it ends.
  const bool shape_needs_it =
      !variant.warmed_up && !options.skip_warmup &&
      (function.options.warm_up_each_shape || !function.warmed_up_once || variant.needs_own_warmup);
  return shape_needs_it || path.state() == PathState::warmup || options.force_warmup;
}

Result<void> fail_static_input_moved(const CallFrame& frame, const Match& match) {
  // Every input that moved, so that one fix is enough.
  const TreeNode& child = *match.static_moved_child;
  std::string moved;
  for (const std::uint32_t input : child.static_inputs()) {
    if (frame.descs[input].data == child.recorded_data()[input]) continue;
    moved += (moved.empty() ? "" : ", ") + std::to_string(input);
  }
  return fail(Errc::static_input_moved,
              "static input(s) " + moved + " of " + in_quotes(frame.function->name) +
                  " are not at the addresses its graph was recorded with; keep static inputs in place, or set "
                  "on_static_input_moved = rerecord",
              frame.function->name, child.id(), match.moved_static_input);
}

}  // namespace

Result<CallOutputs> Engine::run_tree(CallFrame& frame) {
  // The steady loop of a program: the path replayed ends in a node without a child of this
  // function, which is a root. PyTorch tries the roots once no child fits (below); with no child
  // to try, and nothing that would keep the path (a warm-up goes on down it, a rerecord count is
  // per node), that is decided first, and the checks below run once, at the roots.
  if (path_.state() == PathState::execution && path_.node() != nullptr && !frame.variant->rerecorded &&
      !path_.node()->children().has(frame.variant->id) && tree_.roots().has(frame.variant->id) &&
      !needs_warmup(*frame.function, *frame.variant, path_, options_)) {
    memory_.end_path_if_over(frame.generation, PathCheck::no_child_fits);
  }

  if (needs_warmup(*frame.function, *frame.variant, path_, options_)) {
    if (path_.state() == PathState::execution) {
      if (auto restored = memory_.restore_checkpoint(); !restored) {
        return std::unexpected(in_call(std::move(restored.error()), *frame.function, "restoring a checkpoint"));
      }
    }
    return warm_up(frame);
  }

  NodeReason reason = NodeReason::first_call;
  if (path_.state() != PathState::recording) {
    const Match match = Tree::match(path_.children(tree_.roots()).of(frame.variant->id), frame.descs, frame.args,
                                    options_.on_static_input_moved);
    if (match.replayable != nullptr) return replay(*match.replayable, frame);
    if (match.static_moved_child != nullptr && options_.on_static_input_moved == OnStaticInputMoved::error) {
      return std::unexpected(fail_static_input_moved(frame, match).error());
    }

    // No child fits. If the function is also a root, the path may be over: try from the roots.
    if (path_.node() != nullptr && tree_.roots().has(frame.variant->id)) {
      memory_.end_path_if_over(frame.generation, PathCheck::no_child_fits);
      if (path_.node() == nullptr) return run_tree(frame);
    }
    if (match.moved_managed_input >= 0) {
      ChildFacts& facts = path_.children(tree_.roots()).facts(frame.variant->id);
      ++facts.rerecords;
      frame.variant->rerecorded = true;
      if (facts.rerecords > options_.rerecord_limit) {
        // Said once, here, where the input that keeps moving is known; `eager_reason` decides.
        events_.say(EventKind::eager_fallback, Reason::rerecord_limit, *frame.function,
                    "skipping graphs for " + in_quotes(frame.function->name) + ": re-recorded more than " +
                        std::to_string(options_.rerecord_limit) + " times under one node because input " +
                        std::to_string(match.moved_managed_input) + " (an output of an earlier graph) keeps moving");
        return give_back(frame);
      }
    }
    ++stats_.failed_matches;
    if (match.static_moved_child != nullptr) {
      reason = NodeReason::static_input_moved;
      frame.rerecording_of = match.static_moved_child;
    } else if (match.moved_managed_input >= 0) {
      reason = NodeReason::managed_input_moved;
    } else if (match.liveness_differs) {
      reason = NodeReason::new_liveness_pattern;
    }

    memory_.end_path_if_over(frame.generation, PathCheck::no_child_fits);
    if (path_.node() != nullptr) {
      if (auto restored = memory_.restore_checkpoint(); !restored) {
        return std::unexpected(in_call(std::move(restored.error()), *frame.function, "restoring a checkpoint"));
      }
    }
  }
  return record(frame, reason);
}

}  // namespace cgt::detail
