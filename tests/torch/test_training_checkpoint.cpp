// Checkpoints of training state: a run stopped at step 50 and resumed by a fresh program from the
// optimizer's checkpoint (Optimizer::save/load) and the model's file (torch::save, then
// load_parameters_in_place) trains as the uninterrupted run; loaded into the running step, the
// copies reach the recorded graph; a file that does not fit changes nothing. Why parameters are
// loaded in place, and the errors of files, need no device ([training]).
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <filesystem>
#include <functional>
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
using training_test::Mlp;
using training_test::must;
using training_test::TempFile;

using Catch::Matchers::ContainsSubstring;

constexpr int steps = 100;
constexpr int stop = 50;  // the step before which the checkpoint is taken

struct Batch {
  torch::Tensor x, y;
};

std::vector<Batch> batches() {
  torch::manual_seed(1);
  std::vector<Batch> out;
  for (int i = 0; i < steps; ++i) out.push_back({torch::randn({32, 16}, gpu), torch::randn({32, 8}, gpu)});
  return out;
}

const cgt::torch::LrSchedule schedule = cgt::torch::lr::warmup_cosine(3e-3, 10, steps, 3e-4);

cgt::torch::Adam make_adamw(Mlp& model) {
  auto adam = must(cgt::torch::make_adam(
      model->parameters(), {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0}));
  must(adam.set_schedule(schedule));
  return adam;
}

cgt::torch::TrainingStep make_step(cgt::torch::Pool& pool, cgt::torch::Optimizer& optimizer, Mlp& model) {
  return must(cgt::torch::make_training_step(pool, optimizer, [&model](cgt::torch::Inputs in) {
    return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
  }));
}

// Steps [from, to) of `data`, their losses appended to `losses`.
void train(cgt::torch::Pool& pool, const cgt::torch::TrainingStep& step, const std::vector<Batch>& data, int from,
           int to, std::vector<float>& losses) {
  for (int t = from; t < to; ++t) {
    pool.mark_step_begin();
    auto out = step({data[t].x, data[t].y});
    if (!out) FAIL(out.error().describe());
    losses.push_back(must(out->take(0)).item<float>());
  }
}

}  // namespace

// The uninterrupted run saves at step 50 and trains on; a fresh model, optimizer, pool and step,
// loaded from the two files, train steps 50..99 to the same losses and parameters.
TEST_CASE("training/a_run_resumed_from_a_checkpoint_trains_as_the_uninterrupted_run", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  const TempFile optimizer_file("checkpoint_adamw");
  const TempFile model_file("checkpoint_mlp");

  std::vector<float> whole;
  std::vector<torch::Tensor> whole_params;
  {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto adam = make_adamw(model);
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = make_step(pool, adam, model);
    train(pool, step, data, 0, stop, whole);
    must(adam.save(optimizer_file.path));
    torch::save(model, model_file.path);
    train(pool, step, data, stop, steps, whole);
    whole_params = host_copies(model->parameters());
    CHECK(pool.stats().recordings == 1);
  }

  torch::manual_seed(7);  // other initial parameters: only the files make the runs agree
  Mlp model;
  model->to(gpu);
  auto adam = make_adamw(model);
  must(adam.load(optimizer_file.path));
  must(cgt::torch::load_parameters_in_place(*model, model_file.path));
  CHECK(adam.scheduled_steps() == stop);
  CHECK(adam.lr() == schedule(stop - 1));
  for (const auto& count : adam.steps()) CHECK(count.item<float>() == stop);
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = make_step(pool, adam, model);
  std::vector<float> resumed;
  train(pool, step, data, stop, steps, resumed);

  const std::vector<float> second_half(whole.begin() + stop, whole.end());
  const double losses = max_difference(second_half, resumed);
  const double params = max_difference(whole_params, host_copies(model->parameters()));
  WARN("resumed against uninterrupted: loss " << losses << ", param " << params);
  CHECK(losses <= 1e-6);
  CHECK(params <= 1e-6);
  CHECK(resumed.back() < whole.front());
}

