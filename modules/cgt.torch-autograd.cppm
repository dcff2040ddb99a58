// cgt.torch:autograd — pool functions that take part in libtorch's autograd (training).
//
//   auto layer = cgt::torch::make_autograd_function(
//       pool, [&model](cgt::torch::Inputs in) { return cgt::torch::Values{model->forward(in[0])}; },
//       {.name = "layer", .parameters = model->parameters()});
//   pool.mark_step_begin();
//   auto out = (*layer)({x});                         // forward graph; out[0] carries a grad_fn
//   at::Tensor loss = torch::mse_loss(out[0], target);
//   loss.backward();                                  // the backward graph: x.grad(), the parameters' .grad()
//
// One autograd function is three pool functions of the pool it is made on, named after it:
//  * "<name>.inference" (`FunctionMode::inference`) runs when no backward can follow: grad mode off
//    (`torch::NoGradGuard`), `c10::InferenceMode`, or neither an input nor a parameter requires grad.
//    Its outputs have no grad_fn.
//  * "<name>.forward" (`FunctionMode::forward`) runs the callable without building an autograd
//    graph; its outputs get a grad_fn (a `cgt::GraphedBackward` node). What the backward needs is
//    the forward's inputs, held by that node: an output of an earlier autograd function of the pool
//    by a lease (its memory stays live until the backward has run or the node is dropped), any
//    other tensor as itself.
//  * "<name>.backward" (`FunctionMode::backward`) runs when autograd reaches the node: it runs the
//    callable again under grad mode (activation checkpointing: no memory of the forward is kept
//    between the two calls but its inputs) and takes the gradients with `torch::autograd::grad`,
//    all inside one graph. Random numbers (dropout) are the forward's: the node replays the
//    default CUDA generator's offset the forward drew from.
// Chained functions (layer 1 -> layer 2 -> loss) form one path of the pool's tree: forward 1,
// forward 2, ..., backward 2, backward 1, replayed as a whole on later steps.
//
// Gradients reach inputs that require grad as eager autograd would give them (accumulated into a
// leaf's `.grad()`, passed on to earlier nodes otherwise), and the parameters' `.grad()`: the
// backward graph accumulates each parameter's gradient into a buffer outside the pool, at the
// address it recorded, and the buffer becomes `.grad()` where there is none. The buffer is the
// `.grad()` the parameter had when the function was made (a capturable optimizer's static
// gradient, cgt.torch:optim: make the optimizer first, and the backward graph writes straight
// into what its update reads; it comes back as `.grad()` itself, as `attach_grads()` would put
// it), or one the function makes, handed out as a tensor of its own over the buffer, so that a
// `.grad()` the program kept after setting `.grad()` to none keeps its values, as eager's: before
// the buffer is zeroed, that tensor moves onto a copy (the only copy; a view or `detach()` of it
// is not moved). So no `.grad()` ever lives in the pool (PyTorch's "gradient accumulation into a
// .grad tensor output of CUDAGraphs" cannot happen), accumulation over several backwards,
// `retain_graph` and both `zero_grad()` forms work; a `.grad()` the program assigned itself
// receives the gradient with `add_`. As in eager mode, `torch::autograd::grad(outputs, inputs)`
// never touches the parameters' `.grad()` (its backward is a graph of its own that leaves them
// out), and `backward(inputs=...)` fills them only when it names them all (the graph computes
// them together). Autograd sees no edge from the node to the parameters, so it runs the node only
// for a named input of the function: naming the parameters and no such input fills nothing;
// naming some parameters, or asking `grad` for one, raises a `c10::Error` rather than giving a
// wrong gradient.
//
// Errors inside a backward are raised as `c10::Error` by autograd's `backward()`, as libtorch
// reports them: a failed call; an input modified in place between the forward and the backward
// (eager's "modified by an inplace operation": the backward recomputes the forward from the
// input's memory); `create_graph=true` (the backward graph's gradients have no history, so a
// second derivative would miss this function's terms: differentiate twice eagerly, outside
// cgt); a second backward through a node without `retain_graph` ("Trying to backward through the
// graph a second time", as eager's).
module;
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

export module cgt.torch:autograd;
import cgt.backend;
import :api;

