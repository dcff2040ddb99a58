// A randomized property test of the tree against eager execution: random calls (inputs fresh or
// earlier outputs, borrowed or moved in), lease drops, take()s and new steps. After every step,
// every value must equal eager execution, no held output may have changed, a lease reclaimed by
// a new step must say so, and (with debug checks on) the pool's memory must match the leases.
#pragma once

#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
#include <vector>

#include "scenario/scenarios.hpp"
#include "scenario/spec.hpp"

import cgt;

namespace scenario {

struct PropertyReport {
  std::size_t steps = 0, calls = 0, checks = 0;
  cgt::Stats stats;
};

template <class H>
PropertyReport walk_random_calls(std::uint64_t seed, std::size_t steps) {
  Env<H> env(cgt::Options{.debug_checks = true});
  // Functions covering every kind of output: new storage, two outputs, an alias of another output,
  // a view of an input (pool memory of an earlier graph, a slot, or the caller's memory), a
  // static input.
  const std::vector<FnSpec> specs{
      unary("affine", in(0) * 2 + 1),
      FnSpec{"sum_and_difference", {map(in(0) + in(1)), map(in(0) - in(1))}, {temp_out(0), temp_out(1)}, {}, {}, {}},
      FnSpec{"square_and_half", {map(in(0) * in(0))}, {temp_out(0), temp_out(0, slice(0, 4))}, {}, {}, {}},
      FnSpec{"tail_view", {map(in(0) + 0.5)}, {input_out(0, slice(2, 8)), temp_out(0)}, {}, {}, {}},
      FnSpec{"scaled_by_weight", {map(in(0) * in(1) - 1)}, {temp_out(0)}, {}, {1}, {}},
  };
  std::vector<typename H::Function> functions;
  for (const FnSpec& spec : specs) functions.push_back(env.add(spec));
  const std::vector<std::int64_t> lengths{8, 16};  // two shape keys per function
  std::vector<typename H::Value> weights;
  for (std::int64_t length : lengths) weights.push_back(H::make(HostTensor::random({length}, 99)));

  struct Held {
    typename H::Lease lease;
    HostTensor expected;
    std::uint64_t step = 0;    // the step it was produced in
    bool pool_memory = false;  // reclaimed by a new step
  };
  std::vector<Held> held;
  std::deque<std::pair<typename H::Value, HostTensor>> values;  // caller-owned inputs; a deque keeps addresses stable
  std::uint64_t step_number = 0;
  std::uint64_t last_call_step = 0;  // the step of the last call: it reclaimed everything older
  std::uint64_t rng = seed;
  auto next = [&](std::uint64_t bound) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % bound;
  };
  PropertyReport report;

  auto verify_held = [&] {
    for (const Held& item : held) {
      auto got = item.lease.get();
      if (item.pool_memory && item.step < last_call_step) {
        // A new step began and a call ran: the memory was reclaimed.
        REQUIRE(!got);
        REQUIRE(got.error().code == cgt::Errc::output_overwritten);
      } else {
        if (!got) {
          FAIL("a held lease of step " << item.step << " (now " << step_number << ", last call in " << last_call_step
                                       << ", pool memory: " << item.pool_memory << "): " << got.error().describe());
        }
        REQUIRE(close(H::read(got->get()), item.expected));
      }
      ++report.checks;
    }
  };
  auto is_stale = [&](const Held& item) { return item.pool_memory && item.step < step_number; };
  // A program drops most leases of the last step before the next one; the rest must report
  // output_overwritten once the next call has run.
  auto forget_reclaimed = [&] {
    std::erase_if(held, [&](const Held& item) { return is_stale(item) && next(4) != 0; });
  };

