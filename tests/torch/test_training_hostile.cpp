// Issue 29's training surfaces under hostile use: the learning rate as device state and its
// schedules, clipping, mixed precision, gradient accumulation and checkpoints, tried with handles in
// every state, loss functions, schedules and hooks that throw (or run out of memory), checkpoint
// files that do not fit or are broken, parameters and inputs in odd layouts, two threads, and
// gradients of zero, NaN and infinity. Each test states the promise it tries to break (from
// modules/cgt.torch-optim.inc and docs/training.md) and checks what a user relies on: values,
// errors, and which state holds after. Tagged [training][hostile]; those that need a GPU [gpu]
// too (SKIPPED without one).
#include <torch/torch.h>
#include <ATen/autocast_mode.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::autocast_state;
using training_test::AutocastState;
using training_test::gpu;
using training_test::host_copies;
using training_test::max_difference;
using training_test::Mlp;
using training_test::must;
using training_test::TempFile;

using Catch::Matchers::ContainsSubstring;

constexpr double not_a_number = std::numeric_limits<double>::quiet_NaN();
// The most steps a schedule counts (cgt.torch-optim.inc, Optimizer::scheduled_steps).
constexpr std::int64_t most_scheduled_steps = std::int64_t{1} << 62;
constexpr double infinity = std::numeric_limits<double>::infinity();

// ---- helpers ------------------------------------------------------------------------------------

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

// Equal element for element, NaN equal to NaN.
bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].detach().cpu();
    const auto y = b[i].detach().cpu();
    if (x.sizes() != y.sizes() || x.scalar_type() != y.scalar_type()) return false;
    if (!torch::equal(x.isnan(), y.isnan())) return false;
    if (!torch::equal(torch::nan_to_num(x, 0.0), torch::nan_to_num(y, 0.0))) return false;
  }
  return true;
}

// NaN where the other is NaN, and within `tolerance` elsewhere.
bool nan_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, double tolerance) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].detach().cpu().to(torch::kDouble);
    const auto y = b[i].detach().cpu().to(torch::kDouble);
    if (x.sizes() != y.sizes() || !torch::equal(x.isnan(), y.isnan())) return false;
    if ((torch::nan_to_num(x, 0.0) - torch::nan_to_num(y, 0.0)).abs().max().item<double>() > tolerance) return false;
  }
  return true;
}

// The error code a result holds, if any.
template <class T>
std::optional<cgt::Errc> error_of(const cgt::Result<T>& result) {
  if (result) return std::nullopt;
  return result.error().code;
}

// A failure with `code` whose message names `says`.
void expect_error(const cgt::Result<void>& result, cgt::Errc code, const std::string& says) {
  REQUIRE_FALSE(result.has_value());
  CHECK(result.error().code == code);
  CHECK_THAT(result.error().message, ContainsSubstring(says));
}

cgt::torch::Values mse(Mlp& model, const cgt::torch::Inputs& in) {
  return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
}

}  // namespace

// ---- handles in every state (no device) ---------------------------------------------------------

// A handle made by default or moved from holds no state: every member issue 29 added fails with
// invalid_argument naming itself, or answers an empty value (0, undefined, false), and nothing it
// is asked reaches the optimizer its state went to. An optimizer over no parameters needs no
// device, so this runs everywhere.
TEST_CASE("training/hostile: optimizer handles without state refuse every new member", "[training][hostile]") {
  auto adam = must(cgt::torch::make_adam({}, {.lr = 0.25, .max_grad_norm = 1.0}));
  must(adam.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 3));
  cgt::torch::Adam moved = std::move(adam);
  auto sgd = must(cgt::torch::make_sgd({}, {.lr = 0.5, .momentum = 0.9}));
  cgt::torch::SGD sgd_moved = std::move(sgd);
  cgt::torch::Adam adam_default;
  cgt::torch::SGD sgd_default;

  const TempFile checkpoint("hostile_no_state_source");
  must(moved.save(checkpoint.path));  // a real checkpoint, which no handle below may read
  const TempFile never("hostile_no_state_target");
  for (cgt::torch::Optimizer* none :
       std::initializer_list<cgt::torch::Optimizer*>{&adam, &sgd, &adam_default, &sgd_default}) {
    CHECK_FALSE(none->has_state());
    expect_error(none->set_lr(0.1), cgt::Errc::invalid_argument, "Optimizer::set_lr");
    CHECK(none->lr() == 0);
    expect_error(none->set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10)), cgt::Errc::invalid_argument,
                 "Optimizer::set_schedule");
    expect_error(none->set_schedule({}), cgt::Errc::invalid_argument, "Optimizer::set_schedule");
    CHECK(none->scheduled_steps() == 0);
    CHECK_FALSE(none->grad_norm().defined());
    CHECK_FALSE(none->clips_gradients());
    CHECK_FALSE(none->loss_scale().defined());
    CHECK_FALSE(none->skipped_steps().defined());
    CHECK_FALSE(none->scales_loss());
    torch::serialize::OutputArchive out;
    expect_error(none->save(out), cgt::Errc::invalid_argument, "Optimizer::save");
    expect_error(none->save(never.path), cgt::Errc::invalid_argument, "Optimizer::save");
    CHECK_FALSE(std::filesystem::exists(never.path));  // nothing written
    torch::serialize::InputArchive in;
    in.load_from(checkpoint.path);
    expect_error(none->load(in), cgt::Errc::invalid_argument, "Optimizer::load");
    expect_error(none->load(checkpoint.path), cgt::Errc::invalid_argument, "Optimizer::load");
    CHECK(none->lr() == 0);  // the file reached nothing
    CHECK(none->scheduled_steps() == 0);
  }
  // The handles the states moved into are the optimizers, untouched by all of the above.
  CHECK(moved.lr() == 0.25);
  CHECK(moved.scheduled_steps() == 3);
  CHECK(moved.options().max_grad_norm == 1.0);
  CHECK_FALSE(moved.clips_gradients());  // over no parameters: nothing to clip
  CHECK(sgd_moved.lr() == 0.5);
  CHECK(sgd_moved.scheduled_steps() == 0);

  // An Adam handle given an SGD's state through its base: its own members read as without state
  // (cgt.torch-optim.inc), the base's reach the SGD, and a checkpoint says "sgd".
  cgt::torch::Adam sliced = must(cgt::torch::make_adam({}, {.lr = 0.125}));
  static_cast<cgt::torch::Optimizer&>(sliced) = std::move(sgd_moved);
  CHECK(sliced.has_state());
  CHECK(sliced.options().lr == cgt::torch::AdamOptions{}.lr);
  CHECK(sliced.exp_avgs().empty());
  CHECK(sliced.lr() == 0.5);
  const TempFile sliced_file("hostile_no_state_sliced");
  must(sliced.save(sliced_file.path));
  expect_error(moved.load(sliced_file.path), cgt::Errc::invalid_argument, "'sgd'");
  CHECK(moved.lr() == 0.25);
}

// An optimizer over no parameters is valid (cgt.torch-optim.inc, Optimizer): its steps update
// nothing, eager or from given gradients (an empty list: the foreach kernels would refuse it), and
// with `max_grad_norm` it clips nothing: `clips_gradients()` is false and `grad_norm()` undefined,
// so no training step hands out a norm that no step writes. Needs no device.
TEST_CASE("training/hostile: an optimizer over no parameters steps and clips nothing", "[training][hostile]") {
  auto adam = must(cgt::torch::make_adam({}, {.lr = 0.25, .max_grad_norm = 1.0, .loss_scale = {.dynamic = true}}));
  auto sgd = must(cgt::torch::make_sgd({}, {.lr = 0.5, .momentum = 0.9, .max_grad_norm = 1.0}));
  for (cgt::torch::Optimizer* none : std::initializer_list<cgt::torch::Optimizer*>{&adam, &sgd}) {
    CHECK(none->has_state());
    CHECK(none->params().empty());
    CHECK_FALSE(none->clips_gradients());
    CHECK_FALSE(none->grad_norm().defined());
    CHECK_FALSE(none->scales_loss());
    CHECK_NOTHROW(none->step());
    CHECK_NOTHROW(none->step(std::span<const torch::Tensor>{}));
    CHECK_NOTHROW(none->zero_grad());
    CHECK_NOTHROW(none->zero_grad(true));
    must(none->attach_grads());
    // A gradient for a parameter it does not have is still a mistake.
    const std::vector<torch::Tensor> one{torch::zeros({2})};
    CHECK_THROWS_AS(none->step(std::span<const torch::Tensor>(one)), c10::Error);
  }
  CHECK(adam.lr() == 0.25);
  CHECK(sgd.lr() == 0.5);
}

