// Checkpoint files that do not fit or are broken: optimizer files truncated, tampered key by key,
// of another kind, shape or dtype, with or without the grad scaler's state, and parameter files
// whose last layer does not fit: a load checks the whole file first, so a refused one changes no
// state tensor, rate, count or parameter; targets in odd layouts receive the values in their
// logical order. Each test states the promise it tries to break (from modules/cgt.torch-optim.inc
// and docs/training.md) and checks what a user relies on: values, errors, and which state holds
// after. Tagged [training]; those that need a GPU [gpu] too (SKIPPED without one).
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_checks.hpp"
#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::error_of;
using training_test::expect_error;
using training_test::gpu;
using training_test::host_copies;
using training_test::infinity;
using training_test::Mlp;
using training_test::most_scheduled_steps;
using training_test::must;
using training_test::not_a_number;
using training_test::same;
using training_test::TempFile;

using Catch::Matchers::ContainsSubstring;

// ---- checkpoint files, read and rewritten ------------------------------------------------------

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// What a key of an archive becomes in its copy: the value to write instead, or none to leave it out.
using Tamper = std::function<std::optional<c10::IValue>(const std::string& key, const c10::IValue& value)>;

void put(torch::serialize::OutputArchive& archive, const std::string& key, const c10::IValue& value) {
  if (value.isTensor()) {
    archive.write(key, value.toTensor());  // as Optimizer::save writes its tensors
  } else {
    archive.write(key, value);
  }
}

// Copies the archive `from` into `to`, every key through `tamper` (none: unchanged), then `extra`.
void rewrite(const std::string& from, const std::string& to, const Tamper& tamper,
             const std::vector<std::pair<std::string, c10::IValue>>& extra = {}) {
  torch::serialize::InputArchive in;
  in.load_from(from);
  torch::serialize::OutputArchive out;
  for (const std::string& key : in.keys()) {
    c10::IValue value;
    in.read(key, value);
    const std::optional<c10::IValue> written = tamper ? tamper(key, value) : std::optional<c10::IValue>(value);
    if (written) put(out, key, *written);
  }
  for (const auto& [key, value] : extra) put(out, key, value);
  out.save_to(to);
}

// A tamper that changes one key.
Tamper replacing(const std::string& which, c10::IValue by) {
  return [which, by = std::move(by)](const std::string& key, const c10::IValue& value) -> std::optional<c10::IValue> {
    return key == which ? by : value;
  };
}

// A tamper that leaves one key out.
Tamper dropping(const std::string& which) {
  return [which](const std::string& key, const c10::IValue& value) -> std::optional<c10::IValue> {
    if (key == which) return std::nullopt;
    return value;
  };
}

}  // namespace

// ---- checkpoints (no device) ---------------------------------------------------------------------

