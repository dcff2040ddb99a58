// One training step of a launch-bound transformer (2 layers, hidden 256, 4 heads, batch 8,
// seq 64, Adam), by several methods in one process: CPU time and wall time per step, and the
// peak of allocated device memory against eager libtorch (`scripts/gpu.sh bench` runs it next to
// bench/training.py, PyTorch's torch.compile(mode="reduce-overhead") on the same model, and
// bench/training_report.py makes bench/results/training.md).
//
//   training_bench [steps] [fp32|tf32]      (CGT_BENCH_METHOD=text: only the methods named with it;
//                                             CGT_TRAINING_PACKAGE=path.pt2: the AOTInductor methods)
//
// Prints CSV lines "training,<precision>,<method>,<cpu us/step>,<wall us/step>,<peak bytes>"
// (tf32: cuBLAS may use TF32 for float32 matmuls, in every method alike). A method is a
// name and a function that, given a fresh model, returns the step to time: adding one (the
// per-function forward and backward graphs) is one entry in `methods()`.
#include <torch/torch.h>

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

template <class T>
T must(cgt::Result<T> result) {
  if (!result) {
    std::cerr << result.error().describe() << '\n';
    std::exit(1);
  }
  return std::move(*result);
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

struct Data {
  torch::Tensor x, y;
};

// What a method keeps alive while it is timed (optimizer, pool, ...) and its step.
struct Trainer {
  std::shared_ptr<void> state;
  std::function<void()> step;
};

struct Method {
  std::string name;
  std::function<Trainer(Transformer&, const Data&)> make;  // empty: a slot not filled yet
};

Trainer eager_libtorch(Transformer& model, const Data& data) {
  auto adam = std::make_shared<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-3));
  return {adam, [adam, model, &data]() mutable {
            adam->zero_grad(true);
            torch::mse_loss(model->forward(data.x), data.y).backward();
            adam->step();
          }};
}

// The capturable Adam of cgt.torch, eagerly: what the whole-step graph replays.
Trainer eager_capturable(Transformer& model, const Data& data) {
  auto adam = std::make_shared<cgt::torch::Adam>(must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3})));
  return {adam, [adam, model, &data]() mutable {
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
  return {state, [state, &data] {
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
  return {state, [state, &data] {
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

std::vector<Method> methods() {
  const char* package = std::getenv("CGT_TRAINING_PACKAGE");
  const bool have_package = package != nullptr && *package != '\0';
  return {
      {"eager libtorch", eager_libtorch},
      {"eager libtorch (capturable Adam)", eager_capturable},
      {"cgt whole-step graph", [](Transformer& m, const Data& d) { return cgt_whole_step(m, d, true); }},
      {"cgt whole-step graph (per-step grads)",
       [](Transformer& m, const Data& d) { return cgt_whole_step(m, d, false); }},
      {"cgt per-function graphs + graphed update", cgt_per_function},
      {"cgt AOTInductor whole-step graph",
       have_package ? std::function([](Transformer& m, const Data& d) { return cgt_whole_step_aoti(m, d, true); })
                    : nullptr},
      {"cgt AOTInductor whole-step graph (per-step grads)",
       have_package ? std::function([](Transformer& m, const Data& d) { return cgt_whole_step_aoti(m, d, false); })
                    : nullptr},
  };
}

struct Timing {
  double cpu_us = 0, wall_us = 0;
  std::size_t peak_bytes = 0;
};

Timing measure(const std::function<void()>& step, int steps) {
  for (int i = 0; i < 20; ++i) step();  // warm-up, recording, caches
  drain();
  std::vector<double> cpu;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    cpu.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
    if (i % 4 == 3) drain();  // keep the GPU's queue short (not timed)
  }
  std::ranges::sort(cpu);
  drain();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  drain();
  const double wall = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  return {cpu[cpu.size() / 2], wall / steps, 0};
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  const std::string precision = argc > 2 ? argv[2] : "fp32";
  at::globalContext().setAllowTF32CuBLAS(precision == "tf32");
  if (!cgt::torch::is_available()) {
    std::cerr << "training_bench needs a CUDA device\n";
    return 1;
  }
  const torch::Device gpu(torch::kCUDA, 0);
  torch::manual_seed(0);
  const Data data{torch::randn({batch, seq, hidden}, gpu), torch::randn({batch, seq, hidden}, gpu)};
  // CGT_BENCH_METHOD: only the methods whose name contains it (to profile one, say).
  const char* only = std::getenv("CGT_BENCH_METHOD");
  for (const Method& method : methods()) {
    if (only != nullptr && method.name.find(only) == std::string::npos) continue;
    if (!method.make) {
      std::printf("training,%s,%s,nan,nan,nan\n", precision.c_str(), method.name.c_str());
      continue;
    }
    Timing t;
    {
      torch::manual_seed(0);
      Transformer model;
      model->to(gpu);
      drain();
      // Every method makes its own cuBLAS workspaces (one per thread and stream: the backward
      // runs on autograd's thread), counted in its peak.
      at::cuda::clearCublasWorkspaces();
      c10::cuda::CUDACachingAllocator::emptyCache();
      // Peak from here: the model's parameters, then what the method allocates (its gradients,
      // optimizer state, activations, pool).
      c10::cuda::CUDACachingAllocator::resetPeakStats(0);
      Trainer trainer = method.make(model, data);
      t = measure(trainer.step, steps);
      drain();
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
      t.peak_bytes = static_cast<std::size_t>(
          stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak);
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
    std::printf("training,%s,%s,%.3f,%.3f,%zu\n", precision.c_str(), method.name.c_str(), t.cpu_us, t.wall_us,
                t.peak_bytes);
    std::fflush(stdout);
  }
  return 0;
}
