// How long the stress test runs and which of its hostile moves it makes, from the environment, so
// that CI runs a bounded version and scripts/stress.sh a long one with the same binary:
//   CGT_STRESS_SEED=1         first seed
//   CGT_STRESS_SEEDS=4        number of seeds (each seed: CGT_STRESS_SEQUENCES pools, start to teardown)
//   CGT_STRESS_SEQUENCES=6    sequences per seed
//   CGT_STRESS_STEPS=200      actions per sequence
//   CGT_STRESS_SECONDS=0      if > 0: keep taking seeds until this many seconds have passed
//   CGT_STRESS_ENABLE=a,b     turn on moves that are off by default (they hit open library bugs)
//   CGT_STRESS_DISABLE=a,b    turn off moves ("all" in ENABLE turns every move on)
//   CGT_STRESS_VERBOSE=1      print every action of a failing sequence
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

namespace stress {

/// One hostile move the stress test can make. Moves that hit a known open library bug are off by
/// default, each named after what it does, so that the rest keeps running; the report of a run
/// says which were off. See tests/host/test_stress.cpp for what each one exercises.
struct Moves {
  bool throw_std = true;               // the function throws a std::exception after allocating
  bool throw_non_std = true;           // the function throws an int
  bool drop_lease_then_throw = true;   // the function drops a held lease, then throws (item 11)
  bool arena_limit = true;             // small ArenaOptions::max_bytes: calls may fail with out_of_memory
  bool copy_out = true;                // Options::copy_out_on_new_step at random
  bool graph_sizes_view = true;        // a function with graph_sizes returns a view of its input (item 1)
  bool restrided_inputs = true;        // same data address, other strides (a transpose) (item 2)
  bool overlapping_inputs = true;      // a copied input with stride 0 (item 3)
  bool negative_stride_inputs = true;  // a copied input with a negative stride (item 3)
  bool strided_static_inputs = true;   // a misaligned static input mutated in place (copied: runs eagerly)
  bool mutation_after_failure = true;  // an in-place function whose recording fails, then runs (item 4)
  bool undeclared_writes = true;       // an in-place function registered without its mutated_inputs
  // Off: the engine refuses to hand out a kept block (function_failed), but the function's own
  // kernels still write into memory it no longer owns during warm-ups and eager runs, and its heap
  // buffer aliases across calls: wild writes no pool can prevent, which the model counts as failures.
  bool cached_pool_buffer = false;            // a function returns a pool buffer it kept from an earlier call (item 5)
  bool stale_value_passed = true;             // a value escaped from a reclaimed lease, passed back in (item 6)
  bool moved_lease_into_failing_call = true;  // a failing call must leave a moved-in lease alone (item 12)
  bool empty_outputs_untracked = true;        // an empty output must not be a pool block (item 17)
  bool moved_from_handles = true;             // calls on moved-from Function handles (item 10)
  bool throwing_log_sink = true;              // the log sink throws (item 9)
  bool shutdown_midway = true;                // Pool::shutdown() in the middle of a sequence
  bool wrong_calls = true;                    // wrong input count / type / rank
  bool inconsistent_options = true;           // skip_warmup + force_warmup must be invalid_argument (item 15)

  /// Names and fields, for the environment variables and the report.
  template <class F>
  void each(F&& f) {
    f("throw_std", throw_std);
    f("throw_non_std", throw_non_std);
    f("drop_lease_then_throw", drop_lease_then_throw);
    f("arena_limit", arena_limit);
    f("copy_out", copy_out);
    f("graph_sizes_view", graph_sizes_view);
    f("restrided_inputs", restrided_inputs);
    f("overlapping_inputs", overlapping_inputs);
    f("negative_stride_inputs", negative_stride_inputs);
    f("strided_static_inputs", strided_static_inputs);
    f("mutation_after_failure", mutation_after_failure);
    f("undeclared_writes", undeclared_writes);
    f("cached_pool_buffer", cached_pool_buffer);
    f("stale_value_passed", stale_value_passed);
    f("moved_lease_into_failing_call", moved_lease_into_failing_call);
    f("empty_outputs_untracked", empty_outputs_untracked);
    f("moved_from_handles", moved_from_handles);
    f("throwing_log_sink", throwing_log_sink);
    f("shutdown_midway", shutdown_midway);
    f("wrong_calls", wrong_calls);
    f("inconsistent_options", inconsistent_options);
  }
};

struct Config {
  std::uint64_t first_seed = 1;
  std::uint64_t seeds = 4;
  std::size_t sequences = 6;
  std::size_t steps = 200;
  double seconds = 0;
  bool verbose = false;
  Moves moves;
};

inline std::uint64_t env_number(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  return std::strtoull(text, nullptr, 10);
}

inline std::vector<std::string> env_list(const char* name) {
  std::vector<std::string> items;
  const char* text = std::getenv(name);
  if (text == nullptr) return items;
  std::string item;
  for (const char* c = text;; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!item.empty()) items.push_back(item);
      item.clear();
      if (*c == '\0') break;
    } else {
      item.push_back(*c);
    }
  }
  return items;
}

/// The configuration from the environment; `defaults` are what CI runs.
inline Config config_from_env(Config defaults) {
  Config config = defaults;
  config.first_seed = env_number("CGT_STRESS_SEED", config.first_seed);
  config.seeds = env_number("CGT_STRESS_SEEDS", config.seeds);
  config.sequences = env_number("CGT_STRESS_SEQUENCES", config.sequences);
  config.steps = env_number("CGT_STRESS_STEPS", config.steps);
  config.seconds = static_cast<double>(env_number("CGT_STRESS_SECONDS", 0));
  config.verbose = env_number("CGT_STRESS_VERBOSE", 0) != 0;
  const auto enable = env_list("CGT_STRESS_ENABLE");
  const auto disable = env_list("CGT_STRESS_DISABLE");
  auto listed = [](const std::vector<std::string>& list, const char* name) {
    return std::find(list.begin(), list.end(), name) != list.end() ||
           std::find(list.begin(), list.end(), "all") != list.end();
  };
  config.moves.each([&](const char* name, bool& on) {
    if (listed(enable, name)) on = true;
    if (listed(disable, name)) on = false;
  });
  return config;
}

inline std::string describe_moves(Moves moves) {
  std::string on, off;
  moves.each([&](const char* name, bool& enabled) {
    (enabled ? on : off) += std::string(on.empty() && enabled ? "" : (!enabled && off.empty() ? "" : ",")) + name;
  });
  return "moves on: " + on + "\nmoves off: " + (off.empty() ? "(none)" : off);
}

}  // namespace stress
