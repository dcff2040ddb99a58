// The whole training step as one pool function: zero the gradients in place, forward, backward,
// optimizer step; or, for a program that computes its own gradients, that program, then the step.
module;
#include <ATen/ATen.h>

#include <c10/core/GradMode.h>

#include <cstddef>
#include <expected>
#include <span>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.backend;

namespace cgt::torch {

namespace {

// What both kinds of training step share: the options a whole step allows, the optimizer's
// gradients attached, the step registered as a pool function.
Result<Function> add_training_step(Pool& pool, Optimizer& optimizer, Callable step, FunctionOptions options) {
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

}  // namespace

Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss, FunctionOptions options) {
  auto step = [optimizer = &optimizer, loss = std::move(loss)](Inputs in) mutable -> Values {
    const c10::AutoGradMode grad_on(true);
    // Static gradients are zeroed in place, at their addresses; per-step ones are set to none, so
    // that the backward allocates them in this call (see cgt.torch-optim.cppm).
    const bool static_grads = optimizer->has_static_grads();
    optimizer->zero_grad(!static_grads);
    Values out = loss(in);
    TORCH_CHECK(!out.empty() && out[0].defined() && out[0].numel() == 1,
                "a training step's loss function returns the loss (one element) first");
    out[0].backward();
    optimizer->step();
    if (!static_grads) optimizer->zero_grad(true);  // they die here, inside the step's graph
    for (at::Tensor& value : out) {
      if (value.defined()) value = value.detach();
    }
    return out;
  };
  auto function = add_training_step(pool, optimizer, std::move(step), std::move(options));
  if (!function) return std::unexpected(std::move(function.error()));
  return TrainingStep(std::move(*function), optimizer);
}

Result<TrainingStep> make_training_step_from_gradients(Pool& pool, Optimizer& optimizer, Callable loss_and_gradients,
                                                       FunctionOptions options) {
  auto step = [optimizer = &optimizer, function = std::move(loss_and_gradients)](Inputs in) mutable -> Values {
    const c10::NoGradGuard no_autograd;  // the function computes the gradients itself
    Values out = function(in);
    const std::size_t n = optimizer->params().size();
    TORCH_CHECK(out.size() >= 1 + n && out[0].defined() && out[0].numel() == 1,
                "a gradient function returns the loss (one element), then one gradient per parameter (", n,
                "); it returned ", out.size(), " values");
    optimizer->step(std::span<const at::Tensor>(out).subspan(1, n));
    // The gradients are not returned: with per-step gradients they die here, inside the graph.
    out.erase(out.begin() + 1, out.begin() + static_cast<std::ptrdiff_t>(1 + n));
    return out;
  };
  auto function = add_training_step(pool, optimizer, std::move(step), std::move(options));
  if (!function) return std::unexpected(std::move(function.error()));
  return TrainingStep(std::move(*function), optimizer);
}

Owning<Outputs> TrainingStep::operator()(std::span<const Arg> args) const {
  // `.grad` set to none between steps: the graph still writes the optimizer's tensors; put them
  // back. Per-step gradients: a `.grad` the program set between steps is not the graph's; drop it.
  if (!optimizer_->has_static_grads()) optimizer_->zero_grad(true);
  if (auto attached = optimizer_->attach_grads(); !attached) return std::unexpected(std::move(attached.error()));
  return function_(args);
}

}  // namespace cgt::torch