// Loaded into the running step, the copies land where the recorded graph reads: steps 50..59 taken
// again after loading the checkpoint of 50 give the losses of the first time, with no re-recording.
TEST_CASE("training/a_checkpoint_loaded_into_the_running_step_reaches_its_graph", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  const TempFile optimizer_file("checkpoint_adamw_running");
  const TempFile model_file("checkpoint_mlp_running");
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = make_adamw(model);
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = make_step(pool, adam, model);
  std::vector<float> before;
  train(pool, step, data, 0, stop, before);
  must(adam.save(optimizer_file.path));
  torch::save(model, model_file.path);
  const auto addresses = [&model] {
    std::vector<const void*> out;
    for (const auto& p : model->parameters()) out.push_back(p.data_ptr());
    return out;
  };
  const auto recorded_at = addresses();

  std::vector<float> first;
  train(pool, step, data, stop, stop + 10, first);
  const auto first_params = host_copies(model->parameters());
  must(adam.load(optimizer_file.path));
  must(cgt::torch::load_parameters_in_place(*model, model_file.path));
  CHECK(addresses() == recorded_at);
  CHECK(adam.scheduled_steps() == stop);
  std::vector<float> again;
  train(pool, step, data, stop, stop + 10, again);

  CHECK(max_difference(first, again) <= 1e-6);
  CHECK(max_difference(first_params, host_copies(model->parameters())) <= 1e-6);
  CHECK(pool.stats().warmups == 1);
  CHECK(pool.stats().recordings == 1);
}

// SGD with momentum: the buffers and step counts come back, and a fresh run goes on as the first.
TEST_CASE("training/sgd_with_momentum_resumes_from_a_checkpoint", "[gpu][training]") {
  REQUIRE_GPU();
  const auto data = batches();
  const TempFile optimizer_file("checkpoint_sgd");
  const TempFile model_file("checkpoint_mlp_sgd");
  const auto make_sgd = [](Mlp& model) {
    return must(cgt::torch::make_sgd(model->parameters(), {.lr = 1e-2, .momentum = 0.9, .weight_decay = 1e-3}));
  };
  std::vector<float> whole;
  std::vector<torch::Tensor> whole_params;
  {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto sgd = make_sgd(model);
    must(sgd.set_lr(2e-2));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = make_step(pool, sgd, model);
    train(pool, step, data, 0, 20, whole);
    must(sgd.save(optimizer_file.path));
    torch::save(model, model_file.path);
    train(pool, step, data, 20, 40, whole);
    whole_params = host_copies(model->parameters());
  }
  torch::manual_seed(7);
  Mlp model;
  model->to(gpu);
  auto sgd = make_sgd(model);
  must(sgd.load(optimizer_file.path));
  must(cgt::torch::load_parameters_in_place(*model, model_file.path));
  CHECK(sgd.lr() == 2e-2);  // the rate set before the checkpoint, not the options'
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = make_step(pool, sgd, model);
  std::vector<float> resumed;
  train(pool, step, data, 20, 40, resumed);
  CHECK(max_difference(std::vector<float>(whole.begin() + 20, whole.end()), resumed) <= 1e-6);
  CHECK(max_difference(whole_params, host_copies(model->parameters())) <= 1e-6);
}

// A file of another kind of optimizer, of other state lists or of other shapes fails with
// invalid_argument naming what differs, and the optimizer is as it was; so does a missing file,
// and a load inside a pool function's recording.
TEST_CASE("training/a_checkpoint_that_does_not_fit_changes_nothing", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 1e-3}));
  // Some state to see unchanged: one step.
  torch::mse_loss(model->forward(torch::randn({4, 16}, gpu)), torch::randn({4, 8}, gpu)).backward();
  adam.step();
  must(adam.set_schedule(schedule, 3));
  const auto moments = host_copies(adam.exp_avgs());
  const auto params = host_copies(model->parameters());
  const auto unchanged = [&] {
    CHECK(max_difference(moments, host_copies(adam.exp_avgs())) == 0);
    CHECK(max_difference(params, host_copies(model->parameters())) == 0);
    for (const auto& count : adam.steps()) CHECK(count.item<float>() == 1);
    CHECK(adam.lr() == 1e-3);
    CHECK(adam.scheduled_steps() == 3);
  };
  const auto refused = [&](const std::string& path, const std::string& says) {
    auto loaded = adam.load(path);
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(loaded.error().message, ContainsSubstring("Optimizer::load") && ContainsSubstring(says));
    unchanged();
  };

  const TempFile sgd_file("checkpoint_other_kind");
  must(must(cgt::torch::make_sgd(model->parameters(), {.lr = 1e-2, .momentum = 0.9})).save(sgd_file.path));
  refused(sgd_file.path, "'sgd'");

  const TempFile amsgrad_file("checkpoint_amsgrad");
  {
    Mlp same;
    same->to(gpu);
    must(must(cgt::torch::make_adam(same->parameters(), {.amsgrad = true})).save(amsgrad_file.path));
  }
  refused(amsgrad_file.path, "amsgrad");

  const TempFile shapes_file("checkpoint_other_shapes");
  {
    Mlp wider(32);
    wider->to(gpu);
    must(must(cgt::torch::make_adam(wider->parameters())).save(shapes_file.path));
  }
  refused(shapes_file.path, "parameter 0");

  const TempFile model_file("checkpoint_not_an_optimizer");
  torch::save(model, model_file.path);
  refused(model_file.path, "not a checkpoint of a cgt optimizer");

  refused((std::filesystem::temp_directory_path() / "cgt_checkpoint_missing.pt").string(), "cannot read");

  // Inside a function, a warm-up may load (nothing is recorded); a recording may not.
  const TempFile own_file("checkpoint_own");
  must(adam.save(own_file.path));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  std::vector<std::optional<cgt::Errc>> seen;
  auto f = must(pool.add_function([&](cgt::torch::Inputs in) {
    auto loaded = adam.load(own_file.path);
    seen.push_back(loaded ? std::nullopt : std::optional(loaded.error().code));
    return cgt::torch::Values{in[0] * 2};
  }));
  const auto x = torch::ones({4}, gpu);
  for (int i = 0; i < 2; ++i) must(f({x}));
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::nullopt);                 // the warm-up
  CHECK(seen[1] == cgt::Errc::invalid_argument);  // the recording
  unchanged();
}

