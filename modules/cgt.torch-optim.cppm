// cgt.torch:optim — training with graphs: capturable optimizers and the whole training step.
//
// libtorch's `torch::optim::Adam` keeps its step count on the host and computes the bias
// corrections as host doubles: captured in a graph, they are constants, and every replay repeats
// the first step's update. The optimizers here keep all their state on the device, allocated
// when they are made (outside any pool: static addresses), and `step()` issues device work only,
// no host synchronisation and no host value that changes from step to step (PyTorch's
// `capturable=True`). They also own the parameters' `.grad` tensors: made (zeros) with the
// optimizer, outside the pool, written in place by every backward.
//
// The whole training step (MLPerf's "whole iteration" graph) is one pool function that zeroes
// the gradients in place, runs the forward and the backward and steps the optimizer:
//
//   auto adam = cgt::torch::make_adam(model->parameters(), {.lr = 1e-3});   // before the pool's first call
//   auto train = cgt::torch::make_training_step(*pool, *adam,
//       [&model](cgt::torch::Inputs in) {
//         return cgt::torch::Values{torch::mse_loss(model->forward(in[0]), in[1])};
//       });
//   for (auto& [x, y] : batches) {
//     pool->mark_step_begin();
//     auto loss = (*train)({x, y});    // warm-up, recording, then one graph launch per step
//   }
//
// An optimizer is a handle on state that the steps made from it share: once `train` is made,
// `adam` may move or go, and `train` trains on.
//
// Why gradients are zeroed in place inside the graph, never set to none: with no `.grad`, the
// backward's AccumulateGrad hands the parameter the gradient it just computed, memory the graph
// allocated in its pool; a replay writes that memory again but cannot re-assign `.grad` (a host
// action), and the optimizer's graph reads the address it saw when recording. With a `.grad` that
// exists, AccumulateGrad adds into it in place, at its static address. Between steps, outside the
// graph, the program may still call `zero_grad(true)` (`.grad` becomes undefined, as libtorch's
// optimizers do): the training step puts the optimizer's tensor back before its next call.
// (An optimizer made with `static_grads = false` owns no gradients: the training step sets them
// to none at its start and end instead, so they are born and die inside one replay, never
// crossing a call: eager `zero_grad(true)`'s memory, at the cost of `.grad` between steps.)
//
// The whole-step graph replays eager libtorch's kernels. For Inductor's, export the model's joint
// forward and backward as an AOTInductor package (scripts/aoti_training.py) and train on it with
// `load_aoti_gradients` and `make_training_step_from_gradients`: one graph of the package and the
// update, no autograd.
module;
#include <ATen/ATen.h>

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

export module cgt.torch:optim;
import cgt.backend;
import :api;

export namespace cgt::torch {

/// Adam's hyper-parameters (libtorch's `AdamOptions`); constants of the graph.
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// L2 penalty added to the gradient (Adam), or, with `decoupled_weight_decay`, the parameters
  /// shrunk by `lr * weight_decay` before the update (AdamW: libtorch's `AdamW` is
  /// `{.weight_decay = 1e-2, .decoupled_weight_decay = true}`).
  double weight_decay = 0;
  bool decoupled_weight_decay = false;
  /// The maximum of the second moments so far in the denominator (AMSGrad); one more state tensor
  /// per parameter.
  bool amsgrad = false;
  /// The gradients at static addresses, made with the optimizer (outside any pool) and zeroed in
  /// place by the training step: `.grad` stays readable after each step, and the memory of the
  /// gradients is held through the forward. False: the training step sets `.grad` to none at its
  /// start and at its end, so the backward allocates the gradients inside the step's graph and
  /// they die there (eager `zero_grad(true)`'s memory; `.grad` is undefined between steps).
  bool static_grads = true;
};

/// SGD's hyper-parameters (libtorch's `SGDOptions`, without dampening).
struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double weight_decay = 0;
  bool nesterov = false;
  /// As `AdamOptions::static_grads`.
  bool static_grads = true;
};

class TrainingStep;
class OptimizerStep;

