// A randomized walk of training through one optimizer shared by four training steps and a graphed
// update, beside an eager libtorch twin that takes every action with the same meaning. Each seed
// is a sequence of its own configuration (AdamW or SGD with momentum, loss scaling or not, clipping
// or not, a schedule or a constant rate, a parameter the loss never reaches or not); its actions
// are drawn from the walk's own generator:
//  * calls of two training steps with micro-batches one per call (2 and 3: one step's calls while
//    the other is in the middle of its step are refused with invalid_argument and change nothing),
//    one with 2 micro-batches in one call and one whole step (refused the same way mid-step); the
//    micro-batch before the last reaches a parameter (`sometimes`) the others do not, by its shape;
//  * the update as a graph of its own (make_optimizer_step) after a backward through a cgt autograd
//    function, or after an eager backward with attach_grads; the update refused mid-step and
//    without gradients;
//  * the program's own step() and zero_grad() (either form), which end a step in progress;
//    restart_step(), set_lr, set_schedule (warm-up + cosine, step decay, none);
//  * overflows where the loss is scaled: a micro-batch's loss times infinity, which skips its step;
//  * save, and a rewind: load of an earlier checkpoint into the same optimizer, its parameters
//    loaded in place (load_parameters_in_place) or copied in; load refused mid-step;
//  * a loss function that throws on a planned call (after trying the graphed update from inside the
//    step, which is refused: one graphed step of an optimizer at a time): the call fails with
//    function_failed, and changes no parameter, step count, moment, loss scale, schedule count or
//    micro-batch count (nor the gradients, where the call does not begin a step); then, at times,
//    restart_step().
// The twin: libtorch's AdamW or SGD with the same hyper-parameters, libtorch's clip_grad_norm_,
// GradScaler's ops by hand (an overflow skips the step, as PyTorch's fused Adam under GradScaler),
// and `.grad` as cgt keeps it: a training step zeroes every gradient in place when it begins a step
// and updates the parameters its backward reached (the twin sets the others' `.grad` aside for
// libtorch's step, which skips a parameter without one: zero_grad(set_to_none=true)'s semantics);
// the program's step() and the graphed update take every parameter with a gradient.
// After every action: the parameters, step counts and Adam's moments (SGD's momentum buffers at the
// end) within 1e-5 of the twin's, `.grad` defined where the twin's is and equal to it (within
// 1e-3 relative: the gradients of parameters 1e-5 apart), the rate, the schedule's count, the loss
// scale, the skips and each step's micro-batches taken equal. A failure names the seed, its
// configuration and the last actions. Tagged [gpu][training][walk].
#include <torch/torch.h>
// libtorch's logging defines CHECK; the tests mean Catch2's.
#undef CHECK
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "torch/training_harness.hpp"

import cgt;
import cgt.torch;