// ---- schedules (no device) -----------------------------------------------------------------------

// cgt.torch-optim.inc, namespace lr: "Counts below 0 count as 0". A program that asks a schedule for
// the rate before its first step (`schedule(step - 1)` at step 0, as a resumed run's log does) must
// get the first rate, not a negative one, nor infinity, nor a rate above the peak. At any count the
// rates stay finite and >= 0 (set_lr would refuse anything else and fail the step).
TEST_CASE("training/hostile: schedules count steps below 0 as 0 and stay finite at every count",
          "[training][hostile]") {
  constexpr std::int64_t lowest = std::numeric_limits<std::int64_t>::min();
  constexpr std::int64_t highest = std::numeric_limits<std::int64_t>::max();
  const std::vector<std::pair<const char*, cgt::torch::LrSchedule>> schedules{
      {"warmup_cosine", cgt::torch::lr::warmup_cosine(1.0, 10, 110, 0.1)},
      {"warmup_cosine without warm-up", cgt::torch::lr::warmup_cosine(1.0, 0, 100, 0.1)},
      {"step_decay", cgt::torch::lr::step_decay(1.0, 10, 0.5)},
      {"linear", cgt::torch::lr::linear(0.5, 1.0, 4)}};
  for (const auto& [name, schedule] : schedules) {
    INFO(name);
    const double first = schedule(0);
    for (const std::int64_t t : {std::int64_t{-1}, std::int64_t{-15}, std::int64_t{-1000}, lowest}) {
      INFO("step " << t);
      CHECK(schedule(t) == first);
    }
    for (const std::int64_t t : {std::int64_t{0}, std::int64_t{1}, std::int64_t{1000}, highest}) {
      INFO("step " << t);
      CHECK(std::isfinite(schedule(t)));
      CHECK(schedule(t) >= 0);
    }
  }
}

// ---- checkpoints (no device) ---------------------------------------------------------------------

// Optimizer::load reads and checks the whole file before it changes anything: a file that is
// broken (truncated, empty, not an archive, a directory), not an optimizer's, of another kind, or
// whose every key is right but one (format, kind, count, lists, a rate that is NaN, negative,
// beyond float32's range or not a number, a step count below 0 or above 2^62) fails with
// invalid_argument naming what differs, and the rate and the schedule's count stay. The same file
// untampered, with a key more (a later version's), and with a count of 2^62, loads. An optimizer
// over no parameters needs no device.
TEST_CASE("training/hostile: broken and tampered optimizer files change nothing", "[training][hostile]") {
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

// A schedule counts steps from 0 to 2^62 (cgt.torch-optim.inc, Optimizer::set_schedule): a start
// above (INT64_MAX would overflow at the next step) fails with invalid_argument naming the
// function, and the schedule's count stays; 2^62 itself is taken.
TEST_CASE("training/hostile: a schedule may not start above 2^62 steps", "[training][hostile]") {
  auto sgd = must(cgt::torch::make_sgd({}, {.lr = 0.5}));
  must(sgd.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), 5));
  for (const std::int64_t start : {std::numeric_limits<std::int64_t>::max(), most_scheduled_steps + 1}) {
    INFO("start " << start);
    expect_error(sgd.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), start), cgt::Errc::invalid_argument,
                 "Optimizer::set_schedule");
    CHECK(sgd.scheduled_steps() == 5);
  }
  must(sgd.set_schedule(cgt::torch::lr::linear(1.0, 0.5, 10), most_scheduled_steps));
  CHECK(sgd.scheduled_steps() == most_scheduled_steps);
}

// load_parameters_in_place reads and checks the whole file first: a file whose first layers fit
// and whose last does not (a shape, or the dtype) fails naming that layer, and no parameter is
// changed, not even those that fit; a truncated file changes nothing either. Targets in odd layouts
// (a transposed view, a strided view with gaps) receive the file's values in their logical order,
// at their addresses, and the gaps between their elements are left alone.
TEST_CASE("training/hostile: load_parameters_in_place changes nothing or everything, in any layout",
          "[training][hostile]") {
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

// ---- handles that move while training (GPU) -------------------------------------------------------

// A training step (micro-batches one per call) and its optimizer both move mid-step, and then the
// optimizer's last handle goes: the step keeps its place in the step (micro_batches_taken), the
// moved-from step fails with invalid_argument, the schedule set through the handle the optimizer
// moved into drives the step made from the old one, the norm and the loss scale are read through
// it, and with every handle gone the step trains on at the rate last set. SGD on (w * x).sum()
// with x = 1: each step moves every weight by exactly minus the rate.
TEST_CASE("training/hostile: steps and optimizers moved mid-step keep the rate, the schedule, the norm and the scale",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  std::optional<cgt::torch::SGD> sgd(must(cgt::torch::make_sgd(
      {w}, {.lr = 0.5, .max_grad_norm = 100.0, .loss_scale = {.dynamic = true, .init_scale = 1024}})));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, *sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; },
      cgt::torch::TrainingStepOptions{.micro_batches = 2}));
  auto update = must(cgt::torch::make_optimizer_step(pool, *sgd));
  const auto x = torch::ones({8}, gpu);

  std::optional<cgt::torch::SGD> kept(std::move(*sgd));
  cgt::torch::SGD& moved_from = *sgd;
  expect_error(moved_from.set_lr(0.3), cgt::Errc::invalid_argument, "Optimizer::set_lr");
  must(kept->set_schedule([](std::int64_t t) { return 0.01 * static_cast<double>(t + 1); }));

  pool.mark_step_begin();
  must(step({x}));
  CHECK(step.micro_batches_taken() == 1);
  cgt::torch::TrainingStep moved_step = std::move(step);
  CHECK(moved_step.micro_batches_taken() == 1);
  CHECK(moved_step.micro_batches() == 2);
  cgt::torch::TrainingStep& old_step = step;
  auto refused = old_step({x});
  REQUIRE_FALSE(refused);
  CHECK(refused.error().code == cgt::Errc::invalid_argument);
  cgt::torch::OptimizerStep moved_update = std::move(update);
  cgt::torch::OptimizerStep& old_update = update;
  CHECK(error_of(old_update()) == cgt::Errc::invalid_argument);
  CHECK(moved_update.function().name() == "optimizer_step");

  double expected = 0;
  for (std::int64_t t = 0; t < 4; ++t) {  // warm-ups, recordings, replays
    INFO("step " << t);
    if (t > 0) {
      pool.mark_step_begin();
      must(moved_step({x}));
    }
    pool.mark_step_begin();
    auto out = moved_step({x});
    if (!out) FAIL(out.error().describe());
    REQUIRE(out->size() == 2);  // the loss, then the norm
    const double norm = must(out->take(1)).item<double>();
    CHECK(std::abs(norm - std::sqrt(8.0)) <= 1e-6);  // the unscaled gradient: 1 everywhere
    CHECK(kept->grad_norm().item<double>() == norm);
    CHECK(kept->loss_scale().item<double>() == 1024);
    CHECK(kept->skipped_steps().item<std::int64_t>() == 0);
    CHECK(kept->scheduled_steps() == t + 1);
    CHECK(moved_step.micro_batches_taken() == 0);
    expected -= static_cast<double>(static_cast<float>(0.01 * static_cast<double>(t + 1)));
    CHECK(std::abs(w.detach().max().item<double>() - expected) <= 1e-6);
    CHECK(std::abs(w.detach().min().item<double>() - expected) <= 1e-6);
  }
  // The schedule taken away, a rate set through the moved-into handle; then that handle goes too.
  must(kept->set_schedule({}));
  must(kept->set_lr(0.25));
  kept.reset();
  for (int t = 0; t < 2; ++t) {
    pool.mark_step_begin();
    must(moved_step({x}));
    pool.mark_step_begin();
    auto out = moved_step({x});
    if (!out) FAIL(out.error().describe());
    CHECK(out->size() == 2);
    expected -= static_cast<double>(0.25F);
  }
  CHECK(std::abs(w.detach().max().item<double>() - expected) <= 1e-6);
  CHECK(std::abs(w.detach().min().item<double>() - expected) <= 1e-6);
  CHECK(pool.stats().eager_calls == 0);
}

