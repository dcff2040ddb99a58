// Capturable optimizers: state on the device, made with the optimizer; a step of device work only.
module;
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_copy.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_maximum.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_neg.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_pow.h>
#include <ATen/ops/_foreach_reciprocal.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_foreach_zero.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>

#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAStream.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <iterator>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :optim_state;

namespace cgt::torch {

namespace {

// `which`: how the messages name the parameter ("parameter 3").
Result<void> check_param(const at::Tensor& p, const std::string& which) {
  if (!p.defined()) return fail(Errc::invalid_argument, which + " is undefined");
  if (!p.is_cuda()) return fail(Errc::invalid_argument, which + " is not on a CUDA device");
  if (!p.is_floating_point()) return fail(Errc::invalid_argument, which + " is not floating point");
  if (!(p.layout() == at::kStrided)) return fail(Errc::invalid_argument, which + " is not a dense strided tensor");
  if (!p.requires_grad() || !p.is_leaf()) {
    return fail(Errc::invalid_argument, which + " is not a leaf that requires grad: nothing would train it");
  }
  // An expanded tensor (a stride of 0) is one element seen many times: an in-place update of it
  // fails inside the step, after the step counts and moments were written.
  if (at::has_internal_overlap(p) == at::MemOverlap::Yes) {
    return fail(Errc::invalid_argument, which + " has elements that share memory (an expanded tensor): clone it");
  }
  return {};
}

}  // namespace

bool is_rate(double lr) noexcept {
  return std::isfinite(lr) && lr >= 0 && lr <= std::numeric_limits<float>::max();
}

namespace {

// A weight decay, eps or momentum an update can use: finite and not below 0 (an infinite one
// turns every parameter into NaN or infinity at the first step).
bool is_coefficient(double value) noexcept {
  return std::isfinite(value) && value >= 0;
}

}  // namespace

std::string number_text(double value) {
  std::array<char, 32> text{};
  const auto [end, error] = std::to_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc()) return std::to_string(value);
  return {text.data(), end};
}

Result<std::unique_ptr<LossScale>> LossScale::make(const LossScaleOptions& options, const at::Device& device) {
  if (!std::isfinite(options.init_scale) || options.init_scale <= 0 || !std::isfinite(options.growth_factor) ||
      options.growth_factor <= 1 || !(options.backoff_factor > 0) || !(options.backoff_factor < 1) ||
      options.growth_interval < 1) {
    return fail(Errc::invalid_argument,
                "loss scaling: init_scale must be finite and above 0, growth_factor finite and above 1, "
                "backoff_factor in (0, 1) and growth_interval at least 1");
  }
  auto made = std::make_unique<LossScale>();
  made->options_ = options;
  try {
    const auto on = at::TensorOptions().device(device).requires_grad(false);
    made->scale_ = at::full({}, options.init_scale, on.dtype(at::kFloat));
    made->growth_tracker_ = at::zeros({}, on.dtype(at::kInt));
    made->found_inf_ = at::zeros({}, on.dtype(at::kFloat));
    made->inv_scale_ = at::zeros({}, on.dtype(at::kFloat));
    made->skipped_ = at::zeros({}, on.dtype(at::kLong));
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string("making the loss scale's state: ") + e.what());
  }
  return made;
}

void LossScale::unscale(const std::vector<at::Tensor>& grads) {
  found_inf_.zero_();
  inv_scale_.copy_(scale_.to(at::kDouble).reciprocal());
  // The kernel takes one dtype at a time (GradScaler groups the gradients so too).
  std::vector<std::pair<at::ScalarType, std::vector<at::Tensor>>> by_dtype;
  for (const at::Tensor& grad : grads) {
    auto group = std::ranges::find_if(by_dtype, [&grad](const auto& g) { return g.first == grad.scalar_type(); });
    if (group == by_dtype.end()) group = by_dtype.insert(by_dtype.end(), {grad.scalar_type(), {}});
    group->second.push_back(grad);
  }
  for (const auto& [dtype, group] : by_dtype) {
    at::_amp_foreach_non_finite_check_and_unscale_(group, found_inf_, inv_scale_);
  }
}

void LossScale::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
  skipped_.add_(found_inf_.to(at::kLong));
}

std::vector<at::Tensor> LossScale::save(const std::vector<at::Tensor>& written) const {
  std::vector<at::Tensor> saved;
  saved.reserve(written.size());
  for (const at::Tensor& t : written) saved.push_back(t.clone());
  return saved;
}

void LossScale::restore_where_found_inf(const std::vector<at::Tensor>& written,
                                        const std::vector<at::Tensor>& saved) const {
  const at::Tensor skip = found_inf_.ne(0);
  for (std::size_t i = 0; i < written.size(); ++i) written[i].copy_(at::where(skip, saved[i], written[i]));
}

namespace {

const std::vector<at::Tensor>& no_tensors() {
  static const std::vector<at::Tensor> none;
  return none;
}

std::string moved_from(const std::string& what) {
  return what +
         ": the optimizer handle holds no state (made by default, or moved from): use the handle it was moved "
         "into, or make one with make_adam/make_sgd";
}

}  // namespace

