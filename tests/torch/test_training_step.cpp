// Training with graphs: the capturable optimizers of cgt.torch, and the whole
// training step (zero_grad in place, forward, backward, optimizer step) as one pool function. A
// small MLP and a small transformer block trained 100 steps through the graph give the parameters
// and loss curve of the same training run eagerly. Tagged [gpu][training]; the argument checks
// that need no device are [training] only.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <optional>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::Block;
using training_test::gpu;
using training_test::Mlp;  // 16 -> 64 -> 64 -> 8
using training_test::must;

constexpr int steps = 100;

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches(std::vector<std::int64_t> x_sizes, std::vector<std::int64_t> y_sizes) {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) {
    out.push_back({torch::randn(x_sizes, gpu), torch::randn(y_sizes, gpu)});
  }
  return out;
}

// A run of training: the loss of every step and the parameters at the end, on the host.
struct Run {
  std::vector<float> losses;
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // the parameters' names, where the run knows them
};

enum class Method {
  graph,                 // the whole-step graph
  graph_set_to_none,     // the same, zero_grad(true) between steps
  graph_per_step_grads,  // the same, static_grads = false
  per_function,          // the model and the loss as autograd functions, the update a graph of its own
  eager_capturable,      // cgt's Adam, eagerly
  eager_libtorch         // torch::optim::Adam (or AdamW), eagerly
};

// libtorch's optimizer with the same options as `o`.
std::unique_ptr<torch::optim::Optimizer> libtorch_adam(const std::vector<torch::Tensor>& params,
                                                       const cgt::torch::AdamOptions& o) {
  if (o.decoupled_weight_decay) {
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(o.lr)
                                                             .betas({o.beta1, o.beta2})
                                                             .eps(o.eps)
                                                             .weight_decay(o.weight_decay)
                                                             .amsgrad(o.amsgrad));
  }
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(o.lr)
                                                          .betas({o.beta1, o.beta2})
                                                          .eps(o.eps)
                                                          .weight_decay(o.weight_decay)
                                                          .amsgrad(o.amsgrad));
}

// Trains a fresh model (same seed, same data) with Adam (options `adam_options`) by `method`.
template <class Model>
Run train(Method method, const std::vector<Batch>& data, cgt::Stats* stats = nullptr,
          cgt::torch::AdamOptions adam_options = {.lr = 1e-3}) {
  torch::manual_seed(0);
  Model model;
  model->to(gpu);
  const auto loss_of = [&model](const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(model->forward(x), y);
  };
  std::vector<torch::Tensor> losses;
  if (method == Method::eager_libtorch) {
    auto adam = libtorch_adam(model->parameters(), adam_options);
    for (const Batch& b : data) {
      adam->zero_grad(true);
      auto loss = loss_of(b.x, b.y);
      loss.backward();
      adam->step();
      losses.push_back(loss.detach());
    }
  } else if (method == Method::eager_capturable) {
    auto adam = must(cgt::torch::make_adam(model->parameters(), adam_options));
    for (const Batch& b : data) {
      adam.zero_grad(false);
      auto loss = loss_of(b.x, b.y);
      loss.backward();
      adam.step();
      losses.push_back(loss.detach());
    }
  } else if (method == Method::per_function) {
    // The optimizer first: the autograd function adopts its gradients, so the backward graph
    // accumulates where the update graph reads.
    auto adam = must(cgt::torch::make_adam(model->parameters(), adam_options));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto body = must(cgt::torch::make_autograd_function(
        pool, [&model](cgt::torch::Inputs in) { return cgt::torch::Values{model->forward(in[0])}; },
        {.name = "model", .parameters = model->parameters()}));
    auto head = must(cgt::torch::make_autograd_function(
        pool, [](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(in[0], in[1])}; },
        {.name = "loss"}));
    auto update = must(cgt::torch::make_optimizer_step(pool, adam));
    for (const Batch& b : data) {
      pool.mark_step_begin();
      adam.zero_grad(false);
      auto h = must(body({b.x}));
      auto loss = must(head({h[0], b.y}));
      loss[0].backward();
      auto updated = update();
      if (!updated) FAIL(updated.error().describe());
      losses.push_back(must(loss.take(0)));
      for (std::size_t i = 0; i < adam.params().size(); ++i) REQUIRE(adam.params()[i].grad().is_same(adam.grads()[i]));
    }
    if (stats != nullptr) *stats = pool.stats();
  } else {
    const bool static_grads = method != Method::graph_per_step_grads;
    adam_options.static_grads = static_grads;
    auto adam = must(cgt::torch::make_adam(model->parameters(), adam_options));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = must(cgt::torch::make_training_step(
        pool, adam, [&](cgt::torch::Inputs in) { return cgt::torch::Values{loss_of(in[0], in[1])}; }));
    const cgt::torch::Device& device = must(pool.device()).get();
    for (const Batch& b : data) {
      pool.mark_step_begin();
      auto out = step({b.x, b.y});
      if (!out) FAIL(out.error().describe());
      losses.push_back(must(out->take(0)));
      if (method == Method::graph_set_to_none) adam.zero_grad(true);  // between steps, outside the graph
      // .grad and the optimizer's state stay where they were made: never in the pool.
      for (std::size_t i = 0; i < adam.params().size(); ++i) {
        if (!static_grads) {  // born and dead inside the step
          REQUIRE_FALSE(adam.params()[i].grad().defined());
          REQUIRE_FALSE(device.contains(reinterpret_cast<std::uintptr_t>(adam.exp_avgs()[i].data_ptr())));
          continue;
        }
        if (method == Method::graph) REQUIRE(adam.params()[i].grad().is_same(adam.grads()[i]));
        REQUIRE_FALSE(device.contains(reinterpret_cast<std::uintptr_t>(adam.grads()[i].data_ptr())));
        REQUIRE_FALSE(device.contains(reinterpret_cast<std::uintptr_t>(adam.exp_avgs()[i].data_ptr())));
        REQUIRE_FALSE(device.contains(reinterpret_cast<std::uintptr_t>(adam.steps()[i].data_ptr())));
      }
    }
    if (stats != nullptr) *stats = pool.stats();
  }
  Run run;
  for (const auto& loss : losses) run.losses.push_back(loss.item<float>());
  for (const auto& item : model->named_parameters()) {
    run.params.push_back(item.value().detach().cpu());
    run.names.push_back(item.key());
  }
  return run;
}

