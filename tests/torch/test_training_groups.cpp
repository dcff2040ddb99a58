// Training as recipes train: parameter groups (PyTorch's `param_groups`) with a weight decay and a
// learning rate of their own, as every AdamW recipe puts its biases and norm weights in a group
// without weight decay, and the grad scaler's state in checkpoints. A model with a LayerNorm
// trained with two groups (the matrices with weight decay at the options' rate, the vectors
// without at 3x the rate) through a whole-step graph and eagerly gives the losses and parameters
// of libtorch's AdamW and SGD built with the same `OptimizerParamGroup`s; a schedule scales both
// groups; a checkpoint carries the groups, and one of a float16 run the grad scaler's state too,
// so that resumed runs equal the uninterrupted ones exactly. The argument and file checks of
// groups without parameters need no device ([training]).
//
// Tolerances against libtorch: its AdamW computes the bias corrections and the update op by op in
// double and float32 arithmetic, where the graph runs the fused kernel (and SGD's update rounds
// the rate times the gradient once more): they round apart by a few float32 ulps of values below
// 1 each step, which 40 steps keep below 1e-5, as the 100-step tests of test_training_step.cpp.
// Between cgt's graph and cgt's optimizer stepped eagerly, and between a resumed run and the
// uninterrupted one, the kernels are the same on the same values: equal, exactly.
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::gpu;
using training_test::host_copies;
using training_test::max_difference;
using training_test::must;
using training_test::TempFile;

using Catch::Matchers::ContainsSubstring;

constexpr int steps = 40;

// 16 -> 64, LayerNorm, tanh -> 8: two weight matrices, and four vectors (two biases, the norm's
// weight and bias), the parameters an AdamW recipe keeps out of weight decay.
struct NormMlpImpl : torch::nn::Module {
  NormMlpImpl()
      : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})))),
        fc2(register_module("fc2", torch::nn::Linear(64, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2->forward(torch::tanh(norm->forward(fc1->forward(x)))); }
  torch::nn::Linear fc1;
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc2;
};
TORCH_MODULE(NormMlp);

// The model's parameters as a recipe groups them: matrices, then vectors, each in the model's order.
struct Split {
  std::vector<torch::Tensor> matrices;
  std::vector<torch::Tensor> vectors;
};

Split split(NormMlp& model) {
  Split out;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? out.matrices : out.vectors).push_back(p);
  return out;
}

// The parameters in the order cgt's optimizer lists them (group after group), on the host.
std::vector<torch::Tensor> grouped_params(NormMlp& model) {
  Split s = split(model);
  s.matrices.insert(s.matrices.end(), s.vectors.begin(), s.vectors.end());
  return host_copies(s.matrices);
}

// A recipe: the matrices take the options' rate and weight decay (their group sets neither), the
// vectors a rate and a weight decay of their own.
struct Recipe {
  const char* what;
  bool sgd;
  double lr;
  double weight_decay;
  double vector_lr;
  double vector_weight_decay;
};

constexpr Recipe adamw{"AdamW", false, 1e-3, 0.1, 3e-3, 0};
constexpr Recipe sgd_momentum{"SGD with momentum", true, 1e-2, 1e-3, 3e-2, 0};

std::unique_ptr<cgt::torch::Optimizer> make_cgt(const Recipe& r, NormMlp& model,
                                                cgt::torch::LossScaleOptions scaling = {}) {
  const Split s = split(model);
  std::vector<cgt::torch::ParamGroup> groups{
      {.params = s.matrices}, {.params = s.vectors, .lr = r.vector_lr, .weight_decay = r.vector_weight_decay}};
  if (r.sgd) {
    return std::make_unique<cgt::torch::SGD>(must(cgt::torch::make_sgd(
        std::move(groups), {.lr = r.lr, .momentum = 0.9, .weight_decay = r.weight_decay, .loss_scale = scaling})));
  }
  return std::make_unique<cgt::torch::Adam>(must(cgt::torch::make_adam(
      std::move(groups),
      {.lr = r.lr, .weight_decay = r.weight_decay, .decoupled_weight_decay = true, .loss_scale = scaling})));
}

