// The whole training step as one pool function: zero the gradients in place, forward, backward,
// optimizer step; or, for a program that computes its own gradients, that program, then the step.
module;
#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :optim_state;

namespace cgt::torch {

namespace {

// What both kinds of training step share: the options a whole step allows, the optimizer's
// gradients attached, the step registered as a pool function.
Result<Function> add_training_step(Pool& pool, Optimizer& optimizer, Callable step, FunctionOptions options) {
  if (!optimizer.has_state()) {
    return fail(Errc::invalid_argument,
                "make_training_step: the optimizer handle holds no state (made by default, or moved from): pass the "
                "handle it was moved into, or one from make_adam/make_sgd");
  }
  if (options.mode != FunctionMode::inference) {
    return fail(Errc::invalid_argument,
                "a training step is a whole step (forward, backward and update): its mode must be inference");
  }
  if (!options.graph_sizes.empty() || !options.buckets.sizes.empty()) {
    // Padded rows would enter the loss and the gradients (the loss, one element, is never sliced).
    return fail(Errc::invalid_argument,
                "a training step trains on the whole batch it is given: buckets would train on padded rows, and "
                "graph_sizes is for inference; record each batch size (calls of a new size record a graph)");
  }
  if (auto attached = optimizer.attach_grads(); !attached) return std::unexpected(std::move(attached.error()));
  return pool.add_function(std::move(step), std::move(options));
}

// Whether `given` is `param`: the same tensor, or one at its address in its layout (`p.detach()`),
// which a gradient function reads just as well while the optimizer updates `param` in place.
bool is_same_parameter(const at::Tensor& given, const at::Tensor& param) {
  if (given.is_same(param)) return true;
  return given.defined() && param.defined() && given.has_storage() && param.has_storage() &&
         given.data_ptr() == param.data_ptr() && given.device() == param.device() &&
         given.scalar_type() == param.scalar_type() && given.sizes() == param.sizes() &&
         given.strides() == param.strides();
}

// The gradient function's parameters against the optimizer's, in order: same-shaped parameters
// in another order would pass every check of the step (shapes, dtypes) and train each on
// another's gradient.
Result<void> check_same_parameters(const std::vector<at::Tensor>& given, const std::vector<at::Tensor>& params) {
  const std::string where = "make_training_step_from_gradients: ";
  const std::size_t n = std::min(given.size(), params.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (is_same_parameter(given[i], params[i])) continue;
    return fail(Errc::invalid_argument,
                where + "parameter " + std::to_string(i) +
                    " of the gradient function is not the optimizer's parameter " + std::to_string(i) +
                    " (another tensor, or the parameters in another order): its gradient would update another "
                    "parameter; make both from the same list, in the order the function returns the gradients");
  }
  if (given.size() != params.size()) {
    return fail(Errc::invalid_argument, where + "the gradient function has " + std::to_string(given.size()) +
                                            " parameters and the optimizer " + std::to_string(params.size()) +
                                            " (first differing index " + std::to_string(n) +
                                            "): make both from the same list");
  }
  return {};
}

}  // namespace

namespace {

// CUDA autocast to `dtype` while it lives (nothing without a dtype), as PyTorch's
// `torch.autocast("cuda", dtype, cache_enabled=False)`: the cache of weight casts is off, since a
// cast cached while a graph records would be memory of that recording, read by later calls. The
// thread's previous state comes back when it goes, also when the loss function threw.
class AutocastScope {
 public:
  explicit AutocastScope(std::optional<at::ScalarType> dtype) : active_(dtype.has_value()) {
    if (!active_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    was_cached_ = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, *dtype);
    at::autocast::set_autocast_cache_enabled(false);
    at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (!active_) return;
    // As PyTorch's `autocast.__exit__`: the outermost scope empties the cache.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, was_dtype_);
    at::autocast::set_autocast_cache_enabled(was_cached_);
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kHalf;
  bool was_cached_ = true;
};

// The loss function's values, its forward under `autocast` (the backward runs outside it).
Values run_loss(Callable& loss, Inputs in, std::optional<at::ScalarType> autocast) {
  const AutocastScope scope(autocast);
  return loss(in);
}

void check_loss(const Values& out) {
  TORCH_CHECK(!out.empty() && out[0].defined() && out[0].numel() == 1,
              "a training step's loss function returns the loss (one element) first");
}

// The name of one phase's function: the step's own name for the one that steps.
FunctionOptions phase_options(const FunctionOptions& options, const char* phase) {
  FunctionOptions named = options;
  named.name = (options.name.empty() ? std::string("training_step") : options.name) + phase;
  return named;
}

}  // namespace

// The bodies of a training step's pool functions. A member of TrainingStep, Optimizer's friend,
// so that they reach the optimizer's state behind its handle: a step updates only the parameters
// its backward reached, as eager libtorch after zero_grad(set_to_none=true) steps only those with
// a gradient. The static gradients are zeroed in place, so a parameter the loss never reaches
// still has one (zeros), which AdamW's decay or SGD's momentum would move it by; the body tells
// the reached ones by their gradients' versions (Optimizer::State::reached_since). Which
// parameters a graph updates is a host decision taken when its body runs (warm-up, recording),
// baked into the graph with the autograd graph that decided it.
class TrainingStep::Body {
 public:
  using State = Optimizer::State;