namespace {

using training_test::gpu;
using training_test::host_copies;
using training_test::must;
using training_test::TempFile;

// The walk's size: sequences (one per seed, each of the configuration `configs` gives it) and
// actions in each: 1,200 actions of a few small launches and a few dozen host copies of kilobytes
// each, and about a dozen recordings per sequence; estimated at seconds, far below CI's minute.
constexpr int walk_seeds = 8;
constexpr int walk_actions = 150;

// Tolerances. The fused AdamW kernel (and cgt's SGD formula) against libtorch's per-op update round
// apart by a few float32 ulps of values below 1 per step: the 100-step tests compare within 1e-5,
// and a sequence takes about 60 optimizer steps. Gradients are compared where the twin knows
// them: computed by the same kernels at parameters up to 1e-5 apart, they agree to 1e-3 of their
// size (or 1e-5 of the loss scale, for those near zero); a micro-batch counted twice or dropped
// changes them by a third or more. Norms as test_training_clipping.cpp (1e-4 relative).
constexpr double value_tolerance = 1e-5;
constexpr double grad_relative_tolerance = 1e-3;
constexpr double norm_relative_tolerance = 1e-4;

// ---- the model ---------------------------------------------------------------------------------

// The parameters, by index: an MLP 16 -> 32 -> 8, `sometimes` (a bias on the output) which the
// loss reaches in micro-batches of 8 rows only, and `never`, which it never reaches (in the
// optimizer in some sequences).
constexpr std::size_t w1 = 0;
constexpr std::size_t b1 = 1;
constexpr std::size_t w2 = 2;
constexpr std::size_t b2 = 3;
constexpr std::size_t sometimes = 4;
constexpr std::size_t never = 5;
constexpr std::int64_t in_features = 16;
constexpr std::int64_t hidden = 32;
constexpr std::int64_t out_features = 8;
constexpr std::int64_t full_rows = 16;
constexpr std::int64_t reaching_rows = 8;

torch::Tensor body(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
  return torch::tanh(x.matmul(p[w1]) + p[b1]).matmul(p[w2]) + p[b2];
}

torch::Tensor forward(const std::vector<torch::Tensor>& p, const torch::Tensor& x) {
  torch::Tensor out = body(p, x);
  // A host decision on the shape, which each shape's graph bakes in with its autograd graph.
  if (x.size(0) == reaching_rows) out = out + p[sometimes];
  return out;
}

// The loss times `factor` (a [1] tensor: 1, or infinity to overflow the scaled gradients).
torch::Tensor loss_of(const std::vector<torch::Tensor>& p, const torch::Tensor& x, const torch::Tensor& y,
                      const torch::Tensor& factor) {
  return torch::mse_loss(forward(p, x), y) * factor.sum();
}

std::vector<torch::Tensor> initial_values(int seed, bool with_never) {
  static_assert(never == sometimes + 1, "`never`, where the optimizer has it, is the last parameter");
  torch::manual_seed(static_cast<std::uint64_t>(seed));
  std::vector<torch::Tensor> values{torch::randn({in_features, hidden}) * 0.3, torch::randn({hidden}) * 0.1,
                                    torch::randn({hidden, out_features}) * 0.3, torch::randn({out_features}) * 0.1,
                                    torch::randn({out_features}) * 0.1};
  if (with_never) values.push_back(torch::randn({out_features}));
  return values;
}

// ---- the configurations ------------------------------------------------------------------------

enum class Kind : std::uint8_t { adamw, sgd };
enum class Rate : std::uint8_t { constant, warmup_cosine, step_decay };

struct Config {
  Kind kind;
  bool scaling;     // dynamic loss scaling, with overflows injected
  double max_norm;  // clipping by the gradients' total norm (0: none)
  Rate schedule;    // the schedule the sequence begins with
  bool with_never;  // `never` in the optimizer
};

// Every seed's configuration, so that each option is walked whatever the actions drawn.
constexpr std::array<Config, walk_seeds> configs{{
    {Kind::adamw, false, 1.0, Rate::warmup_cosine, true},
    {Kind::adamw, true, 1.0, Rate::step_decay, false},
    {Kind::sgd, true, 0, Rate::constant, true},
    {Kind::adamw, true, 0.5, Rate::warmup_cosine, true},
    {Kind::adamw, false, 0, Rate::step_decay, false},
    {Kind::sgd, false, 1.0, Rate::warmup_cosine, false},
    {Kind::adamw, true, 1.0, Rate::constant, false},
    {Kind::sgd, true, 1.0, Rate::step_decay, true},
}};

std::string describe(const Config& c) {
  std::ostringstream out;
  out << (c.kind == Kind::adamw ? "AdamW" : "SGD with momentum") << ", "
      << (c.scaling ? "loss scaling" : "no loss scaling") << ", ";
  if (c.max_norm > 0) {
    out << "clipping at " << c.max_norm;
  } else {
    out << "no clipping";
  }
  out << ", "
      << (c.schedule == Rate::warmup_cosine ? "warm-up + cosine"
          : c.schedule == Rate::step_decay  ? "step decay"
                                            : "constant rate")
      << (c.with_never ? ", `never` in the optimizer" : "");
  return out.str();
}

constexpr double adam_lr = 3e-3;
constexpr double adam_decay = 1e-2;
constexpr double sgd_lr = 1e-2;
constexpr double sgd_momentum = 0.9;
constexpr double sgd_decay = 1e-3;
// The loss scale grows every 4 steps without an overflow, so that the sequences see it grow and back off.
constexpr std::int64_t growth_interval = 4;
constexpr double growth_factor = 2.0;
constexpr double backoff_factor = 0.5;
constexpr double init_scale = 65536.0;

double peak_rate(Kind kind) {
  return kind == Kind::adamw ? adam_lr : sgd_lr;
}

cgt::torch::LrSchedule schedule_of(Rate rate, Kind kind) {
  const double peak = peak_rate(kind);
  switch (rate) {
    case Rate::warmup_cosine: return cgt::torch::lr::warmup_cosine(peak, 10, 80, peak / 10);
    case Rate::step_decay: return cgt::torch::lr::step_decay(peak, 15, 0.5);
    case Rate::constant: return {};
  }
  return {};
}

// ---- the walk's generator and data --------------------------------------------------------------

struct Rng {
  std::uint64_t state;
  std::uint64_t pick(std::uint64_t bound) {
    state = (state * 6364136223846793005ULL) + 1442695040888963407ULL;
    return (state >> 33) % bound;
  }
  bool chance(std::uint64_t percent) { return pick(100) < percent; }
};

struct Batch {
  torch::Tensor x, y, factor;  // factor: one per micro-batch of the call, 1 or infinity
};

// Drawn on the host from libtorch's generator, seeded per sequence (nothing in the pool draws from it).
Batch make_batch(std::int64_t rows, const std::vector<bool>& overflow) {
  std::vector<float> factors;
  for (const bool o : overflow) factors.push_back(o ? std::numeric_limits<float>::infinity() : 1.0F);
  return {torch::randn({rows, in_features}).to(gpu), torch::randn({rows, out_features}).to(gpu),
          torch::tensor(factors).to(gpu)};
}

// Output `i` of a call as a number; none where it cannot be taken.
template <class Outputs>
std::optional<double> value_at(Outputs& out, std::size_t i) {
  auto taken = out.take(i);
  if (!taken) return std::nullopt;
  return taken->template item<double>();
}

// Bit for bit (NaN equal to NaN): what a refused or failed call must leave.
bool identical(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (a.scalar_type() == torch::kFloat) return torch::equal(a.view(torch::kInt), b.view(torch::kInt));
  return torch::equal(a, b);
}

bool identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!identical(a[i], b[i])) return false;
  }
  return true;
}

// Two numbers the same within `tolerance`, infinities and NaN by kind.
bool close(double a, double b, double tolerance) {
  if (!std::isfinite(a) || !std::isfinite(b)) return a == b || (std::isnan(a) && std::isnan(b));
  return std::abs(a - b) <= tolerance;
}

double largest_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.detach().to(gpu, torch::kDouble) - b.detach().to(gpu, torch::kDouble)).abs().max().item<double>();
}

// ---- the eager twin ----------------------------------------------------------------------------

// What the twin's optimizer keeps, copied: a rewind's target.
struct TwinCheckpoint {
  std::vector<torch::Tensor> params;
  std::vector<bool> has_state;               // libtorch makes a parameter's state at its first step
  std::vector<std::int64_t> counts;          // AdamW's step, or SGD's (which libtorch does not count)
  std::vector<torch::Tensor> first, second;  // exp_avg and exp_avg_sq, or the momentum buffer
  double lr = 0;
  std::int64_t scheduled = 0;
  torch::Tensor scale, growth;
  std::int64_t skipped = 0;
};

// What one step of the twin did.
struct TwinStep {
  std::optional<double> norm;  // with clipping: the norm before clipping
  bool skipped = false;        // an overflow: nothing updated
};

