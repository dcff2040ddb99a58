// A small libtorch decoder run through one cgt pool: a "prefill" and a "decode" function, decode
// called once per generated token, for two batch sizes. The decoder's state is a static buffer
// that both functions update in place (as a KV cache is), so it is never copied; the token is a
// small input copied into the graph on each replay. Prints cgt's and libtorch's versions, then per
// call whether the pool warmed up, recorded or replayed; then the counters, the pool's memory, and
// the tree (written as DOT).
//
//   build/examples/torch_decoder [tokens per request]
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <string>
#include <vector>

import cgt;
import cgt.torch;

namespace {

constexpr std::int64_t vocabulary = 256;
constexpr std::int64_t width = 128;

struct DecoderImpl : torch::nn::Module {
  DecoderImpl()
      : embedding(register_module("embedding", torch::nn::Embedding(vocabulary, width))),
        mix(register_module("mix", torch::nn::Linear(width, width))),
        head(register_module("head", torch::nn::Linear(width, vocabulary))) {}

  // Reads a prompt [batch, length] into the state [batch, width]; returns the first logits.
  torch::Tensor prefill(const torch::Tensor& prompt, torch::Tensor& state) {
    state.copy_(torch::tanh(mix->forward(embedding->forward(prompt).mean(1))));
    return head->forward(state);
  }
  // One step: folds the last token [batch] into the state; returns the next logits.
  torch::Tensor decode(const torch::Tensor& token, torch::Tensor& state) {
    state.copy_(torch::tanh(mix->forward(state + embedding->forward(token))));
    return head->forward(state);
  }

  torch::nn::Embedding embedding;
  torch::nn::Linear mix;
  torch::nn::Linear head;
};
TORCH_MODULE(Decoder);

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 6;
  if (!cgt::torch::is_available()) {
    std::cerr << "torch_decoder needs a CUDA device\n";
    return 1;
  }
  std::cout << "cgt " << cgt::version_string << ", libtorch " << TORCH_VERSION << '\n';
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  Decoder model;
  model->to(torch::Device(torch::kCUDA, 0));

  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  // The model is captured: its parameters are constants of the graphs. The state is a static
  // input (at a stable address, never copied) that the functions mutate.
  auto prefill = pool->add_function(
      [&model](cgt::torch::Inputs in) {
        torch::Tensor state = in[1];
        return cgt::torch::Values{model->prefill(in[0], state)};
      },
      {.name = "prefill", .static_inputs = {1}, .mutated_inputs = {1}});
  auto decode = pool->add_function(
      [&model](cgt::torch::Inputs in) {
        torch::Tensor state = in[1];
        return cgt::torch::Values{model->decode(in[0], state)};
      },
      {.name = "decode", .static_inputs = {1}, .mutated_inputs = {1}});
  if (!prefill) return report(prefill.error());
  if (!decode) return report(decode.error());

  std::map<std::int64_t, torch::Tensor> states;  // one state buffer per batch size
  std::cout << "request  batch  call        kind        tokens\n";
  for (int request = 0; request < 3; ++request) {
    for (std::int64_t batch : {1, 4}) {
      torch::Tensor& state = states.try_emplace(batch, torch::zeros({batch, width}, cuda)).first->second;
      const torch::Tensor prompt = torch::randint(vocabulary, {batch, 5}, cuda.dtype(torch::kLong));
      pool->mark_step_begin();
      auto logits = (*prefill)({prompt, state});
      if (!logits) return report(logits.error());
      std::cout << std::setw(7) << request << std::setw(7) << batch << "  prefill     " << std::left << std::setw(12)
                << cgt::to_string(logits->kind()) << std::right << '\n';
      torch::Tensor token = (*logits->get(0)).get().argmax(-1);  // eager code between graphs
      std::string generated;
      std::vector<std::string> kinds;
      for (int step = 0; step < tokens; ++step) {
        pool->mark_step_begin();  // the last step's logits may be reclaimed from here on
        auto next = (*decode)({token, state});
        if (!next) return report(next.error());
        kinds.emplace_back(cgt::to_string(next->kind()));
        token = (*next->get(0)).get().argmax(-1);
        generated += std::to_string(token[0].item<std::int64_t>()) + " ";
      }
      std::cout << std::setw(7) << request << std::setw(7) << batch << "  decode x" << tokens << "  ";
      for (const auto& kind : kinds) std::cout << kind.substr(0, 3) << ' ';
      std::cout << "  " << generated << '\n';
    }
  }

  const cgt::Stats stats = pool->stats();
  std::cout << "\ncounters: calls " << stats.calls << ", warm-ups " << stats.warmups << ", recordings "
            << stats.recordings << ", replays " << stats.replays << ", eager " << stats.eager_calls
            << ", checkpoint restores " << stats.checkpoint_restores << '\n';
  const cgt::MemoryInfo memory = pool->memory();
  std::cout << "pool memory: " << memory.reserved_bytes << " bytes reserved, " << memory.allocated_bytes
            << " allocated in " << memory.live_blocks << " blocks\n";
  std::ofstream("torch_decoder_tree.dot") << pool->to_dot();
  std::cout << "tree written to torch_decoder_tree.dot (" << pool->roots().size() << " roots)\n";
  return 0;
}
