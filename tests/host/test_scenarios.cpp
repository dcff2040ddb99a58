// The shared scenario suite on the host backend.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <deque>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "scenario/spec.hpp"

import cgt;
import cgt.host;

#include "scenario/scenarios.hpp"
#include "host/harness.hpp"
#include "scenario/property.hpp"

using H = HostHarness;

TEST_CASE("run_simple", "[scenario][host]") {
  scenario::run_simple<H>();
}
TEST_CASE("function_compiled_multiple_times", "[scenario][host]") {
  scenario::function_compiled_multiple_times<H>();
}
TEST_CASE("end_recording_early", "[scenario][host]") {
  scenario::end_recording_early<H>();
}
TEST_CASE("execution_into_recording", "[scenario][host]") {
  scenario::execution_into_recording<H>();
}
TEST_CASE("accumulate_multiple_recordings", "[scenario][host]") {
  scenario::accumulate_multiple_recordings<H>();
}
TEST_CASE("live_outputs_multiple_graphs", "[scenario][host]") {
  scenario::live_outputs_multiple_graphs<H>();
}
TEST_CASE("tensor_dies_between_checkpoint", "[scenario][host]") {
  scenario::tensor_dies_between_checkpoint<H>();
}
TEST_CASE("aliased_storage_single_weakref", "[scenario][host]") {
  scenario::aliased_storage_single_weakref<H>();
}
TEST_CASE("aliasing_static_ref", "[scenario][host]") {
  scenario::aliasing_static_ref<H>();
}
TEST_CASE("constant_output", "[scenario][host]") {
  scenario::constant_output<H>();
}
TEST_CASE("expanded_inputs", "[scenario][host]") {
  scenario::expanded_inputs<H>();
}
TEST_CASE("mutation_on_inp", "[scenario][host]") {
  scenario::mutation_on_inp<H>();
}
TEST_CASE("mutation_cudagraph_managed_tensors", "[scenario][host]") {
  scenario::mutation_cudagraph_managed_tensors<H>();
}
TEST_CASE("mutation_cudagraph_managed_tensor_warn_only_once", "[scenario][host]") {
  scenario::mutation_cudagraph_managed_tensor_warn_only_once<H>();
}
TEST_CASE("mutation_cudagraph_managed_tensor_warn", "[scenario][host]") {
  scenario::mutation_cudagraph_managed_tensor_warn<H>();
}
TEST_CASE("memory_of_branches_is_max_not_sum", "[scenario][host]") {
  scenario::memory_of_branches_is_max_not_sum<H>();
}
TEST_CASE("replay_never_changes_a_held_value", "[scenario][host]") {
  scenario::replay_never_changes_a_held_value<H>();
}
TEST_CASE("new_liveness_pattern_records_a_sibling", "[scenario][host]") {
  scenario::new_liveness_pattern_records_a_sibling<H>();
}
TEST_CASE("random_calls_match_eager", "[scenario][property][host]") {
  const auto report = scenario::random_calls_match_eager<H>(20261122, 12000);
  CHECK(report.steps == 12000);
  INFO("calls " << report.calls << ", checks " << report.checks << ", replays " << report.stats.replays
                << ", recordings " << report.stats.recordings << ", warm-ups " << report.stats.warmups << ", restores "
                << report.stats.checkpoint_restores << ", reclaimed " << report.stats.steps_reclaimed
                << ", invalidated " << report.stats.leases_invalidated);
  CHECK(report.calls > 6000);
  // The walk must exercise every path of the tree, not only warm-ups.
  CHECK(report.stats.replays > 1000);
  CHECK(report.stats.recordings > 10);
  CHECK(report.stats.checkpoint_restores > 10);
  CHECK(report.stats.steps_reclaimed > 100);
  CHECK(report.stats.leases_invalidated > 0);
  CHECK(report.stats.eager_calls == 0);
}