struct Difference {
  double loss = 0;
  double param = 0;
};

Difference difference(const Run& a, const Run& b) {
  Difference d;
  REQUIRE(a.losses.size() == b.losses.size());
  REQUIRE(a.params.size() == b.params.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    d.loss = std::max(d.loss, static_cast<double>(std::abs(a.losses[i] - b.losses[i])));
  }
  for (std::size_t i = 0; i < a.params.size(); ++i) {
    d.param = std::max(d.param, (a.params[i] - b.params[i]).abs().max().item<double>());
  }
  return d;
}

// Against libtorch's own Adam, every parameter but the attention's key bias. That bias adds
// q.b to every score of a row, which softmax ignores: its true gradient is zero and the computed
// one is rounding noise, which Adam divides by its own size (m / sqrt(v)) into steps of about lr.
// Two Adam implementations that round differently (the fused kernel, libtorch's per-op formula)
// walk it apart by up to lr per step; against the same implementation run eagerly it is equal.
// Returns the difference over the other parameters; `key_bias` gets the bias's own.
Difference difference_but_key_bias(const Run& a, const Run& b, double& key_bias) {
  Run a_rest = a, b_rest = b;
  key_bias = 0;
  for (std::size_t i = 0; i < a.names.size(); ++i) {
    if (a.names[i] != "qkv.bias") continue;
    const std::int64_t hidden = a.params[i].size(0) / 3;
    const auto keys = torch::indexing::Slice(hidden, 2 * hidden);
    key_bias = (a.params[i].index({keys}) - b.params[i].index({keys})).abs().max().item<double>();
    a_rest.params[i] = a.params[i].clone();
    a_rest.params[i].index_put_({keys}, 0);
    b_rest.params[i] = b.params[i].clone();
    b_rest.params[i].index_put_({keys}, 0);
  }
  return difference(a_rest, b_rest);
}

template <class Model>
void graph_trains_as_eager(const std::vector<Batch>& data, const char* what) {
  cgt::Stats stats;
  const Run graph = train<Model>(Method::graph, data, &stats);
  const Run eager = train<Model>(Method::eager_capturable, data);
  const Run libtorch = train<Model>(Method::eager_libtorch, data);
  // The loss falls: the run trains something (a test of equal runs that learn nothing proves little).
  CHECK(graph.losses.back() < graph.losses.front());
  // One warm-up, one recording, then replays only.
  CHECK(stats.calls == steps);
  CHECK(stats.warmups == 1);
  CHECK(stats.recordings == 1);
  CHECK(stats.replays == steps - 2);
  CHECK(stats.eager_calls == 0);
  const Difference vs_eager = difference(graph, eager);
  double key_bias = 0;
  const Difference vs_libtorch = difference_but_key_bias(graph, libtorch, key_bias);
  WARN(what << ": graph vs eager (capturable Adam): max loss diff " << vs_eager.loss << ", max param diff "
            << vs_eager.param << "; vs torch::optim::Adam: loss " << vs_libtorch.loss << ", param " << vs_libtorch.param
            << " (attention key bias: " << key_bias << ")");
  CHECK(vs_eager.loss <= 1e-5);
  CHECK(vs_eager.param <= 1e-5);
  // The fused kernel's bias corrections are doubles from the device's step count, as libtorch's
  // are from its host count: the element math rounds alike.
  CHECK(vs_libtorch.loss <= 1e-5);
  CHECK(vs_libtorch.param <= 1e-5);
}

}  // namespace

TEST_CASE("training/mlp_whole_step_graph_trains_as_eager", "[gpu][training]") {
  REQUIRE_GPU();
  graph_trains_as_eager<Mlp>(batches({32, 16}, {32, 8}), "MLP");
}

TEST_CASE("training/transformer_block_whole_step_graph_trains_as_eager", "[gpu][training]") {
  REQUIRE_GPU();
  graph_trains_as_eager<Block>(batches({4, 16, 64}, {4, 16, 64}), "transformer block");
}

