// Greedy decoding with a static KV cache through one cgt pool (Hugging Face's StaticCache
// pattern): the cache is a static input the graph writes in place, the position a one-element
// tensor copied in on each call, so a single recording per batch size serves every position.
// Decodes a prompt for two batch sizes, through the pool and eagerly, and checks that the tokens
// agree; prints the tokens, what each call did, and the counters.
//
//   build/examples/torch_kv_decode [tokens to generate]
#include "kv_decoder.hpp"

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <string>
#include <vector>

import cgt;
import cgt.torch;

namespace {

constexpr std::int64_t prompt_length = 8;

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t tokens = argc > 1 ? std::atoi(argv[1]) : 64;
  if (tokens < 1) {
    std::cerr << "usage: torch_kv_decode [tokens to generate, at least 1]\n";
    return 2;
  }
  if (!cgt::torch::is_available()) {
    std::cerr << "torch_kv_decode needs a CUDA device\n";
    return 1;
  }
  const torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  const std::int64_t max_length = prompt_length + tokens;
  kv_decoder::Decoder model(max_length);
  model->to(torch::Device(torch::kCUDA, 0));

  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  // Inputs: the tokens [batch], the position [1], then the cache's tensors: static (never
  // copied: the graph writes them where they are) and mutated.
  std::vector<std::size_t> cache;
  for (std::size_t i = 0; i < 2 * kv_decoder::layers; ++i) cache.push_back(2 + i);
  auto step = pool->add_function(
      [&model](cgt::torch::Inputs in) {
        std::vector<torch::Tensor> kv;
        for (std::size_t i = 2; i < in.size(); ++i) kv.push_back(in[i]);
        return cgt::torch::Values{model->step(in[0], in[1], kv)};
      },
      {.name = "decode", .static_inputs = cache, .mutated_inputs = cache});
  if (!step) return report(step.error());

  for (const std::int64_t batch : {1, 4}) {
    const torch::Tensor prompt =
        torch::randint(kv_decoder::vocabulary, {batch, prompt_length}, cuda.dtype(torch::kLong));
    const kv_decoder::Cache graph_cache(batch, max_length, cuda);
    const kv_decoder::Cache eager_cache(batch, max_length, cuda);
    torch::Tensor next, next_eager;
    std::map<std::string, int> kinds;
    std::string text;
    bool same = true;
    for (std::int64_t position = 0; position < max_length - 1; ++position) {
      const torch::Tensor where = torch::full({1}, position, cuda.dtype(torch::kLong));
      // Contiguous, as the generated tokens are: strides are part of a graph's key, so a strided
      // column of the prompt would get a graph of its own.
      const torch::Tensor input = position < prompt_length ? prompt.select(1, position).contiguous() : next;
      const torch::Tensor input_eager = position < prompt_length ? prompt.select(1, position) : next_eager;

      pool->mark_step_begin();  // the last step's logits may be reclaimed from here on
      std::vector<torch::Tensor> values{input, where};
      for (const auto& t : graph_cache.tensors()) values.push_back(t);
      auto logits = (*step)(std::vector<cgt::torch::Arg>(values.begin(), values.end()));
      if (!logits) return report(logits.error());
      ++kinds[std::string(cgt::to_string(logits->kind()))];
      next = (*logits->get(0)).get().argmax(-1);  // eager code between graphs
      next_eager = model->step(input_eager, where, eager_cache.tensors()).argmax(-1);
      same = same && torch::equal(next, next_eager);
      if (position >= prompt_length - 1) text += std::to_string(next[0].item<std::int64_t>()) + ' ';
    }
    std::cout << "batch " << batch << ": " << tokens << " tokens, first sequence: " << text << '\n';
    std::cout << "  calls:";
    for (const auto& [kind, count] : kinds) std::cout << ' ' << kind << ' ' << count;
    std::cout << "; tokens " << (same ? "equal to" : "DIFFERENT FROM") << " eager\n";
    if (!same) return 1;
  }
  const cgt::Stats stats = pool->stats();
  std::cout << "counters: calls " << stats.calls << ", warm-ups " << stats.warmups << ", recordings "
            << stats.recordings << ", replays " << stats.replays << ", eager " << stats.eager_calls << '\n';
  return 0;
}
