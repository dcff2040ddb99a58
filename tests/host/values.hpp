// What the host tests share to read values and make pools: a buffer's elements as doubles, an
// output's, a vector of one value, a pool that poisons dead memory, and a function that scales.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenarios.hpp"

import cgt;
import cgt.host;

namespace host_test {

/// What one call did: replayed, recorded or ran eagerly, and which node (-1: none).
struct Ran {
  cgt::CallKind kind;
  std::int64_t node;
  friend bool operator==(const Ran&, const Ran&) = default;
};

/// What the call that gave `out` did.
inline Ran ran(const cgt::host::Outputs& out) {
  return {.kind = out.kind(), .node = out.node()};
}

/// Every element of `buffer`, in order, as doubles.
inline std::vector<double> values_of(const cgt::host::Buffer& buffer) {
  std::vector<double> values(buffer.numel());
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = buffer.get(i);
  return values;
}

/// The elements of output `i` of a call.
inline std::vector<double> output_values(const cgt::host::Outputs& out, std::size_t i) {
  return values_of(scenario::must(out.get(i)).get());
}

/// `count` copies of `value`.
inline std::vector<double> repeat(double value, std::size_t count = 4) {
  return std::vector<double>(count, value);
}

/// A host function whose one output, a single element of `type`, is the sum of every element of
/// its two inputs: it mixes rows, so it sees their padding, and it has no batch dimension, so a
/// bucketed call hands it out whole.
inline auto sum_of_both_inputs(cgt::ElementType type) {
  return [type](cgt::host::Context& ctx, cgt::host::Inputs in) {
    cgt::host::Buffer total = ctx.allocate(type, {1});
    ctx.launch([a = in[0], b = in[1], total] {
      double sum = 0;
      for (std::size_t i = 0; i < a.numel(); ++i) sum += a.get(i);
      for (std::size_t i = 0; i < b.numel(); ++i) sum += b.get(i);
      total.set(0, sum);
    });
    return cgt::host::Values{total};
  };
}

/// A host pool whose dead memory is overwritten (a read of reclaimed memory sees NaN at once).
inline cgt::host::Pool poisoned_pool(cgt::Options options = {}) {
  cgt::host::PoolOptions pool_options;
  pool_options.tree = std::move(options);
  pool_options.poison_dead_memory = true;
  return scenario::must(cgt::host::make_pool(std::move(pool_options)));
}

/// A pool function named `name`: y = factor * x, in a storage of its own.
inline cgt::host::Function scaling(cgt::host::Pool& pool, std::string name, double factor,
                                   cgt::FunctionOptions options = {}) {
  options.name = std::move(name);
  return scenario::must(pool.add_function(
      [factor](cgt::host::Context& ctx, cgt::host::Inputs in) {
        const cgt::host::Buffer y = ctx.allocate_like(in[0]);
        ctx.launch([x = in[0], y, factor] {
          for (std::size_t i = 0; i < x.numel(); ++i) y.set(i, factor * x.get(i));
        });
        return cgt::host::Values{y};
      },
      std::move(options)));
}

}  // namespace host_test
