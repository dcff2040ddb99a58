// Greedy decoding of the small decoder (examples/kv_decoder.hpp, examples/device_decode.hpp) per
// token, on one card in one run: libtorch eagerly; cgt one replay per token, reading the stop
// condition after each (as every generate loop must) and without reading it (the bound of any
// host loop); cgt's device loop (a WHILE node, one launch per generation) at 1, 4 and 8 tokens per
// iteration; and one graph with every token unrolled (no loop: the GPU's floor for this work).
// No end token stops a generation here: every way makes exactly `tokens` tokens.
//
// Per token: wall time (the generation, its tokens read back at the end), and the host CPU time
// spent issuing it (thread CPU time up to the final wait; the per-step loop that reads the stop
// waits inside, and that wait is counted: it cannot go on without it).
//
//   loop_bench [generations per row]   prints "loop,<batch>,<tokens>,<way>,<wall us/token>,<cpu us/token>"
#include <torch/torch.h>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

// After the headers above: it imports cgt's modules, and libtorch's headers must come first.
#include "../examples/device_decode.hpp"

import cgt;
import cgt.torch;

namespace {

template <class T>
T must(cgt::Result<T> result) {
  if (!result) {
    std::cerr << result.error().describe() << '\n';
    std::exit(1);
  }
  return std::move(*result);
}
void must(cgt::Result<void> result) {
  if (!result) {
    std::cerr << result.error().describe() << '\n';
    std::exit(1);
  }
}

double thread_cpu_us() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e6 + static_cast<double>(now.tv_nsec) / 1e3;
}

struct PerToken {
  double wall_us = 0;
  double cpu_us = 0;
};

// Median over `generations` runs of `generate` (each from a fresh start): wall to the tokens read
// back, CPU up to the final wait.
PerToken measure(int generations, std::int64_t tokens, const std::function<void()>& start,
                 const std::function<void()>& generate) {
  std::vector<double> walls, cpus;
  for (int g = 0; g < generations + 2; ++g) {  // two untimed: warm-up and recording
    start();
    c10::cuda::getCurrentCUDAStream().synchronize();
    (void)cudaDeviceSynchronize();
    const auto began = std::chrono::steady_clock::now();
    const double cpu_began = thread_cpu_us();
    generate();
    const double cpu = thread_cpu_us() - cpu_began;
    (void)cudaDeviceSynchronize();
    const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - began).count();
    if (g >= 2) {
      walls.push_back(wall / static_cast<double>(tokens));
      cpus.push_back(cpu / static_cast<double>(tokens));
    }
  }
  std::ranges::sort(walls);
  std::ranges::sort(cpus);
  return {.wall_us = walls[walls.size() / 2], .cpu_us = cpus[cpus.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  const int generations = argc > 1 ? std::atoi(argv[1]) : 20;
  if (!cgt::torch::is_available()) {
    std::cerr << "loop_bench needs a CUDA device\n";
    return 1;
  }
  const torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  constexpr std::int64_t prompt_length = 8;
  constexpr std::int64_t slack = 8;  // the steps a device loop may run past the stop
  constexpr std::int64_t no_end_token = -1;
  cudaDeviceProp properties{};
  (void)cudaGetDeviceProperties(&properties, 0);
  std::cout << "# loop_bench on " << properties.name << ", " << generations << " generations per row\n";
  std::cout << "| batch | tokens | way | wall us/token | CPU us/token |\n|---|---|---|---|---|\n";
  for (const std::int64_t tokens : {64, 256}) {
    const std::int64_t max_length = prompt_length + tokens + slack;
    kv_decoder::Decoder model(max_length);
    model->to(torch::Device(torch::kCUDA, 0));
    for (const std::int64_t batch : {1, 8}) {
      const torch::Tensor prompt =
          torch::randint(kv_decoder::vocabulary, {batch, prompt_length}, cuda.dtype(torch::kLong));
      device_decode::State state(batch, tokens + slack, max_length, cuda);
      auto start = [&] { device_decode::start(model, state, prompt, no_end_token); };
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto row = [&](const std::string& way, const PerToken& cost) {
        std::cout << "| " << batch << " | " << tokens << " | " << way << " | " << cost.wall_us << " | " << cost.cpu_us
                  << " |\n";
        std::fprintf(stderr, "loop,%lld,%lld,%s,%.3f,%.3f\n", static_cast<long long>(batch),
                     static_cast<long long>(tokens), way.c_str(), cost.wall_us, cost.cpu_us);
      };

      row("eager libtorch, reads the stop",
          measure(generations, tokens, start, [&] { device_decode::eager(model, state, no_end_token, tokens); }));
      auto per_token = must(device_decode::per_step_function(pool, model, no_end_token, tokens));
      row("cgt replay per token, reads the stop",
          measure(generations, tokens, start, [&] { must(device_decode::per_step(pool, per_token, state)); }));
      const std::vector<torch::Tensor> inputs = state.inputs();
      row("cgt replay per token, never reads", measure(generations, tokens, start, [&] {
            for (std::int64_t t = 0; t < tokens; ++t) {
              pool.mark_step_begin();
              (void)must(per_token(std::vector<cgt::torch::Arg>(inputs.begin(), inputs.end())));
            }
          }));
      for (const std::int64_t steps : {1, 4, 8}) {
        auto loop = must(device_decode::device_loop_function(pool, model, no_end_token, tokens, steps));
        row("cgt device loop, " + std::to_string(steps) + " per iteration",
            measure(generations, tokens, start, [&] { (void)must(device_decode::device_loop(pool, loop, state)); }));
        if (steps != 8) continue;
        // The same call when the host did little since the last one (only the state's small tensors
        // reset, no prefill): the call's own CPU, its code and data still in the CPU's caches. After
        // a prefill's eager work (the rows above) the call runs with cold caches, as a raw
        // CUDAGraph::replay does (see loop.md).
        row("cgt device loop, 8 per iteration, CPU caches warm (state reset only)",
            measure(
                generations, tokens, [&] { device_decode::reset(state, no_end_token); },
                [&] { (void)must(device_decode::device_loop(pool, loop, state)); }));
        // The fallback where a conditional node cannot be made: the same loop recorded as segments,
        // the host reading go_on between iterations (a launch and a wait per iteration).
        auto on_host = must(device_decode::device_loop_function(pool, model, no_end_token, tokens, steps, true));
        row("cgt host-decided loop (the fallback), 8 per iteration",
            measure(generations, tokens, start, [&] { (void)must(device_decode::device_loop(pool, on_host, state)); }));
      }
      auto unrolled = must(pool.add_function(
          [&model, tokens](cgt::torch::Inputs in) {
            device_decode::View s(in);
            for (std::int64_t t = 0; t < tokens; ++t) device_decode::step(model, s, no_end_token, tokens);
            return cgt::torch::Values{};
          },
          device_decode::options("unrolled")));
      row("cgt one graph, every token unrolled", measure(generations, tokens, start, [&] {
            pool.mark_step_begin();
            (void)must(unrolled(std::vector<cgt::torch::Arg>(inputs.begin(), inputs.end())));
          }));
      const cgt::Stats stats = pool.stats();
      if (stats.eager_calls != 0) {
        std::cerr << "loop_bench: " << stats.eager_calls << " calls ran eagerly\n";
        return 1;
      }
    }
  }
  return 0;
}