  // Which call of a step a body is: all of it, or (micro-batches one per call) the first, a middle
  // or the last micro-batch. The first zeroes the gradients, the last steps.
  enum class Part : std::uint8_t { whole, first, middle, last };
  struct Phase {
    Part part = Part::whole;
    double loss_factor = 1;                  // 1 / micro-batches, before the backward
    std::optional<at::ScalarType> autocast;  // TrainingStepOptions::autocast
  };
  // The parameters the first and the middle calls' backward reached when their bodies last ran
  // (replays run none), for the last call to update what any micro-batch of its step reached.
  // Every kind of call runs its body (warm-up) before the first step's last call does. Written
  // and read by the bodies, under the optimizer's hold (StepInUse).
  struct Reached {
    std::vector<bool> first;
    std::vector<bool> middle;
  };

  static std::shared_ptr<State> state_of(const Optimizer& optimizer) { return optimizer.state_; }

  // One micro-batch, or a whole batch (`Part::whole`).
  static Callable phase(std::shared_ptr<State> state, std::shared_ptr<Callable> loss, Phase phase,
                        std::shared_ptr<Reached> reached) {
    return [state = std::move(state), loss = std::move(loss), phase, reached = std::move(reached)](Inputs in) {
      const c10::AutoGradMode grad_on(true);
      const bool zeroes = phase.part == Part::whole || phase.part == Part::first;
      const bool steps = phase.part == Part::whole || phase.part == Part::last;
      // Static gradients are zeroed in place, at their addresses; per-step ones are set to none,
      // so that the backward allocates them in this call (see cgt.torch-optim.inc).
      if (zeroes) state->zero_grad(!state->static_grads_);
      const std::vector<std::int64_t> versions = state->grad_versions();
      Values out = run_loss(*loss, in, phase.autocast);
      check_loss(out);
      backward(*state, phase.loss_factor == 1 ? out[0] : out[0].mul(phase.loss_factor));
      std::vector<bool> reached_here = state->reached_since(versions);
      if (phase.part == Part::first) reached->first = reached_here;
      if (phase.part == Part::middle) reached->middle = reached_here;
      if (steps) {
        if (phase.part == Part::last) {
          add(reached_here, reached->first);
          add(reached_here, reached->middle);
        }
        step_reached(*state, reached_here);
      }
      finish_outputs(out, *state, steps);
      return out;
    };
  }