// ---- throws and out of memory inside a step (GPU) -------------------------------------------------

namespace {

enum class Failure : std::uint8_t { none, std_exception, not_std, out_of_memory };

struct AccumulationRun {
  std::vector<double> losses;  // of the calls that succeeded, in order
  std::vector<torch::Tensor> params;
  cgt::Stats stats;
};

constexpr int accumulation_steps = 6;
constexpr int accumulation_micro = 4;

std::vector<std::pair<torch::Tensor, torch::Tensor>> micro_batch_data() {
  torch::manual_seed(11);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> out;
  for (int i = 0; i < accumulation_steps * accumulation_micro; ++i) {
    out.emplace_back(torch::randn({16, 16}, gpu), torch::randn({16, 8}, gpu));
  }
  return out;
}

// Trains `accumulation_steps` steps of 4 micro-batches one per call (AdamW, clipping, warm-up +
// cosine). `plan`: the failure the loss function makes the first time micro-batch (step, micro) is
// tried; each failed call is checked to have changed nothing (the micro-batches taken, the
// schedule's count, the parameters, the accumulated gradients, the thread's autocast state), then
// the same micro-batch is tried again.
AccumulationRun train_accumulating(std::optional<at::ScalarType> autocast,
                                   const std::map<std::pair<int, int>, Failure>& plan) {
  const auto data = micro_batch_data();
  torch::manual_seed(0);
  Mlp model;
  model->to(gpu);
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 2, accumulation_steps, 3e-4);
  auto adam = must(cgt::torch::make_adam(
      model->parameters(), {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0}));
  must(adam.set_schedule(schedule));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  Failure inject = Failure::none;
  auto step = must(cgt::torch::make_training_step(
      pool, adam,
      [&](cgt::torch::Inputs in) {
        const Failure failure = std::exchange(inject, Failure::none);
        if (failure == Failure::out_of_memory) {
          (void)at::empty({std::int64_t{1} << 50}, in[0].options());  // 4 PiB: the allocator throws
        }
        const auto y = model->forward(in[0]);
        if (failure == Failure::std_exception) throw std::runtime_error("the loss function failed");
        if (failure == Failure::not_std) throw 7;  // NOLINT(hicpp-exception-baseclass): what a careless program throws
        return cgt::torch::Values{torch::mse_loss(y, in[1])};
      },
      cgt::torch::TrainingStepOptions{.micro_batches = accumulation_micro, .autocast = autocast}));
  const AutocastState outside = autocast_state();
  AccumulationRun run;
  for (int t = 0; t < accumulation_steps; ++t) {
    for (int m = 0; m < accumulation_micro; ++m) {
      INFO("step " << t << ", micro-batch " << m);
      const auto& [x, y] = data[static_cast<std::size_t>((t * accumulation_micro) + m)];
      CHECK(step.micro_batches_taken() == m);
      if (const auto planned = plan.find({t, m}); planned != plan.end()) {
        const auto params = host_copies(model->parameters());
        const auto grads = host_copies(adam.grads());
        inject = planned->second;
        pool.mark_step_begin();
        auto failed = step({x, y});
        CHECK(inject == Failure::none);  // the loss function ran: the plan is where it is called
        REQUIRE_FALSE(failed);
        CHECK(failed.error().code ==
              (planned->second == Failure::out_of_memory ? cgt::Errc::out_of_memory : cgt::Errc::function_failed));
        CHECK(step.micro_batches_taken() == m);  // a failed call counts no micro-batch
        CHECK(adam.scheduled_steps() == t);
        if (m == accumulation_micro - 1) CHECK(adam.lr() == schedule(t));  // the same rate, again
        CHECK(same(params, host_copies(model->parameters())));
        CHECK(same(grads, host_copies(adam.grads())));
        CHECK(autocast_state() == outside);
      }
      pool.mark_step_begin();
      auto out = step({x, y});
      if (!out) FAIL(out.error().describe());
      run.losses.push_back(must(out->take(0)).item<double>());
    }
    CHECK(adam.scheduled_steps() == t + 1);
  }
  run.params = host_copies(model->parameters());
  run.stats = pool.stats();
  return run;
}

}  // namespace

// A loss function that throws (a std::exception, or anything else) or runs out of memory on a
// micro-batch, the 3rd of a step among them, under float32 and under bf16 autocast: each call fails
// with function_failed (out_of_memory for the allocation), counts no micro-batch and changes no
// parameter, no accumulated gradient and no autocast state; the micro-batch tried again, training
// goes on exactly as a run in which nothing failed, with the same graphs (a failure in an intact
// capture is passing: no shape falls back to eager). The failures are placed where the loss
// function runs: the warm-ups and the recordings of the first, middle and stepping calls.
TEST_CASE("training/hostile: a loss function that throws or runs out of memory mid-step changes nothing",
          "[gpu][training][hostile][provokes-api-errors]") {
  REQUIRE_GPU();
  const std::map<std::pair<int, int>, Failure> plan{
      {{0, 1}, Failure::out_of_memory},  // the middle calls' warm-up
      {{0, 2}, Failure::std_exception},  // the 3rd micro-batch: the middle calls' recording
      {{0, 3}, Failure::not_std},        // the stepping call's warm-up
      {{1, 0}, Failure::std_exception},  // the first calls' recording
      {{1, 3}, Failure::std_exception},  // the stepping call's recording
  };
  for (const std::optional<at::ScalarType> autocast : {std::optional<at::ScalarType>(), std::optional(at::kBFloat16)}) {
    INFO((autocast ? "bf16 autocast" : "float32"));
    const AccumulationRun clean = train_accumulating(autocast, {});
    const AccumulationRun failing = train_accumulating(autocast, plan);
    CHECK(max_difference(clean.losses, failing.losses) <= 1e-6);
    CHECK(max_difference(clean.params, failing.params) <= 1e-6);
    CHECK(failing.stats.recordings == clean.stats.recordings);
    CHECK(failing.stats.recordings == 3);
    CHECK(failing.stats.eager_calls == 0);
    CHECK(failing.stats.replays == clean.stats.replays);
  }
}