/// What the training step needs of an optimizer: the parameters, their gradients at static
/// addresses, and a `step()` made of device work only.
///
/// A handle on state it shares with the steps made from it (`make_training_step`,
/// `make_optimizer_step`): moving the handle (out of a `Result`, into a vector that grows) or
/// dropping it changes nothing for them, and the state (parameters, gradients, moments) lives
/// until the last of the handle and the steps goes. Not copyable: one handle per optimizer (the
/// parameters' `.grad` are its tensors). A handle made by default or moved from holds no state:
/// its lists are empty, `zero_grad` does nothing, `step` throws `c10::Error`, and what returns
/// `Result` (`attach_grads`, a step made from it) fails with `invalid_argument`.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) noexcept = default;
  Optimizer& operator=(Optimizer&&) noexcept = default;

  /// One update of every parameter whose `.grad` is defined, from device state only: capturable.
  /// A `.grad` that is not the optimizer's tensor (the program, or an eager backward after
  /// `zero_grad(true)`, put another there) is copied into the optimizer's and replaced by it.
  /// Throws `c10::Error` as libtorch's ops do (inside a pool function the call then fails), and
  /// for a handle without state.
  void step();
  /// One update of every parameter from `grads`, one per parameter in `params()` order, computed
  /// without autograd (by `make_training_step_from_gradients`' function, say). With static
  /// gradients they are copied into `.grad` first, which stays readable after the step; without,
  /// `.grad` is left alone. A gradient whose strides differ from its parameter's is copied into the
  /// parameter's layout (the fused kernel reads them element for element). Throws `c10::Error`
  /// for a count, shape, dtype or device that does not match, and for a handle without state.
  void step(std::span<const at::Tensor> grads);
  /// Zeroes the gradients in place (`set_to_none = false`: what a graph may do), or makes the
  /// parameters' `.grad` undefined (`true`: outside a graph only; the optimizer keeps its tensors,
  /// and `attach_grads()` puts them back).
  void zero_grad(bool set_to_none = false);
  /// Makes every parameter's `.grad` the optimizer's tensor again where it is undefined. Fails
  /// with `invalid_argument` where it is another tensor (a graph writes gradients at the address
  /// it recorded: a `.grad` assigned by the program would silently stop receiving them), and for a
  /// handle without state.
  [[nodiscard]] Result<void> attach_grads();
  /// Whether the handle holds an optimizer: false when made by default or moved from.
  [[nodiscard]] bool has_state() const noexcept { return state_ != nullptr; }
  /// Whether the optimizer owns the gradients at static addresses (`AdamOptions::static_grads`).
  [[nodiscard]] bool has_static_grads() const noexcept;

  /// The lists below belong to the shared state: valid while the handle or a step made from it
  /// lives (empty without state).
  [[nodiscard]] const std::vector<at::Tensor>& params() const noexcept;
  /// The gradients, one per parameter, at static addresses (what `.grad` is while attached);
  /// empty with `static_grads = false`.
  [[nodiscard]] const std::vector<at::Tensor>& grads() const noexcept;
  /// The step count, a float32 tensor on the device (one per parameter, as PyTorch's).
  [[nodiscard]] const std::vector<at::Tensor>& steps() const noexcept;

 protected:
  // The parameters, gradients, step counts and the update (src/torch/optim.cpp). Made by
  // `make_adam`/`make_sgd`; shared by the handle and the steps' pool functions, which keep it
  // alive, so no step ever reaches the optimizer through the handle's address.
  class State;
  Optimizer() = default;
  std::shared_ptr<State> state_;  // set by make_adam/make_sgd; null once moved from

 private:
  // The step functions hold handles of their own on the state.
  friend Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss,
                                                 FunctionOptions options);
  friend Result<TrainingStep> make_training_step_from_gradients(Pool& pool, Optimizer& optimizer,
                                                                Callable loss_and_gradients, FunctionOptions options);
  friend Result<OptimizerStep> make_optimizer_step(Pool& pool, Optimizer& optimizer, FunctionOptions options);
  explicit Optimizer(std::shared_ptr<State> state) noexcept : state_(std::move(state)) {}
  // Another handle on the same state.
  [[nodiscard]] Optimizer share() const noexcept { return Optimizer(state_); }
};

/// Adam with its state on the device: PyTorch's fused Adam (`Adam(fused=True)`: one kernel
/// launch per ~hundred tensors, bias corrections in double precision from the device's step
/// counts) where every parameter, gradient and state tensor share a dtype, a device and a dense
/// layout; otherwise PyTorch's `capturable=True` multi-tensor formula (bias corrections in
/// float32 on the device). Both are capturable.
class Adam final : public Optimizer {
 public:
  /// As the lists of `Optimizer`: the shared state's (defaults and empty without state).
  [[nodiscard]] const AdamOptions& options() const noexcept;
  [[nodiscard]] const std::vector<at::Tensor>& exp_avgs() const noexcept;
  [[nodiscard]] const std::vector<at::Tensor>& exp_avg_sqs() const noexcept;
  /// The running maxima of the second moments (empty without `amsgrad`).
  [[nodiscard]] const std::vector<at::Tensor>& max_exp_avg_sqs() const noexcept;

