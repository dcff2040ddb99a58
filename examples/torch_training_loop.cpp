// A modern training loop through one cgt pool: a warm-up + cosine learning-rate schedule,
// gradient clipping at 1.0, bf16 autocast and gradient accumulation over 4 micro-batches, all
// inside the recorded graphs (the rate and the clipping on the device: nothing is recorded again),
// and a checkpoint at step 100 from which a fresh process-like restart resumes. The resumed run
// ends with the parameters of the uninterrupted one.
//
//   build/examples/torch_training_loop [directory for the checkpoint files, default /tmp]
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <expected>
#include <iomanip>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

namespace {

constexpr std::int64_t steps = 200;        // optimizer steps
constexpr std::int64_t micro_batches = 4;  // per optimizer step, one per call
constexpr std::int64_t checkpoint_at = 100;

struct RegressorImpl : torch::nn::Module {
  RegressorImpl()
      : hidden(register_module("hidden", torch::nn::Linear(32, 256))),
        out(register_module("out", torch::nn::Linear(256, 1))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out->forward(torch::gelu(hidden->forward(x))); }
  torch::nn::Linear hidden, out;
};
TORCH_MODULE(Regressor);

int report(const cgt::Error& error) {
  std::cerr << "error: " << error.describe() << '\n';
  return 1;
}

// Micro-batch `i` of the run: the same data whichever run asks for it. y = sum(sin(x)).
std::pair<torch::Tensor, torch::Tensor> micro_batch(std::int64_t i) {
  torch::manual_seed(1000 + i);
  torch::Tensor x = torch::randn({16, 32}, torch::Device(torch::kCUDA, 0));
  return {x, torch::sin(x).sum(1, /*keepdim=*/true)};
}

// Trains optimizer steps [from, steps): from 0, saving the checkpoint when it gets to
// `checkpoint_at`; from `checkpoint_at`, loading it first. Returns the parameters at the end.
cgt::Result<std::vector<torch::Tensor>> train(std::int64_t from, const std::string& dir) {
  torch::manual_seed(0);  // a resumed run loads its parameters: these initial ones are overwritten
  Regressor model;
  model->to(torch::Device(torch::kCUDA, 0));
  // The optimizer first (its state and the gradients at static addresses, outside the pool):
  // AdamW, its learning rate on the device, clipping by global norm before every update.
  auto adam = cgt::torch::make_adam(
      model->parameters(), {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0});
  if (!adam) return std::unexpected(adam.error());
  if (from > 0) {  // resume: the parameters and the optimizer's state, copied in place
    if (auto loaded = cgt::torch::load_parameters_in_place(*model, dir + "/model.pt"); !loaded) {
      return std::unexpected(loaded.error());
    }
    if (auto loaded = adam->load(dir + "/adam.pt"); !loaded) return std::unexpected(loaded.error());
  }
  // 20 steps of warm-up to 3e-3, then a cosine down to 3e-4 at the last step. `load` restored the
  // schedule's position (from the file: the checkpoint's step).
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 20, steps, 3e-4);
  if (auto set = adam->set_schedule(schedule, adam->scheduled_steps()); !set) return std::unexpected(set.error());

  auto pool = cgt::torch::make_pool({.device = 0});
  if (!pool) return std::unexpected(pool.error());
  auto train = cgt::torch::make_training_step(
      *pool, *adam,
      [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = micro_batches, .autocast = at::kBFloat16});
  if (!train) return std::unexpected(train.error());

  for (std::int64_t step = from; step < steps; ++step) {
    if (step == checkpoint_at && from == 0) {  // between optimizer steps: nothing half accumulated
      torch::save(model, dir + "/model.pt");
      if (auto saved = adam->save(dir + "/adam.pt"); !saved) return std::unexpected(saved.error());
      std::cout << "step " << step << ": checkpoint saved in " << dir << '\n';
    }
    for (std::int64_t micro = 0; micro < micro_batches; ++micro) {
      const auto [x, y] = micro_batch((step * micro_batches) + micro);
      pool->mark_step_begin();
      auto out = (*train)({x, y});  // the 4th call of each step steps the optimizer
      if (!out) return std::unexpected(out.error());
      if (micro == micro_batches - 1 && (step % 50 == 49 || step == from)) {
        // Read only here (a read waits for the GPU). The stepping call adds the gradients' norm
        // before clipping after the micro-batch's loss.
        std::cout << "step " << std::setw(3) << step + 1 << "  lr " << std::setprecision(3) << adam->lr() << "  loss "
                  << (*out->get(0)).get().item<float>() << "  grad norm " << (*out->get(1)).get().item<float>() << '\n';
      }
    }
  }
  const cgt::Stats stats = pool->stats();
  std::cout << "counters: calls " << stats.calls << ", warm-ups " << stats.warmups << ", recordings "
            << stats.recordings << ", replays " << stats.replays << ", eager " << stats.eager_calls << '\n';
  std::vector<torch::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  if (!cgt::torch::is_available()) {
    std::cerr << "torch_training_loop needs a CUDA device\n";
    return 1;
  }
  std::cout << "uninterrupted run, checkpoint at step " << checkpoint_at << ":\n";
  auto whole = train(0, dir);
  if (!whole) return report(whole.error());
  std::cout << "resumed from the checkpoint:\n";
  auto resumed = train(checkpoint_at, dir);
  if (!resumed) return report(resumed.error());
  double differs = 0;
  for (std::size_t i = 0; i < whole->size(); ++i) {
    differs = std::max(differs, ((*whole)[i] - (*resumed)[i]).abs().max().item<double>());
  }
  std::cout << "resumed against uninterrupted: largest parameter difference " << differs << '\n';
  return differs <= 1e-5 ? 0 : 1;
}