// Each member below that changes or copies the state holds it for its duration (OperationInUse):
// while another thread's graphed step runs it changes nothing, and fails (or throws, where it
// returns nothing).
//
// The program's step and zero_grad take or drop the gradients a training step has accumulated so
// far: they end its step in progress. Called inside a step's function (its own zero_grad and step,
// at warm-up and recording) they leave the progress to TrainingStep's call, which keeps it for
// replays too.
void Optimizer::step() {
  TORCH_CHECK(state_ != nullptr, moved_from("Optimizer::step"));
  const OperationInUse in_use(state_->in_use_);
  TORCH_CHECK(!in_use.refused(), used_by_another_thread("Optimizer::step"));
  state_->step();
  if (!in_use.inside()) state_->progress_.clear();
}

void Optimizer::step(std::span<const at::Tensor> grads) {
  TORCH_CHECK(state_ != nullptr, moved_from("Optimizer::step"));
  const OperationInUse in_use(state_->in_use_);
  TORCH_CHECK(!in_use.refused(), used_by_another_thread("Optimizer::step"));
  state_->step(grads);
  if (!in_use.inside()) state_->progress_.clear();
}

void Optimizer::zero_grad(bool set_to_none) {
  if (state_ == nullptr) return;  // without state there is nothing to zero
  const OperationInUse in_use(state_->in_use_);
  TORCH_CHECK(!in_use.refused(), used_by_another_thread("Optimizer::zero_grad"));
  state_->zero_grad(set_to_none);
  if (!in_use.inside()) state_->progress_.clear();
}