// libtorch's optimizer with the same groups, each with its full options (a group's options replace
// the defaults in libtorch, they are not merged with them).
std::unique_ptr<torch::optim::Optimizer> make_libtorch(const Recipe& r, NormMlp& model) {
  const Split s = split(model);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (r.sgd) {
    const auto options = [](double lr, double decay) {
      return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(lr).momentum(0.9).weight_decay(decay));
    };
    groups.emplace_back(s.matrices, options(r.lr, r.weight_decay));
    groups.emplace_back(s.vectors, options(r.vector_lr, r.vector_weight_decay));
    return std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(r.lr));
  }
  const auto options = [](double lr, double decay) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(lr).weight_decay(decay));
  };
  groups.emplace_back(s.matrices, options(r.lr, r.weight_decay));
  groups.emplace_back(s.vectors, options(r.vector_lr, r.vector_weight_decay));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(r.lr));
}

// The vectors' rate over the options' rate, as cgt computes it when the optimizer is made.
double vector_factor(const Recipe& r) {
  return r.vector_lr / r.lr;
}

// Copies the archive `from` into `to` without the keys that begin with `left_out` (a file of an
// earlier version, say), tensors written as Optimizer::save writes them.
void copy_without(const std::string& from, const std::string& to, const std::vector<std::string>& left_out) {
  torch::serialize::InputArchive in;
  in.load_from(from);
  torch::serialize::OutputArchive out;
  for (const std::string& key : in.keys()) {
    if (std::ranges::any_of(left_out, [&key](const std::string& prefix) { return key.starts_with(prefix); })) {
      continue;
    }
    c10::IValue value;
    in.read(key, value);
    if (value.isTensor()) {
      out.write(key, value.toTensor());
    } else {
      out.write(key, value);
    }
  }
  out.save_to(to);
}

// A file as cgt wrote it before parameter groups: without "cgt.optimizer.groups" and "group.*".
void without_groups(const std::string& from, const std::string& to) {
  copy_without(from, to, {"cgt.optimizer.groups", "group."});
}

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches(int n) {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back({torch::randn({32, 16}, gpu), torch::randn({32, 8}, gpu)});
  return out;
}

torch::Tensor loss_of(NormMlp& model, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::mse_loss(model->forward(x), y);
}

struct Run {
  std::vector<float> losses;
  std::vector<torch::Tensor> params;  // in the optimizer's order: matrices, then vectors
  cgt::Stats stats;
};

// Eager libtorch; with a schedule, each group's rate of step t set by hand to the schedule's rate
// times the group's factor, as PyTorch's LambdaLR scales each group's initial rate.
Run train_libtorch(const Recipe& r, const cgt::torch::LrSchedule& schedule, const std::vector<Batch>& data) {
  torch::manual_seed(0);
  NormMlp model;
  model->to(gpu);
  auto optimizer = make_libtorch(r, model);
  Run run;
  for (std::size_t t = 0; t < data.size(); ++t) {
    if (schedule) {
      const double rate = schedule(static_cast<std::int64_t>(t));
      optimizer->param_groups()[0].options().set_lr(rate);
      optimizer->param_groups()[1].options().set_lr(rate * vector_factor(r));
    }
    optimizer->zero_grad(true);
    auto loss = loss_of(model, data[t].x, data[t].y);
    loss.backward();
    optimizer->step();
    run.losses.push_back(loss.item<float>());
  }
  run.params = grouped_params(model);
  return run;
}