// Eager libtorch, driven by the walk's choices. `.grad` follows cgt's: all defined or all none
// (attach_grads and zero_grad take every parameter), zeroed where a step begins.
class Twin {
 public:
  Twin(const Config& config, const std::vector<torch::Tensor>& values) : config_(config) {
    for (const auto& v : values) {
      params.push_back(v.to(gpu).clone().requires_grad_());
      params.back().mutable_grad() = torch::zeros_like(params.back());  // make_adam's gradients: zeros
    }
    if (config.kind == Kind::adamw) {
      optimizer_ =
          std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(adam_lr).weight_decay(adam_decay));
    } else {
      optimizer_ = std::make_unique<torch::optim::SGD>(
          params, torch::optim::SGDOptions(sgd_lr).momentum(sgd_momentum).weight_decay(sgd_decay));
    }
    sgd_counts_.assign(params.size(), 0);
    lr = peak_rate(config.kind);
    scale = torch::full({}, init_scale, torch::TensorOptions(gpu).dtype(torch::kFloat));
    growth = torch::zeros({}, torch::TensorOptions(gpu).dtype(torch::kInt));
  }

  std::vector<torch::Tensor> params;
  double lr = 0;
  cgt::torch::LrSchedule schedule;
  std::int64_t scheduled = 0;
  torch::Tensor scale;  // GradScaler's scale and growth tracker, by hand
  torch::Tensor growth;
  std::int64_t skipped = 0;
  int owner = 0;  // the training step (by number) in the middle of its step; 0: none
  std::int64_t taken = 0;
  // False after a failed call that began a step: its warm-up zeroes the gradients, its recording
  // captures the zeroing without running it, so they may be either. Cleared by what zeroes them.
  bool grads_known = true;

  [[nodiscard]] bool grads_defined() const { return params.front().grad().defined(); }

  void end_step() {
    owner = 0;
    taken = 0;
  }
  // A training step's first micro-batch, and attach_grads + zero_grad(false): every gradient zero.
  void zero_grads() {
    for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
    grads_known = true;
  }
  void zero_grad(bool set_to_none) {
    for (auto& p : params) {
      if (set_to_none) {
        p.mutable_grad() = torch::Tensor();
      } else if (p.grad().defined()) {
        p.mutable_grad() = torch::zeros_like(p);
      }
    }
    grads_known = true;
  }
  void forget_grads() {
    zero_grads();
    grads_known = false;
  }
  // The backward of a micro-batch's loss (divided as the step divides it), times the scale.
  void backward(const torch::Tensor& loss) { (config_.scaling ? loss.mul(scale) : loss).backward(); }
  void take_scheduled_rate() {
    if (schedule) lr = schedule(scheduled);
  }
  void count_scheduled_step() {
    if (schedule) ++scheduled;
  }

  // One update of the parameters at `among` that have a gradient: GradScaler's unscale and check,
  // clip_grad_norm_ over them, libtorch's step (the others' `.grad` set aside, so that it skips
  // them) unless an overflow was found, then the scale's update.
  TwinStep step(const std::vector<std::size_t>& among) {
    const torch::NoGradGuard no_grad;
    TwinStep out;
    std::vector<std::size_t> with_grad;
    std::vector<torch::Tensor> grads;
    std::vector<torch::Tensor> stepped;
    for (const std::size_t i : among) {
      if (!params[i].grad().defined()) continue;
      with_grad.push_back(i);
      grads.push_back(params[i].grad());
      stepped.push_back(params[i]);
    }
    if (with_grad.empty()) {
      if (config_.max_norm > 0) out.norm = 0;
      return out;
    }
    torch::Tensor found_inf;
    if (config_.scaling) {
      found_inf = torch::zeros({}, torch::TensorOptions(gpu).dtype(torch::kFloat));
      const torch::Tensor inv_scale = scale.to(torch::kDouble).reciprocal().to(torch::kFloat);
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    }
    if (config_.max_norm > 0) out.norm = torch::nn::utils::clip_grad_norm_(stepped, config_.max_norm);
    out.skipped = config_.scaling && found_inf.item<float>() != 0;
    if (!out.skipped) {
      optimizer_->param_groups()[0].options().set_lr(lr);
      std::vector<torch::Tensor> aside(params.size());
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (std::ranges::find(with_grad, i) != with_grad.end()) continue;
        aside[i] = params[i].grad();
        params[i].mutable_grad() = torch::Tensor();
      }
      optimizer_->step();
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (aside[i].defined()) params[i].mutable_grad() = aside[i];
      }
      for (const std::size_t i : with_grad) ++sgd_counts_[i];
    }
    if (config_.scaling) {
      at::_amp_update_scale_(scale, growth, found_inf, growth_factor, backoff_factor, growth_interval);
      if (out.skipped) ++skipped;
    }
    return out;
  }

  // Parameter i's step count, first and second moment (Adam's exp_avg and exp_avg_sq; SGD's
  // momentum buffer and none): zeros before its first step, as cgt keeps them.
  [[nodiscard]] std::int64_t count(std::size_t i) const {
    if (config_.kind == Kind::sgd) return sgd_counts_[i];
    const auto* state = adamw_state(i);
    return state != nullptr ? state->step() : 0;
  }
  [[nodiscard]] torch::Tensor first_moment(std::size_t i) const {
    if (config_.kind == Kind::sgd) {
      const auto found = optimizer_->state().find(params[i].unsafeGetTensorImpl());
      if (found == optimizer_->state().end()) return torch::zeros_like(params[i]);
      return static_cast<const torch::optim::SGDParamState&>(*found->second).momentum_buffer();
    }
    const auto* state = adamw_state(i);
    return state != nullptr ? state->exp_avg() : torch::zeros_like(params[i]);
  }
  [[nodiscard]] torch::Tensor second_moment(std::size_t i) const {
    const auto* state = adamw_state(i);
    return state != nullptr ? state->exp_avg_sq() : torch::zeros_like(params[i]);
  }

  [[nodiscard]] TwinCheckpoint checkpoint() const {
    TwinCheckpoint c;
    for (std::size_t i = 0; i < params.size(); ++i) {
      c.params.push_back(params[i].detach().clone());
      const bool has = optimizer_->state().find(params[i].unsafeGetTensorImpl()) != optimizer_->state().end();
      c.has_state.push_back(has);
      c.counts.push_back(count(i));
      c.first.push_back(has ? first_moment(i).clone() : torch::Tensor());
      c.second.push_back(has && config_.kind == Kind::adamw ? second_moment(i).clone() : torch::Tensor());
    }
    c.lr = lr;
    c.scheduled = scheduled;
    c.scale = scale.clone();
    c.growth = growth.clone();
    c.skipped = skipped;
    return c;
  }

  // The rewind, as cgt's load and the parameters' copies: `.grad` and the schedule function stay.
  void restore(const TwinCheckpoint& c) {
    const torch::NoGradGuard no_grad;
    auto& state = optimizer_->state();
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i].copy_(c.params[i]);
      void* key = params[i].unsafeGetTensorImpl();
      sgd_counts_[i] = c.counts[i];
      if (!c.has_state[i]) {
        state.erase(key);
        continue;
      }
      if (config_.kind == Kind::adamw) {
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->step(c.counts[i]);
        s->exp_avg(c.first[i].clone());
        s->exp_avg_sq(c.second[i].clone());
        state[key] = std::move(s);
      } else {
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(c.first[i].clone());
        state[key] = std::move(s);
      }
    }
    lr = c.lr;
    scheduled = c.scheduled;
    scale = c.scale.clone();
    growth = c.growth.clone();
    skipped = c.skipped;
  }

 private:
  [[nodiscard]] const torch::optim::AdamWParamState* adamw_state(std::size_t i) const {
    const auto found = optimizer_->state().find(params[i].unsafeGetTensorImpl());
    if (found == optimizer_->state().end()) return nullptr;
    return &static_cast<const torch::optim::AdamWParamState&>(*found->second);
  }

  Config config_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::vector<std::int64_t> sgd_counts_;  // every step's count (AdamW's are read from its state)
};

