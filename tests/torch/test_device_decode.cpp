// Greedy decoding in one launch (examples/device_decode.hpp): the small decoder's generation in a
// loop the GPU decides gives the tokens libtorch gives eagerly and one replay per token gives, at
// 1, 4 and 8 tokens per iteration, stopping early at an end token placed on purpose, for one and
// several sequences; once recorded, a generation is one replay. Tagged [gpu]; SKIPPED without a
// device.
#include "../../examples/device_decode.hpp"
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>

#include <cstdint>
#include <string>

#include "scenario/spec.hpp"

import cgt;
import cgt.torch;

#include "torch/harness.hpp"

using H = TorchHarness;
using scenario::must;

TEST_CASE(
    "torch/device decode: a generation in a WHILE node, or host-decided, gives eager's tokens and per-step replays'",
    "[gpu][control_flow][decode]") {
  scenario::skip_unless_available<H>();
  const std::int64_t batch = GENERATE(1, 3);
  const std::int64_t steps = GENERATE(1, 4, 8);
  CAPTURE(batch, steps);
  const torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  const auto cuda = H::cuda();
  constexpr std::int64_t prompt_length = 5;
  constexpr std::int64_t max_new = 64;
  const std::int64_t columns = max_new + 8;
  const std::int64_t max_length = prompt_length + columns;
  kv_decoder::Decoder model(max_length);
  model->to(cuda.device());
  const torch::Tensor prompt = torch::randint(kv_decoder::vocabulary, {batch, prompt_length}, cuda.dtype(torch::kLong));
  device_decode::State state(batch, columns, max_length, cuda);

  // Without an end token the generation runs to its bound; with the token the first sequence makes
  // at index 20, every sequence that makes it stops there.
  device_decode::start(model, state, prompt, -1);
  device_decode::eager(model, state, -1, max_new);
  CHECK(state.generated.item<std::int64_t>() == max_new);
  const std::int64_t end_token = state.out[0][20].item<std::int64_t>();
  device_decode::start(model, state, prompt, end_token);
  device_decode::eager(model, state, end_token, max_new);
  const torch::Tensor expected = state.out.narrow(1, 0, max_new).clone();
  if (batch == 1) CHECK(state.generated.item<std::int64_t>() <= 21);  // stopped early

  auto pool = must(H::make_pool({.debug_checks = true}));
  auto per_token = must(device_decode::per_step_function(pool, model, end_token, max_new));
  device_decode::start(model, state, prompt, end_token);
  must(device_decode::per_step(pool, per_token, state));
  CHECK(torch::equal(state.out.narrow(1, 0, max_new), expected));

  // The WHILE node, then the fallback: the same loop with the host deciding between segments.
  for (const bool host_decides : {false, true}) {
    CAPTURE(host_decides);
    auto loop = must(device_decode::device_loop_function(pool, model, end_token, max_new, steps, host_decides));
    const cgt::Stats before = pool.stats();
    for (const cgt::CallKind kind :
         {cgt::CallKind::warmup, cgt::CallKind::recording, cgt::CallKind::replay, cgt::CallKind::replay}) {
      device_decode::start(model, state, prompt, end_token);
      CHECK(must(device_decode::device_loop(pool, loop, state)) == kind);
      CHECK(torch::equal(state.out.narrow(1, 0, max_new), expected));
    }
    CHECK(pool.stats().recordings - before.recordings == 1);
    CHECK(pool.stats().eager_calls == 0);
  }
}
