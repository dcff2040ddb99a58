// A small libtorch model trained through one cgt pool, the whole training step (zero the
// gradients, forward, backward, Adam) being one CUDA graph: the first call warms up, the second
// records, every later step is one graph launch. The optimizer is cgt.torch's capturable Adam,
// whose state (and the parameters' .grad) is made before the first call, outside the pool, and
// updated in place by every replay. Prints the loss, what each call was, and the counters.
//
//   build/examples/torch_training [steps]
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>

import cgt;
import cgt.torch;

namespace {

struct RegressorImpl : torch::nn::Module {
  RegressorImpl()
      : hidden(register_module("hidden", torch::nn::Linear(32, 128))),
        out(register_module("out", torch::nn::Linear(128, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out->forward(torch::relu(hidden->forward(x))); }
  torch::nn::Linear hidden, out;
};
TORCH_MODULE(Regressor);

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  if (!cgt::torch::is_available()) {
    std::cerr << "torch_training needs a CUDA device\n";
    return 1;
  }
  torch::manual_seed(0);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  Regressor model;
  model->to(torch::Device(torch::kCUDA, 0));
  // What to learn: y = sum(sin(x)), from random batches.
  const auto batch = [&cuda] {
    torch::Tensor x = torch::randn({64, 32}, cuda);
    return std::pair{x, torch::sin(x).sum(1, /*keepdim=*/true)};
  };

  // The optimizer first: its state and the gradients get static addresses outside the pool.
  auto adam = cgt::torch::make_adam(model->parameters(), {.lr = 1e-3});
  if (!adam) return report(adam.error());
  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return report(pool.error());
  // The loss function: the batch and target are inputs (copied into the graph each step), the
  // model is captured (its parameters are the graph's, updated in place).
  auto train = cgt::torch::make_training_step(*pool, *adam, [&model](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  });
  if (!train) return report(train.error());

  for (int step = 0; step < steps; ++step) {
    const auto [x, y] = batch();
    pool->mark_step_begin();  // the last step's loss may be reclaimed from here on
    auto loss = (*train)({x, y});
    if (!loss) return report(loss.error());
    if (step < 3 || step % 50 == 49) {
      std::cout << "step " << std::setw(4) << step + 1 << "  " << std::left << std::setw(10)
                << cgt::to_string(loss->kind()) << std::right << "  loss " << (*loss->get(0)).get().item<float>()
                << '\n';
    }
    // Between steps the program may also drop the gradients (adam->zero_grad(true)): the next
    // step puts the optimizer's tensors back before the graph writes them.
  }
  const cgt::Stats stats = pool->stats();
  std::cout << "counters: calls " << stats.calls << ", warm-ups " << stats.warmups << ", recordings "
            << stats.recordings << ", replays " << stats.replays << ", eager " << stats.eager_calls << '\n';
  return stats.replays + 2 == static_cast<std::uint64_t>(steps) ? 0 : 1;
}