// After a failed call the program may give up the step: restart_step drops the micro-batches it
// took, and the next call begins it again (its first micro-batch zeroes the gradients). Two
// micro-batches taken and dropped leave no trace in the training that follows.
TEST_CASE("training/hostile: restart_step drops the micro-batches taken and begins the step again",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  const auto data = micro_batch_data();
  const auto run = [&data](bool abandon_a_step) {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto sgd = must(cgt::torch::make_sgd(model->parameters(), {.lr = 0.1}));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step = must(cgt::torch::make_training_step(
        pool, sgd,
        [&model](cgt::torch::Inputs in) { return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])}; },
        cgt::torch::TrainingStepOptions{.micro_batches = 3}));
    if (abandon_a_step) {
      for (std::size_t i = 6; i < 8; ++i) {
        pool.mark_step_begin();
        must(step({data[i].first, data[i].second}));
      }
      CHECK(step.micro_batches_taken() == 2);
      must(step.restart_step());
      CHECK(step.micro_batches_taken() == 0);
    }
    for (std::size_t i = 0; i < 6; ++i) {
      pool.mark_step_begin();
      must(step({data[i].first, data[i].second}));
    }
    CHECK(step.micro_batches_taken() == 0);
    return host_copies(model->parameters());
  };
  CHECK(max_difference(run(false), run(true)) <= 1e-6);
}

// ---- schedules that fail (GPU) -------------------------------------------------------------------

// A schedule whose rate is NaN, negative or infinite, or that throws, fails the stepping call
// before the pool is called (invalid_argument, function_failed for the throw): the micro-batches
// taken, the schedule's count, the host's rate and the device's rate stay, and no parameter moves.
// The device's rate is read back by the update: the schedule taken away, the next step moves each
// weight by the rate before the failures. Then the schedule resumes at its count.
TEST_CASE("training/hostile: schedules that return bad rates or throw keep the previous rate",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.5}));
  std::function<double(std::int64_t)> rate = [](std::int64_t t) { return 0.01 * static_cast<double>(t + 1); };
  const cgt::torch::LrSchedule good = rate;
  const auto through = [&rate](std::int64_t t) { return rate(t); };
  must(sgd.set_schedule(through));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; },
      cgt::torch::TrainingStepOptions{.micro_batches = 2}));
  const auto x = torch::ones({8}, gpu);
  const auto call = [&] {
    pool.mark_step_begin();
    return step({x});
  };
  const auto weights_are = [&w](double value) {
    CHECK(std::abs(w.detach().max().item<double>() - value) <= 1e-7);
    CHECK(std::abs(w.detach().min().item<double>() - value) <= 1e-7);
  };
  must(call());
  must(call());
  weights_are(-0.01);
  CHECK(sgd.scheduled_steps() == 1);
  must(call());  // the first micro-batch of step 1
  const auto grads = host_copies(sgd.grads());
  const std::uint64_t calls = pool.stats().calls;

  struct Bad {
    const char* what;
    std::function<double(std::int64_t)> rate;
    cgt::Errc code;
  };
  const std::vector<Bad> bads{
      {"NaN", [](std::int64_t) { return not_a_number; }, cgt::Errc::invalid_argument},
      {"negative", [](std::int64_t) { return -1e-3; }, cgt::Errc::invalid_argument},
      {"infinite", [](std::int64_t) { return infinity; }, cgt::Errc::invalid_argument},
      {"minus infinity", [](std::int64_t) { return -infinity; }, cgt::Errc::invalid_argument},
      {"throws", [](std::int64_t) -> double { throw std::runtime_error("no rate"); }, cgt::Errc::function_failed},
  };
  for (const Bad& bad : bads) {
    INFO(bad.what);
    rate = bad.rate;
    auto failed = call();
    REQUIRE_FALSE(failed);
    CHECK(failed.error().code == bad.code);
    CHECK_THAT(failed.error().message, ContainsSubstring("schedule"));
    CHECK(step.micro_batches_taken() == 1);
    CHECK(sgd.scheduled_steps() == 1);
    CHECK(sgd.lr() == 0.01);
    weights_are(-0.01);
    CHECK(same(grads, host_copies(sgd.grads())));
  }
  CHECK(pool.stats().calls == calls);  // none reached the pool

  must(sgd.set_schedule({}));  // the rate stays where the failures left it: 0.01, on the device too
  CHECK(sgd.lr() == 0.01);
  must(call());
  weights_are(-0.02);
  rate = good;
  must(sgd.set_schedule(through, 1));
  must(call());
  must(call());
  weights_are(-0.04);  // schedule(1) = 0.02
  CHECK(sgd.scheduled_steps() == 2);
  CHECK(pool.stats().eager_calls == 0);
}

// cgt.cppm: "nothing throws, asserts or aborts on a caller's mistake", and a pool function that
// throws anything (std::exception or not) fails with function_failed. A schedule is the program's
// code too: one that throws something other than a std::exception must fail the training step's
// and the graphed update's call the same way, not escape from it.
TEST_CASE("training/hostile: a schedule that throws a non-std exception fails the call, never escapes",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.5}));
  must(sgd.set_schedule(
      [](std::int64_t) -> double { throw 42; }));  // NOLINT(hicpp-exception-baseclass): a careless program's
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  auto update = must(cgt::torch::make_optimizer_step(pool, sgd));
  const auto x = torch::ones({8}, gpu);

  std::optional<cgt::Errc> step_error;
  bool step_escaped = false;
  try {
    auto out = step({x});
    step_error = error_of(out);
  } catch (...) {
    step_escaped = true;
  }
  CHECK_FALSE(step_escaped);
  CHECK(step_error == cgt::Errc::function_failed);

  std::optional<cgt::Errc> update_error;
  bool update_escaped = false;
  try {
    update_error = error_of(update());
  } catch (...) {
    update_escaped = true;
  }
  CHECK_FALSE(update_escaped);
  CHECK(update_error == cgt::Errc::function_failed);
  CHECK(sgd.scheduled_steps() == 0);
  CHECK(sgd.lr() == 0.5);
  CHECK(w.detach().abs().max().item<double>() == 0);
}

// The schedule's count stops at 2^62 (cgt.torch-optim.inc, Optimizer::scheduled_steps), so that it
// never overflows: a schedule resumed there is asked for the rate of step 2^62 at every step, each
// step trains at that rate, and the count stays.
TEST_CASE("training/hostile: the schedule's count stops at 2^62", "[gpu][training][hostile]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.5}));
  std::vector<std::int64_t> asked;
  must(sgd.set_schedule(
      [&asked](std::int64_t t) {
        asked.push_back(t);
        return 0.25;
      },
      most_scheduled_steps));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  const auto x = torch::ones({8}, gpu);
  for (int t = 0; t < 3; ++t) {
    pool.mark_step_begin();
    must(step({x}));
    CHECK(sgd.scheduled_steps() == most_scheduled_steps);
  }
  CHECK(asked == std::vector<std::int64_t>(3, most_scheduled_steps));
  CHECK(w.detach().max().item<double>() == -0.75);  // three steps at 0.25 (exact in float32)
  CHECK(w.detach().min().item<double>() == -0.75);
}