  for (std::size_t s = 0; s < steps; ++s) {
    const auto action = next(100);
    if (action < 60) {
      if (last_call_step != step_number) forget_reclaimed();
      last_call_step = step_number;
      const std::size_t which = next(specs.size());
      const FnSpec& spec = specs[which];
      const std::size_t length_index = next(lengths.size());
      const std::int64_t length = lengths[length_index];
      const std::size_t arity = which == 1 || which == 4 ? 2 : 1;
      std::vector<typename H::Arg> args;
      std::vector<HostTensor> inputs;
      std::vector<std::size_t> consumed, used;
      for (std::size_t i = 0; i < arity; ++i) {
        if (which == 4 && i == 1) {
          args.emplace_back(weights[length_index]);
          inputs.push_back(H::read(weights[length_index]));
          continue;
        }
        // An earlier output of the right length, borrowed or moved in, or a fresh value.
        std::vector<std::size_t> candidates;
        for (std::size_t h = 0; h < held.size(); ++h) {
          if (held[h].expected.sizes == std::vector<std::int64_t>{length} && !is_stale(held[h]) &&
              std::find(used.begin(), used.end(), h) == used.end()) {
            candidates.push_back(h);
          }
        }
        if (!candidates.empty() && next(3) != 0) {
          const std::size_t h = candidates[next(candidates.size())];
          used.push_back(h);  // passing one lease twice, once moved, would be a use after move
          inputs.push_back(held[h].expected);
          if (next(2) == 0) {
            args.emplace_back(std::move(held[h].lease));
            consumed.push_back(h);
          } else {
            args.emplace_back(held[h].lease);
          }
        } else {
          const HostTensor data = HostTensor::random({length}, rng);
          values.emplace_back(H::make(data), data);
          args.emplace_back(values.back().first);
          inputs.push_back(data);
        }
      }
      std::vector<HostTensor> eager_inputs = inputs;
      const std::vector<HostTensor> expected = reference(spec, eager_inputs);
      auto outs = functions[which](std::span<const typename H::Arg>(args));
      if (!outs) FAIL("step " << s << ": " << outs.error().describe());
      ++report.calls;
      // Moved-in leases are gone; remove them from the held list (highest index first).
      std::sort(consumed.rbegin(), consumed.rend());
      for (std::size_t h : consumed) held.erase(held.begin() + static_cast<std::ptrdiff_t>(h));
      for (std::size_t o = 0; o < expected.size(); ++o) {
        auto lease = must(outs->release(o));
        const auto& value = must(lease.get()).get();
        REQUIRE(close(H::read(value), expected[o]));
        if (next(4) != 0) {
          held.push_back({std::move(lease), expected[o], step_number, H::is_pool_memory(env.pool, value)});
        }
      }
    } else if (action < 62) {
      // Passing a lease that a new step reclaims fails, and changes nothing: a call that fails
      // does not begin its step, so the leases of the last one stay valid until a call succeeds.
      auto stale = std::find_if(held.begin(), held.end(), [&](const Held& item) { return is_stale(item); });
      if (stale != held.end()) {
        const auto calls = env.pool.stats().calls;
        auto outs = functions[0]({stale->lease});
        REQUIRE(!outs);
        REQUIRE(outs.error().code == cgt::Errc::output_overwritten);
        REQUIRE(outs.error().input == 0);
        REQUIRE(env.pool.stats().calls == calls + 1);
      }
    } else if (action < 75) {
      if (!held.empty()) held.erase(held.begin() + static_cast<std::ptrdiff_t>(next(held.size())));
    } else if (action < 88) {
      if (!held.empty()) {
        Held& item = held[next(held.size())];
        if (item.lease.is_valid()) {
          auto taken = must(item.lease.take());
          REQUIRE(close(H::read(taken), item.expected));
          REQUIRE(!H::is_pool_memory(env.pool, taken));
          values.emplace_back(std::move(taken), item.expected);
        }
      }
    } else {
      env.step();
      ++step_number;
    }
    verify_held();
    while (values.size() > 64) values.pop_front();
    ++report.steps;
  }
  report.stats = env.pool.stats();
  return report;
}

/// The property test as a scenario: a walk of `H::property_steps` steps, which must also exercise
/// every path of the tree (replays, recordings, checkpoints, reclaimed steps), not only warm-ups.
template <class H>
void random_calls_match_eager() {
  constexpr std::size_t steps = H::property_steps;
  const PropertyReport report = walk_random_calls<H>(20261122, steps);
  CHECK(report.steps == steps);
  INFO("calls " << report.calls << ", checks " << report.checks << ", replays " << report.stats.replays
                << ", recordings " << report.stats.recordings << ", warm-ups " << report.stats.warmups << ", restores "
                << report.stats.checkpoint_restores << ", reclaimed " << report.stats.steps_reclaimed
                << ", invalidated " << report.stats.leases_invalidated);
  CHECK(report.calls > steps / 2);
  CHECK(report.stats.replays > 1000);
  CHECK(report.stats.recordings > 10);
  CHECK(report.stats.checkpoint_restores > 10);
  CHECK(report.stats.steps_reclaimed > 100);
  CHECK(report.stats.leases_invalidated > 0);
  CHECK(report.stats.eager_calls == 0);
}

}  // namespace scenario
