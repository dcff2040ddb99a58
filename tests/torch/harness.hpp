// The libtorch backend's harness for the shared scenarios: turns a scenario::FnSpec into libtorch
// ops, and moves data between HostTensor and CUDA tensors.
#pragma once

#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's, included below unless already there.
#ifndef CATCH_TEST_MACROS_HPP_INCLUDED
#undef CHECK
#endif
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenarios.hpp"
#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

// On CUDA device `DeviceIndex` (the scenario suite runs on device 1 too: tests/multi).
template <int DeviceIndex = 0>
struct TorchHarnessOn : scenario::HarnessTypes<cgt::torch::Pool> {
  static constexpr const char* name = "torch";
  /// Steps of the randomized walk (scenario::random_calls_match_eager): fewer than the host's,
  /// every call being real launches.
  static constexpr std::size_t property_steps = 10000;

  static std::string unavailable() {
    if (!cgt::torch::is_available()) return "no CUDA device";
    if (static_cast<int>(torch::cuda::device_count()) <= DeviceIndex)
      return "no CUDA device " + std::to_string(DeviceIndex) + " (fewer than " + std::to_string(DeviceIndex + 1) +
             " GPUs)";
    return {};
  }

  static cgt::Result<Pool> make_pool(cgt::Options options = {}) {
    return cgt::torch::make_pool({.tree = std::move(options), .device = DeviceIndex});
  }

  static at::TensorOptions cuda() { return at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, DeviceIndex); }

  static Value make(const scenario::HostTensor& t) {
    std::vector<float> data(t.data.begin(), t.data.end());
    at::Tensor host = at::from_blob(data.data(), t.sizes, at::TensorOptions().dtype(at::kFloat)).clone();
    return host.to(cuda());
  }
  static Value misaligned(const scenario::HostTensor& t) {
    at::Tensor backing = at::empty({static_cast<std::int64_t>(t.numel()) + 1}, cuda());
    at::Tensor view = backing.narrow(0, 1, static_cast<std::int64_t>(t.numel())).view(t.sizes);
    view.copy_(make(t));
    return view;
  }
  static void write(const Value& value, const scenario::HostTensor& t) { value.copy_(make(t)); }
  static Value expand(const Value& value, std::vector<std::int64_t> sizes) { return value.expand(sizes); }
  static scenario::HostTensor read(const Value& value) {
    at::Tensor host = value.detach().to(at::kCPU, at::kDouble).contiguous();
    scenario::HostTensor t{{value.sizes().begin(), value.sizes().end()}, {}};
    t.data.assign(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
    return t;
  }
  static std::uintptr_t storage_of(const Value& value) {
    return reinterpret_cast<std::uintptr_t>(value.storage().data_ptr().get());
  }
  static std::uintptr_t storage_object_of(const Value& value) {
    return reinterpret_cast<std::uintptr_t>(value.storage().unsafeGetStorageImpl());
  }
  static std::size_t live_blocks(const Pool& pool) { return pool.live_blocks().size(); }
  static bool is_pool_memory(Pool& pool, const Value& value) {
    return scenario::must(pool.device()).get().contains(storage_of(value));
  }

  static Value view_of(const Value& source, const scenario::View& view) {
    using Kind = scenario::View::Kind;
    switch (view.kind) {
      case Kind::whole: return source;
      case Kind::slice: return source.slice(0, view.start, view.end);
      case Kind::select: return source.select(0, view.start);
      case Kind::transpose: return source.t();
    }
    return source;
  }

  // An elementwise expression over whole tensors; constants stay scalars until they meet a tensor.
  static at::Tensor evaluate(const scenario::Expr& expr, const std::vector<at::Tensor>& inputs,
                             const std::vector<at::Tensor>& temps, const at::Tensor& shape) {
    struct Entry {
      at::Tensor tensor;
      double scalar = 0;
    };
    std::vector<Entry> stack;
    auto combine = [](const Entry& a, const Entry& b, scenario::Instr::Op op) -> Entry {
      using Op = scenario::Instr::Op;
      if (!a.tensor.defined() && !b.tensor.defined()) {
        return {{}, op == Op::add ? a.scalar + b.scalar : op == Op::sub ? a.scalar - b.scalar : a.scalar * b.scalar};
      }
      if (!a.tensor.defined())
        return {op == Op::add ? b.tensor + a.scalar : op == Op::sub ? a.scalar - b.tensor : b.tensor * a.scalar};
      if (!b.tensor.defined())
        return {op == Op::add ? a.tensor + b.scalar : op == Op::sub ? a.tensor - b.scalar : a.tensor * b.scalar};
      return {op == Op::add ? a.tensor + b.tensor : op == Op::sub ? a.tensor - b.tensor : a.tensor * b.tensor};
    };
    for (const scenario::Instr& instr : expr.code) {
      using Op = scenario::Instr::Op;
      switch (instr.op) {
        case Op::input: stack.push_back({inputs[static_cast<std::size_t>(instr.index)]}); break;
        case Op::temp: stack.push_back({temps[static_cast<std::size_t>(instr.index)]}); break;
        case Op::constant: stack.push_back({{}, instr.value}); break;
        default: {
          Entry b = stack.back();
          stack.pop_back();
          Entry a = stack.back();
          stack.pop_back();
          stack.push_back(combine(a, b, instr.op));
        }
      }
    }
    const Entry& result = stack.back();
    return result.tensor.defined() ? result.tensor.expand(shape.sizes()).contiguous()
                                   : at::full(shape.sizes(), result.scalar, cuda());
  }

  static cgt::Result<Function> add(Pool& pool, const scenario::FnSpec& spec) {
    std::vector<at::Tensor> constants;
    for (const auto& constant : spec.constants) constants.push_back(make(constant));
    auto body = [spec, constants](cgt::torch::Inputs in) {
      std::vector<at::Tensor> inputs(in.size());
      for (std::size_t i = 0; i < in.size(); ++i) inputs[i] = in[i];
      std::vector<at::Tensor> temps;
      for (const scenario::Step& step : spec.steps) {
        using Kind = scenario::Step::Kind;
        if (step.kind == Kind::matmul_transposed) {
          temps.push_back(at::matmul(inputs[step.a].t(), inputs[step.b]));
        } else if (step.kind == Kind::map) {
          const at::Tensor& shape = step.shape_from_temp ? temps[step.a] : inputs[step.a];
          temps.push_back(evaluate(step.expr, inputs, temps, shape));
        } else {
          inputs[step.a].copy_(evaluate(step.expr, inputs, temps, inputs[step.a]));
        }
      }
      return scenario::select_outputs<cgt::torch::Values>(
          spec, temps, inputs, constants,
          [](const Value& source, const scenario::View& view) { return view_of(source, view); });
    };
    return pool.add_function(
        std::move(body),
        {.name = spec.name, .static_inputs = spec.static_inputs, .mutated_inputs = spec.mutated_inputs});
  }
};

using TorchHarness = TorchHarnessOn<0>;
