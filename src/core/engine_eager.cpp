// Calls that run eagerly, outside the pool: the one place `run_decided` sends a call that no graph
// can serve (`Engine::eager_reason` decides which).
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

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
    case Reason::out_of_memory:
      return "running " + name +
             " eagerly: its recording ran out of pool memory (the pool is as it was before); it records at a later "
             "call";
    case Reason::over_budget:
      return "running " + name + " eagerly: recording it would take the pool past Options::memory_budget_bytes";
    default: return "skipping graphs for " + name + ": " + std::string(to_string(reason));
  }
}

// Reasons decided once and kept (a mutation, a re-record limit passed, a failed capture), which
// were logged when made; the others are decided, and logged, per call.
bool logged_when_kept(Reason reason) noexcept {
  return reason == Reason::mutated_input || reason == Reason::rerecord_limit || reason == Reason::capture_failed ||
         reason == Reason::nested_pool || reason == Reason::unsupported_output ||
         reason == Reason::control_flow_on_host || reason == Reason::over_budget;
}

}  // namespace

bool mutates_unmanaged_input(const CallFrame& frame, const Path& path, Events& events) {
  FunctionRecord& function = *frame.function;
  bool mutates = false;
  for (std::size_t i = 0; i < frame.descs.size() && !mutates; ++i) {
    mutates = function.is_mutated[i] && frame.descs[i].kind == backend::ArgKind::value &&
              !is_usable_in_place(function, i, frame.descs[i]) && !path.is_output(frame.descs[i].storage);
  }
  if (mutates && !function.warned_mutation) {
    // Decided per call, and warned once per function, as the reference does.
    function.warned_mutation = true;
    events.say(EventKind::eager_fallback, Reason::mutated_input, function,
               "skipping graphs for '" + function.name + "'" +
                   ": it mutates an input that is neither static nor an output of an earlier graph of this pool; "
                   "declare the input static, or pass a pool output");
  }
  return mutates;
}

Result<void> check_outputs_are_ours(const backend::RunResult& result, const CallFrame& frame) {
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
  if (!logged_when_kept(reason)) events_.say(EventKind::eager_fallback, reason, function, message);

  auto result = device_->run(*function.invoker, frame.args, backend::RunMode::eager);
  if (!result) return std::unexpected(in_call(std::move(result.error()), function, "running eagerly"));
  if (auto taken = take_writes(frame, result->written_inputs); !taken) return std::unexpected(std::move(taken.error()));
  if (auto ours = check_outputs_are_ours(*result, frame); !ours) return std::unexpected(std::move(ours.error()));
  memory_.release_ended();
  // An eager run allocates outside the pool, but may return a view of an input that is a pool
  // output: its lease shares that output's cell, so it keeps the memory live and is reclaimed
  // with it, like any other lease on it.
  const backend::RunResult& ran = *result;
  return lease_outputs(
      frame, CallKind::eager, -1, ran.values.size(),
      [&](std::size_t i) -> Cell* {
        const backend::OutputDesc& desc = ran.outputs[i];
        return desc.kind == backend::OutputKind::value && desc.in_pool ? path_.live_cell(desc.storage) : nullptr;
      },
      [&](std::size_t i) { return ran.values[i]; }, ran.owner);
}

}  // namespace cgt::detail
