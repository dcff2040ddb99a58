// The generation rule on its own (src/core/generation_rule.hpp): when a call begins a new
// generation, and what it takes back. The engine's use of it is tested through pools in
// tests/host/test_training.cpp and tests/host/test_training_modes.cpp.
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/generation_rule.hpp"

using cgt::detail::CallGeneration;
using cgt::detail::CallRole;
using cgt::detail::GenerationRule;

TEST_CASE("inference and backward calls never begin a generation", "[generation]") {
  GenerationRule rule;
  for (const CallRole role : {CallRole::inference, CallRole::backward}) {
    const CallGeneration call = rule.begin_call(role, /*has_path=*/true);
    CHECK(call.generation == 0);
    CHECK_FALSE(call.begun_by_forward);
    CHECK_FALSE(call.held_by_pending_backward);
    rule.end_call(role);
  }
  CHECK(rule.current() == 0);
}

TEST_CASE("a forward begins a generation when the pool has a path and no backward is pending", "[generation]") {
  GenerationRule rule;
  SECTION("without a path there is nothing to reclaim: the generation stays") {
    const CallGeneration call = rule.begin_call(CallRole::forward, /*has_path=*/false);
    CHECK(call.generation == 0);
    CHECK_FALSE(call.begun_by_forward);
  }
  SECTION("with a path, the forward begins one") {
    const CallGeneration call = rule.begin_call(CallRole::forward, /*has_path=*/true);
    CHECK(call.generation == 1);
    CHECK(call.begun_by_forward);
    CHECK(GenerationRule::is_new_generation(0, call.generation));
    CHECK_FALSE(GenerationRule::is_new_generation(1, call.generation));
  }
}

TEST_CASE("a pending backward holds off the generation a forward would begin", "[generation]") {
  GenerationRule rule;
  const CallGeneration first = rule.begin_call(CallRole::forward, true);
  rule.end_call(CallRole::forward);
  CHECK(rule.pending_backward());
  const CallGeneration second = rule.begin_call(CallRole::forward, true);
  CHECK(second.generation == first.generation);
  CHECK_FALSE(second.begun_by_forward);
  CHECK(second.held_by_pending_backward);
  rule.end_call(CallRole::forward);
  // One backward clears the pending state, however many forwards ran.
  (void)rule.begin_call(CallRole::backward, true);
  rule.end_call(CallRole::backward);
  CHECK_FALSE(rule.pending_backward());
  const CallGeneration third = rule.begin_call(CallRole::forward, true);
  CHECK(third.begun_by_forward);
  CHECK(third.generation == first.generation + 1);
}

TEST_CASE("a forward that fails leaves no backward pending", "[generation]") {
  GenerationRule rule;
  (void)rule.begin_call(CallRole::forward, true);  // the engine calls end_call only after success
  CHECK_FALSE(rule.pending_backward());
  CHECK(rule.begin_call(CallRole::forward, true).begun_by_forward);
}

TEST_CASE("once the program marks generations, forwards begin none", "[generation]") {
  GenerationRule rule;
  CHECK_FALSE(rule.program_marks_generations());
  rule.mark_step_begin();
  CHECK(rule.program_marks_generations());
  CHECK(rule.current() == 1);
  const CallGeneration call = rule.begin_call(CallRole::forward, true);
  CHECK(call.generation == 1);
  CHECK_FALSE(call.begun_by_forward);
  CHECK_FALSE(call.held_by_pending_backward);  // the program's marks alone decide: no warning either
  rule.end_call(CallRole::forward);
  rule.mark_step_begin();  // a pending backward does not hold off the program's mark
  CHECK(rule.begin_call(CallRole::forward, true).generation == 2);
}

TEST_CASE("taking back a generation a failed forward began", "[generation]") {
  GenerationRule rule;
  SECTION("undoes it") {
    const CallGeneration call = rule.begin_call(CallRole::forward, true);
    CHECK(rule.take_back(call));
    CHECK(rule.current() == 0);
  }
  SECTION("leaves alone a generation the call did not begin") {
    rule.mark_step_begin();
    const CallGeneration call = rule.begin_call(CallRole::forward, true);
    CHECK_FALSE(rule.take_back(call));
    CHECK(rule.current() == 1);
  }
  SECTION("keeps it when the program marked one since (from the function, another thread)") {
    const CallGeneration call = rule.begin_call(CallRole::forward, true);
    rule.mark_step_begin();
    CHECK_FALSE(rule.take_back(call));
    CHECK(rule.current() == 2);
  }
}

TEST_CASE("marks from many threads each begin a generation", "[generation][threads]") {
  GenerationRule rule;
  constexpr int threads = 4;
  constexpr int marks = 1000;
  std::vector<std::thread> markers;
  markers.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    markers.emplace_back([&rule] {
      for (int i = 0; i < marks; ++i) rule.mark_step_begin();
    });
  }
  std::uint64_t seen = 0;
  for (int i = 0; i < 100; ++i) {  // the lock holder's calls see generations only grow
    const std::uint64_t now = rule.begin_call(CallRole::inference, true).generation;
    CHECK(now >= seen);
    seen = now;
  }
  for (auto& marker : markers) marker.join();
  CHECK(rule.current() == static_cast<std::uint64_t>(threads) * marks);
}