// cgt: a whole-step graph (the schedule on the optimizer), or the optimizer stepped eagerly (the
// schedule's rate set before each step, as a loop that steps itself does).
Run train_cgt(const Recipe& r, bool graphed, const cgt::torch::LrSchedule& schedule, const std::vector<Batch>& data) {
  torch::manual_seed(0);
  NormMlp model;
  model->to(gpu);
  auto optimizer = make_cgt(r, model);
  Run run;
  if (graphed) {
    if (schedule) must(optimizer->set_schedule(schedule));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = must(cgt::torch::make_training_step(pool, *optimizer, [&model](cgt::torch::Inputs in) {
      return cgt::torch::Values{loss_of(model, in[0], in[1])};
    }));
    for (const Batch& b : data) {
      pool.mark_step_begin();
      auto out = step({b.x, b.y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<float>());
    }
    run.stats = pool.stats();
  } else {
    for (std::size_t t = 0; t < data.size(); ++t) {
      if (schedule) must(optimizer->set_lr(schedule(static_cast<std::int64_t>(t))));
      optimizer->zero_grad(false);
      auto loss = loss_of(model, data[t].x, data[t].y);
      loss.backward();
      optimizer->step();
      run.losses.push_back(loss.item<float>());
    }
  }
  if (schedule) {  // the last step's rates: the schedule's, and the vectors' times their factor
    const double last = schedule(static_cast<std::int64_t>(data.size()) - 1);
    CHECK(optimizer->lr() == last);
    CHECK(must(optimizer->group(0)).lr == last);
    CHECK(must(optimizer->group(1)).lr == last * vector_factor(r));
  }
  run.params = grouped_params(model);
  return run;
}

// The graph and the eager loop on cgt's optimizer against each other (equal) and against libtorch.
void groups_train_as_libtorch(const Recipe& r, const cgt::torch::LrSchedule& schedule) {
  INFO(r.what << (schedule ? ", warm-up + cosine" : ", constant rates"));
  const auto data = batches(steps);
  const Run libtorch = train_libtorch(r, schedule, data);
  const Run graph = train_cgt(r, true, schedule, data);
  const Run eager = train_cgt(r, false, schedule, data);
  CHECK(graph.stats.warmups == 1);
  CHECK(graph.stats.recordings == 1);  // a new rate, or a schedule's, never records again
  CHECK(graph.stats.replays == steps - 2);
  CHECK(max_difference(graph.losses, eager.losses) == 0);
  CHECK(max_difference(graph.params, eager.params) == 0);
  const double losses = max_difference(graph.losses, libtorch.losses);
  const double params = max_difference(graph.params, libtorch.params);
  WARN(r.what << " in two groups against libtorch's: loss " << losses << ", param " << params);
  CHECK(losses <= 1e-5);
  CHECK(params <= 1e-5);
}

// A warm-up + cosine of the options' rate (the vectors' group takes 3x each rate).
cgt::torch::LrSchedule cosine(const Recipe& r) {
  return cgt::torch::lr::warmup_cosine(r.lr, 5, steps, r.lr / 10);
}

}  // namespace

// What the groups are, as the optimizer holds them: the matrices' group takes the options' rate
// and weight decay, the vectors' group its own; params() lists the groups one after another.
TEST_CASE("training/groups: an optimizer holds its groups as given, unset fields the options'", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  NormMlp model;
  model->to(gpu);
  for (const Recipe& r : {adamw, sgd_momentum}) {
    INFO(r.what);
    auto optimizer = make_cgt(r, model);
    const Split s = split(model);
    REQUIRE(optimizer->group_count() == 2);
    const cgt::torch::ParamGroupInfo matrices = must(optimizer->group(0));
    const cgt::torch::ParamGroupInfo vectors = must(optimizer->group(1));
    CHECK(matrices.first == 0);
    CHECK(matrices.count == s.matrices.size());
    CHECK(matrices.weight_decay == r.weight_decay);
    CHECK(matrices.lr_factor == 1);
    CHECK(matrices.lr == r.lr);
    CHECK(vectors.first == s.matrices.size());
    CHECK(vectors.count == s.vectors.size());
    CHECK(vectors.weight_decay == r.vector_weight_decay);
    CHECK(vectors.lr_factor == vector_factor(r));
    CHECK(vectors.lr == r.lr * vector_factor(r));
    REQUIRE(optimizer->params().size() == s.matrices.size() + s.vectors.size());
    for (std::size_t i = 0; i < s.matrices.size(); ++i) CHECK(optimizer->params()[i].is_same(s.matrices[i]));
    for (std::size_t i = 0; i < s.vectors.size(); ++i) {
      CHECK(optimizer->params()[vectors.first + i].is_same(s.vectors[i]));
    }
    CHECK(optimizer->lr() == r.lr);  // the options' rate
  }
}

// AdamW (decoupled): the matrices with weight decay 0.1 at 1e-3, the vectors without at 3e-3.
TEST_CASE("training/groups: AdamW in two groups trains as libtorch's AdamW with the same param groups",
          "[gpu][training]") {
  REQUIRE_GPU();
  groups_train_as_libtorch(adamw, {});
}