// ---- cgt's side ---------------------------------------------------------------------------------

// The training steps of the walk, by number (the twin's `owner`).
enum class Step : std::uint8_t { two_per_call = 1, three_per_call = 2, in_one_call = 3, whole = 4 };

constexpr int number(Step s) {
  return static_cast<int>(s);
}
constexpr bool per_call(Step s) {
  return s == Step::two_per_call || s == Step::three_per_call;
}
constexpr std::int64_t micro_batches(Step s) {
  switch (s) {
    case Step::two_per_call: return 2;
    case Step::three_per_call: return 3;
    case Step::in_one_call: return 2;
    case Step::whole: return 1;
  }
  return 1;
}
const char* name(Step s) {
  switch (s) {
    case Step::two_per_call: return "2 per call";
    case Step::three_per_call: return "3 per call";
    case Step::in_one_call: return "2 in one call";
    case Step::whole: return "whole";
  }
  return "?";
}

// The state a refused or failed call must leave, on the host.
struct Snapshot {
  std::vector<torch::Tensor> params, grads, counts, first, second;
  double lr = 0;
  std::int64_t scheduled = 0;
  torch::Tensor scale, skipped;
  std::array<std::int64_t, 2> taken{};
};

struct Saved {
  std::vector<torch::Tensor> values;  // the parameters, on the host
  TwinCheckpoint twin;
};

// A checkpoint's place: the optimizer's file, the parameters' file, and the twin's copy.
struct Slot {
  explicit Slot(const std::string& name) : optimizer("walk_optimizer_" + name), params("walk_params_" + name) {}
  TempFile optimizer;
  TempFile params;
  std::optional<Saved> saved;
};

// How many of each kind of action the walk took (over the seeds: each kind at least once).
struct Totals {
  int updates = 0;  // optimizer steps that updated (not skipped)
  int skipped = 0;
  int refused = 0;
  int failures = 0;
  int rewinds = 0;
  int ended_mid_step = 0;  // the program's step() or zero_grad() in the middle of a step
  int restarted_mid_step = 0;
};

class Walk {
 public:
  Walk(int seed, const Config& config)
      : seed_(seed),
        config_(config),
        rng_{(static_cast<std::uint64_t>(seed) * 7919) + 17},
        twin_(config, initial_values(seed, config.with_never)) {
    for (const auto& v : initial_values(seed, config.with_never)) params_.push_back(v.to(gpu).requires_grad_());
    for (std::size_t i = 0; i < params_.size(); ++i) all_.push_back(i);
    if (config.kind == Kind::adamw) {
      adam_.emplace(must(cgt::torch::make_adam(params_, {.lr = adam_lr,
                                                         .weight_decay = adam_decay,
                                                         .decoupled_weight_decay = true,
                                                         .max_grad_norm = config.max_norm,
                                                         .loss_scale = scaling()})));
    } else {
      sgd_.emplace(must(cgt::torch::make_sgd(params_, {.lr = sgd_lr,
                                                       .momentum = sgd_momentum,
                                                       .weight_decay = sgd_decay,
                                                       .max_grad_norm = config.max_norm,
                                                       .loss_scale = scaling()})));
    }
    if (const auto schedule = schedule_of(config.schedule, config.kind)) {
      must(optimizer().set_schedule(schedule));
      twin_.schedule = schedule;
    }
    pool_.emplace(must(cgt::torch::make_pool({.device = 0})));
    const auto loss = [this](cgt::torch::Inputs in) {
      if (inject_.fail) {
        inject_.fail = false;
        if (inject_.probe) {
          inject_.probed = true;
          auto nested = (*update_)();
          inject_.nested = nested ? std::nullopt : std::optional(nested.error().code);
        }
        throw std::runtime_error("the walk's planned failure");
      }
      return cgt::torch::Values{loss_of(params_, in[0], in[1], in[2])};
    };
    for (const Step s : {Step::two_per_call, Step::three_per_call, Step::in_one_call, Step::whole}) {
      steps_[number(s) - 1].emplace(must(
          cgt::torch::make_training_step(*pool_, optimizer(), loss,
                                         cgt::torch::TrainingStepOptions{.function = {.name = name(s)},
                                                                         .micro_batches = micro_batches(s),
                                                                         .all_in_one_call = s == Step::in_one_call})));
    }
    // Made after the optimizer: its backward graph accumulates into the optimizer's gradients.
    function_.emplace(must(cgt::torch::make_autograd_function(
        *pool_, [this](cgt::torch::Inputs in) { return cgt::torch::Values{body(params_, in[0])}; },
        {.name = "mlp", .parameters = {params_[w1], params_[b1], params_[w2], params_[b2]}})));
    update_.emplace(must(cgt::torch::make_optimizer_step(*pool_, optimizer())));
  }
  Walk(const Walk&) = delete;
  Walk& operator=(const Walk&) = delete;
  Walk(Walk&&) = delete;
  Walk& operator=(Walk&&) = delete;
  ~Walk() = default;

  // The walk; the first problem found, with the seed and the last actions, or empty.
  std::string run() {
    for (action_ = 0; action_ < walk_actions; ++action_) {
      try {
        act();
        compare();
      } catch (const std::exception& e) {
        fail(std::string("threw: ") + e.what());
      }
      if (!problem_.empty()) break;
    }
    if (problem_.empty()) finish();
    if (problem_.empty()) return {};
    std::ostringstream out;
    out << "seed " << seed_ << " (" << describe(config_) << "), action " << action_ << ": " << problem_
        << "\nthe last actions:";
    const std::size_t from = log_.size() > 24 ? log_.size() - 24 : 0;
    for (std::size_t i = from; i < log_.size(); ++i) out << "\n  " << log_[i];
    return out.str();
  }

  Totals totals;

 private:
  [[nodiscard]] cgt::torch::LossScaleOptions scaling() const {
    return {.dynamic = config_.scaling,
            .init_scale = init_scale,
            .growth_factor = growth_factor,
            .backoff_factor = backoff_factor,
            .growth_interval = growth_interval};
  }
  cgt::torch::Optimizer& optimizer() {
    if (adam_) return *adam_;
    return *sgd_;
  }
  cgt::torch::TrainingStep& step(Step s) { return *steps_[number(s) - 1]; }
  Slot& slot(std::size_t i) { return i == 0 ? slot0_ : slot1_; }