Result<void> Optimizer::attach_grads() {
  if (state_ == nullptr) return fail(Errc::invalid_argument, moved_from("Optimizer::attach_grads"));
  const OperationInUse in_use(state_->in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::attach_grads"));
  return state_->attach_grads();
}

Result<void> Optimizer::set_lr(double lr) {
  if (state_ == nullptr) return fail(Errc::invalid_argument, moved_from("Optimizer::set_lr"));
  const OperationInUse in_use(state_->in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::set_lr"));
  return state_->set_lr(lr);
}

double Optimizer::lr() const noexcept {
  return state_ != nullptr ? state_->lr_.load() : 0;
}

std::size_t Optimizer::group_count() const noexcept {
  return state_ != nullptr ? state_->groups_.size() : 0;
}

// The groups never change once made; the rate is read once, as lr() reads it.
Result<ParamGroupInfo> Optimizer::group(std::size_t g) const {
  if (state_ == nullptr) return fail(Errc::invalid_argument, moved_from("Optimizer::group"));
  if (g >= state_->groups_.size()) {
    return fail(Errc::invalid_argument, "Optimizer::group: there is no group " + std::to_string(g) + " of " +
                                            std::to_string(state_->groups_.size()));
  }
  const State::Group& group = state_->groups_[g];
  return ParamGroupInfo{.first = group.begin,
                        .count = group.end - group.begin,
                        .weight_decay = group.weight_decay,
                        .lr_factor = group.lr_factor,
                        .lr = state_->lr_.load() * group.lr_factor};
}

Result<void> Optimizer::set_schedule(LrSchedule schedule, std::int64_t start) {
  if (state_ == nullptr) return fail(Errc::invalid_argument, moved_from("Optimizer::set_schedule"));
  if (start < 0 || start > max_scheduled_steps) {
    return fail(Errc::invalid_argument, "Optimizer::set_schedule: the step to start from is " + std::to_string(start) +
                                            "; a schedule counts steps from 0 to 2^62");
  }
  LrSchedule replaced;  // destroyed after the hold is given back: its destructor is the program's code
  const OperationInUse in_use(state_->in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("Optimizer::set_schedule"));
  replaced = std::exchange(state_->schedule_, std::move(schedule));
  state_->scheduled_steps_.store(start);
  return {};
}

std::int64_t Optimizer::scheduled_steps() const noexcept {
  return state_ != nullptr ? state_->scheduled_steps_.load() : 0;
}

// A graphed step's call holds the state (StepInUse) around this and `count_scheduled_step`.
Result<void> Optimizer::take_scheduled_lr() {
  if (state_ == nullptr || !state_->schedule_) return {};
  const std::int64_t step = state_->scheduled_steps_.load();
  double rate = 0;
  try {
    rate = state_->schedule_(step);
  } catch (const std::exception& e) {
    return fail(Errc::function_failed,
                "the learning-rate schedule threw at step " + std::to_string(step) + ": " + e.what());
  } catch (...) {  // whatever the program's function throws comes back as an error, as a pool function's does
    return fail(Errc::function_failed,
                "the learning-rate schedule threw at step " + std::to_string(step) + " (not a std::exception)");
  }
  if (auto set = state_->set_lr(rate); !set) {
    Error error = std::move(set.error());
    error.message = "the learning-rate schedule at step " + std::to_string(step) + ": " + error.message;
    return std::unexpected(std::move(error));
  }
  return {};
}

void Optimizer::count_scheduled_step() noexcept {
  if (state_ == nullptr || !state_->schedule_) return;
  const std::int64_t counted = state_->scheduled_steps_.load();
  if (counted < max_scheduled_steps) state_->scheduled_steps_.store(counted + 1);  // never overflows
}

const at::Tensor& Optimizer::grad_norm() const noexcept {
  static const at::Tensor none;
  return state_ != nullptr ? state_->grad_norm_ : none;
}

bool Optimizer::clips_gradients() const noexcept {
  return state_ != nullptr && state_->clips_gradients();
}

const at::Tensor& Optimizer::loss_scale() const noexcept {
  static const at::Tensor none;
  return scales_loss() ? state_->loss_scale_->scale() : none;
}

const at::Tensor& Optimizer::skipped_steps() const noexcept {
  static const at::Tensor none;
  return scales_loss() ? state_->loss_scale_->skipped() : none;
}

bool Optimizer::scales_loss() const noexcept {
  return state_ != nullptr && state_->loss_scale_ != nullptr;
}

bool Optimizer::has_static_grads() const noexcept {
  return state_ != nullptr && state_->static_grads_;
}
const std::vector<at::Tensor>& Optimizer::params() const noexcept {
  return state_ != nullptr ? state_->params_ : no_tensors();
}
const std::vector<at::Tensor>& Optimizer::grads() const noexcept {
  return state_ != nullptr ? state_->grads_ : no_tensors();
}
const std::vector<at::Tensor>& Optimizer::steps() const noexcept {
  return state_ != nullptr ? state_->steps_ : no_tensors();
}

// The handle's state is Adam's when make_adam made it; a base handle assigned another
// optimizer's state through `Optimizer&` is not, and reads as a handle without state.
const Adam::State* Adam::adam_state() const noexcept {
  return dynamic_cast<const State*>(state_.get());
}
const AdamOptions& Adam::options() const noexcept {
  static const AdamOptions defaults;
  const State* state = adam_state();
  return state != nullptr ? state->options_ : defaults;
}
const std::vector<at::Tensor>& Adam::exp_avgs() const noexcept {
  const State* state = adam_state();
  return state != nullptr ? state->exp_avgs_ : no_tensors();
}
const std::vector<at::Tensor>& Adam::exp_avg_sqs() const noexcept {
  const State* state = adam_state();
  return state != nullptr ? state->exp_avg_sqs_ : no_tensors();
}
const std::vector<at::Tensor>& Adam::max_exp_avg_sqs() const noexcept {
  const State* state = adam_state();
  return state != nullptr ? state->max_exp_avg_sqs_ : no_tensors();
}

const SGD::State* SGD::sgd_state() const noexcept {
  return dynamic_cast<const State*>(state_.get());
}
const SGDOptions& SGD::options() const noexcept {
  static const SGDOptions defaults;
  const State* state = sgd_state();
  return state != nullptr ? state->options_ : defaults;
}

Result<void> Optimizer::State::adopt(std::vector<ParamGroup> groups, bool static_grads, double lr,
                                     double weight_decay) {
  // The groups' own options first (they need no device), then their parameters, numbered across
  // the groups as params() lists them.
  std::vector<Group> made;
  std::vector<at::Tensor> params;
  std::vector<std::size_t> group_of;  // per parameter
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string which = "group " + std::to_string(g);
    Group group{.begin = params.size(), .weight_decay = groups[g].weight_decay.value_or(weight_decay)};
    if (const std::optional<double> own = groups[g].lr; own.has_value()) {
      if (!is_rate(*own)) {
        return fail(Errc::invalid_argument,
                    which + "'s lr must be finite, >= 0 and within float32's range, not " + number_text(*own));
      }
      if (lr == 0) {
        // PyTorch's schedulers scale each group's first rate; here a group's rate is the options'
        // rate times its lr / options.lr, which a rate of 0 leaves without a value.
        return fail(Errc::invalid_argument,
                    which + " has an lr of its own (" + number_text(*own) +
                        ") but the options' lr is 0: a group steps at the options' rate times its lr / options.lr, "
                        "which has no value; give the options a rate above 0, or leave the group's lr unset");
      }
      group.lr_factor = *own / lr;
      if (!std::isfinite(group.lr_factor) || !is_rate(lr * group.lr_factor)) {
        return fail(Errc::invalid_argument, which + "'s lr over the options' lr (" + number_text(*own) + " / " +
                                                number_text(lr) + ") is beyond float32's range");
      }
    }
    if (!is_coefficient(group.weight_decay)) {
      return fail(Errc::invalid_argument,
                  which + "'s weight_decay must be finite and >= 0, not " + number_text(group.weight_decay));
    }
    for (at::Tensor& p : groups[g].params) {
      params.push_back(std::move(p));
      group_of.push_back(g);
    }
    group.end = params.size();
    made.push_back(std::move(group));
  }
  // "parameter 5", and with several groups "parameter 5 (group 1's parameter 2)".
  const auto name = [&](std::size_t i) {
    std::string out = "parameter " + std::to_string(i);
    if (made.size() > 1) {
      const std::size_t g = group_of[i];
      out += " (group " + std::to_string(g) + "'s parameter " + std::to_string(i - made[g].begin) + ")";
    }
    return out;
  };
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (auto ok = check_param(params[i], name(i)); !ok) return ok;
    for (std::size_t j = 0; j < i; ++j) {
      if (params[j].is_same(params[i])) {
        return fail(Errc::invalid_argument,
                    name(i) + " is " + name(j) + (made.size() > 1 ? ": a parameter belongs to one group" : ""));
      }
    }
  }
  try {
    const c10::NoGradGuard no_grad;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (static_grads) {
        // The gradient keeps an existing `.grad`'s values (a program may accumulate before the
        // first step) but is always a tensor of ours, made here: never one that lives in a pool.
        at::Tensor grad = at::zeros_like(p, at::MemoryFormat::Preserve);
        if (p.grad().defined()) grad.copy_(p.grad());
        p.mutable_grad() = grad;
        grads_.push_back(std::move(grad));
      }
      steps_.push_back(at::zeros({}, p.options().dtype(at::kFloat)));
      all_.push_back(i);
      std::vector<at::Tensor>& rates = made[group_of[i]].lr_by_device;
      const auto same_device = [&p](const at::Tensor& t) { return t.device() == p.device(); };
      auto rate = std::ranges::find_if(rates, same_device);
      if (rate == rates.end()) {
        const double value = lr * made[group_of[i]].lr_factor;
        rates.push_back(at::full({}, value, p.options().dtype(at::kFloat).requires_grad(false)));
        rate = std::prev(rates.end());
      }
      lrs_.push_back(*rate);
    }
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string("making the optimizer's state: ") + e.what());
  }
  params_ = std::move(params);
  groups_ = std::move(made);
  static_grads_ = static_grads;
  lr_.store(lr);
  return {};
}

