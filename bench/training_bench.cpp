// One training step of a launch-bound transformer (2 layers, hidden 256, 4 heads, batch 8,
// seq 64, Adam), by several methods in one process: CPU time and wall time per step, and the
// peak of allocated device memory against eager libtorch (`scripts/gpu.sh bench` runs it next to
// bench/training.py, PyTorch's torch.compile(mode="reduce-overhead") on the same model, and
// bench/training_report.py makes bench/results/training.md).
//
//   training_bench [steps] [fp32|tf32|loop|curve]
//                     (CGT_BENCH_METHOD=text: only the methods named with it;
//                      CGT_TRAINING_PACKAGE=path.pt2: the AOTInductor methods)
//
// Prints CSV lines "training,<configuration>,<method>,<cpu us/step>,<wall us/step>,<peak bytes>".
// fp32 and tf32 time one step of Adam on one batch (tf32: cuBLAS may use TF32 for float32
// matmuls, in every method alike). loop times a step of a modern loop: AdamW with a warm-up +
// cosine schedule, clipping at 1.0, bf16 autocast and 4 micro-batches (one optimizer step, four
// forwards and backwards). curve trains the loop's methods `steps` steps from one model and prints
// "loss,<method>,<step>,<loss>" (the mean of the step's micro-batch losses), for the loss-curve
// plot. A method is a name and a function that, given a fresh model, returns the step to time:
// adding one is one entry in `methods()`.
#include <torch/torch.h>
#include <ATen/autocast_mode.h>

#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

import cgt;
import cgt.torch;

namespace {

constexpr std::int64_t layers = 2, hidden = 256, heads = 4, batch = 8, seq = 64;
// The modern loop: micro-batches a step, the steps of data it cycles through, its schedule.
constexpr std::int64_t micro_batches = 4, loop_batches = 8, warmup_steps = 20;
constexpr double peak_lr = 1e-3, floor_lr = 1e-4, max_grad_norm = 1.0, weight_decay = 1e-2;

template <class T>
T must(cgt::Result<T> result) {
  if (!result) {
    std::cerr << result.error().describe() << '\n';
    std::exit(1);
  }
  return std::move(*result);
}

void must(const cgt::Result<void>& result) {
  if (!result) {
    std::cerr << result.error().describe() << '\n';
    std::exit(1);
  }
}

void drain() {
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::cerr << "cudaDeviceSynchronize failed\n";
    std::exit(1);
  }
}

// The model of bench/training.py, layer for layer: pre-norm blocks of self-attention (matmul,
// softmax) and a GELU MLP, then a final LayerNorm; MSE against a target.
struct BlockImpl : torch::nn::Module {
  BlockImpl()
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        qkv(register_module("qkv", torch::nn::Linear(hidden, 3 * hidden))),
        proj(register_module("proj", torch::nn::Linear(hidden, hidden))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))),
        up(register_module("up", torch::nn::Linear(hidden, 4 * hidden))),
        down(register_module("down", torch::nn::Linear(4 * hidden, hidden))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t b = x.size(0), s = x.size(1), d = hidden / heads;
    auto parts = qkv->forward(norm1->forward(x)).view({b, s, 3, heads, d}).permute({2, 0, 3, 1, 4});
    auto scores = torch::matmul(parts[0], parts[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    auto attended = torch::matmul(torch::softmax(scores, -1), parts[2]).transpose(1, 2).reshape({b, s, hidden});
    auto h = x + proj->forward(attended);
    return h + down->forward(torch::gelu(up->forward(norm2->forward(h))));
  }
  torch::nn::LayerNorm norm1;
  torch::nn::Linear qkv, proj;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

struct TransformerImpl : torch::nn::Module {
  TransformerImpl() : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})))) {
    for (std::int64_t i = 0; i < layers; ++i) blocks.push_back(register_module("block" + std::to_string(i), Block()));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& block : blocks) x = block->forward(x);
    return norm->forward(x);
  }
  std::vector<Block> blocks;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(Transformer);

// fp32 and tf32: one batch, x and y [batch, seq, hidden]. loop and curve: `loop_batches` steps of
// data, x and y [loop_batches, micro_batches * batch, seq, hidden], y a function of x (a fixed
// random linear map through tanh) that the model can learn; step t takes x[t % loop_batches].
struct Data {
  torch::Tensor x, y;
};