// Training with autograd functions: the model's forward and backward graphs, the loss's, and the
// update as a graph of its own (make_optimizer_step), 100 steps: the same parameters and losses
// as eager training, every call after the first steps replayed, and the optimizer's `.grad`
// written by the backward graph directly (adopted, never copied).
TEST_CASE("training/per_function_graphs_with_a_graphed_update_train_as_eager", "[gpu][training]") {
  REQUIRE_GPU();
  for (const bool transformer : {false, true}) {
    const auto data = transformer ? batches({4, 16, 64}, {4, 16, 64}) : batches({32, 16}, {32, 8});
    cgt::Stats stats;
    const Run graphs =
        transformer ? train<Block>(Method::per_function, data, &stats) : train<Mlp>(Method::per_function, data, &stats);
    const Run eager =
        transformer ? train<Block>(Method::eager_capturable, data) : train<Mlp>(Method::eager_capturable, data);
    const Run libtorch =
        transformer ? train<Block>(Method::eager_libtorch, data) : train<Mlp>(Method::eager_libtorch, data);
    INFO((transformer ? "transformer block" : "MLP"));
    CHECK(graphs.losses.back() < graphs.losses.front());
    // Five functions a step (model forward, loss forward, loss backward, model backward, update),
    // each warmed up and recorded once.
    CHECK(stats.calls == 5 * steps);
    CHECK(stats.recordings == 5);
    CHECK(stats.eager_calls == 0);
    CHECK(stats.replays == stats.calls - stats.warmups - stats.recordings);
    CHECK(stats.replays >= 5 * (steps - 2));
    const Difference vs_eager = difference(graphs, eager);
    double key_bias = 0;
    const Difference vs_libtorch = difference_but_key_bias(graphs, libtorch, key_bias);
    WARN((transformer ? "transformer block" : "MLP")
         << " per-function: vs eager (cgt Adam): loss " << vs_eager.loss << ", param " << vs_eager.param
         << "; vs torch::optim::Adam: loss " << vs_libtorch.loss << ", param " << vs_libtorch.param
         << " (attention key bias: " << key_bias << ")");
    CHECK(vs_eager.loss <= 1e-5);
    CHECK(vs_eager.param <= 1e-5);
    CHECK(vs_libtorch.loss <= 1e-5);
    CHECK(vs_libtorch.param <= 1e-5);
  }
}

// AdamW (decoupled weight decay) and AMSGrad, alone and together, through the whole-step graph,
// against libtorch's AdamW / Adam(amsgrad) run eagerly.
TEST_CASE("training/adamw_and_amsgrad_whole_step_graph_train_as_libtorch", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches({32, 16}, {32, 8});
  const std::vector<std::pair<const char*, cgt::torch::AdamOptions>> variants{
      {"AdamW", {.lr = 1e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true}},
      {"Adam amsgrad", {.lr = 1e-3, .amsgrad = true}},
      {"Adam L2 weight decay", {.lr = 1e-3, .weight_decay = 1e-2}},
      {"AdamW amsgrad", {.lr = 1e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .amsgrad = true}},
  };
  for (const auto& [name, options] : variants) {
    cgt::Stats stats;
    const Run graph = train<Mlp>(Method::graph, data, &stats, options);
    const Run libtorch = train<Mlp>(Method::eager_libtorch, data, nullptr, options);
    const Run eager = train<Mlp>(Method::eager_capturable, data, nullptr, options);
    INFO(name);
    CHECK(stats.replays == steps - 2);
    const Difference vs_libtorch = difference(graph, libtorch);
    const Difference vs_eager = difference(graph, eager);
    WARN(name << ": vs libtorch: loss " << vs_libtorch.loss << ", param " << vs_libtorch.param);
    CHECK(vs_eager.loss <= 1e-6);
    CHECK(vs_eager.param <= 1e-6);
    CHECK(vs_libtorch.loss <= 1e-5);
    CHECK(vs_libtorch.param <= 1e-5);
  }
  // AMSGrad keeps its running maxima, at static addresses.
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto amsgrad = must(cgt::torch::make_adam(model->parameters(), {.amsgrad = true}));
  CHECK(amsgrad.max_exp_avg_sqs().size() == amsgrad.params().size());
  auto plain = must(cgt::torch::make_adam(model->parameters(), {}));
  CHECK(plain.max_exp_avg_sqs().empty());
}