// Why parameters are loaded with load_parameters_in_place: torch::load points each parameter at
// new memory (a recorded graph keeps the old address), load_parameters_in_place copies into it.
TEST_CASE("training/load_parameters_in_place_keeps_the_addresses_torch_load_replaces", "[training]") {
  const TempFile file("checkpoint_cpu_mlp");
  torch::manual_seed(0);
  Mlp saved;
  torch::save(saved, file.path);
  const auto values = host_copies(saved->parameters());

  Mlp model;  // other values
  const auto addresses = [&model] {
    std::vector<const void*> out;
    for (const auto& p : model->parameters()) out.push_back(p.data_ptr());
    return out;
  };
  const auto before = addresses();
  REQUIRE(max_difference(values, host_copies(model->parameters())) > 0);
  must(cgt::torch::load_parameters_in_place(*model, file.path));
  CHECK(addresses() == before);
  CHECK(max_difference(values, host_copies(model->parameters())) == 0);

  Mlp replaced;
  std::vector<const void*> old;
  for (const auto& p : replaced->parameters()) old.push_back(p.data_ptr());
  torch::load(replaced, file.path);
  std::vector<const void*> now;
  for (const auto& p : replaced->parameters()) now.push_back(p.data_ptr());
  CHECK(now != old);  // the file's memory: what a recorded graph would no longer read
}

TEST_CASE("training/load_parameters_in_place_refuses_a_file_that_does_not_fit", "[training]") {
  torch::manual_seed(0);
  Mlp model;
  const auto values = host_copies(model->parameters());
  const auto refused = [&](cgt::Result<void> loaded, const std::string& says) {
    REQUIRE_FALSE(loaded);
    CHECK(loaded.error().code == cgt::Errc::invalid_argument);
    CHECK_THAT(loaded.error().message, ContainsSubstring("load_parameters_in_place") && ContainsSubstring(says));
    CHECK(max_difference(values, host_copies(model->parameters())) == 0);
  };
  const std::string missing = (std::filesystem::temp_directory_path() / "cgt_checkpoint_missing.pt").string();
  refused(cgt::torch::load_parameters_in_place(*model, missing), "cannot read");

  const TempFile wider_file("checkpoint_wider");
  torch::save(Mlp(32), wider_file.path);
  refused(cgt::torch::load_parameters_in_place(*model, wider_file.path), "fc1.weight");

  // A list of tensors, as torch::save(tensors) writes it: by count, then by index.
  const TempFile list_file("checkpoint_list");
  torch::save(std::vector<torch::Tensor>{torch::ones({2, 3}), torch::ones({4})}, list_file.path);
  refused(cgt::torch::load_parameters_in_place(model->parameters(), list_file.path), "holds 2 tensors");
  std::vector<torch::Tensor> tensors{torch::zeros({2, 3}), torch::zeros({4})};
  const void* first = tensors[0].data_ptr();
  must(cgt::torch::load_parameters_in_place(tensors, list_file.path));
  CHECK(tensors[0].data_ptr() == first);
  CHECK(tensors[0].sum().item<float>() == 6);
  CHECK(tensors[1].sum().item<float>() == 4);
}

TEST_CASE("training/checkpoints_of_a_handle_without_state_fail", "[training]") {
  const TempFile file("checkpoint_no_state");
  cgt::torch::Adam none;
  CHECK(none.save(file.path).error().code == cgt::Errc::invalid_argument);
  CHECK(none.load(file.path).error().code == cgt::Errc::invalid_argument);
  CHECK_THAT(none.load(file.path).error().message, ContainsSubstring("Optimizer::load"));
}
