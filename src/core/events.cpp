// The pool's reports (events.cppm): to the log sink, or once per reason and function to stderr.
module;
#include <cstddef>
#include <iostream>
#include <set>
#include <string>

module cgt.core;
import :events;

namespace cgt::detail {

void Events::say(EventKind kind, Reason reason, FunctionRecord& function, const std::string& message) noexcept {
  try {
    const bool first = function.logged.insert(reason).second;
    if (kind == EventKind::eager_fallback && first) ++stats_.fallback_warnings;
    if (sink_) {
      sink_(Event{.kind = kind, .reason = reason, .function = function.name, .message = message});
    } else if (first) {
      std::cerr << "cgt: " << message << '\n';
    }
  } catch (...) {
    // A log sink that throws must not abandon a call halfway through its bookkeeping: the
    // decision stands (it is counted in Stats), only its report is lost.
    ++stats_.log_sink_failures;
  }
}

void Events::count_and_say(EventKind kind, Reason reason, FunctionRecord& function,
                           const std::string& message) noexcept {
  ++stats_.by_reason[static_cast<std::size_t>(reason)];
  say(kind, reason, function, message);
}

}  // namespace cgt::detail