  void fail(const std::string& what) {
    if (problem_.empty()) problem_ = what;
  }
  void note(const std::string& what) { log_.push_back("#" + std::to_string(action_) + " " + what); }
  // The outcome of the action noted last.
  void outcome(const std::string& what) { log_.back() += what; }
  bool ok(const cgt::Result<void>& result, const std::string& what) {
    if (!result) fail(what + " failed: " + result.error().describe());
    return result.has_value();
  }
  bool refused_with(const cgt::Error& error, cgt::Errc code, const std::string& says) {
    if (error.code != code || error.message.find(says) == std::string::npos) {
      fail("expected a refusal saying '" + says + "', got: " + error.describe());
      return false;
    }
    return true;
  }

  // The actions, drawn until one applies.
  void act() {
    while (true) {
      const std::uint64_t what = rng_.pick(100);
      if (what < 34) {  // the two steps of micro-batches one per call, mostly the one mid-step
        Step s = rng_.chance(50) ? Step::two_per_call : Step::three_per_call;
        if (twin_.owner != 0)
          s = rng_.chance(80) ? static_cast<Step>(twin_.owner) : other(static_cast<Step>(twin_.owner));
        call(s, std::nullopt, false);
      } else if (what < 41) {
        call(Step::in_one_call, std::nullopt, false);
      } else if (what < 47) {
        call(Step::whole, std::nullopt, false);
      } else if (what < 52) {
        update_after_backward(false);
      } else if (what < 57) {
        update_after_backward(true);
      } else if (what < 62) {
        if (!twin_.grads_defined() || !twin_.grads_known) continue;
        program_step();
      } else if (what < 67) {
        program_zero_grad();
      } else if (what < 70) {
        set_lr();
      } else if (what < 72) {
        set_schedule();
      } else if (what < 76) {
        save();
      } else if (what < 81) {
        if (!slot0_.saved && !slot1_.saved) continue;
        load();
      } else if (what < 89) {
        planned_failure();
      } else if (what < 93) {
        restart_step(rng_.chance(50) ? Step::two_per_call : Step::three_per_call);
      } else {
        if (twin_.owner == 0 && twin_.grads_defined()) continue;
        refused_update();
      }
      return;
    }
  }

  static Step other(Step s) { return s == Step::two_per_call ? Step::three_per_call : Step::two_per_call; }

  // The micro-batch a call of `s` takes in its step: 0 unless it owns the step in progress.
  [[nodiscard]] std::int64_t micro_batch_of(Step s) const { return twin_.owner == number(s) ? twin_.taken : 0; }

  // The rows of a call: fixed per kind of call (first, middle, last) for micro-batches one per call,
  // whose last call updates what the earlier kinds reached as they were recorded (the one before
  // the last reaches `sometimes`); either shape for the others (each shape is a graph of its own).
  std::int64_t rows_of(Step s) {
    if (per_call(s)) return micro_batch_of(s) == micro_batches(s) - 2 ? reaching_rows : full_rows;
    const std::int64_t per_micro_batch = rng_.chance(50) ? reaching_rows : full_rows;
    return per_micro_batch * micro_batches(s);
  }

  // The parameters a step of `s` updates: those its backward reached. One per call, the micro-batch
  // before the last reaches `sometimes` at every step.
  [[nodiscard]] std::vector<std::size_t> reached(Step s, std::int64_t rows) const {
    std::vector<std::size_t> out{w1, b1, w2, b2};
    if (per_call(s) || rows / micro_batches(s) == reaching_rows) out.push_back(sometimes);
    return out;
  }

  [[nodiscard]] std::string key(Step s, std::int64_t rows) const {
    std::string phase;
    if (per_call(s)) {
      const std::int64_t m = micro_batch_of(s);
      phase = m == 0 ? ".first" : m == micro_batches(s) - 1 ? ".last" : ".middle";
    }
    return std::string(name(s)) + phase + "/" + std::to_string(rows);
  }

  std::vector<bool> overflows(std::int64_t count) {
    std::vector<bool> out;
    for (std::int64_t i = 0; i < count; ++i) out.push_back(config_.scaling && rng_.chance(6));
    return out;
  }

  Snapshot snapshot() {
    Snapshot s;
    s.params = host_copies(params_);
    for (const auto& p : params_)
      s.grads.push_back(p.grad().defined() ? p.grad().detach().cpu().clone() : torch::Tensor());
    s.counts = host_copies(optimizer().steps());
    if (adam_) {
      s.first = host_copies(adam_->exp_avgs());
      s.second = host_copies(adam_->exp_avg_sqs());
    }
    s.lr = optimizer().lr();
    s.scheduled = optimizer().scheduled_steps();
    if (config_.scaling) {
      s.scale = optimizer().loss_scale().cpu().clone();
      s.skipped = optimizer().skipped_steps().cpu().clone();
    }
    s.taken = {step(Step::two_per_call).micro_batches_taken(), step(Step::three_per_call).micro_batches_taken()};
    return s;
  }

  // What a refused call (or, with the exceptions given, a failed one) must leave as it was.
  void unchanged(const Snapshot& before, bool grads, bool lr) {
    const Snapshot after = snapshot();
    if (!identical(before.params, after.params)) fail("a parameter changed");
    if (grads && !identical(before.grads, after.grads)) fail("a gradient changed");
    if (!identical(before.counts, after.counts)) fail("a step count changed");
    if (!identical(before.first, after.first) || !identical(before.second, after.second)) fail("a moment changed");
    if (lr && before.lr != after.lr) fail("the rate changed");
    if (before.scheduled != after.scheduled) fail("the schedule's count changed");
    if (!identical(before.scale, after.scale) || !identical(before.skipped, after.skipped)) {
      fail("the loss scale or the skip count changed");
    }
    if (before.taken != after.taken) fail("the micro-batches taken changed");
  }

  // The norm a stepping call or step returned against the twin's.
  void compare_norm(const std::optional<double>& norm, const TwinStep& twin) {
    if (config_.max_norm <= 0) return;
    if (!norm || !twin.norm) return fail("a norm is missing");
    // Of gradients with an infinity, the norm is infinite or NaN, as each kernel sums them.
    if (!std::isfinite(*norm) && !std::isfinite(*twin.norm)) return;
    if (!close(*norm, *twin.norm, norm_relative_tolerance * std::max(1.0, std::abs(*twin.norm)))) {
      fail("the norm is " + std::to_string(*norm) + ", the twin's " + std::to_string(*twin.norm));
    }
  }

  void count_step(const TwinStep& stepped) {
    if (stepped.skipped) {
      ++totals.skipped;
    } else {
      ++totals.updates;
    }
  }