bool is_capturing(const at::Device& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &status);
  return asked != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

Result<void> Optimizer::State::clip_by_norm(double max_norm, double norm_type) {
  if (!std::isfinite(max_norm) || max_norm < 0 || std::isnan(norm_type) || norm_type <= 0) {
    return fail(Errc::invalid_argument,
                "gradient clipping: max_grad_norm must be finite and >= 0 (0: no clipping), "
                "grad_norm_type above 0 (or infinity), not " +
                    std::to_string(max_norm) + " and " + std::to_string(norm_type));
  }
  max_grad_norm_ = max_norm;
  grad_norm_type_ = norm_type;
  if (max_norm == 0 || params_.empty()) return {};
  try {
    grad_norm_ = at::zeros({}, params_.front().options().dtype(at::kFloat).requires_grad(false));
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string("making the gradient norm's tensor: ") + e.what());
  }
  return {};
}

Result<void> Optimizer::State::scale_loss(const LossScaleOptions& options) {
  if (!options.dynamic || params_.empty()) return {};
  const at::Device device = params_.front().device();
  for (std::size_t i = 1; i < params_.size(); ++i) {
    if (params_[i].device() != device) {
      return fail(Errc::invalid_argument, "loss scaling: parameter " + std::to_string(i) + " is on " +
                                              params_[i].device().str() + " and parameter 0 on " + device.str() +
                                              "; the scale and its flag live on one device: one optimizer per device");
    }
  }
  auto made = LossScale::make(options, device);
  if (!made) return std::unexpected(std::move(made.error()));
  loss_scale_ = std::move(*made);
  return {};
}

// PyTorch's clip_grad_norm_ (torch/nn/utils/clip_grad.py), op for op, without its host decisions:
// the norms of the gradients, their norm, the coefficient clamped at 1, every gradient scaled by it.
// As there, the gradients are taken a device at a time (a foreach kernel reads one device's
// tensors, and the coefficient of one device cannot scale another's): the norms are moved to the
// first device for the total, and the coefficient to each device for its gradients.
void Optimizer::State::clip(const std::vector<at::Tensor>& grads) {
  if (!clips_gradients() || grads.empty()) return;
  std::vector<std::vector<at::Tensor>> by_device;
  for (const at::Tensor& grad : grads) {
    auto group =
        std::ranges::find_if(by_device, [&grad](const auto& g) { return g.front().device() == grad.device(); });
    if (group == by_device.end()) group = by_device.insert(by_device.end(), std::vector<at::Tensor>{});
    group->push_back(grad);
  }
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& group : by_device) {
    for (const at::Tensor& norm : at::_foreach_norm(group, grad_norm_type_))
      norms.push_back(norm.to(grad_norm_.device()));
  }
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), grad_norm_type_);
  grad_norm_.copy_(total);
  const at::Tensor coefficient = at::full_like(total, max_grad_norm_);  // in-place ops below: const handle
  coefficient.div_(total.add(1e-6));
  coefficient.clamp_max_(1.0);
  for (const auto& group : by_device) at::_foreach_mul_(group, coefficient.to(group.front().device()));
}

Result<void> Optimizer::State::set_lr(double lr) {
  if (auto ok = check_lr(lr); !ok) return ok;
  return write_lr(lr);
}

Result<void> Optimizer::State::check_lr(double lr) const {
  if (!is_rate(lr)) {
    return fail(Errc::invalid_argument,
                "the learning rate must be finite, >= 0 and within float32's range, not " + std::to_string(lr));
  }
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (is_rate(lr * groups_[g].lr_factor)) continue;
    return fail(Errc::invalid_argument, "the learning rate " + number_text(lr) + " times group " + std::to_string(g) +
                                            "'s factor " + number_text(groups_[g].lr_factor) +
                                            " is beyond float32's range, where the group's rate lives");
  }
  return {};
}

Result<void> Optimizer::State::write_lr(double lr) {
  for (const Group& group : groups_) {
    for (const at::Tensor& rate : group.lr_by_device) {
      if (!is_capturing(rate.device())) continue;
      return fail(Errc::invalid_argument,
                  "set_lr while the current stream captures a graph (inside a pool function): the write would be "
                  "recorded, and every replay would set this rate again; set the rate between steps, or give the "
                  "optimizer a schedule (set_schedule)");
    }
  }
  try {
    // Kernels on the current stream: no wait. A factor of 1 gives `lr` itself.
    for (const Group& group : groups_) {
      for (const at::Tensor& rate : group.lr_by_device) rate.fill_(lr * group.lr_factor);
    }
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string("writing the learning rate: ") + e.what());
  }
  lr_.store(lr);
  return {};
}