 private:
  friend Result<Adam> make_adam(std::vector<at::Tensor> params, AdamOptions options);
  class State;  // the moments and the update (src/torch/optim.cpp)
  // This handle's state as Adam's, or null without one.
  [[nodiscard]] const State* adam_state() const noexcept;
};

/// SGD (with momentum, Nesterov, weight decay) whose momentum buffers are made with it (zeros:
/// the first step's buffer is the gradient, as libtorch's).
class SGD final : public Optimizer {
 public:
  /// The shared state's options (defaults without state).
  [[nodiscard]] const SGDOptions& options() const noexcept;

 private:
  friend Result<SGD> make_sgd(std::vector<at::Tensor> params, SGDOptions options);
  class State;  // the momentum buffers and the update (src/torch/optim.cpp)
  [[nodiscard]] const State* sgd_state() const noexcept;
};

/// A capturable Adam over `params` (CUDA, floating point, leaves that require grad): its state
/// and the parameters' `.grad` are allocated now, on the caller's stream. Make it before the
/// first call of any pool function that uses it (inside one, they would land in the pool).
/// Fails with `invalid_argument` for an unusable parameter or option.
[[nodiscard]] Result<Adam> make_adam(std::vector<at::Tensor> params, AdamOptions options = {});
/// A capturable SGD, as `make_adam`.
[[nodiscard]] Result<SGD> make_sgd(std::vector<at::Tensor> params, SGDOptions options);

/// The whole training step as one function of a pool (see the top of this file).
class TrainingStep {
 public:
  /// One step: puts back `.grad` where the program set it to none, then calls the function:
  /// gradients zeroed in place, the loss function, `backward()` on its first value, the
  /// optimizer's step (`make_training_step_from_gradients`: the gradient function, then the
  /// step from its gradients). (Without static gradients: `.grad` set to none before, inside at
  /// the start, and at the end of the function.) Returns what the loss function returned, detached, as leases (the loss
  /// first). Fails as `Function::operator()` does, and with `invalid_argument` when a `.grad`
  /// was replaced by another tensor (`Optimizer::attach_grads`) or the step was moved from.
  [[nodiscard]] Owning<Outputs> operator()(std::span<const Arg> args) const;
  [[nodiscard]] Owning<Outputs> operator()(std::initializer_list<Arg> args) const {
    return (*this)(std::span<const Arg>(args.begin(), args.size()));
  }
  /// The pool function (its name, its id).
  [[nodiscard]] const Function& function() const noexcept { return function_; }

 private:
  friend Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss,
                                                 FunctionOptions options);
  friend Result<TrainingStep> make_training_step_from_gradients(Pool& pool, Optimizer& optimizer,
                                                                Callable loss_and_gradients, FunctionOptions options);
  TrainingStep(Function function, Optimizer optimizer) noexcept
      : function_(std::move(function)), optimizer_(std::move(optimizer)) {}
  Function function_;
  // A handle of the step's own on the optimizer's state (the function holds another): the user's
  // handle may move or go. Mutable as that state is: a call steps it.
  mutable Optimizer optimizer_;
};

/// The optimizer's update as a graph of its own: for training with autograd functions
/// (cgt.torch:autograd), where the forward and backward are graphs and the update would otherwise
/// be eager launches after `backward()`:
///
///   auto adam = cgt::torch::make_adam(model->parameters(), {.lr = 1e-3});  // first: it makes `.grad`
///   auto layer = cgt::torch::make_autograd_function(*pool, fn, {.parameters = model->parameters()});
///   auto update = cgt::torch::make_optimizer_step(*pool, *adam);
///   for (...) {
///     pool->mark_step_begin();
///     adam->zero_grad(false);
///     auto out = (*layer)({x});
///     (*out)[0].sum().backward();     // the backward graph accumulates into the optimizer's `.grad`
///     auto done = (*update)();        // one graph launch
///   }
///
/// The graph reads the gradients at the addresses it recorded: the optimizer's own (static
/// gradients). An autograd function made after the optimizer accumulates into them directly.
class OptimizerStep {
 public:
  /// One update: calls the function (warm-up, recording, then replays). Every parameter's `.grad`
  /// must be the optimizer's tensor: fails with `invalid_argument` where it is undefined (eager
  /// `step()` would skip the parameter; a graph cannot) or another tensor (an eager backward after
  /// `zero_grad(true)` makes one; a backward through cgt autograd functions puts the optimizer's
  /// back), or the step was moved from, before any update; and as `Function::operator()` does.
  [[nodiscard]] Result<void> operator()() const;
  /// The pool function (its name, its id).
  [[nodiscard]] const Function& function() const noexcept { return function_; }