// Parameters of two dtypes: the fused kernel takes one dtype per call, so the update falls back to
// the multi-tensor formula, still capturable, still Adam.
TEST_CASE("training/parameters_of_mixed_dtypes_train_through_the_multi_tensor_update", "[gpu][training]") {
  REQUIRE_GPU();
  auto run = [](bool graph) {
    torch::manual_seed(0);
    auto single = torch::randn({64}, gpu).requires_grad_();
    auto twice = torch::randn({64}, torch::TensorOptions(gpu).dtype(torch::kDouble)).requires_grad_();
    const auto target = torch::linspace(-1, 1, 64, gpu);
    auto loss_of = [&] {
      return (single - target).pow(2).sum() + (twice - target.to(torch::kDouble)).pow(2).sum().to(torch::kFloat);
    };
    std::vector<float> losses;
    if (graph) {
      auto adam = must(cgt::torch::make_adam({single, twice}, {.lr = 1e-2}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto step = must(cgt::torch::make_training_step(
          pool, adam, [&](cgt::torch::Inputs) { return cgt::torch::Values{loss_of()}; }));
      for (int i = 0; i < steps; ++i) {
        pool.mark_step_begin();
        losses.push_back(must(step({})->take(0)).item<float>());
      }
      CHECK(pool.stats().replays == steps - 2);
    } else {
      torch::optim::Adam adam({single, twice}, torch::optim::AdamOptions(1e-2));
      for (int i = 0; i < steps; ++i) {
        adam.zero_grad();
        auto loss = loss_of();
        loss.backward();
        adam.step();
        losses.push_back(loss.item<float>());
      }
    }
    return Run{losses, {single.detach().cpu(), twice.detach().cpu().to(torch::kFloat)}};
  };
  const Run graph = run(true);
  const Run libtorch = run(false);
  CHECK(graph.losses.back() < graph.losses.front() / 2);
  const Difference d = difference(graph, libtorch);
  INFO("loss diff " << d.loss << ", param diff " << d.param);
  // Float32 bias corrections on the device against libtorch's host doubles.
  CHECK(d.param <= 1e-4);
}

// A graphed update reads gradients at fixed addresses: an optimizer without static gradients, or
// a mode other than inference, is refused; a `.grad` replaced between updates is refused too.
TEST_CASE("training/optimizer_step_refuses_what_a_graph_cannot_follow", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto per_step = must(cgt::torch::make_adam(model->parameters(), {.static_grads = false}));
  auto refused = cgt::torch::make_optimizer_step(pool, per_step);
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {}));
  auto as_forward = cgt::torch::make_optimizer_step(pool, adam, {.name = "update", .mode = cgt::FunctionMode::forward});
  REQUIRE_FALSE(as_forward.has_value());
  CHECK(as_forward.error().code == cgt::Errc::invalid_argument);
  auto sized = cgt::torch::make_optimizer_step(pool, adam, {.name = "update", .graph_sizes = {4}});
  REQUIRE_FALSE(sized.has_value());
  CHECK(sized.error().code == cgt::Errc::invalid_argument);
  // A training step trains on its whole batch: buckets (padded rows in the loss) are refused.
  auto bucketed = cgt::torch::make_training_step(
      pool, adam,
      [&](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
      {.name = "bucketed", .buckets = {.sizes = {8, 32}}});
  REQUIRE_FALSE(bucketed.has_value());
  CHECK(bucketed.error().code == cgt::Errc::invalid_argument);
  auto update = must(cgt::torch::make_optimizer_step(pool, adam));
  const auto x = torch::randn({32, 16}, gpu), y = torch::randn({32, 8}, gpu);
  for (int i = 0; i < 3; ++i) {  // warm-up, recording, replay
    pool.mark_step_begin();
    torch::mse_loss(model->forward(x), y).backward();
    REQUIRE(update().has_value());
  }
  const auto before = model->fc1->weight.detach().clone();
  model->fc1->weight.mutable_grad() = torch::ones_like(model->fc1->weight);
  auto replaced = update();
  REQUIRE_FALSE(replaced.has_value());
  CHECK(replaced.error().code == cgt::Errc::invalid_argument);
  CHECK(torch::equal(model->fc1->weight.detach(), before));  // no update ran
  // Set to none: an eager step would skip the parameters, a graph cannot: refused.
  adam.zero_grad(true);
  auto without = update();
  REQUIRE_FALSE(without.has_value());
  CHECK(without.error().code == cgt::Errc::invalid_argument);
  // An eager backward then makes new tensors, not the optimizer's: refused too.
  torch::mse_loss(model->forward(x), y).backward();
  auto stolen = update();
  REQUIRE_FALSE(stolen.has_value());
  CHECK(torch::equal(model->fc1->weight.detach(), before));  // no update ran
  // The optimizer's gradients put back and zeroed in place: the backward accumulates into them.
  adam.zero_grad(true);
  REQUIRE(adam.attach_grads().has_value());
  adam.zero_grad(false);
  pool.mark_step_begin();
  torch::mse_loss(model->forward(x), y).backward();
  REQUIRE(update().has_value());
  CHECK(model->fc1->weight.grad().is_same(adam.grads()[0]));
  CHECK(pool.stats().replays == 2);
  CHECK_FALSE(torch::equal(model->fc1->weight.detach(), before));
}

// A training step and an optimizer step made with an optimizer whose handle then moves (into a
// vector that grows and moves it again) or is dropped: the steps hold the optimizer's state
// themselves, so training goes on exactly as eager training with a handle that never moved.
TEST_CASE("training/optimizer_moved_or_dropped_after_the_step_is_made_still_trains", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches({32, 16}, {32, 8});
  const Run eager = train<Mlp>(Method::eager_capturable, data);
  for (const bool dropped : {false, true}) {
    INFO((dropped ? "handle dropped" : "handle moved into a growing vector"));
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    std::vector<cgt::torch::Adam> kept;
    auto step = [&] {
      auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
      auto made = must(cgt::torch::make_training_step(pool, adam, [&](cgt::torch::Inputs in) {
        return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
      }));
      if (!dropped) {
        kept.push_back(std::move(adam));
        CHECK_FALSE(adam.has_state());
        for (int i = 0; i < 8; ++i) kept.push_back(must(cgt::torch::make_adam({})));  // reallocates: moves kept[0]
      }
      return made;  // `adam` goes here
    }();
    Run run;
    for (const Batch& b : data) {
      pool.mark_step_begin();
      auto out = step({b.x, b.y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<float>());
    }
    CHECK(pool.stats().replays == steps - 2);
    for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu());
    const Difference d = difference(run, eager);
    CHECK(d.loss <= 1e-5);
    CHECK(d.param <= 1e-5);
    if (!dropped) {
      // The handle that moved is the optimizer still: its gradients are what `.grad` is.
      REQUIRE(kept.front().params().size() == model->parameters().size());
      CHECK(model->fc1->weight.grad().is_same(kept.front().grads()[0]));
    }
  }
  // The update as a graph of its own, its optimizer's handle dropped once it is made.
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto update = [&] {
    auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
    return must(cgt::torch::make_optimizer_step(pool, adam));
  }();
  const auto before = model->fc1->weight.detach().clone();
  for (int i = 0; i < 3; ++i) {
    pool.mark_step_begin();
    torch::mse_loss(model->forward(data[i].x), data[i].y).backward();
    REQUIRE(update().has_value());
  }
  CHECK(pool.stats().replays == 1);
  CHECK_FALSE(torch::equal(model->fc1->weight.detach(), before));
}

// zero_grad(set_to_none=true) between steps, outside the graph: the training step puts the
// optimizer's gradients back, and training is unchanged.
TEST_CASE("training/zero_grad_set_to_none_between_steps", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches({32, 16}, {32, 8});
  cgt::Stats stats;
  const Run graph = train<Mlp>(Method::graph_set_to_none, data, &stats);
  const Run eager = train<Mlp>(Method::eager_capturable, data);
  CHECK(stats.replays == steps - 2);
  const Difference d = difference(graph, eager);
  CHECK(d.loss <= 1e-5);
  CHECK(d.param <= 1e-5);
}

// Gradients that live inside the step only (static_grads = false): .grad is set to none at the
// start and end of the step, the backward allocates it in the graph's pool, the optimizer reads it
// there. The same training, with eager zero_grad(true)'s memory.
TEST_CASE("training/per_step_grads_whole_step_graph_trains_as_eager", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches({4, 16, 64}, {4, 16, 64});
  cgt::Stats stats;
  const Run graph = train<Block>(Method::graph_per_step_grads, data, &stats);
  const Run eager = train<Block>(Method::eager_capturable, data);
  CHECK(stats.warmups == 1);
  CHECK(stats.recordings == 1);
  CHECK(stats.replays == steps - 2);
  const Difference d = difference(graph, eager);
  CHECK(d.loss <= 1e-5);
  CHECK(d.param <= 1e-5);
}

// A .grad the program replaced by a tensor of its own would silently stop receiving the graph's
// gradients: the call fails instead, and succeeds again once .grad is set to none.
TEST_CASE("training/grad_replaced_by_another_tensor_is_an_error", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters()));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(pool, adam, [&](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  }));
  const auto x = torch::randn({32, 16}, gpu), y = torch::randn({32, 8}, gpu);
  for (int i = 0; i < 3; ++i) {
    auto out = step({x, y});
    REQUIRE(out.has_value());
  }
  model->fc1->weight.mutable_grad() = torch::zeros_like(model->fc1->weight);
  auto refused = step({x, y});
  REQUIRE_FALSE(refused.has_value());
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  model->fc1->weight.mutable_grad() = torch::Tensor();
  auto again = step({x, y});
  REQUIRE(again.has_value());
  CHECK(again->kind() == cgt::CallKind::replay);
  CHECK(model->fc1->weight.grad().is_same(adam.grads()[0]));
}