std::vector<at::Tensor> Optimizer::State::pick(const std::vector<at::Tensor>& all,
                                               const std::vector<std::size_t>& index) {
  if (index.size() == all.size()) return all;
  std::vector<at::Tensor> picked;
  picked.reserve(index.size());
  for (const std::size_t i : index) picked.push_back(all[i]);
  return picked;
}

void Optimizer::State::step() {
  step_only(all_);
}

void Optimizer::State::step_only(const std::vector<std::size_t>& among) {
  const c10::NoGradGuard no_grad;
  // Host decisions about which parameters have a gradient: in a graph they are taken once, when
  // it is recorded (the training step attaches every gradient first, and passes the parameters
  // its backward reached).
  std::vector<std::size_t> with_grad;
  std::vector<at::Tensor> grads;
  with_grad.reserve(among.size());
  grads.reserve(among.size());
  for (const std::size_t i : among) {
    const at::Tensor& p = params_[i];
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    if (static_grads_ && !grad.is_same(grads_[i])) {
      grads_[i].copy_(grad);
      p.mutable_grad() = grads_[i];
    }
    with_grad.push_back(i);
    grads.push_back(p.grad());
  }
  if (with_grad.empty()) {
    if (clips_gradients()) grad_norm_.zero_();  // clip_grad_norm_ over no gradients: 0
    return;
  }
  // The unscaling and the clipping take every group's gradients together (PyTorch's
  // clip_grad_norm_ over model.parameters()); the update is each group's own.
  if (loss_scale_) loss_scale_->unscale(grads);
  clip(grads);
  update_groups(with_grad, grads);
  if (loss_scale_) loss_scale_->update();
}

void Optimizer::State::update_groups(const std::vector<std::size_t>& index, const std::vector<at::Tensor>& grads) {
  for (const Group& group : groups_) {
    std::vector<std::size_t> in_group;
    std::vector<at::Tensor> its_grads;
    for (std::size_t k = 0; k < index.size(); ++k) {
      if (index[k] < group.begin || index[k] >= group.end) continue;
      in_group.push_back(index[k]);
      its_grads.push_back(grads[k]);
    }
    if (!in_group.empty()) update(group, in_group, std::move(its_grads));
  }
}

void Optimizer::State::step(std::span<const at::Tensor> grads) {
  const c10::NoGradGuard no_grad;
  TORCH_CHECK(grads.size() == params_.size(), "the optimizer has ", params_.size(), " parameters but was given ",
              grads.size(), " gradients");
  if (params_.empty()) return;  // nothing to update (the foreach kernels refuse empty lists)
  std::vector<at::Tensor> given;
  given.reserve(grads.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& p = params_[i];
    const at::Tensor& g = grads[i];
    TORCH_CHECK(g.defined(), "gradient ", i, " is undefined");
    TORCH_CHECK(g.sizes() == p.sizes() && g.scalar_type() == p.scalar_type() && g.device() == p.device(), "gradient ",
                i, " (", g.sizes(), ", ", g.scalar_type(), ", ", g.device(), ") does not match parameter ", i, " (",
                p.sizes(), ", ", p.scalar_type(), ", ", p.device(), ")");
    // The fused and multi-tensor kernels read parameter and gradient element for element in
    // memory order: a transposed gradient (a joint graph's weight gradient, say) is put in the
    // parameter's layout first. Static gradients have it: the copy into them does that.
    given.push_back(static_grads_ || g.strides() == p.strides() ? g : at::empty_like(p).copy_(g));
  }
  if (static_grads_) {
    at::_foreach_copy_(grads_, given);
    if (loss_scale_) loss_scale_->unscale(grads_);
    clip(grads_);
    update_groups(all_, grads_);
  } else {
    if (loss_scale_) loss_scale_->unscale(given);
    clip(given);
    update_groups(all_, given);
  }
  if (loss_scale_) loss_scale_->update();
}

std::vector<std::int64_t> Optimizer::State::grad_versions() const {
  std::vector<std::int64_t> versions;
  if (!static_grads_) return versions;
  versions.reserve(grads_.size());
  for (const at::Tensor& grad : grads_) versions.push_back(grad._version());
  return versions;
}

std::vector<bool> Optimizer::State::reached_since(const std::vector<std::int64_t>& versions) const {
  std::vector<bool> reached(versions.size(), false);
  for (std::size_t i = 0; i < versions.size(); ++i) {
    const at::Tensor& grad = params_[i].grad();
    // A backward with create_graph puts a new tensor in `.grad` instead of adding in place.
    reached[i] = grad.defined() && (!grad.is_same(grads_[i]) || grads_[i]._version() != versions[i]);
  }
  return reached;
}

