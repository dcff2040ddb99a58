// The scenario suite's one list: every scenario of scenarios.hpp and property.hpp, registered as a
// Catch2 test case for one backend's harness. A backend's test file registers them all with
//   const bool registered = scenario::register_scenarios<CudaHarness>("cuda/", "[gpu]");
// and a new scenario is added to the list below, nowhere else.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <string>
#include <string_view>

#include "scenario/property.hpp"
#include "scenario/scenarios.hpp"

namespace scenario {

/// Runs `Scenario` on harness `H`, or SKIPs (reported skipped, not passed) where `H` cannot run.
template <class H, void (*Scenario)()>
void run_where_available() {
  skip_unless_available<H>();
  Scenario();
}

/// Registers every scenario as a test case named `name_prefix` + the scenario's name, tagged
/// [scenario] (and [property] for the randomized walk) and `backend_tags`. Call it once, during
/// static initialisation (before Catch2's session lists or runs tests); returns true.
template <class H>
bool register_scenarios(std::string_view name_prefix, std::string_view backend_tags) {
  struct Entry {
    std::string_view name;
    std::string_view tags;
    void (*run)();
  };
  const Entry suite[] = {
      {"run_simple", "[scenario]", run_where_available<H, run_simple<H>>},
      {"function_compiled_multiple_times", "[scenario]", run_where_available<H, function_compiled_multiple_times<H>>},
      {"end_recording_early", "[scenario]", run_where_available<H, end_recording_early<H>>},
      {"execution_into_recording", "[scenario]", run_where_available<H, execution_into_recording<H>>},
      {"accumulate_multiple_recordings", "[scenario]", run_where_available<H, accumulate_multiple_recordings<H>>},
      {"live_outputs_multiple_graphs", "[scenario]", run_where_available<H, live_outputs_multiple_graphs<H>>},
      {"tensor_dies_between_checkpoint", "[scenario]", run_where_available<H, tensor_dies_between_checkpoint<H>>},
      {"aliased_storage_single_weakref", "[scenario]", run_where_available<H, aliased_storage_single_weakref<H>>},
      {"aliasing_static_ref", "[scenario]", run_where_available<H, aliasing_static_ref<H>>},
      {"constant_output", "[scenario]", run_where_available<H, constant_output<H>>},
      {"expanded_inputs", "[scenario]", run_where_available<H, expanded_inputs<H>>},
      {"mutation_on_inp", "[scenario]", run_where_available<H, mutation_on_inp<H>>},
      {"mutation_cudagraph_managed_tensors", "[scenario]",
       run_where_available<H, mutation_cudagraph_managed_tensors<H>>},
      {"mutation_cudagraph_managed_tensor_warn_only_once", "[scenario]",
       run_where_available<H, mutation_cudagraph_managed_tensor_warn_only_once<H>>},
      {"mutation_cudagraph_managed_tensor_warn", "[scenario]",
       run_where_available<H, mutation_cudagraph_managed_tensor_warn<H>>},
      {"memory_of_branches_is_max_not_sum", "[scenario]", run_where_available<H, memory_of_branches_is_max_not_sum<H>>},
      {"replay_never_changes_a_held_value", "[scenario]", run_where_available<H, replay_never_changes_a_held_value<H>>},
      {"new_liveness_pattern_records_a_sibling", "[scenario]",
       run_where_available<H, new_liveness_pattern_records_a_sibling<H>>},
      {"random_calls_match_eager", "[scenario][property]", run_where_available<H, random_calls_match_eager<H>>},
  };
  for (const Entry& entry : suite) {
    // Catch2 copies the name and the tags: the strings need not outlive the registration.
    const std::string name = std::string(name_prefix) + std::string(entry.name);
    const std::string tags = std::string(entry.tags) + std::string(backend_tags);
    REGISTER_TEST_CASE(entry.run, name, tags);
  }
  return true;
}

}  // namespace scenario
