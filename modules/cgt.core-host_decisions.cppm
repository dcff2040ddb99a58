// cgt.core:host_decisions — a recording whose loops and branches the host decides
// (`backend::ControlFlow::on_host`): the fallback where they cannot be conditional graph nodes.
//
// The function is captured once, as in any recording. Each `loop_while`, `if_then` and
// `switch_on` it calls marks where the graph is cut: the work captured before it, each body, and
// the work after it become segments, graphs of their own. A replay then launches the segments in
// order and, at each decision, reads the value it is decided on (a wait for the work before it)
// and launches a body's segments as many times as that value says: a host loop of per-step
// replays, with the results of the graph the GPU would have decided. Every backend cuts and
// launches its own graphs; the order of segments and decisions, and the replay's rules (a loop
// checks before each iteration and stops at its maximum; a choice out of range runs nothing), are
// written once, here.
module;
#include <cstddef>
#include <cstdint>
#include <expected>
#include <utility>
#include <vector>

export module cgt.core:host_decisions;
import cgt.vocabulary;

export namespace cgt::backend {

/// The order of a host-decided recording's segments and decisions. A backend adds to it while
/// it captures (`segment`, `open`, `body`, `close`), in the function's order, and replays it with
/// `run`. Segments are numbered by the backend in capture order.
class HostDecisions {
 public:
  enum class Kind : std::uint8_t { loop, branch, choice };

  /// Segment `index` runs here (a graph the backend cut from the capture).
  void segment(std::size_t index) { open_body().push_back(Step{.segment = index}); }
  /// A decision of `kind` on `decider` (one int32 on the device), with `bodies` bodies (1 for a
  /// loop or a branch); `body(0)` follows. A loop runs at most `max_iterations` times.
  void open(Kind kind, const void* decider, std::uint64_t max_iterations, std::size_t bodies) {
    std::vector<Step>& into = open_body();
    into.push_back(Step{.is_decision = true,
                        .kind = kind,
                        .decider = decider,
                        .max_iterations = max_iterations,
                        .bodies = std::vector<std::vector<Step>>(bodies)});
    open_.push_back({.steps = &into, .at = into.size() - 1, .body = 0});
  }
  /// What follows goes into body `i` of the decision opened last.
  void body(std::size_t i) { open_.back().body = i; }
  /// Ends the decision opened last: what follows comes after it.
  void close() { open_.pop_back(); }
  /// Every decision opened was closed (a capture that threw out of a body leaves one open: the
  /// recording then fails anyway).
  [[nodiscard]] bool complete() const noexcept { return open_.empty(); }
  /// Segments and decisions in all.
  [[nodiscard]] bool empty() const noexcept { return top_.empty(); }

  /// Replays: `launch(index)` launches segment `index` (a `Result<void>`), `read(decider)` the
  /// decider's value once the work launched before it ran (a `Result<std::int32_t>`). Stops at
  /// the first failure.
  template <class Launch, class Read>
  [[nodiscard]] Result<void> run(const Launch& launch, const Read& read) const {
    return run_steps(top_, launch, read);
  }

 private:
  struct Step {
    std::size_t segment = 0;  // a segment when not a decision
    bool is_decision = false;
    Kind kind = Kind::loop;
    const void* decider = nullptr;
    std::uint64_t max_iterations = 0;
    std::vector<std::vector<Step>> bodies;
  };
  // A decision being captured: the list it is in (stable: nothing is added to an outer list while
  // an inner one is open), its place there, and the body filled now.
  struct Open {
    std::vector<Step>* steps = nullptr;
    std::size_t at = 0;
    std::size_t body = 0;
  };

  std::vector<Step>& open_body() {
    if (open_.empty()) return top_;
    const Open& innermost = open_.back();
    return (*innermost.steps)[innermost.at].bodies[innermost.body];
  }

  template <class Launch, class Read>
  static Result<void> run_steps(const std::vector<Step>& steps, const Launch& launch, const Read& read) {
    for (const Step& step : steps) {
      if (!step.is_decision) {
        if (Result<void> launched = launch(step.segment); !launched) return launched;
        continue;
      }
      if (step.kind == Kind::loop) {
        // Checked before each iteration, the first included; at most max_iterations.
        for (std::uint64_t i = 0; i < step.max_iterations; ++i) {
          Result<std::int32_t> go_on = read(step.decider);
          if (!go_on) return std::unexpected(std::move(go_on.error()));
          if (*go_on == 0) break;
          if (Result<void> ran = run_steps(step.bodies.front(), launch, read); !ran) return ran;
        }
        continue;
      }
      Result<std::int32_t> value = read(step.decider);
      if (!value) return std::unexpected(std::move(value.error()));
      if (step.kind == Kind::branch) {
        if (*value == 0) continue;
        if (Result<void> ran = run_steps(step.bodies.front(), launch, read); !ran) return ran;
        continue;
      }
      if (*value < 0 || static_cast<std::size_t>(*value) >= step.bodies.size()) continue;  // none taken
      if (Result<void> ran = run_steps(step.bodies[static_cast<std::size_t>(*value)], launch, read); !ran) return ran;
    }
    return {};
  }

  std::vector<Step> top_;
  std::vector<Open> open_;
};

}  // namespace cgt::backend