  // All micro-batches in one call: every tensor input split into `parts` along its first
  // dimension; the step updates what any of them reached.
  static Callable all_in_one(std::shared_ptr<State> state, std::shared_ptr<Callable> loss, std::int64_t parts,
                             std::optional<at::ScalarType> autocast) {
    return [state = std::move(state), loss = std::move(loss), parts, autocast](Inputs in) {
      const c10::AutoGradMode grad_on(true);
      state->zero_grad(!state->static_grads_);
      std::vector<std::vector<at::Tensor>> chunks(in.size());
      for (std::size_t j = 0; j < in.size(); ++j) {
        if (!in[j].defined()) continue;  // a scalar argument: the same for every micro-batch
        TORCH_CHECK(in[j].dim() > 0 && in[j].size(0) % parts == 0, "input ", j, " has ",
                    in[j].dim() > 0 ? in[j].size(0) : 0, " rows along its first dimension, which ", parts,
                    " micro-batches cannot share equally");
        chunks[j] = in[j].chunk(parts, 0);
      }
      std::vector<std::int64_t> scalars(in.size());
      for (std::size_t j = 0; j < in.size(); ++j) scalars[j] = in.scalar(j);
      const std::vector<std::int64_t> versions = state->grad_versions();
      Values out;
      at::Tensor total;
      for (std::int64_t part = 0; part < parts; ++part) {
        std::vector<at::Tensor> values(in.size());
        for (std::size_t j = 0; j < in.size(); ++j) {
          if (!chunks[j].empty()) values[j] = chunks[j][static_cast<std::size_t>(part)];
        }
        out = run_loss(*loss, Inputs(values, scalars), autocast);
        check_loss(out);
        backward(*state, out[0].div(static_cast<double>(parts)));
        total = part == 0 ? out[0].detach() : total.add(out[0].detach());
      }
      step_reached(*state, state->reached_since(versions));
      out[0] = total.div(static_cast<double>(parts));
      finish_outputs(out, *state, true);
      return out;
    };
  }

 private:
  // The backward from the loss, times the optimizer's loss scale where it scales the loss
  // (GradScaler's `scale(loss)`; the step unscales the gradients). An optimizer over no parameters
  // trains nothing: no backward (its loss may be of constants, which have none).
  static void backward(const State& state, const at::Tensor& loss) {
    if (state.params_.empty()) return;
    (state.loss_scale_ ? loss.mul(state.loss_scale_->scale()) : loss).backward();
  }

  // `into` |= `more`, where `more` was found (an empty list: its body has not run).
  static void add(std::vector<bool>& into, const std::vector<bool>& more) {
    if (more.size() != into.size()) return;
    for (std::size_t i = 0; i < into.size(); ++i) into[i] = into[i] || more[i];
  }

  // The optimizer's step over the parameters reached. Per-step gradients need no list: the
  // parameters the backward did not reach have no `.grad`, which the step skips; they are set to
  // none after, so that they die inside the step's graph.
  static void step_reached(State& state, const std::vector<bool>& reached) {
    if (!state.static_grads_) {
      state.step();
      state.zero_grad(true);
      return;
    }
    std::vector<std::size_t> among;
    for (std::size_t i = 0; i < reached.size(); ++i) {
      if (reached[i]) among.push_back(i);
    }
    state.step_only(among);
  }