// SGD with momentum (and Nesterov) through the graph, against libtorch's SGD run eagerly.
TEST_CASE("training/sgd_momentum_whole_step_graph_trains_as_libtorch", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches({32, 16}, {32, 8});
  for (const bool nesterov : {false, true}) {
    const cgt::torch::SGDOptions options{.lr = 1e-2, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = nesterov};
    auto run = [&](bool graph) {
      torch::manual_seed(0);
      Mlp model;
      model->to(gpu);
      std::vector<float> losses;
      if (graph) {
        auto sgd = must(cgt::torch::make_sgd(model->parameters(), options));
        auto pool = must(cgt::torch::make_pool({.device = 0}));
        auto step = must(cgt::torch::make_training_step(pool, sgd, [&](cgt::torch::Inputs in) {
          return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
        }));
        for (const Batch& b : data) {
          pool.mark_step_begin();
          losses.push_back(must(step({b.x, b.y})->take(0)).item<float>());
        }
        CHECK(pool.stats().replays == steps - 2);
      } else {
        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(options.lr)
                                                       .momentum(options.momentum)
                                                       .weight_decay(options.weight_decay)
                                                       .nesterov(nesterov));
        for (const Batch& b : data) {
          sgd.zero_grad();
          auto loss = torch::mse_loss(model->forward(b.x), b.y);
          loss.backward();
          sgd.step();
          losses.push_back(loss.item<float>());
        }
      }
      Run r{losses, {}};
      for (const auto& p : model->parameters()) r.params.push_back(p.detach().cpu());
      return r;
    };
    const Difference d = difference(run(true), run(false));
    INFO("nesterov " << nesterov << ": loss diff " << d.loss << ", param diff " << d.param);
    CHECK(d.loss <= 1e-5);
    CHECK(d.param <= 1e-5);
  }
}

