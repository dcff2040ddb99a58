// The engine's bookkeeping per replay, on the host backend: a 4-input, 4-output function called
// through a pool (replays), against the same work done directly (4 input copies into slots plus a
// raw host-graph replay of the same 4 kernels). The difference is what cgt adds per call.
//
//   host_overhead [iterations]        nanoseconds per call (steady_clock, median of 7 runs)
//   valgrind --tool=callgrind --collect-atstart=no host_overhead --callgrind cgt|raw [iterations]
//                                     instructions: only the measured loop is collected
// scripts/bench-host.sh runs all three and prints the table.
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#else  // no valgrind headers (the GPU machine): the instruction count mode collects nothing
#define CALLGRIND_TOGGLE_COLLECT
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string_view>
#include <vector>

import cgt;
import cgt.host;

namespace {

using cgt::host::Buffer;
using cgt::host::ElementType;
constexpr std::int64_t elements = 16;

// The function's own work: y_i = 2 x_i for four pairs, one kernel each.
cgt::host::Values four_by_four(cgt::host::Context& ctx, cgt::host::Inputs in) {
  cgt::host::Values out;
  for (std::size_t i = 0; i < 4; ++i) {
    Buffer y = ctx.allocate_like(in[i]);
    ctx.launch([x = in[i], y] {
      const float* from = x.as<float>();
      float* to = y.as<float>();
      for (std::int64_t e = 0; e < elements; ++e) to[e] = 2 * from[e];
    });
    out.push_back(y);
  }
  return out;
}

struct Setup {
  cgt::host::Pool pool;
  cgt::host::Function function;
  std::array<Buffer, 4> inputs;
};

Setup make_setup() {
  auto pool = cgt::host::make_pool();
  auto function = pool->add_function(four_by_four, {.name = "four_by_four"});
  Setup setup{std::move(*pool), std::move(*function), {}};
  for (auto& input : setup.inputs) {
    input = Buffer::make(ElementType::f32, {elements}).value();
    input.fill(1.5);
  }
  for (int i = 0; i < 3; ++i)
    (void)setup.function({setup.inputs[0], setup.inputs[1], setup.inputs[2], setup.inputs[3]});
  return setup;  // warmed up and recorded: every further call replays
}

// The static cells of the GPU overhead table: one static input, one output, one kernel.
cgt::host::Values one_static(cgt::host::Context& ctx, cgt::host::Inputs in) {
  Buffer y = ctx.allocate_like(in[0]);
  ctx.launch([x = in[0], y] {
    const float* from = x.as<float>();
    float* to = y.as<float>();
    for (std::int64_t e = 0; e < elements; ++e) to[e] = 2 * from[e];
  });
  return {y};
}

struct StaticSetup {
  cgt::host::Pool pool;
  cgt::host::Function function;
  Buffer input;
};

StaticSetup make_static_setup() {
  auto pool = cgt::host::make_pool();
  auto function = pool->add_function(one_static, {.name = "one_static", .static_inputs = {0}});
  StaticSetup setup{std::move(*pool), std::move(*function), Buffer::make(ElementType::f32, {elements}).value()};
  setup.input.fill(1.5);
  for (int i = 0; i < 3; ++i) (void)setup.function({setup.input});
  return setup;
}

void static_loop(StaticSetup& setup, int iterations) {
  for (int i = 0; i < iterations; ++i) {
    auto out = setup.function({setup.input});
    if (!out || out->kind() != cgt::CallKind::replay) std::abort();
  }
}

// One call as a program makes it: call, read nothing, drop the outputs.
void cgt_loop(Setup& setup, int iterations) {
  for (int i = 0; i < iterations; ++i) {
    auto out = setup.function({setup.inputs[0], setup.inputs[1], setup.inputs[2], setup.inputs[3]});
    if (!out || out->kind() != cgt::CallKind::replay) std::abort();
  }
}

// The same work without cgt: copy the inputs into slots, replay a captured graph of the kernels.
struct Raw {
  std::array<Buffer, 4> slots;
  std::array<Buffer, 4> outputs;
  cgt::host::Graph graph;
};

Raw make_raw() {
  Raw raw;
  cgt::host::Stream stream;
  stream.begin_capture();
  for (std::size_t i = 0; i < 4; ++i) {
    raw.slots[i] = Buffer::make(ElementType::f32, {elements}).value();
    raw.outputs[i] = Buffer::make(ElementType::f32, {elements}).value();
    stream.launch([x = raw.slots[i], y = raw.outputs[i]] {
      const float* from = x.as<float>();
      float* to = y.as<float>();
      for (std::int64_t e = 0; e < elements; ++e) to[e] = 2 * from[e];
    });
  }
  raw.graph = stream.end_capture();
  return raw;
}

void raw_loop(Raw& raw, const std::array<Buffer, 4>& inputs, int iterations) {
  for (int i = 0; i < iterations; ++i) {
    for (std::size_t k = 0; k < 4; ++k) std::memcpy(raw.slots[k].data(), inputs[k].data(), elements * sizeof(float));
    raw.graph.replay();
  }
}

template <class Loop>
double median_ns_per_call(Loop&& loop, int iterations) {
  std::vector<double> runs;
  for (int run = 0; run < 7; ++run) {
    const auto start = std::chrono::steady_clock::now();
    loop(iterations);
    const auto stop = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double, std::nano>(stop - start).count() / iterations);
  }
  std::ranges::sort(runs);
  return runs[runs.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Setup setup = make_setup();
  Raw raw = make_raw();
  StaticSetup one = make_static_setup();
  if (argc > 2 && std::string_view(argv[1]) == "--callgrind") {
    const int iterations = argc > 3 ? std::atoi(argv[3]) : 10000;
    const bool through_cgt = std::string_view(argv[2]) == "cgt";
    const bool one_static_input = std::string_view(argv[2]) == "static";
    CALLGRIND_TOGGLE_COLLECT;
    if (one_static_input) {
      static_loop(one, iterations);
    } else if (through_cgt) {
      cgt_loop(setup, iterations);
    } else {
      raw_loop(raw, setup.inputs, iterations);
    }
    CALLGRIND_TOGGLE_COLLECT;
    std::cout << "iterations " << iterations << '\n';
    return 0;
  }
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200000;
  const double with_cgt = median_ns_per_call([&](int n) { cgt_loop(setup, n); }, iterations);
  const double direct = median_ns_per_call([&](int n) { raw_loop(raw, setup.inputs, n); }, iterations);
  std::cout << "ns_per_call cgt " << with_cgt << " raw " << direct << '\n';
  return 0;
}
