// The cuda backend's harness for the shared scenarios: turns a scenario::FnSpec into launches of
// the test kernels (kernels.hpp), and moves data between HostTensor and device buffers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cuda/kernels.hpp"
#include "scenario/scenarios.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.cuda;

// On CUDA device `DeviceIndex` (the scenario suite runs on device 1 too: tests/multi).
template <int DeviceIndex = 0>
struct CudaHarnessOn : scenario::HarnessTypes<cgt::cuda::Pool> {
  static constexpr const char* name = "cuda";
  /// Steps of the randomized walk (scenario::random_calls_match_eager): fewer than the host's,
  /// every call being real launches.
  static constexpr std::size_t property_steps = 10000;

  static std::string unavailable() {
    if (cgt::cuda::device_count() > DeviceIndex) return {};
    return DeviceIndex == 0 ? std::string("no CUDA device")
                            : "no CUDA device " + std::to_string(DeviceIndex) + " (fewer than " +
                                  std::to_string(DeviceIndex + 1) + " GPUs)";
  }

  static cgt::Result<Pool> make_pool(cgt::Options options = {}) {
    cgt::cuda::PoolOptions pool_options;
    pool_options.tree = std::move(options);
    pool_options.device = DeviceIndex;
    pool_options.poison_dead_memory = true;  // a stale read sees NaN, not a plausible old value
    return cgt::cuda::make_pool(std::move(pool_options));
  }

  static Value make(const scenario::HostTensor& t) {
    Value buffer = scenario::must(Value::make(cgt::ElementType::f32, t.sizes, DeviceIndex));
    scenario::must(buffer.write(t.data));
    return buffer;
  }
  static Value misaligned(const scenario::HostTensor& t) {
    Value backing =
        scenario::must(Value::make(cgt::ElementType::f32, {static_cast<std::int64_t>(t.numel()) + 1}, DeviceIndex));
    Value view = backing.with_layout(backing.layout().slice(1, static_cast<std::int64_t>(t.numel()) + 1));
    scenario::must(view.write(t.data));
    return view;
  }
  static void write(const Value& value, const scenario::HostTensor& t) { scenario::must(value.write(t.data)); }
  static Value expand(const Value& value, std::vector<std::int64_t> sizes) {
    return value.with_layout(value.layout().expand(sizes));
  }
  static scenario::HostTensor read(const Value& value) {
    return {{value.sizes().begin(), value.sizes().end()}, scenario::must(value.read())};
  }
  static std::uintptr_t storage_of(const Value& value) { return reinterpret_cast<std::uintptr_t>(value.storage()); }
  static std::uintptr_t storage_object_of(const Value& value) { return storage_of(value); }
  static std::size_t live_blocks(const Pool& pool) { return pool.live_blocks().size(); }
  static bool is_pool_memory(Pool& pool, const Value& value) {
    return scenario::must(pool.device()).get().arena().contains(storage_of(value));
  }

  static Value view_of(const Value& source, const scenario::View& view) {
    using Kind = scenario::View::Kind;
    switch (view.kind) {
      case Kind::whole: return source;
      case Kind::slice: return source.with_layout(source.layout().slice(view.start, view.end));
      case Kind::select: return source.with_layout(source.layout().select(view.start));
      case Kind::transpose: return source.with_layout(source.layout().transposed());
    }
    return source;
  }

  static cgt_test::Operand operand(const Value& value) {
    cgt_test::Operand operand;
    operand.data = value.as<float>();
    for (std::size_t d = 0; d < value.rank(); ++d) operand.strides[d] = value.strides()[d];
    return operand;
  }

  // One launch of the expression evaluator writing `target`.
  static void launch(const scenario::Expr& expr, const std::vector<Value>& inputs, const std::vector<Value>& temps,
                     const Value& target, cudaStream_t stream) {
    cgt_test::Program program;
    program.operand_count = static_cast<int>(inputs.size() + temps.size());
    if (program.operand_count > cgt_test::max_operands || expr.code.size() > cgt_test::max_instructions) {
      throw std::runtime_error("expression too large for the test kernel");
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) program.operands[i] = operand(inputs[i]);
    for (std::size_t k = 0; k < temps.size(); ++k) program.operands[inputs.size() + k] = operand(temps[k]);
    for (const scenario::Instr& instr : expr.code) {
      using Op = scenario::Instr::Op;
      cgt_test::Instruction& out = program.code[program.count++];
      switch (instr.op) {
        case Op::input: out = {0, instr.index, 0}; break;
        case Op::temp: out = {0, static_cast<int>(inputs.size()) + instr.index, 0}; break;
        case Op::constant: out = {1, 0, instr.value}; break;
        case Op::add: out = {2, 0, 0}; break;
        case Op::sub: out = {3, 0, 0}; break;
        case Op::mul: out = {4, 0, 0}; break;
      }
    }
    program.out = operand(target);
    program.rank = static_cast<int>(target.rank());
    for (std::size_t d = 0; d < target.rank(); ++d) program.sizes[d] = target.sizes()[d];
    program.numel = static_cast<std::int64_t>(target.numel());
    if (cgt_test::evaluate(program, stream) != cudaSuccess) throw std::runtime_error("evaluate failed to launch");
  }

  static cgt::Result<Function> add(Pool& pool, const scenario::FnSpec& spec) {
    std::vector<Value> constants;
    for (const auto& constant : spec.constants) constants.push_back(make(constant));
    auto body = [spec, constants](cgt::cuda::Context& ctx, cgt::cuda::Inputs in) {
      std::vector<Value> inputs(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) inputs[i] = in[i];
      std::vector<Value> temps;
      for (const scenario::Step& step : spec.steps) {
        using Kind = scenario::Step::Kind;
        if (step.kind == Kind::matmul_transposed) {
          const Value& a = inputs[step.a];
          const Value& b = inputs[step.b];
          Value out = ctx.allocate(cgt::ElementType::f32, {a.sizes()[1], b.sizes()[1]});
          if (cgt_test::matmul_transposed(a.as<float>(), a.strides()[0], a.strides()[1], b.as<float>(), b.strides()[0],
                                          b.strides()[1], out.as<float>(), a.sizes()[0], a.sizes()[1], b.sizes()[1],
                                          ctx.stream()) != cudaSuccess) {
            throw std::runtime_error("matmul failed to launch");
          }
          temps.push_back(out);
          continue;
        }
        const Value target = step.kind == Kind::mutate
                                 ? inputs[step.a]
                                 : ctx.allocate_like(step.shape_from_temp ? temps[step.a] : inputs[step.a]);
        launch(step.expr, inputs, temps, target, ctx.stream());
        if (step.kind == Kind::map) temps.push_back(target);
      }
      return scenario::select_outputs<cgt::cuda::Values>(
          spec, temps, inputs, constants,
          [](const Value& source, const scenario::View& view) { return view_of(source, view); });
    };
    return pool.add_function(
        std::move(body),
        {.name = spec.name, .static_inputs = spec.static_inputs, .mutated_inputs = spec.mutated_inputs});
  }
};

using CudaHarness = CudaHarnessOn<0>;