// A handle made by default or moved from holds no optimizer: its lists are empty, zero_grad does
// nothing, step throws, and what returns a Result fails with invalid_argument, naming the call.
// The handle it moved into is the optimizer.
TEST_CASE("training/optimizer_moved_from_reports_errors", "[training]") {
  auto adam = must(cgt::torch::make_adam({}, {.lr = 0.5}));  // no parameters: needs no device
  REQUIRE(adam.has_state());
  cgt::torch::Adam moved = std::move(adam);
  CHECK(moved.has_state());
  CHECK(moved.options().lr == 0.5);
  cgt::torch::Adam made_by_default;
  for (cgt::torch::Adam* empty : {&adam, &made_by_default}) {
    CHECK_FALSE(empty->has_state());
    CHECK_FALSE(empty->has_static_grads());
    CHECK(empty->params().empty());
    CHECK(empty->grads().empty());
    CHECK(empty->steps().empty());
    CHECK(empty->exp_avgs().empty());
    CHECK(empty->options().lr == cgt::torch::AdamOptions{}.lr);
    empty->zero_grad(false);
    empty->zero_grad(true);
    auto attached = empty->attach_grads();
    REQUIRE_FALSE(attached.has_value());
    CHECK(attached.error().code == cgt::Errc::invalid_argument);
    CHECK(attached.error().message.find("Optimizer::attach_grads") != std::string::npos);
    CHECK_THROWS_AS(empty->step(), c10::Error);
    CHECK_THROWS_AS(empty->step({}), c10::Error);
  }
  auto sgd = must(cgt::torch::make_sgd({}, {}));
  cgt::torch::SGD other = std::move(sgd);
  CHECK_FALSE(sgd.has_state());
  CHECK(sgd.options().lr == cgt::torch::SGDOptions{}.lr);
  CHECK(other.has_state());
  REQUIRE_GPU();
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = cgt::torch::make_training_step(pool, adam, [](cgt::torch::Inputs) { return cgt::torch::Values{}; });
  REQUIRE_FALSE(step.has_value());
  CHECK(step.error().code == cgt::Errc::invalid_argument);
  CHECK(step.error().message.find("make_training_step") != std::string::npos);
  auto update = cgt::torch::make_optimizer_step(pool, adam);
  REQUIRE_FALSE(update.has_value());
  CHECK(update.error().code == cgt::Errc::invalid_argument);
  CHECK(update.error().message.find("make_optimizer_step") != std::string::npos);
}

// What needs no device: parameters that cannot be trained, options out of range, a step that is
// not whole.
TEST_CASE("training/unusable_parameters_and_options_are_errors", "[training]") {
  auto cpu_param = torch::zeros({4}).requires_grad_();
  auto on_cpu = cgt::torch::make_adam({cpu_param});
  REQUIRE_FALSE(on_cpu.has_value());
  CHECK(on_cpu.error().code == cgt::Errc::invalid_argument);
  auto bad_betas = cgt::torch::make_adam({}, {.beta1 = 1.0});
  REQUIRE_FALSE(bad_betas.has_value());
  CHECK(bad_betas.error().code == cgt::Errc::invalid_argument);
  auto nesterov_without_momentum = cgt::torch::make_sgd({}, {.nesterov = true});
  REQUIRE_FALSE(nesterov_without_momentum.has_value());
  CHECK(nesterov_without_momentum.error().code == cgt::Errc::invalid_argument);
  REQUIRE_GPU();
  auto frozen = torch::zeros({4}, gpu);  // requires no grad: nothing would train it
  auto not_trained = cgt::torch::make_adam({frozen});
  REQUIRE_FALSE(not_trained.has_value());
  CHECK(not_trained.error().code == cgt::Errc::invalid_argument);
  auto adam = must(cgt::torch::make_adam({torch::zeros({4}, gpu).requires_grad_()}));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto forward = cgt::torch::make_training_step(pool, adam, [](cgt::torch::Inputs) { return cgt::torch::Values{}; },
                                                {.name = "half", .mode = cgt::FunctionMode::forward});
  REQUIRE_FALSE(forward.has_value());
  CHECK(forward.error().code == cgt::Errc::invalid_argument);
}

// The handles of training die in any order: with the pool handle and the optimizer handle
// dropped (in either order) once the step is made, the step trains on, equal to eager; with the
// step dropped first, the optimizer still steps eagerly. Nothing crashes, nothing stops training.
TEST_CASE("training/pool_and_optimizer_handles_dropped_in_every_order", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches({32, 16}, {32, 8});
  const Run eager = train<Mlp>(Method::eager_capturable, data);
  for (const bool pool_first : {true, false}) {
    INFO((pool_first ? "pool handle dropped first" : "optimizer handle dropped first"));
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto step = [&] {
      std::optional<cgt::torch::Pool> pool(must(cgt::torch::make_pool({.device = 0})));
      std::optional<cgt::torch::Adam> adam(must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3})));
      auto made = must(cgt::torch::make_training_step(*pool, *adam, [&](cgt::torch::Inputs in) {
        return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
      }));
      if (pool_first) {
        pool.reset();
        adam.reset();
      } else {
        adam.reset();
        pool.reset();
      }
      return made;
    }();
    Run run;
    for (const Batch& b : data) {
      auto out = step({b.x, b.y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<float>());
    }
    for (const auto& p : model->parameters()) run.params.push_back(p.detach().cpu());
    const Difference d = difference(run, eager);
    CHECK(d.loss <= 1e-5);
    CHECK(d.param <= 1e-5);
  }
  // The step dropped before the optimizer: its handle still updates the parameters eagerly.
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
  {
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto made = must(cgt::torch::make_training_step(pool, adam, [&](cgt::torch::Inputs in) {
      return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
    }));
    (void)must(made({data[0].x, data[0].y}));
  }
  const auto before = model->fc1->weight.detach().clone();
  torch::mse_loss(model->forward(data[1].x), data[1].y).backward();
  adam.step();
  CHECK_FALSE(torch::equal(model->fc1->weight.detach(), before));
}

