// Writes to inputs that a function's options do not declare (`FunctionOptions::mutated_inputs`).
// A graph reads a caller's input through a copy in a slot, so a write to it would go to the slot
// and never reach the caller: a silent wrong value. Backends that can see writes report them
// (`RunResult::written_inputs`); from then on the input counts as mutated, as if declared, and
// calls that would copy it run eagerly (PyTorch finds mutations by tracing and does the same).
module;
#include <expected>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

module cgt.core;
import :engine;

namespace cgt::detail {

Result<void> Engine::take_writes(const CallFrame& frame, std::span<const std::uint32_t> written) {
  FunctionRecord& function = *frame.function;
  for (const std::uint32_t input : written) {
    if (input >= frame.args.size()) continue;
    if (Functions::note_write(function, input)) {
      // Once per input: the next calls take the mutated-input path, which says why they run eagerly.
      events_.count_and_say(
          EventKind::warning, Reason::undeclared_write, function,
          "'" + function.name + "' wrote to its input " + std::to_string(input) +
              ", which FunctionOptions::mutated_inputs does not list: it counts as mutated from now on, and calls "
              "that would copy it into a graph's slot run eagerly; list it in mutated_inputs, and make it a static "
              "input or pass an output of the pool to keep graphs");
    }
    if (frame.padding == nullptr) continue;
    const void* caller = frame.padding->caller_args[input].value;
    if (caller == frame.args[input].value) continue;  // not padded: the write reached the caller's input
    // The function ran on a padded copy (an eager run or a warm-up at the bucket's size): its
    // first rows are the caller's, the rest is padding that nobody reads.
    if (auto copied = device_->write_back(frame.args[input].value, caller, frame.padding->dim, frame.padding->rows);
        !copied) {
      Error error = in_call(std::move(copied.error()), function, "copying a write to a padded input back");
      error.input = static_cast<std::int32_t>(input);
      return std::unexpected(std::move(error));
    }
  }
  return {};
}

}  // namespace cgt::detail