  // After the loss function ran: its values detached, and the norm of a step that clipped last.
  static void finish_outputs(Values& out, const State& state, bool stepped) {
    for (at::Tensor& value : out) {
      if (value.defined()) value = value.detach();
    }
    // The optimizer's norm tensor is rewritten by every step: the call hands out this step's.
    if (stepped && state.clips_gradients()) out.push_back(state.grad_norm_.clone());
  }
};

// The step's function and the step itself hold handles of their own on the optimizer's state
// (`Optimizer::share`): the user's handle may move (out of a Result, into a vector) or go.
Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss, FunctionOptions options) {
  return make_training_step(pool, optimizer, std::move(loss), TrainingStepOptions{.function = std::move(options)});
}

Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss, TrainingStepOptions options) {
  const std::int64_t parts = options.micro_batches;
  if (parts < 1) {
    return fail(Errc::invalid_argument,
                "make_training_step: micro_batches is " + std::to_string(parts) + "; a step has at least one");
  }
  if (options.autocast && *options.autocast != at::kBFloat16 && *options.autocast != at::kHalf) {
    return fail(Errc::invalid_argument, std::string("make_training_step: autocast to ") +
                                            c10::toString(*options.autocast) +
                                            "; CUDA autocast lowers to at::kBFloat16 or at::kHalf");
  }
  const bool per_call = parts > 1 && !options.all_in_one_call;
  if (per_call && optimizer.has_state() && !optimizer.has_static_grads()) {
    return fail(Errc::invalid_argument,
                "make_training_step: micro-batches one per call accumulate their gradients in the optimizer's "
                ".grad across calls: make the optimizer with static_grads = true (or pass all micro-batches in "
                "one call: all_in_one_call)");
  }
  using Body = TrainingStep::Body;
  auto shared_loss = std::make_shared<Callable>(std::move(loss));
  auto reached = std::make_shared<Body::Reached>();
  const double factor = 1.0 / static_cast<double>(parts);
  const auto body = [&](Body::Part part) {
    return Body::phase(Body::state_of(optimizer), shared_loss,
                       {.part = part, .loss_factor = factor, .autocast = options.autocast}, reached);
  };
  Callable last = parts > 1 && options.all_in_one_call
                      ? Body::all_in_one(Body::state_of(optimizer), shared_loss, parts, options.autocast)
                      : body(per_call ? Body::Part::last : Body::Part::whole);
  // A call of a step that does not step: the first micro-batch zeroes the gradients, the middle
  // ones only accumulate.
  const auto add_phase = [&](Body::Part part, const char* suffix) {
    return add_training_step(pool, optimizer, body(part), phase_options(options.function, suffix));
  };
  std::optional<Function> first;
  std::optional<Function> middle;
  if (per_call) {
    // Made first: a failure leaves nothing of the step in the pool but what is made already.
    auto made = add_phase(Body::Part::first, ".first");
    if (!made) return std::unexpected(std::move(made.error()));
    first = std::move(*made);
    if (parts > 2) {
      made = add_phase(Body::Part::middle, ".middle");
      if (!made) return std::unexpected(std::move(made.error()));
      middle = std::move(*made);
    }
  }
  auto function = add_training_step(pool, optimizer, std::move(last), std::move(options.function));
  if (!function) return std::unexpected(std::move(function.error()));
  TrainingStep step(std::move(*function), optimizer.share());
  step.first_ = std::move(first);
  step.middle_ = std::move(middle);
  step.micro_batches_ = parts;
  return step;
}

Result<TrainingStep> make_training_step_from_gradients(Pool& pool, Optimizer& optimizer, Callable loss_and_gradients,
                                                       FunctionOptions options) {
  if (optimizer.scales_loss()) {
    return fail(Errc::invalid_argument,
                "make_training_step_from_gradients: the optimizer scales the loss (LossScaleOptions), but the "
                "gradient function computes the gradients of the loss itself, which the step would divide by the "
                "scale; make the optimizer without loss scaling (bfloat16 needs none)");
  }
  auto step = [optimizer = optimizer.share(), function = std::move(loss_and_gradients)](Inputs in) mutable -> Values {
    const c10::NoGradGuard no_autograd;  // the function computes the gradients itself
    Values out = function(in);
    const std::size_t n = optimizer.params().size();
    TORCH_CHECK(out.size() >= 1 + n && out[0].defined() && out[0].numel() == 1,
                "a gradient function returns the loss (one element), then one gradient per parameter (", n,
                "); it returned ", out.size(), " values");
    optimizer.step(std::span<const at::Tensor>(out).subspan(1, n));
    // The gradients are not returned: with per-step gradients they die here, inside the graph.
    out.erase(out.begin() + 1, out.begin() + static_cast<std::ptrdiff_t>(1 + n));
    if (optimizer.clips_gradients()) out.push_back(optimizer.grad_norm().clone());
    return out;
  };
  auto function = add_training_step(pool, optimizer, std::move(step), std::move(options));
  if (!function) return std::unexpected(std::move(function.error()));
  return TrainingStep(std::move(*function), optimizer.share());
}

Result<TrainingStep> make_training_step_from_gradients(Pool& pool, Optimizer& optimizer, GradientFunction gradients,
                                                       FunctionOptions options) {
  // (An optimizer without state has no parameters to compare: the call below reports that.)
  if (optimizer.has_state()) {
    if (auto same = check_same_parameters(gradients.params, optimizer.params()); !same) {
      return std::unexpected(std::move(same.error()));
    }
  }
  return make_training_step_from_gradients(pool, optimizer, std::move(gradients.loss_and_gradients),
                                           std::move(options));
}