TEST_CASE("training/groups: SGD with momentum in two groups trains as libtorch's SGD with the same param groups",
          "[gpu][training]") {
  REQUIRE_GPU();
  groups_train_as_libtorch(sgd_momentum, {});
}

// A schedule gives the options' rate; each group steps at it times its factor, with one recording.
TEST_CASE("training/groups: a schedule scales every group's rate as libtorch's groups scaled by hand",
          "[gpu][training]") {
  REQUIRE_GPU();
  groups_train_as_libtorch(adamw, cosine(adamw));
  groups_train_as_libtorch(sgd_momentum, cosine(sgd_momentum));
}

// The uninterrupted run saves at step 15 and trains on; fresh parameters (loaded in place), a
// fresh optimizer of the same groups (loaded from the file) and a fresh pool train steps 15..39 to
// the same losses and parameters, exactly, and the groups' rates go on from the file's step.
TEST_CASE("training/groups: a run in two groups resumed from a checkpoint trains as the uninterrupted run",
          "[gpu][training]") {
  REQUIRE_GPU();
  constexpr int stop = 15;
  const auto data = batches(steps);
  for (const Recipe& r : {adamw, sgd_momentum}) {
    INFO(r.what);
    const TempFile optimizer_file(std::string("groups_resume_optimizer_") + (r.sgd ? "sgd" : "adamw"));
    const TempFile model_file(std::string("groups_resume_model_") + (r.sgd ? "sgd" : "adamw"));
    const auto train = [&](int from, std::vector<float>& losses) {
      torch::manual_seed(from == 0 ? 0 : 7);  // a resumed run's own initial values must not matter
      NormMlp model;
      model->to(gpu);
      auto optimizer = make_cgt(r, model);
      if (from > 0) {
        must(cgt::torch::load_parameters_in_place(*model, model_file.path));
        must(optimizer->load(optimizer_file.path));
        CHECK(optimizer->scheduled_steps() == from);
        CHECK(must(optimizer->group(1)).lr == cosine(r)(from - 1) * vector_factor(r));
      }
      must(optimizer->set_schedule(cosine(r), optimizer->scheduled_steps()));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto step = must(cgt::torch::make_training_step(pool, *optimizer, [&model](cgt::torch::Inputs in) {
        return cgt::torch::Values{loss_of(model, in[0], in[1])};
      }));
      for (int t = from; t < steps; ++t) {
        if (t == stop && from == 0) {
          torch::save(model, model_file.path);
          must(optimizer->save(optimizer_file.path));
        }
        pool.mark_step_begin();
        auto out = step({data[t].x, data[t].y});
        if (!out) FAIL(out.error().describe());
        losses.push_back(must(out->take(0)).item<float>());
      }
      return grouped_params(model);
    };
    std::vector<float> whole;
    const auto whole_params = train(0, whole);
    std::vector<float> resumed;
    const auto resumed_params = train(stop, resumed);
    CHECK(max_difference(std::vector<float>(whole.begin() + stop, whole.end()), resumed) == 0);
    CHECK(max_difference(whole_params, resumed_params) == 0);
  }
}

