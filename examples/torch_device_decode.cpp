// Greedy decoding in one launch: the small decoder generates up to 64 tokens in a loop the GPU
// decides (cgt::torch::loop_while, a CUDA WHILE node), 1, 4 or 8 tokens per iteration, and stops
// when every sequence produced the end token. The end token is placed on purpose (a token the
// model produces early), so the loop stops before its bound. Checks the tokens against libtorch
// run eagerly and against one replay per token; prints them and what each call did.
//
//   build/examples/torch_device_decode [tokens to generate]
#include "device_decode.hpp"

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

import cgt;
import cgt.torch;

namespace {

constexpr std::int64_t prompt_length = 8;
constexpr std::int64_t most_steps_per_iteration = 8;

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

std::string tokens_of(const torch::Tensor& out, std::int64_t count) {
  std::string text;
  for (std::int64_t i = 0; i < count; ++i) text += std::to_string(out[0][i].item<std::int64_t>()) + ' ';
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t max_new = argc > 1 ? std::atoi(argv[1]) : 64;
  if (max_new < 2) {
    std::cerr << "usage: torch_device_decode [tokens to generate, at least 2]\n";
    return 2;
  }
  if (!cgt::torch::is_available()) {
    std::cerr << "torch_device_decode needs a CUDA device\n";
    return 1;
  }
  const torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  const std::int64_t columns = max_new + most_steps_per_iteration;
  const std::int64_t max_length = prompt_length + columns;
  kv_decoder::Decoder model(max_length);
  model->to(torch::Device(torch::kCUDA, 0));

  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  for (const std::int64_t batch : {1, 4}) {
    const torch::Tensor prompt =
        torch::randint(kv_decoder::vocabulary, {batch, prompt_length}, cuda.dtype(torch::kLong));
    device_decode::State state(batch, columns, max_length, cuda);
    // The end token: the one the first sequence makes halfway, so that generation stops there.
    device_decode::start(model, state, prompt, -1);
    device_decode::eager(model, state, -1, max_new);
    const std::int64_t end_token = state.out[0][max_new / 2].item<std::int64_t>();
    device_decode::start(model, state, prompt, end_token);
    device_decode::eager(model, state, end_token, max_new);
    const torch::Tensor expected = state.out.narrow(1, 0, max_new).clone();
    const std::int64_t made = state.generated.item<std::int64_t>();
    std::cout << "batch " << batch << ", end token " << end_token << ": eager made " << made
              << " tokens, first sequence: " << tokens_of(expected, made) << '\n';

    auto per_token = device_decode::per_step_function(*pool, model, end_token, max_new);
    if (!per_token) return report(per_token.error());
    device_decode::start(model, state, prompt, end_token);
    if (auto ran = device_decode::per_step(*pool, *per_token, state); !ran) return report(ran.error());
    bool same = torch::equal(state.out.narrow(1, 0, max_new), expected);
    std::cout << "  one replay per token: tokens " << (same ? "equal to" : "DIFFERENT FROM") << " eager\n";
    if (!same) return 1;

    // The device loop at 1, 4 and 8 tokens per iteration, then the host-decided fallback (the same
    // loop recorded as segments, the host reading go_on between them) at 8.
    struct Way {
      std::int64_t steps;
      bool host_decides;
    };
    for (const Way way :
         {Way{1, false}, Way{4, false}, Way{most_steps_per_iteration, false}, Way{most_steps_per_iteration, true}}) {
      const std::int64_t steps = way.steps;
      auto loop = device_decode::device_loop_function(*pool, model, end_token, max_new, steps, way.host_decides);
      if (!loop) return report(loop.error());
      std::string kinds;
      for (int call = 0; call < 3; ++call) {  // warm-up, recording, replay
        device_decode::start(model, state, prompt, end_token);
        auto kind = device_decode::device_loop(*pool, *loop, state);
        if (!kind) return report(kind.error());
        kinds += std::string(cgt::to_string(*kind)) + ' ';
        same = same && torch::equal(state.out.narrow(1, 0, max_new), expected);
      }
      std::cout << "  " << (way.host_decides ? "host-decided loop, " : "device loop, ") << steps
                << " tokens per iteration (" << kinds << "): tokens " << (same ? "equal to" : "DIFFERENT FROM")
                << " eager\n";
      if (!same) return 1;
    }
  }
  const cgt::Stats stats = pool->stats();
  std::cout << "counters: calls " << stats.calls << ", warm-ups " << stats.warmups << ", recordings "
            << stats.recordings << ", replays " << stats.replays << ", eager " << stats.eager_calls << '\n';
  return 0;
}