// The rate lives on the device as a float32: a rate that is finite as a double but beyond float32's
// range (1e300) cannot be written there. It is a bad argument like a negative rate: set_lr, a
// schedule and make_adam refuse it with invalid_argument, and the rate before stays (host and
// device).
TEST_CASE("training/hostile: a rate beyond float32's range is refused as a bad argument", "[gpu][training][hostile]") {
  REQUIRE_GPU();
  auto w = torch::zeros({8}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = 0.01}));
  for (const double huge : {1e300, 2.0 * static_cast<double>(std::numeric_limits<float>::max())}) {
    INFO("rate " << huge);
    auto set = sgd.set_lr(huge);
    REQUIRE_FALSE(set);
    CHECK(set.error().code == cgt::Errc::invalid_argument);
    CHECK(sgd.lr() == 0.01);
  }
  sgd.grads()[0].fill_(1);  // a step at the device's rate: every weight moves by -0.01
  sgd.step();
  CHECK(std::abs(w.detach().max().item<double>() + 0.01) <= 1e-7);
  CHECK(std::abs(w.detach().min().item<double>() + 0.01) <= 1e-7);

  must(sgd.set_schedule([](std::int64_t) { return 1e300; }));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  auto out = step({torch::ones({8}, gpu)});
  REQUIRE_FALSE(out);
  CHECK(out.error().code == cgt::Errc::invalid_argument);
  CHECK(sgd.lr() == 0.01);

  auto made = cgt::torch::make_adam({torch::zeros({4}, gpu).requires_grad_()}, {.lr = 1e300});
  REQUIRE_FALSE(made);
  CHECK(made.error().code == cgt::Errc::invalid_argument);
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
TEST_CASE("training/hostile: optimizer files that do not fit leave every state tensor as it was",
          "[gpu][training][hostile]") {
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
TEST_CASE("training/hostile: a file's grad scaler state loads into an optimizer that scales the loss, only",
          "[gpu][training][hostile]") {
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

// ---- odd layouts (GPU) ----------------------------------------------------------------------------

namespace {

// A two-layer network over parameters in odd layouts: w1 [16, 32] a transposed view of a [32, 16]
// buffer; with `gaps`, b1 [32] every other element of a [64] buffer and w2 [32, 8] the first 8
// columns of a [32, 16] buffer (neither dense: Adam's multi-tensor formula), without, both dense
// (the fused kernel, w1 transposed). The values are the same either way.
struct OddModel {
  torch::Tensor w1_buffer, b1_buffer, w2_buffer;  // what the parameters view (their gaps included)
  std::vector<torch::Tensor> params;              // w1, b1, w2, b2
};

OddModel odd_model(bool gaps) {
  torch::manual_seed(3);
  OddModel m;
  m.w1_buffer = torch::randn({32, 16}, gpu) * 0.25;
  m.b1_buffer = torch::randn({64}, gpu) * 0.1;
  m.w2_buffer = torch::randn({32, 16}, gpu) * 0.25;
  const auto b2 = torch::randn({8}, gpu) * 0.1;
  const auto b1 = m.b1_buffer.slice(0, 0, 64, 2);
  const auto w2 = m.w2_buffer.slice(1, 0, 8);
  m.params = {m.w1_buffer.t().detach().requires_grad_(), (gaps ? b1 : b1.contiguous()).detach().requires_grad_(),
              (gaps ? w2 : w2.contiguous()).detach().requires_grad_(), b2.detach().requires_grad_()};
  return m;
}

torch::Tensor odd_forward(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
  return torch::tanh(x.matmul(p[0]) + p[1]).matmul(p[2]) + p[3];
}

struct OddBatch {
  torch::Tensor x, y;  // x [64, 16] transposed, y [64, 8] with gaps
};

std::vector<OddBatch> odd_batches(int n) {
  torch::manual_seed(4);
  std::vector<OddBatch> out;
  for (int i = 0; i < n; ++i) {
    out.push_back({torch::randn({16, 64}, gpu).t(), torch::randn({64, 16}, gpu).slice(1, 0, 8)});
  }
  return out;
}

struct OddRun {
  std::vector<double> losses;  // per micro-batch, or per step (the mean)
  std::vector<torch::Tensor> params;
};

// Eager libtorch on contiguous copies: AdamW, loss / k per micro-batch, clip_grad_norm_, a step.
OddRun odd_libtorch(const std::vector<OddBatch>& data, int k, bool per_call) {
  std::vector<torch::Tensor> params;
  for (const auto& p : odd_model(false).params) params.push_back(p.detach().clone().contiguous().requires_grad_());
  torch::optim::AdamW adam(params, torch::optim::AdamWOptions(3e-3).weight_decay(1e-2));
  OddRun run;
  for (const OddBatch& b : data) {
    adam.zero_grad(true);
    double sum = 0;
    const auto xs = b.x.contiguous().chunk(k);
    const auto ys = b.y.contiguous().chunk(k);
    for (int j = 0; j < k; ++j) {
      const auto loss =
          torch::mse_loss(odd_forward(params, xs[static_cast<std::size_t>(j)]), ys[static_cast<std::size_t>(j)]);
      (loss / k).backward();
      if (per_call) run.losses.push_back(loss.item<double>());
      sum += loss.item<double>();
    }
    if (!per_call) run.losses.push_back(sum / k);
    torch::nn::utils::clip_grad_norm_(params, 1.0);
    adam.step();
  }
  run.params = host_copies(params);
  return run;
}

}  // namespace

// Parameters that are a transposed view, a strided view with gaps, and inputs that are transposed
// and have gaps, through micro-batches one per call and all in one call: the training is eager
// libtorch's on contiguous copies, each parameter keeps its address and strides, and the elements
// between a strided parameter's (its buffer's gaps) are never written. Rows that the micro-batches
// cannot share fail the call and change nothing; the same tensor twice is not two parameters.
TEST_CASE("training/hostile: parameters and inputs in odd layouts train as contiguous ones",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  constexpr int steps = 8;
  const auto data = odd_batches(steps);
  for (const bool gaps : {false, true}) {
    for (const bool all_in_one : {false, true}) {
      INFO((gaps ? "parameters with gaps (multi-tensor Adam)" : "dense parameters, one transposed (fused Adam)")
           << (all_in_one ? ", 4 micro-batches in one call" : ", 2 micro-batches one per call"));
      const int k = all_in_one ? 4 : 2;
      OddModel m = odd_model(gaps);
      const auto w2_gaps = m.w2_buffer.slice(1, 8, 16).clone();
      const auto b1_gaps = m.b1_buffer.slice(0, 1, 64, 2).clone();
      std::vector<std::vector<std::int64_t>> strides;
      std::vector<const void*> addresses;
      for (const auto& p : m.params) {
        strides.push_back(p.strides().vec());
        addresses.push_back(p.data_ptr());
      }
      auto adam = must(cgt::torch::make_adam(
          m.params, {.lr = 3e-3, .weight_decay = 1e-2, .decoupled_weight_decay = true, .max_grad_norm = 1.0}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      const auto params = m.params;
      auto step = must(cgt::torch::make_training_step(
          pool, adam,
          [params](cgt::torch::Inputs in) {
            return cgt::torch::Values{torch::mse_loss(odd_forward(params, in[0]), in[1])};
          },
          cgt::torch::TrainingStepOptions{.micro_batches = k, .all_in_one_call = all_in_one}));
      OddRun graph;
      for (const OddBatch& b : data) {
        if (all_in_one) {
          pool.mark_step_begin();
          auto out = step({b.x, b.y});
          if (!out) FAIL(out.error().describe());
          graph.losses.push_back(must(out->take(0)).item<double>());
        } else {
          const auto xs = b.x.chunk(k);
          const auto ys = b.y.chunk(k);
          for (int j = 0; j < k; ++j) {
            pool.mark_step_begin();
            auto out = step({xs[static_cast<std::size_t>(j)], ys[static_cast<std::size_t>(j)]});
            if (!out) FAIL(out.error().describe());
            graph.losses.push_back(must(out->take(0)).item<double>());
          }
        }
      }
      graph.params = host_copies(m.params);
      const OddRun libtorch = odd_libtorch(data, k, !all_in_one);
      const double losses = max_difference(graph.losses, libtorch.losses);
      const double differs = max_difference(graph.params, libtorch.params);
      WARN("against libtorch on contiguous copies: loss " << losses << ", param " << differs);
      CHECK(losses <= 1e-5);
      CHECK(differs <= 1e-5);
      for (std::size_t i = 0; i < m.params.size(); ++i) {
        CHECK(m.params[i].strides().vec() == strides[i]);
        CHECK(m.params[i].data_ptr() == addresses[i]);
      }
      CHECK(torch::equal(m.w2_buffer.slice(1, 8, 16), w2_gaps));
      CHECK(torch::equal(m.b1_buffer.slice(0, 1, 64, 2), b1_gaps));
      CHECK(pool.stats().recordings == (all_in_one ? 1U : 2U));
      CHECK(pool.stats().eager_calls == 0);

      if (all_in_one) {  // 2 rows for 4 micro-batches; 64 rows of x with 62 of y
        const auto before = host_copies(m.params);
        pool.mark_step_begin();
        CHECK(error_of(step({torch::randn({16, 2}, gpu).t(), torch::randn({2, 8}, gpu)})) ==
              cgt::Errc::function_failed);
        pool.mark_step_begin();
        CHECK_FALSE(step({data[0].x, data[0].y.slice(0, 0, 62)}).has_value());
        CHECK(same(before, host_copies(m.params)));
      }
    }
  }
  auto w = torch::zeros({4}, gpu).requires_grad_();
  auto twice = cgt::torch::make_adam({w, w});
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code == cgt::Errc::invalid_argument);
}

// A parameter whose elements share memory (an expanded leaf: eight elements, one address) cannot
// be updated in place (libtorch refuses writes to overlapping memory), so every step would fail
// after counting its steps and moments. make_adam and make_sgd "fail with invalid_argument for an
// unusable parameter": this one is.
TEST_CASE("training/hostile: a parameter whose elements overlap is refused when the optimizer is made",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  auto expanded = torch::zeros({1}, gpu).expand({8}).detach().requires_grad_();
  REQUIRE(expanded.stride(0) == 0);
  auto adam = cgt::torch::make_adam({expanded});
  REQUIRE_FALSE(adam);
  CHECK(adam.error().code == cgt::Errc::invalid_argument);
  auto sgd = cgt::torch::make_sgd({expanded}, {.lr = 0.1});
  REQUIRE_FALSE(sgd);
  CHECK(sgd.error().code == cgt::Errc::invalid_argument);
}

// ---- threads (GPU) -------------------------------------------------------------------------------

// set_lr from another thread while one trains (warm-up, recording and replays included): a write
// of the rate lands before or after a step, never in between: a set_lr while a step's call runs
// fails with concurrent_use and writes nothing, and a step called while set_lr writes waits for it.
// Every step moves every weight by one of the two rates the other thread writes, exactly (SGD on
// (w * x).sum(), x = 1), no step fails, nothing falls back to eager, and once the threads are done
// the rate set last is the one the next step takes.
TEST_CASE("training/hostile: set_lr from another thread while steps run takes effect between steps",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  constexpr double slow = 1e-3;
  constexpr double fast = 3e-3;
  auto w = torch::zeros({64}, gpu).requires_grad_();
  auto sgd = must(cgt::torch::make_sgd({w}, {.lr = slow}));
  auto pool = must(cgt::torch::make_pool({.device = 0}));
  auto step = must(cgt::torch::make_training_step(
      pool, sgd, [&w](cgt::torch::Inputs in) { return cgt::torch::Values{(w * in[0]).sum()}; }));
  const auto x = torch::ones({64}, gpu);

  std::atomic<bool> done{false};
  std::atomic<int> written{0};
  std::atomic<int> refused{0};
  std::atomic<int> other_errors{0};
  std::thread writer([&] {
    bool flip = false;
    while (!done.load()) {
      flip = !flip;
      const double before = sgd.lr();
      const auto set = sgd.set_lr(flip ? fast : slow);
      if (set) {
        ++written;
      } else if (set.error().code == cgt::Errc::concurrent_use && sgd.lr() == before) {
        ++refused;  // a step's call was running: nothing written
      } else {
        ++other_errors;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  int failed_calls = 0;
  int other_moves = 0;
  int torn = 0;
  double before = 0;
  for (int t = 0; t < 200; ++t) {
    pool.mark_step_begin();
    if (!step({x})) ++failed_calls;
    const auto now = w.detach().to(torch::kDouble).cpu();
    const double moved = before - now[0].item<double>();
    if ((now - now[0]).abs().max().item<double>() != 0) ++torn;  // all weights moved alike
    if (std::abs(moved - static_cast<double>(static_cast<float>(slow))) > 1e-6 &&
        std::abs(moved - static_cast<double>(static_cast<float>(fast))) > 1e-6) {
      ++other_moves;
    }
    before = now[0].item<double>();
  }
  done = true;
  writer.join();
  CHECK(failed_calls == 0);
  CHECK(other_moves == 0);
  CHECK(torn == 0);
  CHECK(other_errors.load() == 0);
  CHECK(written.load() > 0);
  WARN(written.load() << " rates written, " << refused.load() << " refused while a step ran");
  CHECK((sgd.lr() == slow || sgd.lr() == fast));
  must(sgd.set_lr(5e-3));
  pool.mark_step_begin();
  must(step({x}));
  CHECK(std::abs(before - w.detach()[0].item<double>() - static_cast<double>(5e-3F)) <= 1e-6);
  CHECK(pool.stats().recordings == 1);
  CHECK(pool.stats().eager_calls == 0);
}

// Two threads calling the same training step (micro-batches one per call, a schedule): one thread's
// call is held inside the loss function (its warm-up, then its recording, of the first and of the
// stepping call) while the other calls the step. The second call fails with concurrent_use and
// changes nothing: the micro-batches taken and the schedule's count are the first call's alone,
// the recording is not disturbed, and the training equals a single thread's. A graphed update of
// the same optimizer (an OptimizerStep on another pool) is turned away too: one step at a time.
TEST_CASE("training/hostile: a step called from two threads at once fails with concurrent_use and counts once",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  const auto data = micro_batch_data();
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 2, 10, 3e-4);
  const auto run = [&](bool intrude) {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 3e-3}));
    must(adam.set_schedule(schedule));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    std::mutex mutex;
    std::condition_variable changed;
    bool hold = false;
    bool inside = false;
    bool released = false;
    auto step = must(cgt::torch::make_training_step(
        pool, adam,
        [&](cgt::torch::Inputs in) {
          if (hold) {
            std::unique_lock lock(mutex);
            inside = true;
            changed.notify_all();
            changed.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
          }
          return mse(model, in);
        },
        cgt::torch::TrainingStepOptions{.micro_batches = 2}));
    auto update_pool = must(cgt::torch::make_pool({.device = 0}));
    const auto update = must(cgt::torch::make_optimizer_step(update_pool, adam));
    std::vector<double> losses;
    for (int i = 0; i < 12; ++i) {
      INFO("call " << i);
      const auto& [x, y] = data[static_cast<std::size_t>(i)];
      pool.mark_step_begin();
      if (!intrude || i >= 4) {  // calls 0..3: the warm-ups and recordings of both phases
        auto out = step({x, y});
        if (!out) FAIL(out.error().describe());
        losses.push_back(must(out->take(0)).item<double>());
        continue;
      }
      hold = true;
      inside = false;
      released = false;
      std::optional<cgt::Errc> first_error;
      double first_loss = 0;
      std::thread first([&] {  // no Catch2 assertion on this thread
        auto out = step({x, y});
        first_error = error_of(out);
        if (!out) return;
        auto loss = out->take(0);
        if (loss) first_loss = loss->item<double>();
      });
      {
        std::unique_lock lock(mutex);
        changed.wait_for(lock, std::chrono::seconds(20), [&] { return inside; });
      }
      CHECK(inside);
      auto second = step({x, y});
      // A graphed update of the same optimizer, through a pool of its own, is turned away alike.
      CHECK(error_of(update()) == cgt::Errc::concurrent_use);
      const std::int64_t taken_meanwhile = step.micro_batches_taken();
      const std::int64_t counted_meanwhile = adam.scheduled_steps();
      {
        const std::lock_guard lock(mutex);
        released = true;
      }
      changed.notify_all();
      first.join();
      hold = false;
      CHECK(error_of(second) == cgt::Errc::concurrent_use);
      CHECK(first_error == std::nullopt);
      CHECK(taken_meanwhile == i % 2);
      CHECK(counted_meanwhile == i / 2);
      CHECK(step.micro_batches_taken() == (i + 1) % 2);
      CHECK(adam.scheduled_steps() == (i + 1) / 2);
      losses.push_back(first_loss);
    }
    CHECK(adam.scheduled_steps() == 6);
    CHECK(pool.stats().recordings == 2);
    CHECK(pool.stats().eager_calls == 0);
    return std::make_pair(losses, host_copies(model->parameters()));
  };
  const auto [alone_losses, alone_params] = run(false);
  const auto [raced_losses, raced_params] = run(true);
  CHECK(max_difference(alone_losses, raced_losses) <= 1e-6);
  CHECK(max_difference(alone_params, raced_params) <= 1e-6);
}

// While a graphed step runs on one thread (held inside its loss function, at the stepping call's
// warm-up and its recording, with a micro-batch's gradients accumulated), another thread calls
// every member of the optimizer that changes or copies its state (cgt.torch-optim.inc, Optimizer,
// Threads): those that return Result fail with concurrent_use, step() and zero_grad() throw
// c10::Error naming the other thread's step, a save writes no file, and a second training step and
// a graphed update of the same optimizer are turned away. Nothing changed: the rate, the
// schedule's count, the micro-batches taken and `.grad` are as they were, and the training equals
// a run in which no other thread called anything (a load of the step-0 checkpoint, a rate of 1, a
// schedule from step 0, a zero_grad or a step would each have changed it). On the step's own
// thread (inside its loss function, at the first call's warm-up) the same members work.
TEST_CASE("training/hostile: optimizer members called from another thread while a step runs change nothing",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  const auto data = micro_batch_data();
  const auto schedule = cgt::torch::lr::warmup_cosine(3e-3, 2, 10, 3e-4);
  const auto run = [&](bool intrude) {
    torch::manual_seed(0);
    Mlp model;
    model->to(gpu);
    auto adam = must(cgt::torch::make_adam(model->parameters(), {.lr = 3e-3}));
    must(adam.set_schedule(schedule));
    const TempFile start_file(intrude ? "hostile_threads_start_intruded" : "hostile_threads_start");
    must(adam.save(start_file.path));  // the state of step 0, which a load would put back
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    std::mutex mutex;
    std::condition_variable changed;
    bool hold = false;
    bool inside = false;
    bool released = false;
    bool call_from_inside = true;
    std::vector<std::optional<cgt::Errc>> from_inside;  // the members called inside the loss function
    const auto loss = [&](cgt::torch::Inputs in) {
      if (std::exchange(call_from_inside, false)) {
        from_inside.push_back(error_of(adam.attach_grads()));
        from_inside.push_back(error_of(adam.set_lr(adam.lr())));
        from_inside.push_back(error_of(adam.set_schedule(schedule, adam.scheduled_steps())));
        torch::serialize::OutputArchive archive;
        from_inside.push_back(error_of(adam.save(archive)));
      }
      if (hold) {
        std::unique_lock lock(mutex);
        inside = true;
        changed.notify_all();
        changed.wait_for(lock, std::chrono::seconds(20), [&] { return released; });
      }
      return mse(model, in);
    };
    auto step =
        must(cgt::torch::make_training_step(pool, adam, loss, cgt::torch::TrainingStepOptions{.micro_batches = 2}));
    auto other_pool = must(cgt::torch::make_pool({.device = 0}));
    const auto other_step = must(cgt::torch::make_training_step(other_pool, adam, loss));
    const auto update = must(cgt::torch::make_optimizer_step(other_pool, adam));
    const TempFile never(intrude ? "hostile_threads_never_intruded" : "hostile_threads_never");
    const auto thrown = [](const std::function<void()>& call) {
      try {
        call();
      } catch (const c10::Error& e) {
        return std::string(e.what_without_backtrace());
      }
      return std::string("(nothing thrown)");
    };
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i) {
      INFO("call " << i);
      const auto& [x, y] = data[static_cast<std::size_t>(i)];
      pool.mark_step_begin();
      if (!intrude || (i != 1 && i != 3)) {  // calls 1 and 3: the stepping call's warm-up and recording
        auto out = step({x, y});
        if (!out) FAIL(out.error().describe());
        losses.push_back(must(out->take(0)).item<double>());
        continue;
      }
      // Made before the other thread records: nothing below calls CUDA while it captures.
      torch::serialize::OutputArchive out_archive;
      torch::serialize::InputArchive in_archive;
      in_archive.load_from(start_file.path);
      const std::vector<torch::Tensor> gradients = adam.grads();
      hold = true;
      inside = false;
      released = false;
      std::optional<cgt::Errc> first_error;
      double first_loss = 0;
      std::thread first([&] {  // no Catch2 assertion on this thread
        auto out = step({x, y});
        first_error = error_of(out);
        if (!out) return;
        auto taken = out->take(0);
        if (taken) first_loss = taken->item<double>();
      });
      {
        std::unique_lock lock(mutex);
        changed.wait_for(lock, std::chrono::seconds(20), [&] { return inside; });
      }
      CHECK(inside);
      const double rate = adam.lr();
      const std::int64_t counted = adam.scheduled_steps();
      CHECK(counted == i / 2);
      CHECK(step.micro_batches_taken() == 1);
      // CHECK, not REQUIRE: the other thread must be released whatever fails here.
      const auto refused = [](const cgt::Result<void>& result, const char* member) {
        INFO(member);
        CHECK(error_of(result) == cgt::Errc::concurrent_use);
        if (result) return;
        CHECK_THAT(result.error().message, ContainsSubstring(member));
        CHECK_THAT(result.error().message, ContainsSubstring("another thread"));
      };
      refused(adam.set_lr(1.0), "Optimizer::set_lr");
      refused(adam.set_schedule(cgt::torch::lr::linear(1.0, 1.0, 1)), "Optimizer::set_schedule");
      refused(adam.attach_grads(), "Optimizer::attach_grads");
      refused(adam.save(never.path), "Optimizer::save");
      CHECK_FALSE(std::filesystem::exists(never.path));
      refused(adam.save(out_archive), "Optimizer::save");
      refused(adam.load(start_file.path), "Optimizer::load");
      refused(adam.load(in_archive), "Optimizer::load");
      for (const auto& [what, call] : std::vector<std::pair<const char*, std::function<void()>>>{
               {"Optimizer::step", [&] { adam.step(); }},
               {"Optimizer::step", [&] { adam.step(std::span<const torch::Tensor>(gradients)); }},
               {"Optimizer::zero_grad", [&] { adam.zero_grad(); }},
               {"Optimizer::zero_grad", [&] { adam.zero_grad(true); }}}) {
        INFO(what);
        const std::string message = thrown(call);
        CHECK_THAT(message, ContainsSubstring(what));
        CHECK_THAT(message, ContainsSubstring("another thread's graphed step"));
      }
      CHECK(error_of(other_step({x, y})) == cgt::Errc::concurrent_use);
      CHECK(error_of(update()) == cgt::Errc::concurrent_use);
      CHECK(adam.lr() == rate);
      CHECK(adam.scheduled_steps() == counted);
      CHECK(step.micro_batches_taken() == 1);
      for (std::size_t p = 0; p < adam.params().size(); ++p) {
        CHECK(adam.params()[p].grad().is_same(adam.grads()[p]));  // zero_grad(true) undid nothing
      }
      {
        const std::lock_guard lock(mutex);
        released = true;
      }
      changed.notify_all();
      first.join();
      hold = false;
      CHECK(first_error == std::nullopt);
      losses.push_back(first_loss);
    }
    REQUIRE(from_inside.size() == 4);
    for (const std::optional<cgt::Errc>& error : from_inside) CHECK(error == std::nullopt);
    CHECK(adam.scheduled_steps() == 4);
    CHECK(pool.stats().recordings == 2);
    CHECK(pool.stats().eager_calls == 0);
    return std::make_pair(losses, host_copies(model->parameters()));
  };
  const auto [alone_losses, alone_params] = run(false);
  const auto [raced_losses, raced_params] = run(true);
  CHECK(max_difference(alone_losses, raced_losses) <= 1e-6);
  CHECK(max_difference(alone_params, raced_params) <= 1e-6);
}

// ---- an optimizer over no parameters (GPU) --------------------------------------------------------

// A training step over an optimizer of no parameters with clipping on, whose loss is of constant
// tensors: every kind of step (whole, micro-batches one per call and all in one call, from given
// gradients) runs the loss function and no backward (a constant has none), updates nothing and
// hands out the loss alone (no norm: the optimizer clips nothing), at warm-up, recording and
// replays; the schedule counts its steps.
TEST_CASE("training/hostile: a training step over no parameters runs its loss function and updates nothing",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  const auto constant_loss = [](cgt::torch::Inputs in) { return cgt::torch::Values{(in[0] * 2).sum()}; };
  const auto x = torch::arange(8, torch::TensorOptions(gpu).dtype(torch::kFloat));
  const double expected = 2.0 * 28.0;  // 2 * (0 + 1 + ... + 7)
  struct Kind {
    const char* what;
    std::int64_t micro_batches;
    bool all_in_one;
    bool from_gradients;
  };
  for (const Kind kind :
       {Kind{"whole step", 1, false, false}, Kind{"2 micro-batches one per call", 2, false, false},
        Kind{"2 micro-batches in one call", 2, true, false}, Kind{"from gradients", 1, false, true}}) {
    INFO(kind.what);
    auto adam = must(cgt::torch::make_adam({}, {.lr = 1e-3, .max_grad_norm = 1.0}));
    must(adam.set_schedule([](std::int64_t) { return 1e-3; }));
    auto pool = must(cgt::torch::make_pool({.device = 0}));
    auto step =
        kind.from_gradients
            ? must(cgt::torch::make_training_step_from_gradients(pool, adam, constant_loss))
            : must(cgt::torch::make_training_step(pool, adam, constant_loss,
                                                  cgt::torch::TrainingStepOptions{.micro_batches = kind.micro_batches,
                                                                                  .all_in_one_call = kind.all_in_one}));
    for (int call = 0; call < 6; ++call) {
      INFO("call " << call);
      pool.mark_step_begin();
      auto out = step({x});
      if (!out) FAIL(out.error().describe());
      REQUIRE(out->size() == 1);  // the loss alone: no norm
      // In one call the loss is the mean of the micro-batches': each sums half of x, doubled.
      CHECK(must(out->take(0)).item<double>() == (kind.all_in_one ? expected / 2 : expected));
    }
    const std::int64_t per_step = kind.all_in_one ? 1 : kind.micro_batches;
    CHECK(adam.scheduled_steps() == 6 / per_step);
    CHECK(step.micro_batches_taken() == 0);
    CHECK(pool.stats().eager_calls == 0);
  }
}

// ---- clipping at the edges (GPU) ------------------------------------------------------------------

// Clipping on the device does what libtorch's clip_grad_norm_ does, without loss scaling, where the
// gradients are all zero (the norm is 0, not NaN: the coefficient is capped at 1), hold a NaN (the
// norm is NaN and every gradient, finite or not, becomes NaN, and so does every parameter), or an
// infinity (the norm is infinite: every finite gradient becomes 0, the infinite one NaN). Orders 2
// and infinity; the edge comes at a replay, after a warm-up and a recording on finite gradients.
// SGD on (w1 * a).sum() + (w2 * b).sum(): the gradients are a and b.
TEST_CASE("training/hostile: clipping zero, NaN and infinite gradients as clip_grad_norm_ does",
          "[gpu][training][hostile]") {
  REQUIRE_GPU();
  enum class Edge : std::uint8_t { zero, nan, inf };
  for (const double order : {2.0, infinity}) {
    for (const Edge edge : {Edge::zero, Edge::nan, Edge::inf}) {
      INFO("order " << order << ", " << (edge == Edge::zero ? "zero" : edge == Edge::nan ? "NaN" : "infinity"));
      torch::manual_seed(9);
      std::vector<std::pair<torch::Tensor, torch::Tensor>> inputs;
      for (int i = 0; i < 2; ++i) inputs.emplace_back(torch::randn({64}, gpu) * 3, torch::randn({32}, gpu) * 3);
      auto a = torch::randn({64}, gpu);
      auto b = torch::randn({32}, gpu);
      if (edge == Edge::zero) {
        a.zero_();
        b.zero_();
      }
      if (edge == Edge::nan) a[5] = not_a_number;
      if (edge == Edge::inf) a[5] = infinity;
      inputs.emplace_back(a, b);
      const auto w1_init = torch::randn({64}, gpu);
      const auto w2_init = torch::randn({32}, gpu);

      // cgt: the whole-step graph.
      auto w1 = w1_init.clone().requires_grad_();
      auto w2 = w2_init.clone().requires_grad_();
      auto sgd = must(cgt::torch::make_sgd({w1, w2}, {.lr = 0.1, .max_grad_norm = 1.0, .grad_norm_type = order}));
      auto pool = must(cgt::torch::make_pool({.device = 0}));
      auto step = must(cgt::torch::make_training_step(pool, sgd, [&](cgt::torch::Inputs in) {
        return cgt::torch::Values{(w1 * in[0]).sum() + (w2 * in[1]).sum()};
      }));
      // libtorch: clip_grad_norm_ and SGD, eagerly.
      auto e1 = w1_init.clone().requires_grad_();
      auto e2 = w2_init.clone().requires_grad_();
      torch::optim::SGD eager({e1, e2}, torch::optim::SGDOptions(0.1));

      std::vector<torch::Tensor> params_before;
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        INFO("call " << i);
        params_before = host_copies({w1, w2});
        pool.mark_step_begin();
        auto out = step({inputs[i].first, inputs[i].second});
        if (!out) FAIL(out.error().describe());
        REQUIRE(out->size() == 2);
        const double norm = must(out->take(1)).item<double>();
        eager.zero_grad();
        ((e1 * inputs[i].first).sum() + (e2 * inputs[i].second).sum()).backward();
        const double eager_norm = torch::nn::utils::clip_grad_norm_({e1, e2}, 1.0, order);
        const auto eager_grads = host_copies({e1.grad(), e2.grad()});
        eager.step();
        INFO("norm " << norm << ", clip_grad_norm_'s " << eager_norm);
        CHECK(((std::isnan(norm) && std::isnan(eager_norm)) || norm == eager_norm ||
               std::abs(norm - eager_norm) <= 1e-5 * std::abs(eager_norm)));
        CHECK(nan_close(host_copies(sgd.grads()), eager_grads, 1e-6));
        CHECK(nan_close(host_copies({w1, w2}), host_copies({e1, e2}), 1e-6));
      }
      // What the edge did, spelled out.
      const auto grads = host_copies(sgd.grads());
      if (edge == Edge::zero) {
        CHECK(sgd.grad_norm().item<double>() == 0);
        CHECK(grads[0].abs().max().item<double>() == 0);
        CHECK(same(params_before, host_copies({w1, w2})));
      } else if (edge == Edge::nan) {
        CHECK(std::isnan(sgd.grad_norm().item<double>()));
        CHECK(grads[0].isnan().all().item<bool>());
        CHECK(grads[1].isnan().all().item<bool>());
        CHECK(w2.detach().isnan().all().item<bool>());
      } else {
        CHECK(std::isinf(sgd.grad_norm().item<double>()));
        CHECK(grads[0].isnan().sum().item<std::int64_t>() == 1);
        CHECK(grads[0].isnan()[5].item<bool>());
        CHECK(torch::nan_to_num(grads[0], 0).abs().max().item<double>() == 0);
        CHECK(grads[1].abs().max().item<double>() == 0);
        CHECK(same({params_before[1]}, host_copies({w2})));
      }
      CHECK(pool.stats().replays == 1);
    }
  }
}