 private:
  friend Result<OptimizerStep> make_optimizer_step(Pool& pool, Optimizer& optimizer, FunctionOptions options);
  OptimizerStep(Function function, Optimizer optimizer) noexcept
      : function_(std::move(function)), optimizer_(std::move(optimizer)) {}
  Function function_;
  Optimizer optimizer_;  // the step's own handle on the optimizer's state, as TrainingStep's
};

/// Adds `optimizer.step()` to `pool` as a function of no inputs and no outputs. The optimizer
/// must have static gradients (gradients made per step live at addresses a graph cannot follow:
/// `invalid_argument` otherwise, as for a handle without state). The step shares the optimizer's
/// state: the handle may be moved or dropped after. `options.mode` must be `inference`, and the
/// options about inputs (sizes, buckets, static and mutated inputs) empty (`invalid_argument`).
/// Fails as `Pool::add_function` does.
[[nodiscard]] Result<OptimizerStep> make_optimizer_step(Pool& pool, Optimizer& optimizer,
                                                        FunctionOptions options = {.name = "optimizer_step"});

/// Adds the training step to `pool`: `loss(inputs)` returns the loss first (a tensor of one
/// element; more values may follow, returned too). The step shares the optimizer's state (the
/// handle may be moved or dropped after; one without state fails with `invalid_argument`), which
/// must hold every parameter the loss trains (a parameter it does not hold would get a `.grad`
/// allocated in the pool). The inputs (batch, target) are copied into the graph on each call
/// unless declared static in `options`. The function runs with grad mode on, whatever the
/// caller's is. `options.mode` must be `inference` (the step is whole: no backward follows it),
/// and `graph_sizes` and `buckets` empty (buckets would train on padded rows; each batch size
/// records its own graph); fails with `invalid_argument` otherwise, and as `Pool::add_function`
/// does.
[[nodiscard]] Result<TrainingStep> make_training_step(Pool& pool, Optimizer& optimizer, Callable loss,
                                                      FunctionOptions options = {.name = "training_step"});

/// The training step of a program that computes its own gradients, without autograd: above all
/// an AOTInductor package of the model's joint forward and backward (`load_aoti_gradients`), whose
/// kernels Inductor generated and fused, where `make_training_step` replays eager libtorch's.
/// `loss_and_gradients(inputs)` returns the loss (one element) first, then one gradient per
/// parameter of the optimizer, in `optimizer.params()` order, then any further values; it runs
/// with grad mode off. The step updates the parameters from those gradients (`Optimizer::step(grads)`)
/// and returns the loss and the further values, as leases. A count, shape or dtype that does not
/// match fails the call (`function_failed`, its message naming the gradient; nothing is updated);
/// the order of same-shaped parameters cannot be seen here: prefer the `GradientFunction`
/// overload, which checks it. The rules about the optimizer and the options are `make_training_step`'s.
[[nodiscard]] Result<TrainingStep> make_training_step_from_gradients(
    Pool& pool, Optimizer& optimizer, Callable loss_and_gradients, FunctionOptions options = {.name = "training_step"});

/// A gradient function (as above) with the parameters it computes the gradients of, in the order
/// it returns them: the two lists `make_training_step_from_gradients` compares, since the
/// gradients of same-shaped parameters in another order would train each on another's gradient.
/// `load_aoti_gradients` makes one; a program that computes gradients by hand may too.
struct GradientFunction {
  std::vector<at::Tensor> params;
  Callable loss_and_gradients;
};

/// As above, once `gradients.params` are the optimizer's parameters in the optimizer's order:
/// each the same tensor as `optimizer.params()[i]`, or one at the same address in the same
/// layout (`p.detach()`, say). Fails with `invalid_argument` naming the first index that differs
/// (or both counts), before anything is added to the pool.
[[nodiscard]] Result<TrainingStep> make_training_step_from_gradients(
    Pool& pool, Optimizer& optimizer, GradientFunction gradients, FunctionOptions options = {.name = "training_step"});

/// The gradient function of an AOTInductor package of a joint forward and backward, as
/// scripts/aoti_training.py exports one: the package takes the parameters (`params`, in the order
/// of the Python module's `named_parameters()`), then the step's inputs, and returns the loss,
/// then the gradients; `params` come back with it, for `make_training_step_from_gradients` to
/// check against the optimizer's. Loaded for capture (`run_single_threaded`) on `device`. Fails
/// with `invalid_argument` when the package cannot be loaded or a parameter is not on `device`.
[[nodiscard]] Result<GradientFunction> load_aoti_gradients(const std::string& path, std::vector<at::Tensor> params,
                                                           c10::DeviceIndex device = 0,
                                                           const std::string& model_name = "model");

}  // namespace cgt::torch