// Optimizer::load reads and checks the whole file before it changes anything: a file that is
// broken (truncated, empty, not an archive, a directory), not an optimizer's, of another kind, or
// whose every key is right but one (format, kind, count, lists, a rate that is NaN, negative,
// beyond float32's range or not a number, a step count below 0 or above 2^62) fails with
// invalid_argument naming what differs, and the rate and the schedule's count stay. The same file
// untampered, with a key more (a later version's), and with a count of 2^62, loads. An optimizer
// over no parameters needs no device.
TEST_CASE("training/files: broken and tampered optimizer files change nothing", "[training]") {
  const TempFile good("hostile_file_good");
  {
    auto source = must(cgt::torch::make_adam({}, {.lr = 0.01}));
    must(source.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 7));
    must(source.save(good.path));
  }
  auto adam = must(cgt::torch::make_adam({}, {.lr = 0.02}));
  must(adam.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 2));
  const auto refused = [&adam](const std::string& path, const std::string& says) {
    INFO("refused: " << says);
    const auto loaded = adam.load(path);
    expect_error(loaded, cgt::Errc::invalid_argument, says);
    CHECK_THAT(loaded.error().message, ContainsSubstring("Optimizer::load"));
    CHECK(adam.lr() == 0.02);
    CHECK(adam.scheduled_steps() == 2);
  };
  const std::string bytes = read_bytes(good.path);
  REQUIRE(bytes.size() > 64);

  const TempFile broken("hostile_file_broken");
  write_bytes(broken.path, bytes.substr(0, bytes.size() / 2));
  refused(broken.path, "cannot read");
  write_bytes(broken.path, bytes.substr(0, bytes.size() - 1));
  refused(broken.path, "cannot read");
  write_bytes(broken.path, "");
  refused(broken.path, "cannot read");
  write_bytes(broken.path, "not an archive at all, but some text that is long enough to be read as one\n");
  refused(broken.path, "cannot read");
  refused(std::filesystem::temp_directory_path().string(), "cannot read");  // a directory

  const TempFile tensors("hostile_file_tensors");
  torch::save(std::vector<torch::Tensor>{torch::ones({2})}, tensors.path);
  refused(tensors.path, "not a checkpoint of a cgt optimizer");
  const TempFile sgd_file("hostile_file_sgd");
  must(must(cgt::torch::make_sgd({}, {.lr = 0.5})).save(sgd_file.path));
  refused(sgd_file.path, "'sgd'");

  const TempFile tampered("hostile_file_tampered");
  const auto refused_with = [&](const Tamper& tamper, const std::string& says) {
    rewrite(good.path, tampered.path, tamper);
    refused(tampered.path, says);
  };
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(not_a_number)), "learning rate");
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(-1.0)), "learning rate");
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(infinity)), "learning rate");
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(1e300)), "learning rate");
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(std::string("0.1"))), "'cgt.optimizer.lr' is not a number");
  refused_with(dropping("cgt.optimizer.lr"), "'cgt.optimizer.lr'");
  refused_with(replacing("cgt.optimizer.scheduled_steps", c10::IValue(std::int64_t{-3})), "scheduled steps");
  // Counts above 2^62 (the most a schedule counts: the count could overflow) are refused.
  refused_with(replacing("cgt.optimizer.scheduled_steps", c10::IValue(std::numeric_limits<std::int64_t>::max())),
               "scheduled steps");
  refused_with(replacing("cgt.optimizer.scheduled_steps", c10::IValue(most_scheduled_steps + 1)), "scheduled steps");
  refused_with(replacing("cgt.optimizer.format", c10::IValue(std::int64_t{2})), "newer");
  refused_with(dropping("cgt.optimizer.format"), "'cgt.optimizer.format'");
  refused_with(dropping("cgt.optimizer.kind"), "not a checkpoint of a cgt optimizer");
  refused_with(replacing("cgt.optimizer.kind", c10::IValue(std::string("rmsprop"))), "'rmsprop'");
  refused_with(replacing("cgt.optimizer.params", c10::IValue(std::int64_t{1})), "holds 1 parameters");
  refused_with(replacing("cgt.optimizer.state", c10::IValue(std::string("exp_avg"))), "exp_avg_sq");

  // The copy unchanged loads (the rewrite is faithful), and so does one with a key more.
  rewrite(good.path, tampered.path, {}, {{"cgt.scaler.later", c10::IValue(std::int64_t{5})}});
  must(adam.load(tampered.path));
  CHECK(adam.lr() == 0.01);
  CHECK(adam.scheduled_steps() == 7);
  // The most a schedule counts loads.
  rewrite(good.path, tampered.path, replacing("cgt.optimizer.scheduled_steps", c10::IValue(most_scheduled_steps)));
  must(adam.load(tampered.path));
  CHECK(adam.scheduled_steps() == most_scheduled_steps);
}

