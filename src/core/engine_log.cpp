// The engine's reports: the events it logs (once per reason and function without a sink) and the message a reclaimed
// output gives.
module;
#include <expected>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
void Engine::log(EventKind kind, Reason reason, FunctionRecord& function, const std::string& message) noexcept {
  try {
    const bool first = function.logged.insert(reason).second;
    if (kind == EventKind::eager_fallback && first) ++stats_.fallback_warnings;
    if (options_.log_sink) {
      options_.log_sink(Event{.kind = kind, .reason = reason, .function = function.name, .message = message});
    } else if (first) {
      std::cerr << "cgt: " << message << '\n';
    }
  } catch (...) {
    // A log sink that throws must not abandon a call halfway through its bookkeeping: the
    // decision stands (it is counted in Stats), only its report is lost.
    ++stats_.log_sink_failures;
  }
}

std::string Engine::overwritten_message(const Cell& cell, std::uint32_t output) const {
  // Until the program marks generations, only a forward's call begins them (`FunctionMode::forward`).
  const bool by_forward = !generation_rule_.program_marks_generations();
  return "output " + std::to_string(output) + " of '" + functions_[cell.function].name +
         "' was reclaimed when a new step began (" +
         (by_forward ? "a forward function was called, with no backward pending," : "mark_step_begin was called") +
         " after it was produced in step " + std::to_string(cell.generation()) +
         "); to keep a value across steps, take() it before the next step, set Options::copy_out_on_new_step "
         "(a new step then copies held outputs out of the pool), or " +
         (by_forward ? "call the next step's forward" : "call mark_step_begin()") + " only after you are done with it";
}

}  // namespace cgt::detail