// Where a step puts the mean of its micro-batch losses (it synchronises), or nowhere (timed).
using Losses = std::vector<double>*;

// What a method keeps alive while it is timed (optimizer, pool, ...) and its step.
struct Trainer {
  std::shared_ptr<void> state;
  std::function<void(Losses)> step;
};

struct Method {
  std::string name;
  // Given the model, the data and the schedule's length in steps (loop and curve): the trainer.
  std::function<Trainer(Transformer&, const Data&, std::int64_t)> make;  // empty: a slot not filled yet
};

Trainer eager_libtorch(Transformer& model, const Data& data) {
  auto adam = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
  return {adam, [adam, model, &data](Losses) mutable {
            adam->zero_grad(true);
            torch::mse_loss(model->forward(data.x), data.y).backward();
            adam->step();
          }};
}

// The capturable Adam of cgt.torch, eagerly: what the whole-step graph replays.
Trainer eager_capturable(Transformer& model, const Data& data) {
  auto adam = std::make_shared<cgt::torch::Adam>(must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3})));
  return {adam, [adam, model, &data](Losses) mutable {
            adam->zero_grad(false);
            torch::mse_loss(model->forward(data.x), data.y).backward();
            adam->step();
          }};
}

// A whole-step graph: the optimizer, the pool and the training step made with them.
struct WholeStep {
  cgt::torch::Adam adam;
  cgt::torch::Pool pool;
  std::unique_ptr<cgt::torch::TrainingStep> step;
};

std::shared_ptr<WholeStep> whole_step_state(std::vector<torch::Tensor> params, bool static_grads) {
  return std::make_shared<WholeStep>(
      WholeStep{must(cgt::torch::make_adam(std::move(params), {.lr = 1e-3, .static_grads = static_grads})),
                must(cgt::torch::make_pool({.device = 0})), nullptr});
}

// One step per call, each a new step of the pool.
Trainer whole_step_trainer(std::shared_ptr<WholeStep> state, const Data& data) {
  return {state, [state, &data](Losses) {
            state->pool.mark_step_begin();
            auto loss = (*state->step)({data.x, data.y});
            if (!loss) {
              std::cerr << loss.error().describe() << '\n';
              std::exit(1);
            }
          }};
}

Trainer cgt_whole_step(Transformer& model, const Data& data, bool static_grads) {
  auto state = whole_step_state(model->parameters(), static_grads);
  state->step = std::make_unique<cgt::torch::TrainingStep>(
      must(cgt::torch::make_training_step(state->pool, state->adam, [model](cgt::torch::Inputs in) mutable {
        return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
      })));
  return whole_step_trainer(std::move(state), data);
}

// The forward and the backward as one AOTInductor package (scripts/aoti_training.py exports the
// model of bench/training.py; $CGT_TRAINING_PACKAGE names it): Inductor's generated, fused
// kernels where autograd runs eager libtorch's, called with the parameters in the Python module's
// order (the blocks, then the final norm: this module registers its norm first), then the
// capturable Adam, replayed as one graph (make_training_step_from_gradients).
Trainer cgt_whole_step_aoti(Transformer& model, const Data& data, bool static_grads) {
  std::vector<torch::Tensor> params;
  for (auto& block : model->blocks) {
    for (auto& p : block->parameters()) params.push_back(p);
  }
  for (auto& p : model->norm->parameters()) params.push_back(p);
  auto state = whole_step_state(params, static_grads);
  auto gradients = must(cgt::torch::load_aoti_gradients(std::getenv("CGT_TRAINING_PACKAGE"), params));
  state->step = std::make_unique<cgt::torch::TrainingStep>(
      must(cgt::torch::make_training_step_from_gradients(state->pool, state->adam, std::move(gradients))));
  return whole_step_trainer(std::move(state), data);
}