// load_parameters_in_place reads and checks the whole file first: a file whose first layers fit
// and whose last does not (a shape, or the dtype) fails naming that layer, and no parameter is
// changed, not even those that fit; a truncated file changes nothing either. Targets in odd layouts
// (a transposed view, a strided view with gaps) receive the file's values in their logical order,
// at their addresses, and the gaps between their elements are left alone.
TEST_CASE("training/files: load_parameters_in_place changes nothing or everything, in any layout", "[training]") {
  struct NarrowImpl : torch::nn::Module {  // Mlp's names, its last layer 4 wide instead of 8
    NarrowImpl()
        : fc1(register_module("fc1", torch::nn::Linear(16, 64))),
          fc2(register_module("fc2", torch::nn::Linear(64, 64))),
          fc3(register_module("fc3", torch::nn::Linear(64, 4))) {}
    torch::nn::Linear fc1, fc2, fc3;
  };
  torch::manual_seed(0);
  Mlp model;
  const auto values = host_copies(model->parameters());
  const auto unchanged = [&] { CHECK(same(values, host_copies(model->parameters()))); };

  const TempFile narrow_file("hostile_narrow_model");
  torch::save(std::make_shared<NarrowImpl>(), narrow_file.path);
  auto narrow = cgt::torch::load_parameters_in_place(*model, narrow_file.path);
  expect_error(narrow, cgt::Errc::invalid_argument, "fc3.weight");
  unchanged();  // fc1 and fc2 fit, and were not copied either

  const TempFile double_file("hostile_double_model");
  {
    Mlp twice;
    twice->to(torch::kDouble);
    torch::save(twice, double_file.path);
  }
  expect_error(cgt::torch::load_parameters_in_place(*model, double_file.path), cgt::Errc::invalid_argument, "Double");
  unchanged();

  const TempFile whole_file("hostile_whole_model");
  Mlp other;
  torch::save(other, whole_file.path);
  const std::string bytes = read_bytes(whole_file.path);
  const TempFile truncated("hostile_truncated_model");
  write_bytes(truncated.path, bytes.substr(0, bytes.size() * 3 / 4));
  expect_error(cgt::torch::load_parameters_in_place(*model, truncated.path), cgt::Errc::invalid_argument,
               "cannot read");
  unchanged();
  must(cgt::torch::load_parameters_in_place(*model, whole_file.path));  // the whole file: everything
  CHECK(same(host_copies(other->parameters()), host_copies(model->parameters())));

  // Odd layouts: a transposed view and every other element of a buffer receive the file's values.
  const auto matrix = torch::arange(12, torch::kFloat).reshape({3, 4});
  const auto row = torch::arange(5, torch::kFloat) + 100;
  const TempFile list_file("hostile_odd_layouts");
  torch::save(std::vector<torch::Tensor>{matrix, row}, list_file.path);
  auto transposed_storage = torch::zeros({4, 3});
  auto strided_storage = torch::full({10}, -1.0);
  const std::vector<torch::Tensor> targets{transposed_storage.t(), strided_storage.slice(0, 0, 10, 2)};
  const void* first = targets[0].data_ptr();
  must(cgt::torch::load_parameters_in_place(targets, list_file.path));
  CHECK(targets[0].data_ptr() == first);
  CHECK(torch::equal(targets[0], matrix));
  CHECK(torch::equal(transposed_storage, matrix.t()));
  CHECK(torch::equal(targets[1], row));
  CHECK(torch::equal(strided_storage.slice(0, 1, 10, 2), torch::full({5}, -1.0)));  // the gaps
}

// ---- checkpoints that do not fit (GPU) -----------------------------------------------------------

namespace {

// Everything an Adam with loss scaling keeps that a load could change, as host copies.
struct AdamSnapshot {
  std::vector<torch::Tensor> params, steps, exp_avgs, exp_avg_sqs;
  double lr = 0;
  std::int64_t scheduled = 0;
  double scale = 0;
  std::int64_t skipped = 0;
};

AdamSnapshot snapshot(Mlp& model, const cgt::torch::Adam& adam) {
  return {host_copies(model->parameters()),
          host_copies(adam.steps()),
          host_copies(adam.exp_avgs()),
          host_copies(adam.exp_avg_sqs()),
          adam.lr(),
          adam.scheduled_steps(),
          adam.loss_scale().item<double>(),
          adam.skipped_steps().item<std::int64_t>()};
}

void check_same(const AdamSnapshot& a, const AdamSnapshot& b) {
  CHECK(same(a.params, b.params));
  CHECK(same(a.steps, b.steps));
  CHECK(same(a.exp_avgs, b.exp_avgs));
  CHECK(same(a.exp_avg_sqs, b.exp_avg_sqs));
  CHECK(a.lr == b.lr);
  CHECK(a.scheduled == b.scheduled);
  CHECK(a.scale == b.scale);
  CHECK(a.skipped == b.skipped);
}

// One eager step of `adam` on a batch, its loss times the loss scale where it scales the loss (and
// times `factor`: 1e38 overflows the scaled loss), as a program that steps the optimizer itself does.
void eager_scaled_step(Mlp& model, cgt::torch::Adam& adam, int seed, double factor = 1) {
  torch::manual_seed(seed);
  const auto x = torch::randn({8, 16}, gpu);
  const auto y = torch::randn({8, 8}, gpu);
  adam.zero_grad(false);
  const auto loss = torch::mse_loss(model->forward(x), y) * factor;
  (adam.scales_loss() ? loss * adam.loss_scale() : loss).backward();
  adam.step();
}

}  // namespace

