// The whole training step as one pool function: zero the gradients in place, forward, backward,
// optimizer step; or, for a program that computes its own gradients, that program, then the step.
module;
#include <ATen/core/Tensor.h>

#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstddef>
#include <expected>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;

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

// The step's function and the step itself hold handles of their own on the optimizer's state
// (`Optimizer::share`): the user's handle may move (out of a Result, into a vector) or go.
Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss, FunctionOptions options) {
  auto step = [optimizer = optimizer.share(), loss = std::move(loss)](Inputs in) mutable -> Values {
    const c10::AutoGradMode grad_on(true);
    // Static gradients are zeroed in place, at their addresses; per-step ones are set to none, so
    // that the backward allocates them in this call (see cgt.torch-optim.inc).
    const bool static_grads = optimizer.has_static_grads();
    optimizer.zero_grad(!static_grads);
    Values out = loss(in);
    TORCH_CHECK(!out.empty() && out[0].defined() && out[0].numel() == 1,
                "a training step's loss function returns the loss (one element) first");
    out[0].backward();
    optimizer.step();
    if (!static_grads) optimizer.zero_grad(true);  // they die here, inside the step's graph
    for (at::Tensor& value : out) {
      if (value.defined()) value = value.detach();
    }
    // The optimizer's norm tensor is rewritten by every step: the call hands out this step's.
    if (optimizer.clips_gradients()) out.push_back(optimizer.grad_norm().clone());
    return out;
  };
  auto function = add_training_step(pool, optimizer, std::move(step), std::move(options));
  if (!function) return std::unexpected(std::move(function.error()));
  return TrainingStep(std::move(*function), optimizer.share());
}

Result<TrainingStep> make_training_step_from_gradients(Pool& pool, Optimizer& optimizer, Callable loss_and_gradients,
                                                       FunctionOptions options) {
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

Owning<Outputs> TrainingStep::operator()(std::span<const Arg> args) const {
  // `.grad` set to none between steps: the graph still writes the optimizer's tensors; put them
  // back. Per-step gradients: a `.grad` the program set between steps is not the graph's; drop it.
  if (!optimizer_.has_state()) return fail(Errc::invalid_argument, "TrainingStep: the step was moved from");
  if (!optimizer_.has_static_grads()) optimizer_.zero_grad(true);
  if (auto attached = optimizer_.attach_grads(); !attached) return std::unexpected(std::move(attached.error()));
  if (auto rate = optimizer_.take_scheduled_lr(); !rate) return std::unexpected(std::move(rate.error()));
  auto out = function_(args);
  if (out) optimizer_.count_scheduled_step();
  return out;
}

}  // namespace cgt::torch