  // A call of training step `s` (rows: the planned failure's shape, or drawn), with the loss
  // function throwing where `failing`.
  void call(Step s, std::optional<std::int64_t> planned_rows, bool failing) {
    const bool one_per_call = per_call(s);
    const std::int64_t k = micro_batches(s);
    const bool refused = one_per_call ? twin_.owner != 0 && twin_.owner != number(s) : twin_.owner != 0;
    const std::int64_t m = micro_batch_of(s);
    const bool zeroes = !one_per_call || m == 0;
    const bool steps = !one_per_call || m == k - 1;
    const std::int64_t rows = planned_rows ? *planned_rows : rows_of(s);
    const std::vector<bool> overflow = overflows(s == Step::in_one_call ? 2 : 1);
    const Batch batch = make_batch(rows, overflow);
    std::ostringstream what;
    what << name(s) << (one_per_call ? ", micro-batch " + std::to_string(m + 1) + " of " + std::to_string(k) : "")
         << ", " << rows << " rows";
    for (const bool o : overflow) what << (o ? ", an overflow" : "");
    what << (failing ? ", the loss function throwing" : "");

    note(what.str());
    // What a refused or failed call must leave (a call that succeeds is compared with the twin).
    const std::optional<Snapshot> before = refused || failing ? std::optional(snapshot()) : std::nullopt;
    const std::string key_before = key(s, rows);
    inject_ = {.fail = failing, .probe = failing && rng_.chance(50)};
    pool_->mark_step_begin();
    auto out = step(s)({batch.x, batch.y, batch.factor});
    const bool threw = failing && !inject_.fail;
    const Injection injected = std::exchange(inject_, Injection{});

    if (refused) {
      outcome(std::string(": refused, as ") + name(static_cast<Step>(twin_.owner)) + " is mid-step");
      ++totals.refused;
      if (out) return fail("a call while another training step is mid-step succeeded");
      if (!refused_with(out.error(), cgt::Errc::invalid_argument, "restart_step()")) return;
      if (threw) return fail("the loss function ran in a refused call");
      unchanged(*before, true, true);
      return;
    }
    if (!out) {
      if (!threw) return fail("the call failed: " + out.error().describe());
      outcome(std::string(": failed as planned") + (injected.probed ? ", the update inside it refused" : ""));
      ++totals.failures;
      if (out.error().code != cgt::Errc::function_failed) return fail("failed with " + out.error().describe());
      if (injected.probed && injected.nested != cgt::Errc::concurrent_use) {
        return fail("the graphed update called inside the step was not refused with concurrent_use");
      }
      // A call that begins a step may have zeroed the gradients (its warm-up ran), and the call
      // that steps took the schedule's rate; nothing else moves.
      unchanged(*before, !zeroes, !(steps && twin_.schedule));
      if (zeroes) twin_.forget_grads();
      if (steps) twin_.take_scheduled_rate();
      if (one_per_call && rng_.chance(50)) restart_step(s);
      return;
    }
    if (threw) return fail("the loss function threw, and the call succeeded");
    if (failing) outcome(": replayed (the loss function did not run)");
    ++successes_[key_before];

    if (!zeroes && (!twin_.grads_defined() || !twin_.grads_known)) {
      return fail("the walk continued a step whose gradients it does not know");
    }
    if (zeroes) twin_.zero_grads();
    if (steps) twin_.take_scheduled_rate();
    torch::Tensor loss;
    if (s == Step::in_one_call) {
      for (std::int64_t part = 0; part < k; ++part) {
        const auto j = static_cast<std::size_t>(part);
        const torch::Tensor part_loss =
            loss_of(twin_.params, batch.x.chunk(k, 0)[j], batch.y.chunk(k, 0)[j], batch.factor.chunk(k, 0)[j]);
        twin_.backward(part_loss.div(static_cast<double>(k)));
        loss = part == 0 ? part_loss.detach() : loss.add(part_loss.detach());
      }
      loss = loss.div(static_cast<double>(k));
    } else {
      loss = loss_of(twin_.params, batch.x, batch.y, batch.factor);
      twin_.backward(k == 1 ? loss : loss.mul(1.0 / static_cast<double>(k)));
    }
    if (one_per_call && !steps) {
      twin_.owner = number(s);
      twin_.taken = m + 1;
    }
    TwinStep stepped;
    if (steps) {
      stepped = twin_.step(reached(s, rows));
      twin_.count_scheduled_step();
      twin_.end_step();
      count_step(stepped);
    }
    const std::size_t values = steps && config_.max_norm > 0 ? 2 : 1;
    if (out->size() != values) return fail("the call returned " + std::to_string(out->size()) + " values");
    const std::optional<double> cgt_loss = value_at(*out, 0);
    if (!cgt_loss || !close(*cgt_loss, loss.item<double>(), value_tolerance)) {
      return fail("the loss is " + (cgt_loss ? std::to_string(*cgt_loss) : std::string("unreadable")) +
                  ", the twin's " + std::to_string(loss.item<double>()));
    }
    if (values == 2) compare_norm(value_at(*out, 1), stepped);
  }

  // The update as a graph of its own, after a backward through the autograd function (the
  // program's zero_grad(false) first, which ends any step in progress) or an eager backward (after
  // zero_grad of either form, attach_grads, and zero_grad(false)).
  void update_after_backward(bool eager) {
    cgt::torch::Optimizer& opt = optimizer();
    std::string what = eager ? "eager backward" : "autograd function's backward";
    if (eager) {
      const bool none = rng_.chance(50);
      what += none ? " after zero_grad(true)" : "";
      opt.zero_grad(none);
    }
    if (twin_.owner != 0) ++totals.ended_mid_step;
    if (!ok(opt.attach_grads(), "attach_grads")) return;
    opt.zero_grad(false);
    twin_.end_step();
    twin_.zero_grads();
    const std::int64_t rows = eager && rng_.chance(50) ? reaching_rows : full_rows;
    const std::vector<bool> overflow = overflows(1);
    const Batch batch = make_batch(rows, overflow);
    note(what + ", " + std::to_string(rows) + " rows" + (overflow.front() ? ", an overflow" : "") + ", update");

    pool_->mark_step_begin();
    torch::Tensor loss;
    std::optional<cgt::torch::AutogradOutputs> outputs;
    if (eager) {
      loss = loss_of(params_, batch.x, batch.y, batch.factor);
    } else {
      auto called = (*function_)({batch.x});
      if (!called) return fail("the autograd function failed: " + called.error().describe());
      outputs.emplace(std::move(*called));
      loss = torch::mse_loss((*outputs)[0], batch.y) * batch.factor.sum();
    }
    (config_.scaling ? loss.mul(opt.loss_scale()) : loss).backward();
    if (!ok((*update_)(), "the graphed update")) return;
    outputs.reset();

    twin_.take_scheduled_rate();
    const torch::Tensor twin_loss = loss_of(twin_.params, batch.x, batch.y, batch.factor);
    twin_.backward(twin_loss);
    const TwinStep stepped = twin_.step(all_);
    twin_.count_scheduled_step();
    count_step(stepped);
    if (!close(loss.item<double>(), twin_loss.item<double>(), value_tolerance))
      fail("the loss differs from the twin's");
    if (config_.max_norm > 0) compare_norm(opt.grad_norm().item<double>(), stepped);
  }