// An AdamW with loss scaling saves after 2 steps, then takes an overflowing step (skipped: the scale
// halves) and a normal one, and its rate and schedule change. Files that do not fit fail with
// invalid_argument naming what differs, and everything stays as it was: the parameters, the step
// counts, both moments, the rate, the schedule's count, the scale and the skips. Each file differs
// from the good one in one thing, found after the first parameters' tensors fit (a load that
// copied as it read would have changed those): a later parameter's moment of another shape, a
// step count of another dtype, a tensor left out, the rate (NaN, or finite but beyond float32's
// range) or the count out of range, the loss scale's tensors of another shape or dtype; and whole
// files: truncated, of fewer parameters, of float64 parameters, of SGD. A save inside a recording is refused too. The
// good file then loads.
TEST_CASE("training/files: optimizer files that do not fit leave every state tensor as it was", "[gpu][training]") {
  REQUIRE_GPU();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  const cgt::torch::AdamOptions options{.lr = 1e-3,
                                        .weight_decay = 1e-2,
                                        .decoupled_weight_decay = true,
                                        .loss_scale = {.dynamic = true, .init_scale = 1024}};
  auto adam = must(cgt::torch::make_adam(model->parameters(), options));
  const auto schedule = cgt::torch::lr::linear(1e-3, 1e-4, 100);
  eager_scaled_step(model, adam, 1);
  eager_scaled_step(model, adam, 2);
  must(adam.set_schedule(schedule, 2));
  const TempFile good("hostile_adam_good");
  must(adam.save(good.path));
  const AdamSnapshot saved = snapshot(model, adam);
  eager_scaled_step(model, adam, 3, 1e38);  // skipped: the scale halves, the counts stay
  eager_scaled_step(model, adam, 4);
  must(adam.set_lr(5e-4));
  must(adam.set_schedule(schedule, 9));
  const AdamSnapshot now = snapshot(model, adam);
  REQUIRE(now.scale == 512);
  REQUIRE(now.skipped == 1);
  REQUIRE(now.steps[0].item<float>() == 3);

  const auto refused = [&](const std::string& path, const std::string& says) {
    INFO("refused: " << says);
    expect_error(adam.load(path), cgt::Errc::invalid_argument, says);
    check_same(now, snapshot(model, adam));
  };
  const TempFile tampered("hostile_adam_tampered");
  const auto refused_with = [&](const Tamper& tamper, const std::string& says) {
    rewrite(good.path, tampered.path, tamper);
    refused(tampered.path, says);
  };
  const std::size_t last = model->parameters().size() - 1;
  refused_with(replacing("param.1.exp_avg", c10::IValue(torch::zeros({3, 3}))), "parameter 1's exp_avg");
  refused_with(replacing("param.2.step", c10::IValue(torch::zeros({}, torch::kDouble))), "parameter 2's step");
  refused_with(dropping("param." + std::to_string(last) + ".exp_avg_sq"),
               "'param." + std::to_string(last) + ".exp_avg_sq'");
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(not_a_number)), "learning rate");
  // A rate finite as a double but beyond float32's range, which the device's rate cannot hold: it
  // is refused with the rest of the file, before the step counts and moments are copied.
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(1e300)), "learning rate");
  refused_with(replacing("cgt.optimizer.lr", c10::IValue(2.0 * static_cast<double>(std::numeric_limits<float>::max()))),
               "learning rate");
  refused_with(replacing("cgt.optimizer.scheduled_steps", c10::IValue(std::int64_t{-1})), "scheduled steps");
  refused_with(replacing("cgt.scaler.scale", c10::IValue(torch::ones({2}))), "loss scale's scale");
  refused_with(replacing("cgt.scaler.skipped", c10::IValue(torch::zeros({}))), "loss scale's skipped");

  const std::string bytes = read_bytes(good.path);
  write_bytes(tampered.path, bytes.substr(0, bytes.size() * 9 / 10));
  refused(tampered.path, "cannot read");

  const TempFile fewer("hostile_adam_fewer");
  const TempFile twice("hostile_adam_double");
  const TempFile sgd_file("hostile_adam_sgd");
  {
    Mlp other;
    other->to(gpu);
    const auto params = other->parameters();
    must(must(cgt::torch::make_adam(std::vector<torch::Tensor>(params.begin(), params.begin() + 5), options))
             .save(fewer.path));
    Mlp wide;
    wide->to(gpu, torch::kDouble);
    must(must(cgt::torch::make_adam(wide->parameters(), options)).save(twice.path));
    must(must(cgt::torch::make_sgd(other->parameters(), {.lr = 0.1})).save(sgd_file.path));
  }
  refused(fewer.path, "holds 5 parameters");
  refused(twice.path, "Double");
  refused(sgd_file.path, "'sgd'");

  // Inside a function, a warm-up may save (nothing is recorded); a recording may not.
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  std::vector<std::optional<cgt::Errc>> seen;
  auto f = must(pool.add_function([&](cgt::torch::Inputs in) {
    torch::serialize::OutputArchive archive;
    seen.push_back(error_of(adam.save(archive)));
    return cgt::torch::Values{in[0] * 2};
  }));
  const auto one = torch::ones({4}, gpu);
  for (int i = 0; i < 2; ++i) must(f({one}));
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == std::nullopt);
  CHECK(seen[1] == cgt::Errc::invalid_argument);

  // The good file, rewritten untouched, loads: the state of step 2, the scale of then included.
  rewrite(good.path, tampered.path, {});
  must(adam.load(tampered.path));
  AdamSnapshot loaded = snapshot(model, adam);
  loaded.params = saved.params;  // the parameters are the model file's business, not the optimizer's
  check_same(saved, loaded);
  CHECK(same(now.params, host_copies(model->parameters())));
}