// Each block, and the final norm with the loss, as a cgt autograd function (forward graph; the
// backward graph recomputes the forward), chained into one path per step; `backward()` runs
// through them, then the capturable Adam's update replays as a graph of its own
// (make_optimizer_step). The optimizer is made first: the functions' backward graphs accumulate
// into its gradients directly.
Trainer cgt_per_function(Transformer& model, const Data& data) {
  struct State {
    cgt::torch::Adam adam;
    cgt::torch::Pool pool;
    std::vector<cgt::torch::AutogradFunction> blocks;
    std::optional<cgt::torch::AutogradFunction> head;
    std::optional<cgt::torch::OptimizerStep> update;
  };
  auto state = std::make_shared<State>(State{must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3})),
                                             must(cgt::torch::make_pool({.device = 0})),
                                             {},
                                             std::nullopt,
                                             std::nullopt});
  for (std::size_t i = 0; i < model->blocks.size(); ++i) {
    Block block = model->blocks[i];
    state->blocks.push_back(must(cgt::torch::make_autograd_function(
        state->pool, [block](cgt::torch::Inputs in) mutable { return cgt::torch::Values{block->forward(in[0])}; },
        {.name = "block" + std::to_string(i), .parameters = block->parameters()})));
  }
  torch::nn::LayerNorm norm = model->norm;
  state->head =
      must(cgt::torch::make_autograd_function(state->pool,
                                              [norm](cgt::torch::Inputs in) mutable {
                                                return cgt::torch::Values{torch::mse_loss(norm->forward(in[0]), in[1])};
                                              },
                                              {.name = "norm_and_loss", .parameters = norm->parameters()}));
  state->update = must(cgt::torch::make_optimizer_step(state->pool, state->adam));
  return {state, [state, &data](Losses) {
            state->pool.mark_step_begin();
            state->adam.zero_grad(false);
            std::vector<cgt::torch::AutogradOutputs> outs;
            outs.reserve(state->blocks.size() + 1);
            at::Tensor h = data.x;
            for (const auto& block : state->blocks) {
              outs.push_back(must(block({h})));
              h = outs.back()[0];
            }
            outs.push_back(must((*state->head)({h, data.y})));
            outs.back()[0].backward();
            if (auto updated = (*state->update)(); !updated) {
              std::cerr << updated.error().describe() << '\n';
              std::exit(1);
            }
          }};
}

// --- the modern loop (issue 29): AdamW, warm-up + cosine, clipping, bf16 autocast, 4 micro-batches

cgt::torch::LrSchedule schedule(std::int64_t length) {
  return cgt::torch::lr::warmup_cosine(peak_lr, warmup_steps, length, floor_lr);
}

torch::Tensor loop_loss(Transformer& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(model->forward(x).to(torch::kFloat), y);
}

// Eager bf16 autocast while it lives, as `with torch.autocast("cuda", torch.bfloat16):`.
class Bf16Autocast {
 public:
  Bf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~Bf16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, false);
  }
  Bf16Autocast(const Bf16Autocast&) = delete;
  Bf16Autocast& operator=(const Bf16Autocast&) = delete;
  Bf16Autocast(Bf16Autocast&&) = delete;
  Bf16Autocast& operator=(Bf16Autocast&&) = delete;
};

// Eager libtorch as a training loop is written: the rate set from the schedule, the micro-batches'
// losses divided by their count and accumulated, clip_grad_norm_, AdamW.
Trainer eager_loop(Transformer& model, const Data& data, std::int64_t length) {
  struct State {
    torch::optim::AdamW adam;
    cgt::torch::LrSchedule rate;
    std::int64_t t = 0;
  };
  auto state = std::make_shared<State>(
      State{torch::optim::AdamW(model->parameters(), torch::optim::AdamWOptions(peak_lr).weight_decay(weight_decay)),
            schedule(length)});
  return {state, [state, model, &data](Losses losses) mutable {
            state->adam.param_groups()[0].options().set_lr(state->rate(state->t));
            state->adam.zero_grad(true);
            const auto xs = data.x[state->t % loop_batches].chunk(micro_batches);
            const auto ys = data.y[state->t % loop_batches].chunk(micro_batches);
            double sum = 0;
            for (std::int64_t i = 0; i < micro_batches; ++i) {
              torch::Tensor loss;
              {
                const Bf16Autocast autocast;
                loss = loop_loss(model, xs[i], ys[i]);
              }
              (loss / micro_batches).backward();
              if (losses != nullptr) sum += loss.item<double>();
            }
            torch::nn::utils::clip_grad_norm_(model->parameters(), max_grad_norm);
            state->adam.step();
            ++state->t;
            if (losses != nullptr) losses->push_back(sum / micro_batches);
          }};
}