  // The program's own step: every parameter with a gradient, at the rate set (no schedule).
  void program_step() {
    note(std::string("the program's step()") + (twin_.owner != 0 ? ", mid-step" : ""));
    if (twin_.owner != 0) ++totals.ended_mid_step;
    optimizer().step();
    twin_.end_step();
    const TwinStep stepped = twin_.step(all_);
    count_step(stepped);
    if (config_.max_norm > 0) compare_norm(optimizer().grad_norm().item<double>(), stepped);
  }

  void program_zero_grad() {
    const bool none = rng_.chance(50);
    note(std::string("the program's zero_grad(") + (none ? "true" : "false") + ")" +
         (twin_.owner != 0 ? ", mid-step" : ""));
    if (twin_.owner != 0) ++totals.ended_mid_step;
    optimizer().zero_grad(none);
    twin_.end_step();
    twin_.zero_grad(none);
  }

  void set_lr() {
    const double rate = peak_rate(config_.kind) / (rng_.chance(50) ? 1.0 : 3.0);
    note("set_lr(" + std::to_string(rate) + ")");
    if (ok(optimizer().set_lr(rate), "set_lr")) twin_.lr = rate;
  }

  void set_schedule() {
    const auto rate = static_cast<Rate>(rng_.pick(3));
    const std::int64_t start = rng_.chance(50) ? 0 : twin_.scheduled;
    const cgt::torch::LrSchedule schedule = schedule_of(rate, config_.kind);
    note(std::string("set_schedule(") +
         (rate == Rate::warmup_cosine ? "warm-up + cosine"
          : rate == Rate::step_decay  ? "step decay"
                                      : "none") +
         ", from " + std::to_string(start) + ")");
    if (!ok(optimizer().set_schedule(schedule, start), "set_schedule")) return;
    twin_.schedule = schedule;
    twin_.scheduled = start;
  }

  void save() {
    const std::size_t which = rng_.pick(2);
    note("save into slot " + std::to_string(which) + (twin_.owner != 0 ? ", mid-step" : ""));
    Slot& into = slot(which);
    if (!ok(optimizer().save(into.optimizer.path), "save")) return;
    Saved saved{host_copies(params_), twin_.checkpoint()};
    torch::save(saved.values, into.params.path);
    into.saved = std::move(saved);
  }

  // A rewind to a checkpoint: the optimizer's state loaded in place, the parameters loaded in place
  // from their file or copied in; refused mid-step.
  void load() {
    const std::size_t which = slot0_.saved && slot1_.saved ? rng_.pick(2) : slot0_.saved ? 0 : 1;
    const Slot& from = slot(which);
    if (twin_.owner != 0) {
      note("load of slot " + std::to_string(which) + ": refused mid-step");
      ++totals.refused;
      const Snapshot before = snapshot();
      const auto loaded = optimizer().load(from.optimizer.path);
      if (loaded) return fail("load mid-step succeeded");
      if (!refused_with(loaded.error(), cgt::Errc::invalid_argument, "restart_step()")) return;
      unchanged(before, true, true);
      return;
    }
    const bool in_place = rng_.chance(50);
    note("load of slot " + std::to_string(which) + (in_place ? ", parameters loaded in place" : ", parameters copied"));
    if (!ok(optimizer().load(from.optimizer.path), "load")) return;
    if (in_place) {
      if (!ok(cgt::torch::load_parameters_in_place(std::span<const at::Tensor>(params_), from.params.path),
              "load_parameters_in_place")) {
        return;
      }
    } else {
      const torch::NoGradGuard no_grad;
      for (std::size_t i = 0; i < params_.size(); ++i) params_[i].detach().copy_(from.saved->values[i]);
    }
    twin_.restore(from.saved->twin);
    ++totals.rewinds;
  }

  // A call whose loss function throws: of the step in the middle of its step, or of any step, one
  // whose graph for that call is not recorded yet where there is one (a replay runs no loss
  // function: the call then succeeds, and the walk goes on as for any call).
  void planned_failure() {
    std::vector<std::pair<Step, std::int64_t>> candidates;
    if (twin_.owner != 0) {
      const auto s = static_cast<Step>(twin_.owner);
      candidates.emplace_back(s, rows_of(s));
    } else {
      for (const Step s : {Step::two_per_call, Step::three_per_call}) candidates.emplace_back(s, rows_of(s));
      for (const std::int64_t rows : {reaching_rows, full_rows}) {
        candidates.emplace_back(Step::in_one_call, rows * 2);
        candidates.emplace_back(Step::whole, rows);
      }
    }
    std::vector<std::pair<Step, std::int64_t>> fresh;
    for (const auto& c : candidates) {
      const auto found = successes_.find(key(c.first, c.second));
      if (found == successes_.end() || found->second < 2) fresh.push_back(c);
    }
    const auto& from = fresh.empty() ? candidates : fresh;
    const auto& [s, rows] = from[rng_.pick(from.size())];
    call(s, rows, true);
  }

  void restart_step(Step s) {
    const bool owns = twin_.owner == number(s);
    note(std::string("restart_step() of ") + name(s) + (owns ? ", mid-step" : ""));
    if (!ok(step(s).restart_step(), "restart_step")) return;
    if (owns) {
      ++totals.restarted_mid_step;
      twin_.end_step();
    }
  }

  // The graphed update mid-step, or without gradients (after zero_grad(true)): refused, nothing changes.
  void refused_update() {
    note(twin_.owner != 0 ? "the graphed update mid-step: refused" : "the graphed update without .grad: refused");
    ++totals.refused;
    const Snapshot before = snapshot();
    const auto updated = (*update_)();
    if (updated) return fail("the graphed update succeeded");
    if (!refused_with(updated.error(), cgt::Errc::invalid_argument, twin_.owner != 0 ? "restart_step()" : ".grad")) {
      return;
    }
    unchanged(before, true, true);
  }