export namespace cgt::torch {

/// How an autograd function is made.
struct AutogradOptions {
  /// Names the three pool functions: "<name>.inference", "<name>.forward", "<name>.backward".
  std::string name = "autograd";
  /// The leaves whose `.grad()` the backward fills (`module->parameters()`): the tensors the
  /// callable reads besides its inputs that require grad. Captured at their addresses: update
  /// them in place (optimizers do), never reassign them.
  std::vector<at::Tensor> parameters;
  /// Inputs at a stable address (never copied into the graph), as `FunctionOptions::static_inputs`.
  std::vector<std::size_t> static_inputs;
};

/// The outputs of one call of an autograd function. Each output is held by a lease on its pool
/// memory; `operator[]` hands out a tensor over that memory which carries the backward's grad_fn
/// (when the call recorded one). The tensors are valid while this object lives and no new step
/// reclaimed them (as `Outputs`): keep it until the backward has run and you are done with the
/// values, or `take()` a copy. A tensor copied out of it and used after its memory was reclaimed
/// raises a `c10::Error` naming the function (cgt's escape poisoning). A later autograd function
/// that received an output as input holds the output's lease itself until its backward ran.
class AutogradOutputs {
 public:
  AutogradOutputs() = default;
  AutogradOutputs(AutogradOutputs&&) noexcept = default;
  AutogradOutputs& operator=(AutogradOutputs&&) noexcept = default;
  AutogradOutputs(const AutogradOutputs&) = delete;
  AutogradOutputs& operator=(const AutogradOutputs&) = delete;
  /// The tensors go first, so that dropping the bundle leaves no copy of them behind.
  ~AutogradOutputs() {
    tensors_.clear();
    leases_.clear();
  }

  [[nodiscard]] std::size_t size() const noexcept { return tensors_.size(); }
  /// What the pool did for the forward (or inference) call: warm-up, recording, replay, eager.
  [[nodiscard]] CallKind kind() const noexcept { return kind_; }
  /// True when the outputs carry a grad_fn (the forward ran, not the inference function).
  [[nodiscard]] bool has_backward() const noexcept { return has_backward_; }
  /// Output `i` (an undefined tensor for `i >= size()`), borrowed: valid while this bundle lives.
  [[nodiscard]] const at::Tensor& operator[](std::size_t i) const& [[clang::lifetimebound]] {
    static const at::Tensor none;
    return i < tensors_.size() ? tensors_[i] : none;
  }
  const at::Tensor& operator[](std::size_t i) const&& = delete;
  /// All outputs, borrowed like `operator[]`.
  [[nodiscard]] const std::vector<at::Tensor>& tensors() const& [[clang::lifetimebound]] { return tensors_; }
  const std::vector<at::Tensor>& tensors() const&& = delete;
  /// Output `i` copied out of the pool (no grad_fn), yours to keep; fails like `OutputLease::take`.
  [[nodiscard]] Result<at::Tensor> take(std::size_t i) const;

 private:
  friend class AutogradFunction;
  std::vector<std::shared_ptr<OutputLease>> leases_;  ///< shared with the nodes of later functions
  std::vector<at::Tensor> tensors_;
  CallKind kind_ = CallKind::eager;
  bool has_backward_ = false;
};

/// A callable over tensors registered with a pool as an inference, a forward and a backward
/// function (see the top of this file). Made by `make_autograd_function`. Copies share the same
/// pool functions; the backward nodes of its outputs keep what they need alive.
class AutogradFunction {
 public:
  /// Calls the function on `inputs` (defined CUDA tensors, by position, as the callable takes
  /// them): the forward when a backward may follow, the inference function otherwise. Fails as
  /// `Function::operator()` does, and with `invalid_argument` for an undefined input, more than
  /// 62 inputs or outputs, or an empty (moved-from) handle.
  [[nodiscard]] Result<AutogradOutputs> operator()(const std::vector<at::Tensor>& inputs) const;

  [[nodiscard]] std::string_view name() const noexcept;
  /// The three pool functions, for introspection (their names, their ids in the tree); only on a
  /// handle that is not empty (moved from).
  [[nodiscard]] const Function& inference_function() const;
  [[nodiscard]] const Function& forward_function() const;
  [[nodiscard]] const Function& backward_function() const;

  struct State;  // defined in src/torch/autograd.cpp

 private:
  friend Result<AutogradFunction> make_autograd_function(Pool& pool, Callable fn, AutogradOptions options);
  explicit AutogradFunction(std::shared_ptr<State> state) noexcept : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

/// Registers `fn` with `pool` as an autograd function. `fn` is called by all three pool functions
/// (from the thread that calls the function, and from libtorch's autograd thread for the
/// backward): it must compute the same thing each time from its inputs and parameters, and must
/// not call functions of the pool itself. Fails with `invalid_argument` for an undefined or
/// non-leaf parameter, `pool_shut_down`, or as `Pool::add_function`.
[[nodiscard]] Result<AutogradFunction> make_autograd_function(Pool& pool, Callable fn, AutogradOptions options = {});

}  // namespace cgt::torch
