// The generation rule of a pool: which generation the pool is in, and whether a call begins a new
// one (PyTorch's `can_start_new_generation`, with its `MarkStepBox` and `GenerationTracker`
// counters, and `running_forwards_with_pending_backwards`). This file is the rule's only owner: to
// change when generations begin, change this file and its unit tests (tests/core/test_generation_rule.cpp).
//
// A generation is what PyTorch calls one: the span of calls whose outputs may live together. When
// a call finds the pool's path from an earlier generation, the path ends and the memory of its
// outputs is reclaimed, even where leases still hold them (the engine's `end_path_if_over`).
// cgt's public API says "step" for it (`mark_step_begin`, after PyTorch's
// `cudagraph_mark_step_begin`).
//
// The rule:
//  * `mark_step_begin()` (any thread, any time) begins a generation, and from then on the program
//    alone begins them: forwards no longer do.
//  * Until then, a call of a forward function begins a generation, unless a forward ran whose
//    backward has not (the outputs that backward reads must stay live), or the pool has no path
//    (there is nothing to reclaim, so the counter stays put).
//  * Inference and backward calls never begin one. A forward's call that succeeded leaves its
//    backward pending; a backward's call that succeeded (replayed, recorded, warmed up or run
//    eagerly) clears it.
//
// Plain C++ (no module): the engine includes it in its global module fragment, and the unit tests
// include it directly.
#pragma once

#include <atomic>
#include <cstdint>

namespace cgt::detail {

/// The part a function plays in training (`cgt::FunctionMode`, which this header cannot name).
enum class CallRole : std::uint8_t { inference, forward, backward };

/// What the start of a call made of the generation (`GenerationRule::begin_call`).
struct CallGeneration {
  /// The generation the call runs in: a path last run in another generation is over.
  std::uint64_t generation = 0;
  /// This call's forward began `generation`: `GenerationRule::take_back` undoes it if the call
  /// fails before its work.
  bool begun_by_forward = false;
  /// A forward that would have begun a generation but for a pending backward: it goes on down the
  /// path instead (the engine may warn that it cannot replay).
  bool held_by_pending_backward = false;
};

// Trivially destructible, whatever clang-tidy 19 says: it takes this header's implicit destructor,
// seen again in each module unit that includes it, for a second declaration.
// NOLINTNEXTLINE(performance-trivially-destructible)
class GenerationRule {
 public:
  GenerationRule() = default;
  GenerationRule(const GenerationRule&) = delete;
  GenerationRule& operator=(const GenerationRule&) = delete;

  // --- any thread, no lock ---

  /// The program begins a generation (`Pool::mark_step_begin`). ENSURES: the next `begin_call`
  /// on any thread returns a generation above every earlier one; forwards begin none from now on.
  void mark_step_begin() noexcept {
    program_marks_.store(true);
    counter_.fetch_add(1);
  }
  /// Whether `mark_step_begin` was ever called.
  [[nodiscard]] bool program_marks_generations() const noexcept { return program_marks_.load(); }
  /// The generation now (for messages and leases).
  [[nodiscard]] std::uint64_t current() const noexcept { return counter_.load(std::memory_order_relaxed); }

  // --- under the engine's state lock ---

  /// Starts a call of a function in `role`. REQUIRES: `has_path` says whether the pool has a
  /// current path. ENSURES: a forward's call, before the program marks generations, with a path
  /// and no pending backward, begins a new generation (`begun_by_forward`); no other call changes
  /// the counter.
  [[nodiscard]] CallGeneration begin_call(CallRole role, bool has_path) noexcept {
    CallGeneration call;
    if (role == CallRole::forward && !program_marks_.load() && has_path) {
      if (pending_backward_) {
        call.held_by_pending_backward = true;
      } else {
        counter_.fetch_add(1);
        call.begun_by_forward = true;
      }
    }
    call.generation = counter_.load();
    return call;
  }
  /// Whether a path last run in generation `path_generation` is over for a call in `generation`.
  [[nodiscard]] static bool is_new_generation(std::uint64_t path_generation, std::uint64_t generation) noexcept {
    return path_generation != generation;
  }
  /// The call that began `call.generation` failed before its work: the generation is not begun.
  /// A `mark_step_begin()` since (from the function, another thread) stands, and so does this
  /// generation then. Returns whether it was taken back.
  bool take_back(const CallGeneration& call) noexcept {
    if (!call.begun_by_forward) return false;
    std::uint64_t expected = call.generation;
    return counter_.compare_exchange_strong(expected, call.generation - 1);
  }
  /// After a call in `role` that succeeded (a backward's call, whatever its result): a forward
  /// leaves its backward pending, a backward runs it (set after the call, as the reference does).
  void end_call(CallRole role) noexcept {
    if (role == CallRole::forward) pending_backward_ = true;
    if (role == CallRole::backward) pending_backward_ = false;
  }
  /// A forward ran and no backward since.
  [[nodiscard]] bool pending_backward() const noexcept { return pending_backward_; }

 private:
  std::atomic<std::uint64_t> counter_{0};   ///< the generation now; bumped from any thread
  std::atomic<bool> program_marks_{false};  ///< `mark_step_begin` was called once
  bool pending_backward_ = false;           ///< guarded by the engine's state lock
};

}  // namespace cgt::detail