// cgt's training step for the same loop: the schedule, clipping, autocast and accumulation in the
// graphs, as one graph per micro-batch (a call each) or one graph per step (`all_in_one_call`).
Trainer cgt_loop(Transformer& model, const Data& data, std::int64_t length, bool all_in_one_call) {
  struct State {
    cgt::torch::Adam adam;
    cgt::torch::Pool pool;
    std::unique_ptr<cgt::torch::TrainingStep> step;
    std::int64_t t = 0;
  };
  auto state = std::make_shared<State>(State{must(cgt::torch::make_adam(model->parameters(),
                                                                       {.lr = peak_lr,
                                                                        .weight_decay = weight_decay,
                                                                        .decoupled_weight_decay = true,
                                                                        .max_grad_norm = max_grad_norm})),
                                             must(cgt::torch::make_pool({.device = 0})),
                                             nullptr});
  must(state->adam.set_schedule(schedule(length)));
  state->step = std::make_unique<cgt::torch::TrainingStep>(must(cgt::torch::make_training_step(
      state->pool, state->adam,
      [model](cgt::torch::Inputs in) mutable { return cgt::torch::Values{loop_loss(model, in[0], in[1])}; },
      {.micro_batches = micro_batches, .all_in_one_call = all_in_one_call, .autocast = at::kBFloat16})));
  return {state, [state, &data, all_in_one_call](Losses losses) {
            const torch::Tensor x = data.x[state->t % loop_batches];
            const torch::Tensor y = data.y[state->t % loop_batches];
            ++state->t;
            double sum = 0;
            const auto call = [&](const torch::Tensor& xi, const torch::Tensor& yi, double weight) {
              state->pool.mark_step_begin();
              auto out = must((*state->step)({xi, yi}));
              if (losses != nullptr) sum += weight * must(out.take(0)).item<double>();
            };
            if (all_in_one_call) {
              call(x, y, micro_batches);  // its loss is the micro-batches' mean
            } else {
              const auto xs = x.chunk(micro_batches);
              const auto ys = y.chunk(micro_batches);
              for (std::int64_t i = 0; i < micro_batches; ++i) call(xs[i], ys[i], 1);
            }
            if (losses != nullptr) losses->push_back(sum / micro_batches);
          }};
}

bool is_loop(const std::string& configuration) {
  return configuration == "loop" || configuration == "curve";
}

std::vector<Method> methods(const std::string& configuration) {
  if (is_loop(configuration)) {
    return {
        {"eager libtorch", eager_loop},
        {"cgt training step (a graph per micro-batch)",
         [](Transformer& m, const Data& d, std::int64_t length) { return cgt_loop(m, d, length, false); }},
        {"cgt training step (one graph per step)",
         [](Transformer& m, const Data& d, std::int64_t length) { return cgt_loop(m, d, length, true); }},
    };
  }
  const char* package = std::getenv("CGT_TRAINING_PACKAGE");
  const bool have_package = package != nullptr && *package != '\0';
  using Make = std::function<Trainer(Transformer&, const Data&, std::int64_t)>;
  const auto one_batch = [](Trainer (*make)(Transformer&, const Data&)) {
    return Make([make](Transformer& m, const Data& d, std::int64_t) { return make(m, d); });
  };
  return {
      {"eager libtorch", one_batch(eager_libtorch)},
      {"eager libtorch (capturable Adam)", one_batch(eager_capturable)},
      {"cgt whole-step graph", one_batch([](Transformer& m, const Data& d) { return cgt_whole_step(m, d, true); })},
      {"cgt whole-step graph (per-step grads)",
       one_batch([](Transformer& m, const Data& d) { return cgt_whole_step(m, d, false); })},
      {"cgt per-function graphs + graphed update", one_batch(cgt_per_function)},
      {"cgt AOTInductor whole-step graph",
       have_package ? one_batch([](Transformer& m, const Data& d) { return cgt_whole_step_aoti(m, d, true); })
                    : nullptr},
      {"cgt AOTInductor whole-step graph (per-step grads)",
       have_package ? one_batch([](Transformer& m, const Data& d) { return cgt_whole_step_aoti(m, d, false); })
                    : nullptr},
  };
}

struct Timing {
  double cpu_us = 0, wall_us = 0;
  std::size_t peak_bytes = 0;
};

