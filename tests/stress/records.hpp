// What a stress sequence keeps: the values it owns and the leases it holds, each with its model
// (stress/model.hpp), the figures of a run, and a broken promise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stress/model.hpp"

import cgt;
import cgt.host;

namespace stress {

/// A broken promise: the sequence stops and is reported with its seed and its last actions.
struct Broken {
  std::string what;
};

/// Figures of a run.
struct Figures {
  std::uint64_t seeds = 0, sequences = 0, actions = 0, calls = 0, ok_calls = 0, checks = 0, failures = 0;
  std::uint64_t dropped_elsewhere = 0, dropped_during_call = 0;  // [threads]: handles the other thread dropped
  std::uint64_t forward_steps = 0;                               // calls of forwards that began a step
  std::uint64_t training_programs = 0;                           // sequences whose loop trains
  std::uint64_t padded_calls = 0;                                // calls padded up to a bucket
  std::uint64_t evictions = 0, over_budget = 0;                  // graphs evicted, calls run eagerly over budget
  std::uint64_t sleeps = 0, sleeps_refused = 0;                  // Pool::sleep() that gave memory back, or refused
  std::map<std::string, std::uint64_t> errors;                   // Errc name -> calls that gave it
  std::map<std::string, std::uint64_t> kinds;                    // CallKind name -> successful calls
  std::vector<std::string> failure_reports;
};

/// A value the test owns (a caller's buffer, a static weight, a taken copy) and its model.
struct Owned {
  cgt::host::Buffer buffer;
  ObjectPtr object;
  std::vector<std::int64_t> offsets;
  bool injective = true;  // no two elements share memory: may be mutated
};

/// A lease the test holds (alone, or as one output of an `Outputs` bundle it keeps) and its model.
struct Held {
  cgt::host::OutputLease lease;
  std::shared_ptr<cgt::host::Outputs> bundle;  // when set, the value is bundle->get(index)
  std::size_t index = 0;
  ObjectPtr object;
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> sizes;
  std::uint64_t step = 0;     // the step it was produced in
  bool reclaimable = false;   // pool memory: a new step reclaims it
  std::string from;           // the function that produced it
  bool injective = true;      // no two elements share memory: may be mutated
  cgt::host::Buffer escaped;  // a copy of the view, kept past the lease's life

  cgt::Result<cgt::Ref<cgt::host::Buffer>> get() const { return bundle ? bundle->get(index) : lease.get(); }
};

}  // namespace stress