// The grad scaler's keys are in a file where its optimizer scaled the loss (cgt.torch-optim.inc,
// Optimizer::load): a file without them loads into an optimizer with loss scaling (the scale and
// the skips stay as they were, as a fresh GradScaler beside a loaded optimizer), a file with them
// into one with takes the file's scale and skips, and a file with them into an optimizer without
// is refused (the float16 run's scale would be dropped), as is a file with part of them; a refused
// load changes nothing.
TEST_CASE("training/files: a file's grad scaler state loads into an optimizer that scales the loss, only",
          "[gpu][training]") {
  REQUIRE_GPU();
  const TempFile scaled_file("hostile_scaled");
  const TempFile plain_file("hostile_plain");
  std::vector<torch::Tensor> scaled_moments;
  std::vector<torch::Tensor> plain_moments;
  {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto scaled =
        must(cgt::torch::make_adam(model->parameters(), {.loss_scale = {.dynamic = true, .init_scale = 1024}}));
    eager_scaled_step(model, scaled, 1);
    eager_scaled_step(model, scaled, 2, 1e38);  // skipped: scale 512, one skip
    REQUIRE(scaled.loss_scale().item<double>() == 512);
    must(scaled.save(scaled_file.path));
    scaled_moments = host_copies(scaled.exp_avgs());
    auto plain = must(cgt::torch::make_adam(model->parameters(), {}));
    eager_scaled_step(model, plain, 3);
    must(plain.save(plain_file.path));
    plain_moments = host_copies(plain.exp_avgs());
  }
  torch::manual_seed(5);
  Mlp model;
  model->to(gpu);
  auto plain = must(cgt::torch::make_adam(model->parameters(), {}));
  const auto fresh_moments = host_copies(plain.exp_avgs());
  expect_error(plain.load(scaled_file.path), cgt::Errc::invalid_argument, "holds a grad scaler's state");
  CHECK(same(fresh_moments, host_copies(plain.exp_avgs())));
  CHECK(plain.steps()[0].item<float>() == 0);
  CHECK_FALSE(plain.scales_loss());

  auto scaled = must(cgt::torch::make_adam(model->parameters(), {.loss_scale = {.dynamic = true, .init_scale = 4096}}));
  must(scaled.load(plain_file.path));
  CHECK(same(plain_moments, host_copies(scaled.exp_avgs())));
  CHECK(scaled.loss_scale().item<double>() == 4096);
  CHECK(scaled.skipped_steps().item<std::int64_t>() == 0);
  const TempFile part("hostile_scaled_part");
  rewrite(scaled_file.path, part.path, dropping("cgt.scaler.growth_tracker"));
  expect_error(scaled.load(part.path), cgt::Errc::invalid_argument,
               "the file has the grad scaler's 'cgt.scaler.scale', 'cgt.scaler.skipped' but not "
               "'cgt.scaler.growth_tracker'");
  CHECK(same(plain_moments, host_copies(scaled.exp_avgs())));
  CHECK(scaled.loss_scale().item<double>() == 4096);
  must(scaled.load(scaled_file.path));
  CHECK(same(scaled_moments, host_copies(scaled.exp_avgs())));
  CHECK(scaled.loss_scale().item<double>() == 512);
  CHECK(scaled.skipped_steps().item<std::int64_t>() == 1);
}
