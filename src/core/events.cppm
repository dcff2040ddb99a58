// cgt.core:events (internal) — what a pool tells the program, and how often: every event goes to
// the log sink (Options::log_sink), or without one, a function's first event of each reason to
// stderr. The engine's steps decide what to say; this file decides where it goes and what counts.
module;
#include <string>

export module cgt.core:events;
import cgt.vocabulary;
import :functions;

namespace cgt::detail {

/// The pool's reports. Contract: `say` never throws and never changes a decision, only its report:
/// a sink that throws is counted (`Stats::log_sink_failures`) and the call goes on. It counts an
/// eager fallback's first report per reason and function (`Stats::fallback_warnings`); `count_and_say`
/// also counts the event under its reason (`Stats::by_reason`), for reports the engine does not
/// count where it decides. REQUIRES: the engine's state held (it writes the function's `logged`
/// set and the stats).
class Events {
 public:
  Events(const LogSink& sink, Stats& stats) noexcept : sink_(sink), stats_(stats) {}
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;

  void say(EventKind kind, Reason reason, FunctionRecord& function, const std::string& message) noexcept;
  void count_and_say(EventKind kind, Reason reason, FunctionRecord& function, const std::string& message) noexcept;

 private:
  const LogSink& sink_;
  Stats& stats_;
};

}  // namespace cgt::detail