namespace {

// A model whose loss reaches some parameters only: w1 [16, 32] and w2 [32, 8] always, `sometimes`
// [8] (a bias on the output) in batches of 8 rows only, `never` [8] not at all.
constexpr std::size_t sometimes = 2;
constexpr std::size_t never = 3;

std::vector<torch::Tensor> reach_initial() {
  torch::manual_seed(5);
  return {torch::randn({16, 32}, gpu) * 0.3, torch::randn({32, 8}, gpu) * 0.3, torch::randn({8}, gpu) * 0.1,
          torch::randn({8}, gpu)};
}

torch::Tensor reach_loss(const std::vector<torch::Tensor>& p, const torch::Tensor& x, const torch::Tensor& y) {
  torch::Tensor out = torch::tanh(x.matmul(p[0])).matmul(p[1]);
  // A host decision on the shape, which each shape's graph bakes in with its autograd graph.
  if (x.size(0) == 8) out = out + p[sometimes];
  return torch::mse_loss(out, y);
}

enum class Accumulation : std::uint8_t { none, per_call, in_one_call };

struct ReachMode {
  const char* what;
  Accumulation accumulation;
  int micro_batches;
};

constexpr int reach_steps = 8;

// The rows of micro-batch `m` of step `t`, which decide whether it reaches `sometimes`: without
// accumulation and in one call, the even steps do; one per call, the middle micro-batch of every
// step does (and no other: the stepping call must update what an earlier call of its step reached).
std::int64_t reach_rows(const ReachMode& mode, int t, int m) {
  if (mode.accumulation == Accumulation::per_call) return m == 1 ? 8 : 16;
  return t % 2 == 0 ? 8 : 16;
}

using ReachData = std::vector<std::vector<std::pair<torch::Tensor, torch::Tensor>>>;  // [step][micro-batch]

ReachData reach_data(const ReachMode& mode) {
  torch::manual_seed(6);
  ReachData data(reach_steps);
  for (int t = 0; t < reach_steps; ++t) {
    for (int m = 0; m < mode.micro_batches; ++m) {
      const std::int64_t rows = reach_rows(mode, t, m);
      data[static_cast<std::size_t>(t)].emplace_back(torch::randn({rows, 16}, gpu), torch::randn({rows, 8}, gpu));
    }
  }
  return data;
}

// What a run leaves per parameter, on the host: its value, how many steps updated it, and its
// optimizer state (Adam's moments; SGD's momentum buffer, no second).
struct ReachRun {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
  std::vector<double> steps;
  std::vector<torch::Tensor> first_moments;
  std::vector<torch::Tensor> second_moments;
};

constexpr double reach_lr_adam = 1e-2;
constexpr double reach_lr_sgd = 5e-2;
constexpr double reach_decay = 0.1;

ReachRun reach_graph(const ReachMode& mode, bool sgd, const ReachData& data) {
  std::vector<torch::Tensor> params;
  for (const auto& t : reach_initial()) params.push_back(t.clone().requires_grad_());
  std::optional<cgt::torch::Adam> adam;
  std::optional<cgt::torch::SGD> momentum;
  if (sgd) {
    momentum.emplace(
        must(cgt::torch::make_sgd(params, {.lr = reach_lr_sgd, .momentum = 0.9, .weight_decay = reach_decay})));
  } else {
    adam.emplace(must(cgt::torch::make_adam(
        params, {.lr = reach_lr_adam, .weight_decay = reach_decay, .decoupled_weight_decay = true})));
  }
  cgt::torch::Optimizer& optimizer = sgd ? static_cast<cgt::torch::Optimizer&>(*momentum) : *adam;
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, optimizer,
      [&params](cgt::torch::Inputs in) { return cgt::torch::Values{reach_loss(params, in[0], in[1])}; },
      cgt::torch::TrainingStepOptions{.micro_batches = mode.micro_batches,
                                      .all_in_one_call = mode.accumulation == Accumulation::in_one_call}));
  ReachRun run;
  for (const auto& micro : data) {
    if (mode.accumulation == Accumulation::per_call) {
      for (const auto& [x, y] : micro) {
        pool.mark_step_begin();
        auto out = step({x, y});
        if (!out) FAIL(out.error().describe());
        run.losses.push_back(must(out->take(0)).item<double>());
      }
      continue;
    }
    std::vector<torch::Tensor> xs, ys;
    for (const auto& [x, y] : micro) {
      xs.push_back(x);
      ys.push_back(y);
    }
    pool.mark_step_begin();
    auto out = step({torch::cat(xs), torch::cat(ys)});
    if (!out) FAIL(out.error().describe());
    run.losses.push_back(must(out->take(0)).item<double>());
  }
  CHECK(pool.stats().eager_calls == 0);
  run.params = training_test::host_copies(params);
  for (const auto& count : optimizer.steps()) run.steps.push_back(count.item<double>());
  if (adam) {
    run.first_moments = training_test::host_copies(adam->exp_avgs());
    run.second_moments = training_test::host_copies(adam->exp_avg_sqs());
  } else {  // SGD's buffers are not public: its checkpoint has them
    const training_test::TempFile file("step_reach_sgd");
    training_test::must(optimizer.save(file.path));
    torch::serialize::InputArchive archive;
    archive.load_from(file.path);
    for (std::size_t i = 0; i < params.size(); ++i) {
      c10::IValue buffer;
      archive.read("param." + std::to_string(i) + ".momentum_buffer", buffer);
      run.first_moments.push_back(buffer.toTensor());
    }
  }
  return run;
}