void Optimizer::State::zero_grad(bool set_to_none) {
  if (set_to_none) {
    for (const at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
    return;
  }
  const c10::NoGradGuard no_grad;
  // Gradients the program put in place of ours are zeroed too (as libtorch's zero_grad does).
  std::vector<at::Tensor> grads;
  grads.reserve(params_.size());
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (!grads.empty()) at::_foreach_zero_(grads);
}

Result<void> Optimizer::State::attach_grads() {
  if (!static_grads_) return {};  // per-step gradients: nothing to attach
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& p = params_[i];
    if (!p.grad().defined()) {
      p.mutable_grad() = grads_[i];
    } else if (!p.grad().is_same(grads_[i])) {
      return fail(Errc::invalid_argument,
                  "parameter " + std::to_string(i) +
                      "'s .grad was replaced by another tensor: a training step's graph writes the gradient at "
                      "the address it recorded; set .grad to none (zero_grad(true)) or leave it alone");
    }
  }
  return {};
}

namespace {

// The part of making an optimizer that Adam and SGD share: the groups adopted, then clipping and
// loss scaling as the options ask; an error's message names the optimizer.
template <class OptimizerState, class Options>
Result<void> set_up(OptimizerState& state, const char* who, std::vector<ParamGroup> groups, const Options& options) {
  if (auto ok = state.adopt(std::move(groups), options.static_grads, options.lr, options.weight_decay); !ok) {
    ok.error().message = std::string(who) + ": " + ok.error().message;
    return ok;
  }
  if (auto ok = state.clip_by_norm(options.max_grad_norm, options.grad_norm_type); !ok) return ok;
  return state.scale_loss(options.loss_scale);
}

}  // namespace

Result<Adam> make_adam(std::vector<ParamGroup> groups, AdamOptions options) {
  if (!is_rate(options.lr) || !is_coefficient(options.eps) || !is_coefficient(options.weight_decay) ||
      !(options.beta1 >= 0) || !(options.beta1 < 1) || !(options.beta2 >= 0) || !(options.beta2 < 1)) {
    return fail(Errc::invalid_argument,
                "Adam: lr, eps and weight_decay must be finite and >= 0 (lr within float32), betas in [0, 1)");
  }
  auto state = std::make_shared<Adam::State>();
  state->options_ = options;
  if (auto ok = set_up(*state, "Adam", std::move(groups), options); !ok) return std::unexpected(std::move(ok.error()));
  try {
    const c10::NoGradGuard no_grad;
    for (const at::Tensor& p : state->params_) {
      state->exp_avgs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sqs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (options.amsgrad) state->max_exp_avg_sqs_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
    }
  } catch (const std::exception& e) {
    return fail(Errc::backend_error, std::string("making Adam's state: ") + e.what());
  }
  Adam adam;
  adam.state_ = std::move(state);
  return adam;
}

Result<Adam> make_adam(std::vector<at::Tensor> params, AdamOptions options) {
  std::vector<ParamGroup> one;
  one.push_back({.params = std::move(params)});
  return make_adam(std::move(one), options);
}

Result<Adam> make_adam(std::initializer_list<at::Tensor> params, AdamOptions options) {
  return make_adam(std::vector<at::Tensor>(params), options);
}

namespace {

// Whether PyTorch's fused Adam kernel takes these lists: it walks each tensor's memory as one
// dense range, so every tensor of a parameter's group must have the parameter's dtype, device,
// sizes and strides, and be dense; the step counts are float32 on the same device.
bool fused_kernel_takes(const std::vector<std::vector<at::Tensor>>& lists, const std::vector<at::Tensor>& steps) {
  const std::vector<at::Tensor>& params = lists.front();
  if (params.empty()) return false;
  const at::Tensor& first = params.front();
  if (first.scalar_type() != at::kFloat && first.scalar_type() != at::kDouble && first.scalar_type() != at::kHalf &&
      first.scalar_type() != at::kBFloat16) {
    return false;
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device() || !p.is_non_overlapping_and_dense()) {
      return false;
    }
    for (const auto& list : lists) {
      const at::Tensor& t = list[i];
      if (!t.defined() || t.scalar_type() != p.scalar_type() || t.device() != p.device() || t.sizes() != p.sizes() ||
          t.strides() != p.strides()) {
        return false;
      }
    }
    if (steps[i].scalar_type() != at::kFloat || steps[i].device() != p.device()) return false;
  }
  return true;
}

}  // namespace

