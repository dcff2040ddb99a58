// The host backend's harness for the shared scenarios: turns a scenario::FnSpec into a host pool
// function (one kernel per step), and moves data between HostTensor and host buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenarios.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.host;

struct HostHarness : scenario::HarnessTypes<cgt::host::Pool> {
  static constexpr const char* name = "host";
  /// Steps of the randomized walk (scenario::random_calls_match_eager).
  static constexpr std::size_t property_steps = 12000;

  /// Why this backend cannot run here (empty: it can).
  static std::string unavailable() { return {}; }

  static cgt::Result<Pool> make_pool(cgt::Options options = {}) {
    cgt::host::PoolOptions pool_options;
    pool_options.tree = std::move(options);
    pool_options.poison_dead_memory = true;  // a stale read sees NaN, not a plausible old value
    return cgt::host::make_pool(std::move(pool_options));
  }

  static Value make(const scenario::HostTensor& t) {
    Value buffer = scenario::must(Value::make(cgt::host::ElementType::f32, t.sizes));
    for (std::size_t i = 0; i < t.data.size(); ++i) buffer.set(i, t.data[i]);
    return buffer;
  }
  /// A buffer with the values of `t` whose first element is not aligned to 16 bytes.
  static Value misaligned(const scenario::HostTensor& t) {
    std::vector<std::int64_t> sizes = t.sizes;
    sizes[0] += 1;
    Value backing = scenario::must(Value::make(cgt::host::ElementType::f32, sizes));
    Value view = backing.slice(1, sizes[0]);
    for (std::size_t i = 0; i < t.data.size(); ++i) view.set(i, t.data[i]);
    return view;
  }
  /// Overwrites the values of `value` in place (like `inp.copy_(...)` in the reference).
  static void write(const Value& value, const scenario::HostTensor& t) {
    for (std::size_t i = 0; i < t.data.size(); ++i) value.set(i, t.data[i]);
  }
  static Value expand(const Value& value, std::vector<std::int64_t> sizes) { return value.expand(sizes); }
  static scenario::HostTensor read(const Value& value) {
    scenario::HostTensor t{{value.sizes().begin(), value.sizes().end()}, {}};
    t.data.resize(value.numel());
    for (std::size_t i = 0; i < t.data.size(); ++i) t.data[i] = value.get(i);
    return t;
  }
  /// Identity of the memory a value views (values that alias share it).
  static std::uintptr_t storage_of(const Value& value) { return reinterpret_cast<std::uintptr_t>(value.storage()); }
  /// Identity of the object that tracks that memory: on the host, the memory itself.
  static std::uintptr_t storage_object_of(const Value& value) { return storage_of(value); }
  static std::size_t live_blocks(const Pool& pool) { return pool.live_blocks().size(); }
  /// Is `value` memory of the pool (and so reclaimed by a new step)?
  static bool is_pool_memory(Pool& pool, const Value& value) {
    return scenario::must(pool.device()).get().arena().contains(reinterpret_cast<std::uintptr_t>(value.storage()));
  }

  static Value view_of(const Value& source, const scenario::View& view) {
    using Kind = scenario::View::Kind;
    switch (view.kind) {
      case Kind::whole: return source;
      case Kind::slice: return source.slice(view.start, view.end);
      case Kind::select: {
        std::vector<std::int64_t> sizes(source.sizes().begin() + 1, source.sizes().end());
        std::vector<std::int64_t> strides(source.strides().begin() + 1, source.strides().end());
        return source.restrided(source.offset() + view.start * source.strides()[0], sizes, strides);
      }
      case Kind::transpose: {
        const std::int64_t sizes[] = {source.sizes()[1], source.sizes()[0]};
        const std::int64_t strides[] = {source.strides()[1], source.strides()[0]};
        return source.restrided(source.offset(), sizes, strides);
      }
    }
    return source;
  }

  static cgt::Result<Function> add(Pool& pool, const scenario::FnSpec& spec) {
    std::vector<Value> constants;
    for (const auto& constant : spec.constants) constants.push_back(make(constant));
    auto body = [spec, constants](cgt::host::Context& ctx, cgt::host::Inputs in) {
      std::vector<Value> inputs(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) inputs[i] = in[i];
      std::vector<Value> temps;
      for (const scenario::Step& step : spec.steps) {
        using Kind = scenario::Step::Kind;
        if (step.kind == Kind::matmul_transposed) {
          const Value a = inputs[step.a], b = inputs[step.b];
          Value out = ctx.allocate(cgt::host::ElementType::f32, {a.sizes()[1], b.sizes()[1]});
          ctx.launch([a, b, out] {
            const auto k = a.sizes()[0], m = a.sizes()[1], n = b.sizes()[1];
            for (std::int64_t i = 0; i < m; ++i) {
              for (std::int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (std::int64_t p = 0; p < k; ++p) {
                  acc += a.get(static_cast<std::size_t>(p * m + i)) * b.get(static_cast<std::size_t>(p * n + j));
                }
                out.set(static_cast<std::size_t>(i * n + j), acc);
              }
            }
          });
          temps.push_back(out);
          continue;
        }
        const Value target = step.kind == Kind::mutate
                                 ? inputs[step.a]
                                 : ctx.allocate_like(step.shape_from_temp ? temps[step.a] : inputs[step.a]);
        ctx.launch([expr = step.expr, inputs, temps, target] {
          auto load = [&](bool is_temp, int index, std::size_t i) {
            return is_temp ? temps[static_cast<std::size_t>(index)].get(i)
                           : inputs[static_cast<std::size_t>(index)].get(i);
          };
          for (std::size_t i = 0, n = target.numel(); i < n; ++i) target.set(i, scenario::evaluate(expr, i, load));
        });
        if (step.kind == Kind::map) temps.push_back(target);
      }
      return scenario::select_outputs<cgt::host::Values>(
          spec, temps, inputs, constants,
          [](const Value& source, const scenario::View& view) { return view_of(source, view); });
    };
    return pool.add_function(
        std::move(body),
        {.name = spec.name, .static_inputs = spec.static_inputs, .mutated_inputs = spec.mutated_inputs});
  }
};

/// A host buffer of `sizes` with every element `value` (the tests' usual input).
inline cgt::host::Buffer filled(std::vector<std::int64_t> sizes, double value) {
  return HostHarness::make(scenario::HostTensor::full(std::move(sizes), value));
}