// Refused when the optimizer is made, naming both places: a parameter in two groups, or twice in one.
TEST_CASE("training/groups: a parameter in two groups is refused", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  NormMlp model;
  model->to(gpu);
  const Split s = split(model);
  const auto refused = [](cgt::Result<cgt::torch::Adam> made, const std::string& says) {
    REQUIRE_FALSE(made);
    CHECK(made.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(made.error().message, ContainsSubstring(says));
  };
  std::vector<torch::Tensor> overlapping = s.vectors;
  overlapping.push_back(s.matrices[1]);  // group 1's parameter 4, the matrices' parameter 1
  refused(cgt::torch::make_adam({{.params = s.matrices}, {.params = overlapping, .weight_decay = 0.0}}),
          "parameter 6 (group 1's parameter 4) is parameter 1 (group 0's parameter 1): a parameter belongs to one "
          "group");
  refused(cgt::torch::make_adam({{.params = s.matrices}, {.params = {s.vectors[0], s.vectors[0]}}}),
          "parameter 3 (group 1's parameter 1) is parameter 2 (group 1's parameter 0)");
  auto sgd = cgt::torch::make_sgd({{.params = s.vectors}, {.params = s.vectors}}, {.lr = 0.1});
  REQUIRE_FALSE(sgd);
  CHECK(sgd.error().code == cgt::Errc::invalid_argument);
  CHECK_THAT(sgd.error().message, ContainsSubstring("(group 1's parameter 0) is parameter 0 (group 0's parameter 0)"));
}

// A file whose groups differ from the optimizer's (their count, a group's parameter count, weight
// decay or rate factor, or no groups at all where the optimizer has two) fails with
// invalid_argument naming what differs, and nothing changes: parameters, step counts, moments,
// the rate, the schedule's count. The optimizer's own file then loads.
TEST_CASE("training/groups: a checkpoint of other groups changes nothing", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  NormMlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(
      {{.params = split(model).matrices}, {.params = split(model).vectors, .lr = 3e-3, .weight_decay = 0.0}},
      {.lr = 1e-3, .weight_decay = 0.1, .decoupled_weight_decay = true}));
  const TempFile own("groups_refused_own");
  must(adam.save(own.path));  // the state of no step yet
  loss_of(model, torch::randn({4, 16}, gpu), torch::randn({4, 8}, gpu)).backward();
  adam.step();
  must(adam.set_schedule(cosine(adamw), 3));
  must(adam.set_lr(2e-3));
  const auto moments = host_copies(adam.exp_avgs());
  const auto params = host_copies(model->parameters());
  const auto unchanged = [&] {
    CHECK(max_difference(moments, host_copies(adam.exp_avgs())) == 0);
    CHECK(max_difference(params, host_copies(model->parameters())) == 0);
    for (const auto& count : adam.steps()) CHECK(count.item<float>() == 1);
    CHECK(adam.lr() == 2e-3);
    CHECK(must(adam.group(1)).lr == 2e-3 * (3e-3 / 1e-3));
    CHECK(adam.scheduled_steps() == 3);
  };
  const auto refused = [&](const std::string& path, const std::string& says) {
    INFO("refused: " << says);
    auto loaded = adam.load(path);
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(loaded.error().message, ContainsSubstring("Optimizer::load") && ContainsSubstring(says));
    unchanged();
  };
  // Files of optimizers over another model of the same shapes (one over this model would attach
  // its own gradients to these parameters).
  NormMlp other;
  other->to(gpu);
  const Split s = split(other);
  const auto file_of = [](const std::string& name, cgt::Result<cgt::torch::Adam> made) {
    auto file = std::make_unique<TempFile>(name);
    must(must(std::move(made)).save(file->path));
    return file;
  };
  const cgt::torch::AdamOptions options{.lr = 1e-3, .weight_decay = 0.1, .decoupled_weight_decay = true};
  std::vector<torch::Tensor> all = s.matrices;
  all.insert(all.end(), s.vectors.begin(), s.vectors.end());
  refused(file_of("groups_refused_one", cgt::torch::make_adam(all, options))->path,
          "the file holds 1 parameter groups, this optimizer 2");
  // The same parameters, in the same order, split after the third.
  const std::vector<torch::Tensor> three(all.begin(), all.begin() + 3);
  const std::vector<torch::Tensor> rest(all.begin() + 3, all.end());
  refused(
      file_of("groups_refused_split",
              cgt::torch::make_adam({{.params = three}, {.params = rest, .lr = 3e-3, .weight_decay = 0.0}}, options))
          ->path,
      "group 0 holds 3 parameters in the file, 2 here");
  refused(file_of("groups_refused_decay",
                  cgt::torch::make_adam(
                      {{.params = s.matrices}, {.params = s.vectors, .lr = 3e-3, .weight_decay = 0.01}}, options))
              ->path,
          "group 1's weight decay is 0.01 in the file, 0 here");
  refused(file_of("groups_refused_factor",
                  cgt::torch::make_adam({{.params = s.matrices}, {.params = s.vectors, .weight_decay = 0.0}}, options))
              ->path,
          "group 1's rate factor (its lr / the options' lr) is 1 in the file, 3");
  // A file written before groups: one group, which this optimizer of two is not.
  const TempFile before_groups("groups_refused_before_groups");
  without_groups(own.path, before_groups.path);
  refused(before_groups.path, "the file was written before parameter groups");

  must(adam.load(own.path));
  for (const auto& count : adam.steps()) CHECK(count.item<float>() == 0);
  CHECK(adam.lr() == 1e-3);
  CHECK(must(adam.group(1)).lr == 1e-3 * (3e-3 / 1e-3));
  CHECK(adam.scheduled_steps() == 0);
}