void Adam::State::update(const Group& group, const std::vector<std::size_t>& index, std::vector<at::Tensor> grads) {
  const std::vector<at::Tensor> params = pick(params_, index);
  const std::vector<at::Tensor> exp_avgs = pick(exp_avgs_, index);
  const std::vector<at::Tensor> exp_avg_sqs = pick(exp_avg_sqs_, index);
  const std::vector<at::Tensor> max_exp_avg_sqs =
      options_.amsgrad ? pick(max_exp_avg_sqs_, index) : std::vector<at::Tensor>{};
  const std::vector<at::Tensor> steps = pick(steps_, index);
  std::vector<std::vector<at::Tensor>> lists{params, grads, exp_avgs, exp_avg_sqs};
  if (options_.amsgrad) lists.push_back(max_exp_avg_sqs);
  if (!fused_kernel_takes(lists, steps)) {
    // The multi-tensor formula cannot take the flag: what it writes is put back where it is set.
    std::vector<at::Tensor> written;
    if (loss_scale_) {
      written = lists.front();  // the parameters, then the moments (not the gradients), then the counts
      for (std::size_t l = 2; l < lists.size(); ++l) written.insert(written.end(), lists[l].begin(), lists[l].end());
      written.insert(written.end(), steps.begin(), steps.end());
    }
    const std::vector<at::Tensor> saved = loss_scale_ ? loss_scale_->save(written) : std::vector<at::Tensor>{};
    update_multi_tensor(group, index, std::move(grads));
    if (loss_scale_) loss_scale_->restore_where_found_inf(written, saved);
    return;
  }
  // The steps are counted first (the kernel reads them), then every tensor is updated in one pass,
  // at the group's rate on the device (one device: the kernel takes the parameters of one) and
  // with its weight decay (a host double: one kernel per group).
  // With loss scaling the gradients are unscaled already (`step`): the kernel gets the flag alone,
  // returns without writing where it is set, and the skipped step is taken off the counts again,
  // as PyTorch's `_fused_adam` does under GradScaler.
  const auto& o = options_;
  const at::Tensor& lr = lrs_[index.front()];
  const std::optional<at::Tensor> found_inf =
      loss_scale_ ? std::optional<at::Tensor>(loss_scale_->found_inf()) : std::nullopt;
  at::_foreach_add_(steps, 1);
  if (o.decoupled_weight_decay) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, o.beta1, o.beta2,
                      group.weight_decay, o.eps, o.amsgrad, /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
  } else {
    at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, o.beta1, o.beta2,
                     group.weight_decay, o.eps, o.amsgrad, /*maximize=*/false, /*grad_scale=*/std::nullopt, found_inf);
  }
  if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
}

// PyTorch's _multi_tensor_adam with capturable=True (torch/optim/adam.py), op for op: the step
// counts and bias corrections stay on the device.
void Adam::State::update_multi_tensor(const Group& group, const std::vector<std::size_t>& index,
                                      std::vector<at::Tensor> grads) {
  const std::vector<at::Tensor> params = pick(params_, index);
  const std::vector<at::Tensor> exp_avgs = pick(exp_avgs_, index);
  const std::vector<at::Tensor> exp_avg_sqs = pick(exp_avg_sqs_, index);
  const std::vector<at::Tensor> steps = pick(steps_, index);
  const std::vector<at::Tensor> lrs = pick(lrs_, index);  // each parameter's group and device's rate
  const auto& o = options_;
  const double weight_decay = group.weight_decay;

  at::_foreach_add_(steps, 1);
  if (weight_decay != 0) {
    if (o.decoupled_weight_decay) {
      const std::vector<at::Tensor> decay = at::_foreach_mul(lrs, -weight_decay);  // 1 - lr * weight_decay
      at::_foreach_add_(decay, 1);
      at::_foreach_mul_(params, decay);
    } else {
      grads = at::_foreach_add(grads, params, weight_decay);
    }
  }
  at::_foreach_lerp_(exp_avgs, grads, 1 - o.beta1);
  at::_foreach_mul_(exp_avg_sqs, o.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - o.beta2);

  // step_size = -lr / (1 - beta1^t), bias_correction2_sqrt = sqrt(1 - beta2^t), per parameter.
  const std::vector<at::Tensor> step_size = at::_foreach_pow(o.beta1, steps);
  const std::vector<at::Tensor> correction2_sqrt = at::_foreach_pow(o.beta2, steps);
  at::_foreach_sub_(step_size, 1);
  at::_foreach_sub_(correction2_sqrt, 1);
  at::_foreach_neg_(correction2_sqrt);
  at::_foreach_div_(step_size, lrs);
  at::_foreach_reciprocal_(step_size);
  at::_foreach_sqrt_(correction2_sqrt);

  // denom = -(1 - beta1^t) * (sqrt(v) / sqrt(1 - beta2^t) + eps) / lr; param += m / denom, where
  // v is the second moment, or its running maximum (AMSGrad).
  std::vector<at::Tensor> second = exp_avg_sqs;
  if (o.amsgrad) {
    second = pick(max_exp_avg_sqs_, index);
    at::_foreach_maximum_(second, exp_avg_sqs);
  }
  const std::vector<at::Tensor> denom = at::_foreach_sqrt(second);
  at::_foreach_div_(denom, correction2_sqrt);
  at::_foreach_add_(denom, o.eps);
  at::_foreach_div_(denom, step_size);
  at::_foreach_addcdiv_(params, exp_avgs, denom);
}

Result<SGD> make_sgd(std::vector<ParamGroup> groups, SGDOptions options) {
  if (!is_rate(options.lr) || !is_coefficient(options.momentum) || !is_coefficient(options.weight_decay)) {
    return fail(Errc::invalid_argument,
                "SGD: lr, momentum and weight_decay must be finite and >= 0 (lr within float32)");
  }
  if (options.nesterov && options.momentum <= 0) {
    return fail(Errc::invalid_argument, "SGD: Nesterov momentum needs a momentum above 0");
  }
  auto state = std::make_shared<SGD::State>();
  state->options_ = options;
  if (auto ok = set_up(*state, "SGD", std::move(groups), options); !ok) return std::unexpected(std::move(ok.error()));
  if (options.momentum != 0) {
    try {
      const c10::NoGradGuard no_grad;
      for (const at::Tensor& p : state->params_) {
        state->momentum_buffers_.push_back(at::zeros_like(p, at::MemoryFormat::Preserve));
      }
    } catch (const std::exception& e) {
      return fail(Errc::backend_error, std::string("making SGD's state: ") + e.what());
    }
  }
  SGD sgd;
  sgd.state_ = std::move(state);
  return sgd;
}