// Eager libtorch: zero_grad() (set to none, its default), each micro-batch's loss divided by their
// number before its backward, a step. A parameter no backward of the step reached has no `.grad`,
// and the step skips it.
ReachRun reach_libtorch(const ReachMode& mode, bool sgd, const ReachData& data) {
  std::vector<torch::Tensor> params;
  for (const auto& t : reach_initial()) params.push_back(t.clone().requires_grad_());
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (sgd) {
    optimizer = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(reach_lr_sgd).momentum(0.9).weight_decay(reach_decay));
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(reach_lr_adam).weight_decay(reach_decay));
  }
  ReachRun run;
  run.steps.assign(params.size(), 0);
  for (const auto& micro : data) {
    optimizer->zero_grad();
    std::vector<double> losses;
    for (const auto& [x, y] : micro) {
      const auto loss = reach_loss(params, x, y);
      (loss / mode.micro_batches).backward();
      losses.push_back(loss.item<double>());
    }
    if (mode.accumulation == Accumulation::per_call) {
      run.losses.insert(run.losses.end(), losses.begin(), losses.end());
    } else {
      double sum = 0;
      for (const double l : losses) sum += l;
      run.losses.push_back(sum / static_cast<double>(losses.size()));
    }
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i].grad().defined()) run.steps[i] += 1;
    }
    optimizer->step();
  }
  run.params = training_test::host_copies(params);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto found = optimizer->state().find(params[i].unsafeGetTensorImpl());
    if (found == optimizer->state().end()) {  // never stepped
      run.first_moments.push_back(torch::zeros_like(params[i]).cpu());
      if (!sgd) run.second_moments.push_back(torch::zeros_like(params[i]).cpu());
      continue;
    }
    if (sgd) {
      run.first_moments.push_back(
          static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer().detach().cpu());
    } else {
      const auto& state = static_cast<torch::optim::AdamWParamState&>(*found->second);
      CHECK(static_cast<double>(state.step()) == run.steps[i]);  // libtorch's count is ours
      run.first_moments.push_back(state.exp_avg().detach().cpu());
      run.second_moments.push_back(state.exp_avg_sq().detach().cpu());
    }
  }
  return run;
}

}  // namespace

// A parameter the loss never reaches stays as eager libtorch leaves it after zero_grad() (set to
// none): not decayed by AdamW, not moved by SGD's momentum and weight decay, its step count and
// moments 0; one the loss reaches in some steps only is updated in those only. Whole steps
// (`sometimes` in even steps), micro-batches one per call (`sometimes` by the middle micro-batch
// of each step only, which the stepping call must count) and all in one call (`sometimes` in even
// steps), each against eager libtorch over 8 steps; each row shape records its own graphs.
TEST_CASE("training/parameters_the_loss_does_not_reach_are_not_updated_as_in_eager", "[gpu][training]") {
  REQUIRE_GPU();
  const std::vector<torch::Tensor> initial = training_test::host_copies(reach_initial());
  for (const ReachMode& mode : {ReachMode{"whole steps", Accumulation::none, 1},
                                ReachMode{"3 micro-batches one per call", Accumulation::per_call, 3},
                                ReachMode{"2 micro-batches in one call", Accumulation::in_one_call, 2}}) {
    for (const bool sgd : {false, true}) {
      INFO(mode.what << ", " << (sgd ? "SGD with momentum and weight decay" : "AdamW"));
      const ReachData data = reach_data(mode);
      const ReachRun graph = reach_graph(mode, sgd, data);
      const ReachRun eager = reach_libtorch(mode, sgd, data);
      // The parameter never reached: exactly as it was, never counted, no state.
      CHECK(torch::equal(graph.params[never], initial[never]));
      CHECK(graph.steps[never] == 0);
      CHECK(graph.first_moments[never].abs().max().item<double>() == 0);
      if (!sgd) CHECK(graph.second_moments[never].abs().max().item<double>() == 0);
      // The one reached sometimes: counted as often as eager stepped it (half the steps, or all
      // through the middle micro-batch).
      CHECK(eager.steps[sometimes] == (mode.accumulation == Accumulation::per_call ? reach_steps : reach_steps / 2));
      CHECK(graph.steps == eager.steps);
      // Values: AdamW's fused kernel (or cgt's SGD formula) against libtorch's per-op one round
      // apart by a few float32 ulps of values below 1 a step; 1e-5 as the 100-step tests above.
      CHECK(training_test::max_difference(graph.losses, eager.losses) <= 1e-5);
      CHECK(training_test::max_difference(graph.params, eager.params) <= 1e-5);
      CHECK(training_test::max_difference(graph.first_moments, eager.first_moments) <= 1e-5);
      if (!sgd) CHECK(training_test::max_difference(graph.second_moments, eager.second_moments) <= 1e-5);
    }
  }
}