  // cgt's state against the twin's.
  void compare() {
    if (!problem_.empty()) return;
    cgt::torch::Optimizer& opt = optimizer();
    std::ostringstream bad;
    for (const Step s : {Step::two_per_call, Step::three_per_call}) {
      if (step(s).micro_batches_taken() != micro_batch_of(s)) {
        bad << name(s) << " took " << step(s).micro_batches_taken() << " micro-batches, the twin " << micro_batch_of(s)
            << "; ";
      }
    }
    if (opt.lr() != twin_.lr) bad << "the rate is " << opt.lr() << ", the twin's " << twin_.lr << "; ";
    if (opt.scheduled_steps() != twin_.scheduled) {
      bad << "the schedule counted " << opt.scheduled_steps() << ", the twin " << twin_.scheduled << "; ";
    }
    double scale = 1;
    if (config_.scaling) {
      scale = opt.loss_scale().item<double>();
      if (scale != twin_.scale.item<double>())
        bad << "the loss scale is " << scale << ", the twin's " << twin_.scale.item<double>() << "; ";
      if (opt.skipped_steps().item<std::int64_t>() != twin_.skipped) {
        bad << "skipped " << opt.skipped_steps().item<std::int64_t>() << " steps, the twin " << twin_.skipped << "; ";
      }
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const torch::Tensor& grad = params_[i].grad();
      const torch::Tensor& twin_grad = twin_.params[i].grad();
      if (grad.defined() != twin_grad.defined()) {
        bad << "parameter " << i << "'s .grad is " << (grad.defined() ? "defined" : "none") << ", the twin's not; ";
      } else if (grad.defined()) {
        if (!grad.is_same(opt.grads()[i])) bad << "parameter " << i << "'s .grad is not the optimizer's tensor; ";
        if (twin_.grads_known) {
          const bool finite = grad.isfinite().all().item<bool>();
          if (finite != twin_grad.isfinite().all().item<bool>()) {
            bad << "parameter " << i << "'s gradient is " << (finite ? "" : "not ") << "finite, the twin's not; ";
          } else if (finite) {
            const double d = largest_difference(grad, twin_grad);
            const double limit = (grad_relative_tolerance * twin_grad.abs().max().item<double>()) +
                                 (value_tolerance * std::max(1.0, scale));
            if (!(d <= limit)) bad << "parameter " << i << "'s gradient differs by " << d << "; ";
          }
        }
      }
      const double d = largest_difference(params_[i], twin_.params[i]);
      if (!(d <= value_tolerance)) bad << "parameter " << i << " differs by " << d << "; ";
      const double count = opt.steps()[i].item<double>();
      if (count != static_cast<double>(twin_.count(i))) {
        bad << "parameter " << i << " was stepped " << count << " times, the twin's " << twin_.count(i) << "; ";
      }
      if (adam_) {
        const double m = largest_difference(adam_->exp_avgs()[i], twin_.first_moment(i));
        const double v = largest_difference(adam_->exp_avg_sqs()[i], twin_.second_moment(i));
        if (!(m <= value_tolerance) || !(v <= value_tolerance)) {
          bad << "parameter " << i << "'s moments differ by " << m << " and " << v << "; ";
        }
      }
    }
    if (!bad.str().empty()) fail(bad.str());
  }

  // At the end: SGD's momentum buffers (read from a checkpoint: they are not public), the reach of
  // `never`, and the pool's memory.
  void finish() {
    if (sgd_) {
      const TempFile file("walk_momentum");
      if (!ok(optimizer().save(file.path), "save")) return;
      torch::serialize::InputArchive archive;
      archive.load_from(file.path);
      for (std::size_t i = 0; i < params_.size(); ++i) {
        c10::IValue buffer;
        archive.read("param." + std::to_string(i) + ".momentum_buffer", buffer);
        const double d = largest_difference(buffer.toTensor(), twin_.first_moment(i));
        if (!(d <= value_tolerance))
          fail("parameter " + std::to_string(i) + "'s momentum differs by " + std::to_string(d));
      }
    }
    ok(pool_->check_memory(), "check_memory");
  }

  struct Injection {
    bool fail = false;   // the loss function's next run throws
    bool probe = false;  // and first calls the graphed update
    bool probed = false;
    std::optional<cgt::Errc> nested;  // that call's error, none if it succeeded
  };

  int seed_;
  Config config_;
  Rng rng_;
  Twin twin_;
  std::vector<torch::Tensor> params_;
  std::vector<std::size_t> all_;
  std::optional<cgt::torch::Adam> adam_;
  std::optional<cgt::torch::SGD> sgd_;
  std::optional<cgt::torch::Pool> pool_;
  std::array<std::optional<cgt::torch::TrainingStep>, 4> steps_;
  std::optional<cgt::torch::AutogradFunction> function_;
  std::optional<cgt::torch::OptimizerStep> update_;
  Injection inject_;
  std::map<std::string, int> successes_;  // successful calls per kind of call and shape
  Slot slot0_{"0"};
  Slot slot1_{"1"};
  int action_ = 0;
  std::vector<std::string> log_;
  std::string problem_;
};

}  // namespace

TEST_CASE("training/walk: random training actions on one optimizer give the eager libtorch twin's state",
          "[gpu][training][walk]") {
  REQUIRE_GPU();
  Totals totals;
  for (int seed = 1; seed <= walk_seeds; ++seed) {
    const Config& config = configs[static_cast<std::size_t>(seed - 1)];
    INFO("seed " << seed << ": " << describe(config));
    Walk walk(seed, config);
    const std::string problem = walk.run();
    if (!problem.empty()) FAIL_CHECK(problem);
    CHECK(walk.totals.updates >= 10);  // the sequence trained
    totals.updates += walk.totals.updates;
    totals.skipped += walk.totals.skipped;
    totals.refused += walk.totals.refused;
    totals.failures += walk.totals.failures;
    totals.rewinds += walk.totals.rewinds;
    totals.ended_mid_step += walk.totals.ended_mid_step;
    totals.restarted_mid_step += walk.totals.restarted_mid_step;
  }
  UNSCOPED_INFO("updates " << totals.updates << ", skipped " << totals.skipped << ", refused " << totals.refused
                           << ", failures " << totals.failures << ", rewinds " << totals.rewinds
                           << ", steps ended mid-step " << totals.ended_mid_step << ", restarted mid-step "
                           << totals.restarted_mid_step);
  // Every kind of action happened somewhere: the walk cannot pass by avoiding one.
  CHECK(totals.skipped >= 1);
  CHECK(totals.refused >= 1);
  CHECK(totals.failures >= 1);
  CHECK(totals.rewinds >= 1);
  CHECK(totals.ended_mid_step >= 1);
  CHECK(totals.restarted_mid_step >= 1);
}