// Warm-up steps before the timed ones: warm-up, recording, caches (and the schedule's warm-up).
constexpr int untimed_steps = 20;

Timing measure(const std::function<void(Losses)>& step, int steps) {
  for (int i = 0; i < untimed_steps; ++i) step(nullptr);
  drain();
  std::vector<double> cpu;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step(nullptr);
    cpu.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    if (i % 4 == 3) drain();  // keep the GPU's queue short (not timed)
  }
  std::ranges::sort(cpu);
  drain();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(nullptr);
  drain();
  const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return {cpu[cpu.size() / 2], wall / steps, 0};
}

// The data of `configuration` (see Data), the same for every method.
Data make_data(const std::string& configuration, const torch::Device& gpu) {
  torch::manual_seed(0);
  if (!is_loop(configuration)) {
    return {torch::randn({batch, seq, hidden}, gpu), torch::randn({batch, seq, hidden}, gpu)};
  }
  const torch::Tensor x = torch::randn({loop_batches, micro_batches * batch, seq, hidden}, gpu);
  const torch::Tensor map = torch::randn({hidden, hidden}, gpu) / std::sqrt(static_cast<double>(hidden));
  return {x, torch::tanh(torch::matmul(x, map))};
}

// A fresh model, as every method starts from.
Transformer fresh_model(const torch::Device& gpu) {
  torch::manual_seed(0);
  Transformer model;
  model->to(gpu);
  drain();
  return model;
}

// curve: each loop method trains `steps` steps from the same model; one "loss" line per step.
void print_curves(int steps, const Data& data, const torch::Device& gpu) {
  for (const Method& method : methods("curve")) {
    Transformer model = fresh_model(gpu);
    Trainer trainer = method.make(model, data, steps);
    std::vector<double> losses;
    for (int i = 0; i < steps; ++i) trainer.step(&losses);
    for (std::size_t i = 0; i < losses.size(); ++i) std::printf("loss,%s,%zu,%.6g\n", method.name.c_str(), i + 1, losses[i]);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::string configuration = argc > 2 ? argv[2] : "fp32";
  if (steps < 1 || (configuration != "fp32" && configuration != "tf32" && !is_loop(configuration))) {
    std::cerr << "usage: training_bench [steps] [fp32|tf32|loop|curve]\n";
    return 2;
  }
  at::globalContext().setAllowTF32CuBLAS(configuration == "tf32");
  if (!cgt::torch::is_available()) {
    std::cerr << "training_bench needs a CUDA device\n";
    return 1;
  }
  const torch::Device gpu(torch::kCUDA, 0);
  const Data data = make_data(configuration, gpu);
  if (configuration == "curve") {
    print_curves(steps, data, gpu);
    return 0;
  }
  // The loop's schedule spans every step measure() takes.
  const std::int64_t length = untimed_steps + (2 * static_cast<std::int64_t>(steps));
  // CGT_BENCH_METHOD: only the methods whose name contains it (to profile one, say).
  const char* only = std::getenv("CGT_BENCH_METHOD");
  for (const Method& method : methods(configuration)) {
    if (only != nullptr && method.name.find(only) == std::string::npos) continue;
    if (!method.make) {
      std::printf("training,%s,%s,nan,nan,nan\n", configuration.c_str(), method.name.c_str());
      continue;
    }
    Timing t;
    {
      Transformer model = fresh_model(gpu);
      // Every method makes its own cuBLAS workspaces (one per thread and stream: the backward
      // runs on autograd's thread), counted in its peak.
      at::cuda::clearCublasWorkspaces();
      c10::cuda::CUDACachingAllocator::emptyCache();
      // Peak from here: the model's parameters, then what the method allocates (its gradients,
      // optimizer state, activations, pool).
      c10::cuda::CUDACachingAllocator::resetPeakStats(0);
      Trainer trainer = method.make(model, data, length);
      t = measure(trainer.step, steps);
      drain();
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
      t.peak_bytes = static_cast<std::size_t>(
          stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
    std::printf("training,%s,%s,%.3f,%.3f,%zu\n", configuration.c_str(), method.name.c_str(), t.cpu_us, t.wall_us,
                t.peak_bytes);
    std::fflush(stdout);
  }
  return 0;
}