Result<SGD> make_sgd(std::vector<at::Tensor> params, SGDOptions options) {
  std::vector<ParamGroup> one;
  one.push_back({.params = std::move(params)});
  return make_sgd(std::move(one), options);
}

Result<SGD> make_sgd(std::initializer_list<at::Tensor> params, SGDOptions options) {
  return make_sgd(std::vector<at::Tensor>(params), options);
}

// libtorch's SGD without dampening. Its first step sets the buffer to the gradient; a buffer of
// zeros times the momentum, plus the gradient, is that same value, with no host branch.
void SGD::State::update(const Group& group, const std::vector<std::size_t>& index, std::vector<at::Tensor> grads) {
  const std::vector<at::Tensor> params = pick(params_, index);
  const auto& o = options_;
  // With loss scaling, what the update writes is put back where the flag is set (a skipped step).
  std::vector<at::Tensor> written;
  if (loss_scale_) {
    written = params;
    for (const auto* list : {&steps_, &momentum_buffers_}) {
      if (list->empty()) continue;
      const std::vector<at::Tensor> picked = pick(*list, index);
      written.insert(written.end(), picked.begin(), picked.end());
    }
  }
  const std::vector<at::Tensor> saved = loss_scale_ ? loss_scale_->save(written) : std::vector<at::Tensor>{};
  at::_foreach_add_(pick(steps_, index), 1);
  if (group.weight_decay != 0) grads = at::_foreach_add(grads, params, group.weight_decay);
  if (o.momentum != 0) {
    const std::vector<at::Tensor> buffers = pick(momentum_buffers_, index);
    at::_foreach_mul_(buffers, o.momentum);
    at::_foreach_add_(buffers, grads);
    if (o.nesterov) {
      grads = at::_foreach_add(grads, buffers, o.momentum);
    } else {
      grads = buffers;
    }
  }
  // params -= lr * grads, at the group's rate on the device.
  at::_foreach_sub_(params, at::_foreach_mul(grads, pick(lrs_, index)));
  if (loss_scale_) loss_scale_->restore_where_found_inf(written, saved);
}

Result<OptimizerStep> make_optimizer_step(Pool& pool, Optimizer& optimizer, FunctionOptions options) {
  if (!optimizer.has_state()) return fail(Errc::invalid_argument, moved_from("make_optimizer_step"));
  if (options.mode != FunctionMode::inference) {
    return fail(Errc::invalid_argument, "an optimizer step has no backward: its mode must be inference");
  }
  if (!options.graph_sizes.empty() || !options.buckets.sizes.empty() || !options.static_inputs.empty() ||
      !options.mutated_inputs.empty()) {
    return fail(
        Errc::invalid_argument,
        "an optimizer step has no inputs: graph_sizes, buckets, static_inputs and mutated_inputs must be empty");
  }
  if (!optimizer.has_static_grads()) {
    return fail(Errc::invalid_argument,
                "a graphed optimizer step reads the gradients at the addresses it recorded: make the optimizer "
                "with static_grads = true (gradients made per step are allocated anew by each backward)");
  }
  if (auto attached = optimizer.attach_grads(); !attached) return std::unexpected(std::move(attached.error()));
  // The function and the step hold handles of their own on the state: the user's may move or go.
  auto function = pool.add_function(
      [optimizer = optimizer.share()](Inputs) mutable -> Values {
        optimizer.step();
        return {};
      },
      std::move(options));
  if (!function) return std::unexpected(std::move(function.error()));
  return OptimizerStep(std::move(*function), optimizer.share());
}

Result<void> OptimizerStep::operator()() const {
  // Eagerly, a parameter without a gradient is skipped; a graph cannot skip it, and a gradient
  // at another address is one it cannot read: both are refused rather than updated from stale
  // values.
  if (!optimizer_.has_state()) return fail(Errc::invalid_argument, "OptimizerStep: the step was moved from");
  const StepInUse in_use(optimizer_.state_->in_use_);
  if (!in_use.taken()) return fail(Errc::concurrent_use, step_in_use("OptimizerStep"));
  if (const StepProgress& progress = optimizer_.state_->progress_; progress.owner() != 0) {
    return fail(Errc::invalid_argument, step_in_progress("OptimizerStep", progress.taken(),
                                                         "this update would apply before the step's last micro-batch"));
  }
  const auto& params = optimizer_.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& grad = params[i].grad();
    if (!grad.defined()) {
      return fail(Errc::invalid_argument,
                  "parameter " + std::to_string(i) +
                      " has no .grad: a graphed update updates every parameter from the gradient it recorded; run "
                      "a backward first (zero_grad(false) keeps the optimizer's gradients in place)");
    }
    if (!grad.is_same(optimizer_.grads()[i])) {
      return fail(Errc::invalid_argument,
                  "parameter " + std::to_string(i) +
                      "'s .grad is not the optimizer's tensor, which the graph reads (an eager backward after "
                      "zero_grad(true) makes a new one): use zero_grad(false), or attach_grads() before the backward");
    }
  }
  if (auto rate = optimizer_.take_scheduled_lr(); !rate) return rate;
  auto out = function_(std::span<const Arg>());
  if (!out) return std::unexpected(std::move(out.error()));
  optimizer_.count_scheduled_step();
  return {};
}

}  // namespace cgt::torch