// A file written before groups existed (no group keys) is one group: it loads into an optimizer of
// one group, and its state is the file's.
TEST_CASE("training/groups: a checkpoint written before groups loads into an optimizer of one group",
          "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  NormMlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
  loss_of(model, torch::randn({4, 16}, gpu), torch::randn({4, 8}, gpu)).backward();
  adam.step();
  const TempFile file("groups_before_groups_source");
  must(adam.save(file.path));
  const auto moments = host_copies(adam.exp_avg_sqs());
  const TempFile before_groups("groups_before_groups");
  without_groups(file.path, before_groups.path);

  NormMlp other;
  other->to(gpu);
  auto fresh = must(cgt::torch::make_adam(other->parameters(), {.lr = 1e-3, .weight_decay = 0.5}));
  must(fresh.load(before_groups.path));
  CHECK(max_difference(moments, host_copies(fresh.exp_avg_sqs())) == 0);
  for (const auto& count : fresh.steps()) CHECK(count.item<float>() == 1);
}

// ---- the grad scaler's state in checkpoints --------------------------------------------------------

// float16 autocast with loss scaling, AdamW in two groups: an overflow injected at step 5 halves
// the scale and restarts its growth tracker, so the checkpoint of step 15 holds a scale, a tracker
// and a skip count that are not their first values. A fresh model (loaded in place), optimizer
// (loaded from the file) and pool go on from there: the scale of every step (grown after 20 steps
// in a row without an overflow, which the tracker counts across the checkpoint), the skips, the
// losses and every parameter equal the uninterrupted run's, exactly.
TEST_CASE("training/groups: an fp16 run with loss scaling resumed from a checkpoint trains as the uninterrupted run",
          "[gpu][training]") {
  REQUIRE_GPU();
  constexpr int stop = 15;
  constexpr int overflow_at = 5;
  constexpr cgt::torch::LossScaleOptions scaling{.dynamic = true, .growth_interval = 20};
  auto data = batches(steps);
  // Its loss stays finite in float32, its gradient times the scale overflows float16 on the way
  // back through the last layer (as test_training_amp.cpp's).
  data[overflow_at].y = data[overflow_at].y * 1e4;
  const TempFile optimizer_file("groups_fp16_optimizer");
  const TempFile model_file("groups_fp16_model");

  struct Fp16Run {
    std::vector<float> losses;
    std::vector<double> scales;         // after each step
    std::vector<std::int64_t> skipped;  // after each step
    std::vector<torch::Tensor> params;
  };
  const auto train = [&](int from) {
    torch::manual_seed(from == 0 ? 0 : 7);
    NormMlp model;
    model->to(gpu);
    auto adam = make_cgt(adamw, model, scaling);
    if (from > 0) {
      must(cgt::torch::load_parameters_in_place(*model, model_file.path));
      must(adam->load(optimizer_file.path));
    }
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = must(cgt::torch::make_training_step(
        pool, *adam, [&model](cgt::torch::Inputs in) { return cgt::torch::Values{loss_of(model, in[0], in[1])}; },
        cgt::torch::TrainingStepOptions{.autocast = at::kHalf}));
    Fp16Run run;
    for (int t = from; t < steps; ++t) {
      if (t == stop && from == 0) {
        torch::save(model, model_file.path);
        must(adam->save(optimizer_file.path));
        // What makes the checkpoint worth testing: the scaler is not where a fresh one starts.
        REQUIRE(adam->skipped_steps().item<std::int64_t>() >= 1);
        REQUIRE(adam->loss_scale().item<double>() < scaling.init_scale);
      }
      pool.mark_step_begin();
      auto out = step({data[t].x, data[t].y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<float>());
      run.scales.push_back(adam->loss_scale().item<double>());
      run.skipped.push_back(adam->skipped_steps().item<std::int64_t>());
    }
    run.params = grouped_params(model);
    return run;
  };
  const Fp16Run whole = train(0);
  const Fp16Run resumed = train(stop);
  const auto tail = [](const auto& all) { return std::vector(all.begin() + stop, all.end()); };
  CHECK(max_difference(tail(whole.losses), resumed.losses) == 0);
  CHECK(tail(whole.scales) == resumed.scales);
  CHECK(tail(whole.skipped) == resumed.skipped);
  CHECK(max_difference(whole.params, resumed.params) == 0);
  // The growth after the overflow came after the checkpoint: the tracker, not only the scale, was
  // carried over (a tracker of 0 would have grown the scale 9 steps later).
  CHECK(std::ranges::max(tail(whole.scales)) > whole.scales[stop]);
  WARN("fp16: skipped " << whole.skipped.back() << ", scale " << whole.scales[stop] << " at the checkpoint, "
                        << whole.scales.back() << " at the end");
}

// ---- no device ----------------------------------------------------------------------------------

// A group's options are checked when the optimizer is made, before its parameters: a rate of its
// own where the options' rate is 0 (it has no factor), a rate that is not one, a negative or
// infinite weight decay (eps, momentum). A group's lr unset where the options' is 0 is a group at rate 0.
TEST_CASE("training/groups: a group's rate needs the options' rate, and its options must be valid", "[training]") {
  const auto refused = [](const auto& made, const std::string& says) {
    REQUIRE_FALSE(made);
    CHECK(made.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(made.error().message, ContainsSubstring(says));
  };
  refused(cgt::torch::make_adam({{.params = {}}, {.params = {}, .lr = 3e-3}}, {.lr = 0}),
          "group 1 has an lr of its own (0.003) but the options' lr is 0");
  refused(cgt::torch::make_sgd({{.params = {}, .lr = 0.1}}, {.lr = 0}), "group 0 has an lr of its own");
  refused(cgt::torch::make_adam({{.params = {}, .lr = std::numeric_limits<double>::quiet_NaN()}}), "group 0's lr");
  refused(cgt::torch::make_adam({{.params = {}, .lr = -1e-3}}), "group 0's lr");
  refused(cgt::torch::make_adam({{.params = {}, .lr = 1e-3}, {.params = {}, .weight_decay = -0.1}}),
          "group 1's weight_decay must be finite and >= 0");
  refused(cgt::torch::make_sgd({{.params = {}, .weight_decay = std::numeric_limits<double>::quiet_NaN()}}, {.lr = 1}),
          "group 0's weight_decay");
  // An infinite weight decay, eps or momentum would turn every parameter into NaN at the first step.
  const double inf = std::numeric_limits<double>::infinity();
  refused(cgt::torch::make_adam({{.params = {}, .weight_decay = inf}}), "group 0's weight_decay must be finite");
  refused(cgt::torch::make_adam({{.params = {}}}, {.weight_decay = inf}), "weight_decay must be finite");
  refused(cgt::torch::make_adam({{.params = {}}}, {.eps = inf}), "eps and weight_decay must be finite");
  refused(cgt::torch::make_sgd({{.params = {}}}, {.lr = 1, .momentum = inf}),
          "momentum and weight_decay must be finite");
  refused(cgt::torch::make_sgd({{.params = {}}}, {.lr = 1, .weight_decay = inf}), "weight_decay must be finite");

  auto at_zero = must(cgt::torch::make_sgd({{.params = {}}}, {.lr = 0}));
  CHECK(must(at_zero.group(0)).lr == 0);
  CHECK(must(at_zero.group(0)).lr_factor == 1);
}

// The accessors on groups without parameters (no device): the count, each group's weight decay,
// factor and rate, which set_lr scales; a rate that a group's factor takes beyond float32 is
// refused, naming the group, and changes no rate; a handle without state has no groups.
TEST_CASE("training/groups: set_lr scales every group's rate, and refuses one a group cannot hold", "[training]") {
  auto adam = must(cgt::torch::make_adam({{.params = {}}, {.params = {}, .lr = 0.1, .weight_decay = 0.0}},
                                         {.lr = 1e-3, .weight_decay = 0.1}));
  REQUIRE(adam.group_count() == 2);
  CHECK(must(adam.group(0)).weight_decay == 0.1);
  CHECK(must(adam.group(1)).weight_decay == 0);
  CHECK(must(adam.group(1)).lr_factor == 0.1 / 1e-3);
  CHECK(must(adam.group(1)).count == 0);
  must(adam.set_lr(2e-3));
  CHECK(adam.lr() == 2e-3);
  CHECK(must(adam.group(0)).lr == 2e-3);
  CHECK(must(adam.group(1)).lr == 2e-3 * (0.1 / 1e-3));

  const double too_much = static_cast<double>(std::numeric_limits<float>::max()) / 10;  // a rate; x100 is not
  auto set = adam.set_lr(too_much);
  REQUIRE_FALSE(set);
  CHECK(set.error().code == cgt::Errc::invalid_argument);
  CHECK_THAT(set.error().message, ContainsSubstring("group 1's factor"));
  CHECK(adam.lr() == 2e-3);
  CHECK(must(adam.group(1)).lr == 2e-3 * (0.1 / 1e-3));

  auto beyond = adam.group(2);
  REQUIRE_FALSE(beyond);
  CHECK(beyond.error().code == cgt::Errc::invalid_argument);
  CHECK_THAT(beyond.error().message, ContainsSubstring("no group 2 of 2"));

  // One list is one group; no groups at all is an optimizer over no parameters.
  CHECK(must(cgt::torch::make_adam({})).group_count() == 1);
  CHECK(must(cgt::torch::make_sgd(std::vector<torch::Tensor>{}, {.lr = 0.1})).group_count() == 1);
  CHECK(must(cgt::torch::make_adam(std::vector<cgt::torch::ParamGroup>{})).group_count() == 0);
  cgt::torch::Adam none;
  CHECK(none.group_count() == 0);
  CHECK(none.group(0).error().code == cgt::Errc::invalid_argument);
}

// The groups' keys of a file, checked without a device on optimizers over no parameters: their
// count, a group's weight decay and factor (rates whose quotients are exact: 0.75 / 0.25 is 3); a
// file without groups loads into one group only. A refused load leaves the rate and the schedule's
// count; a file of the same groups loads, its rate scaled by the group's factor.
TEST_CASE("training/groups: a file's groups must be the optimizer's", "[training]") {
  const TempFile two("groups_file_two");
  must(must(cgt::torch::make_adam({{.params = {}}, {.params = {}, .lr = 0.75, .weight_decay = 0.0}}, {.lr = 0.25}))
           .save(two.path));
  const TempFile one("groups_file_one");
  must(must(cgt::torch::make_adam({}, {.lr = 0.25})).save(one.path));
  const TempFile before_groups("groups_file_before_groups");
  without_groups(one.path, before_groups.path);

  const auto refused = [](cgt::torch::Adam& adam, const std::string& path, const std::string& says) {
    INFO("refused: " << says);
    const double lr = adam.lr();
    auto loaded = adam.load(path);
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(loaded.error().message, ContainsSubstring("Optimizer::load") && ContainsSubstring(says));
    CHECK(adam.lr() == lr);
    CHECK(adam.scheduled_steps() == 4);
  };
  const auto with_schedule = [](cgt::Result<cgt::torch::Adam> made) {
    auto adam = must(std::move(made));
    must(adam.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 4));
    return adam;
  };
  auto single = with_schedule(cgt::torch::make_adam({}, {.lr = 0.5}));
  refused(single, two.path, "the file holds 2 parameter groups, this optimizer 1");
  must(single.load(before_groups.path));  // one group: whatever its weight decay
  CHECK(single.lr() == 0.25);

  const auto second_group = [&](double lr, double weight_decay) {
    return with_schedule(
        cgt::torch::make_adam({{.params = {}}, {.params = {}, .lr = lr, .weight_decay = weight_decay}}, {.lr = 0.5}));
  };
  auto decayed = second_group(1.5, 1e-4);
  refused(decayed, two.path, "group 1's weight decay is 0 in the file, 1e-04 here");
  auto faster = second_group(2.0, 0);
  refused(faster, two.path, "group 1's rate factor (its lr / the options' lr) is 3 in the file, 4 here");
  auto same = second_group(1.5, 0);  // the factor 3 too
  refused(same, one.path, "the file holds 1 parameter groups, this optimizer 2");
  refused(same, before_groups.path, "the file was written before parameter groups");
  must(same.load(two.path));
  CHECK(same.lr() == 0.25);
  CHECK(must(same.group(1)).lr == 0.75);
  CHECK(same.scheduled_steps() == 0);
}