namespace {

// A TrainingStep's id: which step owns the optimizer's step in progress (StepProgress; 0 is none).
std::uint64_t new_step_id() noexcept {
  static std::atomic<std::uint64_t> last{0};
  return last.fetch_add(1) + 1;
}

}  // namespace

TrainingStep::TrainingStep(Function function, Optimizer optimizer) noexcept
    : function_(std::move(function)), id_(new_step_id()), optimizer_(std::move(optimizer)) {}

TrainingStep::~TrainingStep() {
  give_up_step();
}

TrainingStep& TrainingStep::operator=(TrainingStep&& other) noexcept {
  if (this == &other) return *this;
  give_up_step();  // this step's step in progress goes with it
  function_ = std::move(other.function_);
  first_ = std::move(other.first_);
  middle_ = std::move(other.middle_);
  micro_batches_ = other.micro_batches_;
  id_ = other.id_;
  optimizer_ = std::move(other.optimizer_);  // the moved-from step holds no state: it gives up nothing
  return *this;
}

void TrainingStep::give_up_step() noexcept {
  if (!optimizer_.has_state()) return;
  Optimizer::State& state = *optimizer_.state_;
  // Refused: another thread's graphed step runs, which began only because this step owned no step
  // in progress (its call refuses another owner's), so there is nothing to give up.
  const OperationInUse in_use(state.in_use_);
  if (!in_use.refused() && state.progress_.owner() == id_) state.progress_.clear();
}

std::int64_t TrainingStep::micro_batches_taken() const noexcept {
  return optimizer_.has_state() ? optimizer_.state_->progress_.taken_by(id_) : 0;
}

Result<void> TrainingStep::restart_step() {
  if (!optimizer_.has_state())
    return fail(Errc::invalid_argument, "TrainingStep::restart_step: the step was moved from");
  Optimizer::State& state = *optimizer_.state_;
  const OperationInUse in_use(state.in_use_);
  if (in_use.refused()) return fail(Errc::concurrent_use, used_by_another_thread("TrainingStep::restart_step"));
  if (state.progress_.owner() == id_) state.progress_.clear();
  return {};
}

Owning<Outputs> TrainingStep::operator()(std::span<const Arg> args) const {
  if (!optimizer_.has_state()) return fail(Errc::invalid_argument, "TrainingStep: the step was moved from");
  Optimizer::State& state = *optimizer_.state_;
  const StepInUse in_use(state.in_use_);
  if (!in_use.taken()) return fail(Errc::concurrent_use, step_in_use("TrainingStep"));
  // Another step's micro-batches are in the gradients this call would zero, add to or step on.
  if (const std::uint64_t owner = state.progress_.owner(); owner != 0 && owner != id_) {
    return fail(Errc::invalid_argument,
                step_in_progress("TrainingStep", state.progress_.taken(), "this call would zero, add to or step on"));
  }
  // `.grad` set to none between steps: the graph still writes the optimizer's tensors; put them
  // back. Per-step gradients: a `.grad` the program set between steps is not the graph's; drop it.
  if (!state.static_grads_) state.zero_grad(true);
  if (auto attached = state.attach_grads(); !attached) return std::unexpected(std::move(attached.error()));
  // Micro-batches one per call: the first of a step, the middle ones, then the one that steps.
  const std::int64_t taken = state.progress_.taken_by(id_);
  const bool steps = !first_.has_value() || taken == micro_batches_ - 1;
  if (!steps) {
    const std::optional<Function>& phase = taken == 0 ? first_ : middle_;
    if (!phase.has_value()) {  // made for every micro-batch count that calls it
      return fail(Errc::invariant_violation, "TrainingStep: no function for micro-batch " + std::to_string(taken));
    }
    auto out = (*phase)(args);
    if (out) state.progress_.take(id_, taken + 1);
    return out;
  }
  if (auto rate = optimizer_.take_scheduled_lr(); !rate) return std::unexpected(std::move(rate.error()));
  auto out = function_(args);
  if (out) {
    optimizer_.count_scheduled_step();
    state.progress_.clear();
  }
  return out;
}

}  // namespace cgt::torch
