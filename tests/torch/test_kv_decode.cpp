// Decoding with a static KV cache through a pool: the cache is a static input
// the graph mutates, the position a small tensor copied in, so one recording per batch size
// serves every position. 8 prompt tokens then 64 generated ones, for two batch sizes: logits
// bit-identical to the same model run eagerly, hence the same tokens. Tagged [gpu][decode].
#include "../../examples/kv_decoder.hpp"

// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

namespace {

template <class T>
T must(cgt::Result<T> result) {
  if (!result) FAIL(result.error().describe());
  return std::move(*result);
}

#define REQUIRE_GPU() \
  if (!cgt::torch::is_available()) SKIP("no CUDA device")

constexpr std::int64_t prompt_length = 8;
constexpr std::int64_t generated = 64;
constexpr std::int64_t max_length = prompt_length + generated;

// The cache tensors are inputs 2.. of the decode function: static (never copied) and mutated.
std::vector<std::size_t> cache_positions() {
  std::vector<std::size_t> positions;
  for (std::size_t i = 0; i < 2 * kv_decoder::layers; ++i) positions.push_back(2 + i);
  return positions;
}

struct Decoded {
  std::vector<torch::Tensor> logits;  // one per step, on the host
  torch::Tensor tokens;               // [batch, generated]
};

// Feeds the prompt, then decodes greedily; `step` runs one step (eagerly or through the pool).
template <class Step>
Decoded decode(const torch::Tensor& prompt, Step&& step) {
  const auto device = prompt.device();
  Decoded out;
  std::vector<torch::Tensor> tokens;
  torch::Tensor next;
  for (std::int64_t position = 0; position < max_length - 1; ++position) {
    // Contiguous, as the generated tokens are: strides are part of a graph's key, so a strided
    // column of the prompt would get a graph of its own.
    const torch::Tensor input = position < prompt_length ? prompt.select(1, position).contiguous() : next;
    const torch::Tensor logits =
        step(input, torch::full({1}, position, torch::TensorOptions(device).dtype(torch::kLong)));
    out.logits.push_back(logits.cpu());
    next = logits.argmax(-1);
    if (position >= prompt_length - 1) tokens.push_back(next);
  }
  out.tokens = torch::stack(tokens, 1).cpu();
  return out;
}

}  // namespace

TEST_CASE("torch/decode: a static KV cache decodes 64 tokens through one graph per batch size, as eager",
          "[gpu][decode]") {
  REQUIRE_GPU();
  const torch::NoGradGuard no_grad;
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  torch::manual_seed(0);
  kv_decoder::Decoder model(max_length);
  model->to(torch::Device(torch::kCUDA, 0));

  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(pool.add_function(
      [&model](cgt::torch::Inputs in) {
        std::vector<torch::Tensor> cache;
        for (std::size_t i = 2; i < in.size(); ++i) cache.push_back(in[i]);
        return cgt::torch::Values{model->step(in[0], in[1], cache)};
      },
      {.name = "decode", .static_inputs = cache_positions(), .mutated_inputs = cache_positions()}));

  for (const std::int64_t batch : {1, 3}) {
    INFO("batch " << batch);
    const torch::Tensor prompt =
        torch::randint(kv_decoder::vocabulary, {batch, prompt_length}, cuda.dtype(torch::kLong));
    const kv_decoder::Cache eager_cache(batch, max_length, cuda);
    const Decoded eager = decode(prompt, [&](const torch::Tensor& tokens, const torch::Tensor& position) {
      return model->step(tokens, position, eager_cache.tensors());
    });
    const kv_decoder::Cache graph_cache(batch, max_length, cuda);
    std::vector<cgt::CallKind> kinds;
    const Decoded graphed = decode(prompt, [&](const torch::Tensor& tokens, const torch::Tensor& position) {
      pool.mark_step_begin();  // the last step's logits may be reclaimed from here on
      std::vector<torch::Tensor> args{tokens, position};
      for (const auto& t : graph_cache.tensors()) args.push_back(t);
      auto out = step(std::vector<cgt::torch::Arg>(args.begin(), args.end()));
      if (!out) FAIL(out.error().describe());
      kinds.push_back(out->kind());
      return must(out->take(0));
    });
    // Every step's logits equal eager's, so the tokens are the same.
    REQUIRE(graphed.logits.size() == eager.logits.size());
    for (std::size_t i = 0; i < eager.logits.size(); ++i) {
      INFO("step " << i);
      REQUIRE(torch::equal(graphed.logits[i], eager.logits[i]));
    }
    CHECK(torch::equal(graphed.tokens, eager.tokens));
    CHECK(graphed.tokens.size(1) == generated);
    // The cache was written in place at every position (through the static inputs).
    for (std::size_t l = 0; l < graph_cache.keys.size(); ++l) {
      CHECK(torch::equal(graph_cache.keys[l], eager_cache.keys[l]));
      CHECK(torch::equal(graph_cache.values[l], eager_cache.values[l]));
    }
    // One warm-up and one recording for this batch size; every other position replays.
    CHECK(kinds.front() == cgt::CallKind::warmup);
    CHECK(kinds[1] == cgt::CallKind::recording);
    for (std::size_t i = 2; i < kinds.size(); ++i) CHECK(kinds[i] == cgt::CallKind::replay);
  }
  const cgt::Stats stats = pool.stats();
  CHECK(stats.recordings == 2);
  CHECK(stats.eager_calls == 0);
  CHECK(stats.replays == 2 * (max_length - 1 - 2));
}
