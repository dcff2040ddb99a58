// Autograd functions: a forward pool function whose outputs carry a node that runs a backward
// pool function (the forward recomputed under grad mode, then torch::autograd::grad, in one graph).
//
// Why the backward recomputes the forward: libtorch gives no way to list an autograd graph's
// saved tensors, and pool memory that only a kept autograd graph held would be invisible to the
// engine (a checkpoint restore would free it under that graph). Recomputing keeps the whole
// autograd graph inside one call of the backward function: its temporaries are the call's, and the
// only thing that lives from the forward to the backward is the forward's inputs, held by leases.
module;
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;

namespace cgt::torch {

namespace {

// Bit masks (which inputs need a gradient, which outputs get one) travel as scalar arguments of
// the backward call: part of its shape key, so each combination has its own graph.
constexpr std::size_t max_positions = 62;

[[nodiscard]] std::string in_quotes(std::string_view name) {
  return "'" + std::string(name) + "'";
}

[[nodiscard]] bool bit(std::int64_t mask, std::size_t i) {
  return ((static_cast<std::uint64_t>(mask) >> i) & 1U) != 0;
}

/// The default CUDA generator's philox offset: where the next random draw starts.
std::uint64_t rng_offset(std::int16_t device) {
  // A handle (mutex() is not const on a const one).
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(device));
  const std::lock_guard lock(generator.mutex());
  return generator.get<at::CUDAGeneratorImpl>()->philox_offset_per_thread();
}

void set_rng_offset(std::int16_t device, std::uint64_t offset) {
  // A handle (mutex() is not const on a const one).
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(static_cast<c10::DeviceIndex>(device));
  const std::lock_guard lock(generator.mutex());
  generator.get<at::CUDAGeneratorImpl>()->set_philox_offset_per_thread(offset);
}

/// Sets the generator's offset for the lifetime of the object and puts the old one back.
class RngOffsetScope {
 public:
  RngOffsetScope(std::int16_t device, std::uint64_t offset) : device_(device), saved_(rng_offset(device)) {
    set_rng_offset(device, offset);
  }
  ~RngOffsetScope() {
    try {
      set_rng_offset(device_, saved_);
    } catch (...) {  // NOLINT(bugprone-empty-catch): a destructor must not throw; the offset stays
    }
  }
  RngOffsetScope(const RngOffsetScope&) = delete;
  RngOffsetScope& operator=(const RngOffsetScope&) = delete;

 private:
  std::int16_t device_;
  std::uint64_t saved_;
};

[[nodiscard]] bool aliases_any(const at::Tensor& tensor, const Inputs& in) {
  const void* storage = tensor.storage().data_ptr().get();
  for (std::size_t j = 0; j < in.size(); ++j) {
    if (in[j].defined() && in[j].has_storage() && in[j].storage().data_ptr().get() == storage) return true;
  }
  return false;
}

std::vector<Arg> args_of(std::span<const at::Tensor> values) {
  return {values.begin(), values.end()};
}

}  // namespace

/// What every call of one autograd function shares, and what its nodes keep alive. Made by
/// make_autograd_function once its pool functions are registered, so that it always holds all
/// three (a Function has no empty state).
struct AutogradState {
  /// The parameters that receive gradients, and their gradient buffers (outside the pool): the
  /// `.grad()` a parameter had when the function was made (an optimizer's static gradient, so
  /// that the backward graph accumulates into it with no copy: `adopted`), otherwise buffers made
  /// here, views of one flat tensor where the dtypes allow (zeroed in one launch). Made once, by
  /// make_gradients.
  struct Gradients {
    std::vector<at::Tensor> parameters;
    std::vector<at::Tensor> buffers;
    std::vector<bool> adopted;
    std::vector<bool> in_flat;
    at::Tensor flat;
    /// Per made buffer: the tensor handed out as the parameter's `.grad()`, a TensorImpl of its
    /// own over the buffer's memory (the graph writes the buffer's address, so the buffer itself
    /// can never move). Because it is its own impl, a `.grad()` the program kept after dropping it
    /// can be moved onto a copy before the buffer is zeroed, as eager's kept `.grad()` keeps its
    /// values. Set by publish, reset when moved away by prepare or prepare_out_of_place;
    /// undefined for adopted buffers, which are handed out as themselves (the optimizer that owns
    /// one reads it).
    std::vector<at::Tensor> handed_out;
    /// Per buffer that was its parameter's `.grad()` when a create_graph backward began: its
    /// values, which the backward graph overwrites. Set by prepare_out_of_place, put back and
    /// cleared by restore_values_before; empty between backwards.
    std::vector<at::Tensor> values_before;

    /// Before a backward: a buffer that is not its parameter's `.grad()` holds nothing of it, and
    /// is zeroed, since the backward graph accumulates into it.
    void prepare() {
      std::vector<std::size_t> stale;
      bool whole_flat_stale = flat.defined();
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        if (!is_buffer(parameters[i].grad(), i)) {
          stale.push_back(i);
        } else if (in_flat[i]) {
          whole_flat_stale = false;
        }
      }
      for (const std::size_t i : stale) release_kept_gradient(i);
      if (whole_flat_stale) flat.zero_();
      for (const std::size_t i : stale) {
        if (!whole_flat_stale || !in_flat[i]) buffers[i].zero_();
      }
    }

    /// After a backward: the buffer becomes `.grad()` where there is none (eager's AccumulateGrad
    /// steals the first gradient), or is added to a `.grad()` the program set itself.
    void publish() {
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        at::Tensor& grad = parameters[i].mutable_grad();
        if (!grad.defined()) {
          grad = hand_out(i);
        } else if (!is_buffer(grad, i)) {
          const at::NoGradGuard no_grad;
          grad.add_(buffers[i]);
        }
      }
    }

    /// Before a backward under create_graph. Eager's AccumulateGrad then never writes a `.grad()`
    /// in place: it sets `.grad()` to a new tensor, old + new (or a copy of new), and the old one
    /// keeps its values. So the graph must give this backward's gradients alone: every buffer is
    /// zeroed, and one that is its parameter's `.grad()` has its values kept in `values_before` first (the
    /// graph writes the buffer's address, and an adopted buffer, the optimizer's own tensor,
    /// cannot move onto a copy). REQUIRES: publish_out_of_place or restore_values_before follows.
    void prepare_out_of_place() {
      const at::NoGradGuard no_grad;
      values_before.assign(parameters.size(), at::Tensor());
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        if (is_buffer(parameters[i].grad(), i)) {
          values_before[i] = buffers[i].clone();
        } else {
          release_kept_gradient(i);
        }
      }
      if (flat.defined()) flat.zero_();
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        if (!in_flat[i]) buffers[i].zero_();
      }
    }

    /// After a backward under create_graph (grad mode on): each `.grad()` becomes a new tensor,
    /// old + gradient where it was defined, the gradient (a copy of the buffer) otherwise, as
    /// eager's (accumulate_grad.h, "Case 3" and "Case 1.5"); the gradients carry `history` as
    /// their grad_fn where it is not null. The buffers get back the values of the `.grad()` they
    /// were, so that old tensor is left as it was.
    void publish_out_of_place(const std::shared_ptr<::torch::autograd::Node>& history) {
      std::vector<at::Tensor> gradients(parameters.size());
      {
        const at::NoGradGuard no_grad;
        for (std::size_t i = 0; i < parameters.size(); ++i) gradients[i] = buffers[i].clone();
      }
      restore_values_before();
      for (std::size_t i = 0; i < parameters.size(); ++i) {
        if (history) ::torch::autograd::set_history(gradients[i], history);
        at::Tensor& grad = parameters[i].mutable_grad();
        grad = grad.defined() ? grad + gradients[i] : std::move(gradients[i]);
      }
    }

    /// Puts back the values prepare_out_of_place kept (after the backward, or when it failed).
    void restore_values_before() {
      const at::NoGradGuard no_grad;
      for (std::size_t i = 0; i < values_before.size(); ++i) {
        if (values_before[i].defined()) buffers[i].copy_(values_before[i]);
      }
      values_before.clear();
    }

    [[nodiscard]] bool is_buffer(const at::Tensor& grad, std::size_t i) const {
      return grad.defined() && grad.data_ptr() == buffers[i].data_ptr() && grad.sizes() == buffers[i].sizes() &&
             grad.strides() == buffers[i].strides();
    }

   private:
    /// The tensor that becomes parameter `i`'s `.grad()`: reused while only this state holds it,
    /// so the common loop (set to none, backward) makes no tensor and copies nothing.
    at::Tensor hand_out(std::size_t i) {
      if (adopted[i]) return buffers[i];
      at::Tensor& tensor = handed_out[i];
      if (!tensor.defined()) {
        const at::Tensor& buffer = buffers[i];
        tensor = at::empty({0}, buffer.options());
        tensor.set_(buffer.storage(), buffer.storage_offset(), buffer.sizes(), buffer.strides());
      }
      return tensor;
    }

    /// REQUIRES: buffer `i` is about to be zeroed (it is not the parameter's `.grad()`). A
    /// handed-out tensor that someone besides this state still holds moves onto a copy of its
    /// values.
    void release_kept_gradient(std::size_t i) {
      at::Tensor& tensor = handed_out[i];
      if (!tensor.defined() || tensor.use_count() == 1) return;
      const at::NoGradGuard no_grad;
      tensor.set_(tensor.clone());
      tensor = at::Tensor();
    }
  };

  std::string name;
  std::int16_t device = 0;
  std::shared_ptr<Callable> fn;
  Function inference;
  Function forward;
  Function backward;
  Gradients gradients;
  /// The stream the backward's body runs on (the pool's: warm-ups and captures run there), set by
  /// the body when it runs. The parameters' grad accumulators a second-order guard makes are made
  /// on it: an accumulator kept alive from another stream would make the next recording's
  /// gradients wait on that stream (autograd orders a leaf's gradient on its accumulator's
  /// stream), and a capture cannot wait on the legacy stream.
  std::shared_ptr<std::optional<c10::cuda::CUDAStream>> backward_stream =
      std::make_shared<std::optional<c10::cuda::CUDAStream>>();
};

namespace {

/// One input of a forward as its backward reads it: an output of an earlier autograd function
/// held by that output's lease, or any other tensor held by itself; and the caller's tensor's
/// version counter with its value at the forward, since the backward recomputes the forward from
/// what the memory holds then (eager's SavedVariable check).
struct SavedInput {
  std::shared_ptr<OutputLease> lease;
  at::Tensor tensor;
  c10::VariableVersion version;  ///< disabled for an inference tensor, which has none
  std::uint32_t saved_version = 0;
};

/// The grad_fn of an autograd function's outputs.
class GraphedBackward final : public ::torch::autograd::Node {
 public:
  GraphedBackward(std::shared_ptr<AutogradState> state, ::torch::autograd::edge_list&& edges)
      : Node(std::move(edges)), state_(std::move(state)) {}

  [[nodiscard]] std::string name() const override { return "cgt::GraphedBackward(" + state_->name + ")"; }

  void release_variables() override {
    const std::lock_guard lock(mutex_);
    drop_saved();
    released_ = true;
  }

  ::torch::autograd::variable_list apply(::torch::autograd::variable_list&& grads) override;

  /// Raises eager's error when an input was modified in place since the forward.
  void check_inputs_unmodified() const;

  /// Under create_graph: the grad_fn to give the gradients this node returns (and the parameters'
  /// new gradients), which raises a `c10::Error` naming the function when a backward reaches it;
  /// null where nothing they depend on requires grad (they stay plain). Eager's gradients would
  /// have history through the incoming gradients that require grad (`incoming_history`, their
  /// edges), the forward's inputs and the parameters, so the node's edges are theirs: a
  /// second-order backward that would need this function's terms (`grad` of a gradient with
  /// respect to an input or a parameter, a backward of a loss that adds a gradient penalty)
  /// reaches it and raises, rather than leaving them out. As with torch.compile's compiled
  /// backward, every gradient gets it, even one eager gives without history (that of `x + 2`).
  [[nodiscard]] std::shared_ptr<::torch::autograd::Node> second_order_guard(
      ::torch::autograd::edge_list&& incoming_history) const;

  /// The lease of output `i`, where the bundle or a later node still holds it.
  [[nodiscard]] std::shared_ptr<OutputLease> lease_of(std::size_t i) const {
    return i < output_leases_.size() ? output_leases_[i].lock() : nullptr;
  }

  ~GraphedBackward() override { drop_saved(); }
  GraphedBackward(const GraphedBackward&) = delete;
  GraphedBackward& operator=(const GraphedBackward&) = delete;
  GraphedBackward(GraphedBackward&&) = delete;
  GraphedBackward& operator=(GraphedBackward&&) = delete;

  std::vector<SavedInput> saved;
  std::vector<std::weak_ptr<OutputLease>> output_leases_;
  std::uint64_t rng_offset = 0;
  std::int64_t input_mask = 0;   ///< inputs that need a gradient
  std::int64_t output_mask = 0;  ///< outputs that have a grad_fn (and so receive a gradient)

 private:
  // Tensors before leases: a tensor over a lease's memory must not outlive it (it would count as
  // an escaped copy and be poisoned).
  void drop_saved() {
    for (SavedInput& input : saved) input.tensor = at::Tensor();
    saved.clear();
  }

  std::shared_ptr<AutogradState> state_;
  std::mutex mutex_;
  bool released_ = false;
};

/// A gradient in pool memory handed to autograd: its storage owns the lease, so the memory stays
/// live while autograd uses the tensor (and is passed on as a pool input to the next backward).
at::Tensor owning_tensor(const at::Tensor& value, std::shared_ptr<OutputLease> lease) {
  return at::from_blob(
      value.data_ptr(), value.sizes(), value.strides(), [lease = std::move(lease)](void*) mutable { lease.reset(); },
      value.options());
}

[[noreturn]] void raise(const std::string& what, const Error& error) {
  TORCH_CHECK(false, what, ": ", error.message);
}

void GraphedBackward::check_inputs_unmodified() const {
  for (std::size_t i = 0; i < saved.size(); ++i) {
    const SavedInput& input = saved[i];
    if (!input.version.enabled() || input.version.current_version() == input.saved_version) continue;
    std::string what = "a tensor";
    if (input.tensor.defined()) {
      what = input.tensor.toString() + " " + c10::str(input.tensor.sizes());
    } else if (auto value = input.lease->get(); value && value->get().defined()) {
      what = value->get().toString() + " " + c10::str(value->get().sizes());
    }
    TORCH_CHECK(false,
                "one of the variables needed for gradient computation has been modified by an inplace operation: [",
                what, "], which is input ", i, " of cgt autograd function \"", state_->name, "\", is at version ",
                input.version.current_version(), "; expected version ", input.saved_version,
                " instead. Its backward recomputes the function from its inputs: modify a copy (clone()) of the "
                "input, or modify it after the backward.");
  }
}

/// Whether the running backward accumulates into the parameters' `.grad()`. A plain `backward()`
/// does (autograd's exec info is empty: every node runs); `torch::autograd::grad` never does, and
/// `backward(inputs=...)` does only into the leaves it names. The backward graph treats the
/// parameters as one, so naming some of them, or asking `grad` for one, is refused rather than
/// answered wrongly.
bool parameters_wanted(const AutogradState& state) {
  const auto* exec_info = ::torch::autograd::get_current_graph_task_exec_info();
  if (exec_info == nullptr || exec_info->empty()) return true;
  // The leaves asked for are AccumulateGrad nodes of the task (no edge of this node leads to a
  // parameter, so they are found by the variable they accumulate into, not by the graph). A leaf
  // with no accumulator yet, as a parameter only this function reads has, autograd replaces by an
  // Identity placeholder that says nothing of the leaf: it may be one of the parameters, which
  // this backward cannot then answer for (eager would), so it is refused rather than left out.
  std::size_t named = 0;
  for (const auto& [node, info] : *exec_info) {
    const bool asked = info.needed_ || info.captures_;
    TORCH_CHECK(!asked || dynamic_cast<const ::torch::autograd::Identity*>(node) == nullptr,
                "a backward through cgt autograd function \"", state.name,
                "\" was asked for the gradient of a leaf autograd cannot reach (backward(inputs=...) or "
                "torch::autograd::grad naming a tensor without a grad accumulator): if it is one of the "
                "function's parameters, its backward graph cannot give it there; call backward() without "
                "inputs and read .grad(), or differentiate that part eagerly (outside cgt)");
    const auto* accumulate = dynamic_cast<const ::torch::autograd::AccumulateGrad*>(node);
    if (accumulate == nullptr) continue;
    const bool is_parameter =
        std::ranges::any_of(state.gradients.parameters, [accumulate](const at::Tensor& parameter) {
          return parameter.unsafeGetTensorImpl() == accumulate->variable.unsafeGetTensorImpl();
        });
    if (!is_parameter) continue;
    TORCH_CHECK(!info.captures_, "torch::autograd::grad with respect to a parameter of cgt autograd function \"",
                state.name,
                "\" is not supported: its backward graph adds the parameters' gradients to their .grad(); call "
                "backward() and read .grad(), or differentiate that part eagerly (outside cgt)");
    if (info.needed_) ++named;
  }
  TORCH_CHECK(named == 0 || named == state.gradients.parameters.size(), "backward(inputs=...) names ", named,
              " of the ", state.gradients.parameters.size(), " parameters of cgt autograd function \"", state.name,
              "\": its backward graph fills all of their .grad() or none; name all of them or none");
  return named != 0;
}

::torch::autograd::variable_list GraphedBackward::apply(::torch::autograd::variable_list&& grads) {
  const std::lock_guard lock(mutex_);
  TORCH_CHECK(!released_, ::torch::autograd::ERR_BACKWARD_TWICE, " (in the backward of cgt autograd function \"",
              state_->name, "\")");
  AutogradState& state = *state_;
  // The engine runs a create_graph backward's nodes under grad mode (and others without it).
  const bool create_graph = at::GradMode::is_enabled();
  check_inputs_unmodified();
  const bool with_parameters = parameters_wanted(state);
  // Arguments: the forward's inputs, the gradients of the outputs that have a grad_fn (zeros for
  // one autograd did not reach), then the input count, the two masks and whether the parameters
  // receive gradients. The graph takes values: an incoming gradient's history stays out of it,
  // kept as an edge of the second-order guard.
  std::vector<at::Tensor> values;
  std::vector<Arg> args;
  ::torch::autograd::edge_list incoming_history;
  values.reserve(grads.size());
  args.reserve(saved.size() + grads.size() + 4);
  for (const SavedInput& input : saved) {
    if (input.lease) {
      args.emplace_back(*input.lease);
    } else {
      args.emplace_back(input.tensor);
    }
  }
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (!bit(output_mask, i)) continue;
    if (!grads[i].defined()) {
      values.push_back(input_metadata(i).zeros_like());
    } else if (grads[i].requires_grad()) {
      incoming_history.push_back(::torch::autograd::impl::gradient_edge(grads[i]));
      values.push_back(grads[i].detach());
    } else {
      values.push_back(std::move(grads[i]));
    }
  }
  for (const at::Tensor& value : values) args.emplace_back(value);
  args.emplace_back(static_cast<std::int64_t>(saved.size()));
  args.emplace_back(input_mask);
  args.emplace_back(output_mask);
  args.emplace_back(std::int64_t{with_parameters ? 1 : 0});

  if (with_parameters) {
    if (create_graph) {
      state.gradients.prepare_out_of_place();
    } else {
      state.gradients.prepare();
    }
  }
  auto out = [&] {
    const RngOffsetScope rng(state.device, rng_offset);
    // Grad mode off, as in any backward: a create_graph backward replays the same graph.
    const at::NoGradGuard no_grad;
    return state.backward(std::span<const Arg>(args));
  }();
  if (!out) {
    if (with_parameters && create_graph) state.gradients.restore_values_before();
    raise("cgt autograd function \"" + state.name + "\": the backward failed", out.error());
  }
  const std::shared_ptr<::torch::autograd::Node> history =
      create_graph ? second_order_guard(std::move(incoming_history)) : nullptr;
  if (with_parameters) {
    if (create_graph) {
      state.gradients.publish_out_of_place(history);
    } else {
      state.gradients.publish();
    }
  }

  ::torch::autograd::variable_list result(num_outputs());
  for (std::size_t i = 0; i < result.size() && i < out->size(); ++i) {
    if (!bit(input_mask, i)) continue;
    auto lease = out->release(i);
    if (!lease) raise("cgt autograd function \"" + state.name + "\": reading a gradient", lease.error());
    auto value = lease->get();
    if (!value) continue;  // an input the outputs do not depend on: no gradient
    const at::Tensor& gradient = value->get();
    if (!gradient.defined()) continue;
    // A leaf's .grad() must not live in the pool: AccumulateGrad gets a copy.
    if (dynamic_cast<::torch::autograd::AccumulateGrad*>(next_edge(i).function.get()) != nullptr) {
      auto copy = lease->take();
      if (!copy) raise("cgt autograd function \"" + state.name + "\": copying a gradient", copy.error());
      result[i] = std::move(*copy);
    } else {
      result[i] = owning_tensor(gradient, std::make_shared<OutputLease>(std::move(*lease)));
    }
    if (history) ::torch::autograd::set_history(result[i], history);
  }
  return result;
}

std::shared_ptr<::torch::autograd::Node> GraphedBackward::second_order_guard(
    ::torch::autograd::edge_list&& incoming_history) const {
  ::torch::autograd::edge_list edges = std::move(incoming_history);
  for (std::size_t i = 0; i < num_outputs(); ++i) {
    if (bit(input_mask, i) && next_edge(i).is_valid()) edges.push_back(next_edge(i));
  }
  {
    std::optional<c10::cuda::CUDAStreamGuard> on_backward_stream;
    if (const std::optional<c10::cuda::CUDAStream>& stream = *state_->backward_stream)
      on_backward_stream.emplace(*stream);
    for (const at::Tensor& parameter : state_->gradients.parameters) {
      if (parameter.requires_grad()) edges.push_back(::torch::autograd::impl::gradient_edge(parameter));
    }
  }
  if (edges.empty()) return nullptr;
  // libtorch's Error node, the grad_fn DelayedError gives once_differentiable's outputs, but with
  // these edges rather than fresh leaves: a backward is only sure to reach it when it leads to
  // what the gradients depend on.
  return {new ::torch::autograd::Error(
              "cgt autograd function \"" + state_->name +
                  "\" gives first-order gradients only: differentiating its gradients again (a second "
                  "derivative) is not supported; its backward graph computes them as values, without the history "
                  "a second derivative needs. Use the gradients of a create_graph backward as values, or "
                  "differentiate twice through an eager model (run that part outside cgt)",
              std::move(edges)),
          ::torch::autograd::deleteNode};
}

/// The lease of `input` when it is an output of an autograd function of any pool (found through its
/// grad_fn), so that a backward can hold it; null otherwise.
std::shared_ptr<OutputLease> lease_behind(const at::Tensor& input) {
  const auto* producer = dynamic_cast<const GraphedBackward*>(input.grad_fn().get());
  if (producer == nullptr) return nullptr;
  auto lease = producer->lease_of(input.output_nr());
  if (!lease) return nullptr;
  auto value = lease->get();
  if (!value || !value->get().defined() || !value->get().has_storage() ||
      value->get().storage().data_ptr().get() != input.storage().data_ptr().get() ||
      value->get().data_ptr() != input.data_ptr() || value->get().sizes() != input.sizes() ||
      value->get().strides() != input.strides()) {
    return nullptr;
  }
  return lease;
}

}  // namespace

Result<at::Tensor> AutogradOutputs::take(std::size_t i) const {
  if (i >= leases_.size()) {
    return fail(Errc::invalid_argument, "output index " + std::to_string(i) + " is out of range: the bundle holds " +
                                            std::to_string(leases_.size()) + " outputs");
  }
  if (!leases_[i]) return at::Tensor();
  return leases_[i]->take();
}

std::string_view AutogradFunction::name() const noexcept {
  return state_ ? std::string_view(state_->name) : std::string_view();
}
const Function& AutogradFunction::inference_function() const {
  return state_->inference;
}
const Function& AutogradFunction::forward_function() const {
  return state_->forward;
}
const Function& AutogradFunction::backward_function() const {
  return state_->backward;
}

Result<AutogradOutputs> AutogradFunction::operator()(const std::vector<at::Tensor>& inputs) const {
  if (!state_) return fail(Errc::invalid_argument, "call of an empty AutogradFunction handle (moved from)");
  const AutogradState& state = *state_;
  if (inputs.size() > max_positions) {
    return fail(Errc::invalid_argument, in_quotes(state.name) + " takes at most " + std::to_string(max_positions) +
                                            " inputs; it was given " + std::to_string(inputs.size()));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      return fail(Errc::invalid_argument,
                  "input " + std::to_string(i) + " of " + in_quotes(state.name) + " is undefined");
    }
  }
  bool any_requires_grad = false;
  for (const at::Tensor& input : inputs) any_requires_grad = any_requires_grad || input.requires_grad();
  for (const at::Tensor& parameter : state.gradients.parameters)
    any_requires_grad = any_requires_grad || parameter.requires_grad();
  const bool records_backward = at::GradMode::is_enabled() && !c10::InferenceMode::is_enabled() && any_requires_grad;

  // The pool functions see plain tensors: no autograd history of the caller's graph.
  std::vector<at::Tensor> plain;
  plain.reserve(inputs.size());
  for (const at::Tensor& input : inputs) plain.push_back(input.detach());
  const std::vector<Arg> args = args_of(plain);

  AutogradOutputs result;
  if (!records_backward) {
    auto out = state.inference(std::span<const Arg>(args));
    if (!out) return std::unexpected(std::move(out.error()));
    result.kind_ = out->kind();
    for (std::size_t i = 0; i < out->size(); ++i) {
      auto lease = out->release(i);
      if (!lease) return std::unexpected(std::move(lease.error()));
      auto shared = std::make_shared<OutputLease>(std::move(*lease));
      auto value = shared->get();
      result.tensors_.push_back(value && value->get().defined() ? value->get().detach() : at::Tensor());
      result.leases_.push_back(std::move(shared));
    }
    return result;
  }

  const std::uint64_t offset = rng_offset(state.device);
  auto out = state.forward(std::span<const Arg>(args));
  if (!out) return std::unexpected(std::move(out.error()));
  if (out->size() > max_positions) {
    return fail(Errc::invalid_argument, in_quotes(state.name) + " returns at most " + std::to_string(max_positions) +
                                            " outputs; it returned " + std::to_string(out->size()));
  }
  result.kind_ = out->kind();
  result.has_backward_ = true;

  ::torch::autograd::edge_list edges;
  edges.reserve(inputs.size());
  std::int64_t input_mask = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].requires_grad()) {
      edges.push_back(::torch::autograd::impl::gradient_edge(inputs[i]));
      input_mask |= std::int64_t{1} << i;
    } else {
      edges.emplace_back();
    }
  }
  auto node =
      std::shared_ptr<GraphedBackward>(new GraphedBackward(state_, std::move(edges)), ::torch::autograd::deleteNode);
  node->rng_offset = offset;
  node->input_mask = input_mask;
  node->saved.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto lease = lease_behind(inputs[i]);
    SavedInput& input = node->saved.emplace_back();
    if (lease) {
      input.lease = std::move(lease);
    } else {
      input.tensor = plain[i];
    }
    if (!inputs[i].is_inference()) {
      input.version = ::torch::autograd::impl::version_counter(inputs[i]);
      input.saved_version = input.version.current_version();
    }
  }

  for (std::size_t i = 0; i < out->size(); ++i) {
    auto lease = out->release(i);
    if (!lease) return std::unexpected(std::move(lease.error()));
    auto shared = std::make_shared<OutputLease>(std::move(*lease));
    auto value = shared->get();
    at::Tensor tensor = value && value->get().defined() ? value->get().detach() : at::Tensor();
    if (tensor.defined() && (at::isFloatingType(tensor.scalar_type()) || at::isComplexType(tensor.scalar_type()))) {
      ::torch::autograd::set_history(tensor, node);
      node->output_mask |= std::int64_t{1} << i;
    } else {
      node->add_input_metadata(::torch::autograd::Node::undefined_input());
    }
    node->output_leases_.push_back(shared);
    result.tensors_.push_back(std::move(tensor));
    result.leases_.push_back(std::move(shared));
  }
  return result;
}

namespace {

using Gradients = AutogradState::Gradients;

/// Those of `parameters` that receive gradients: the ones that require one. Fails with
/// `invalid_argument` for one that is undefined or not a leaf.
Result<std::vector<at::Tensor>> trained_parameters(const std::vector<at::Tensor>& parameters, std::string_view name) {
  std::vector<at::Tensor> trained;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& parameter = parameters[i];
    if (!parameter.defined() || !parameter.is_leaf()) {
      return fail(Errc::invalid_argument, "parameter " + std::to_string(i) + " of " + in_quotes(name) + " is " +
                                              (parameter.defined() ? "not a leaf" : "undefined") +
                                              ": parameters are the leaves whose .grad() the backward fills");
    }
    if (parameter.requires_grad()) trained.push_back(parameter);
  }
  return trained;
}

/// Whether the `.grad()` of `parameter` can be its gradient buffer: outside the pool, with the
/// parameter's dtype and sizes, and a dense layout.
bool adoptable(const at::Tensor& parameter, const Device& pool_device) {
  const at::Tensor& grad = parameter.grad();
  return grad.defined() && !grad.requires_grad() && grad.device() == parameter.device() &&
         grad.scalar_type() == parameter.scalar_type() && grad.sizes() == parameter.sizes() &&
         grad.is_non_overlapping_and_dense() && !pool_device.contains(backend::address_of(grad.data_ptr()));
}

/// Whether the buffers `to_make` can all be views of one flat tensor: there is one, and they all
/// have the first one's dtype and device.
bool fit_one_tensor(const std::vector<at::Tensor>& parameters, const std::vector<std::size_t>& to_make) {
  if (to_make.empty()) return false;
  const at::Tensor& first = parameters[to_make.front()];
  return std::ranges::all_of(to_make, [&](std::size_t i) {
    return parameters[i].scalar_type() == first.scalar_type() && parameters[i].device() == first.device();
  });
}

/// Makes the buffers `to_make` over one flat tensor of zeros, in the parameters' order.
void make_flat_buffers(Gradients& gradients, const std::vector<std::size_t>& to_make) {
  const std::vector<at::Tensor>& parameters = gradients.parameters;
  std::int64_t total = 0;
  for (const std::size_t i : to_make) total += parameters[i].numel();
  gradients.flat = at::zeros({total}, parameters[to_make.front()].options().requires_grad(false));
  std::int64_t offset = 0;
  for (const std::size_t i : to_make) {
    const at::Tensor& parameter = parameters[i];
    // A tensor over the flat storage, not an autograd view of it: optimizers' zero_grad()
    // detach_()es a .grad(), which libtorch refuses for a view.
    at::Tensor buffer = at::empty({0}, gradients.flat.options());
    buffer.set_(gradients.flat.storage(), offset, parameter.sizes(), c10::contiguous_strides(parameter.sizes()));
    gradients.buffers[i] = std::move(buffer);
    gradients.in_flat[i] = true;
    offset += parameter.numel();
  }
}

/// The gradient buffers of `parameters` (see AutogradState::Gradients): a `.grad()` the parameter has is
/// adopted where it can be (`adoptable`); the others are made here, zero, outside the pool.
/// Throws what libtorch throws.
Gradients make_gradients(std::vector<at::Tensor> parameters, const Device& pool_device) {
  const at::NoGradGuard no_grad;
  Gradients gradients;
  gradients.parameters = std::move(parameters);
  const std::size_t count = gradients.parameters.size();
  gradients.buffers.resize(count);
  gradients.adopted.assign(count, false);
  gradients.in_flat.assign(count, false);
  gradients.handed_out.resize(count);
  std::vector<std::size_t> to_make;
  for (std::size_t i = 0; i < count; ++i) {
    const at::Tensor& parameter = gradients.parameters[i];
    if (adoptable(parameter, pool_device)) {
      gradients.buffers[i] = parameter.grad();
      gradients.adopted[i] = true;
    } else {
      to_make.push_back(i);
    }
  }
  if (fit_one_tensor(gradients.parameters, to_make)) {
    make_flat_buffers(gradients, to_make);
  } else {
    for (const std::size_t i : to_make) {
      const at::Tensor& parameter = gradients.parameters[i];
      gradients.buffers[i] = at::zeros(parameter.sizes(), parameter.options().requires_grad(false));
    }
  }
  return gradients;
}

/// The body of the backward pool function: `fn`, the forward, again under grad mode, then its
/// gradients, in one call. Arguments: the n inputs, the outputs' gradients (for the outputs in the
/// output mask), n, the input mask, the output mask, and 1 where the gradients of `parameters` are
/// added to their `buffers` (0 for `torch::autograd::grad`: a graph of its own). Returns one
/// gradient per input (undefined where the mask says none).
Values recompute_gradients(Callable& fn, const std::vector<at::Tensor>& parameters,
                           const std::vector<at::Tensor>& buffers, const Inputs& in) {
  const std::size_t count = in.size();
  const auto n = static_cast<std::size_t>(in.scalar(count - 4));
  const std::int64_t input_mask = in.scalar(count - 3);
  const std::int64_t output_mask = in.scalar(count - 2);
  const bool with_parameters = in.scalar(count - 1) != 0;
  std::vector<at::Tensor> inputs(n);
  std::vector<at::Tensor> targets;
  for (std::size_t i = 0; i < n; ++i) {
    inputs[i] = in[i].detach();
    if (bit(input_mask, i)) {
      inputs[i].requires_grad_(true);
      targets.push_back(inputs[i]);
    }
  }
  if (with_parameters) targets.insert(targets.end(), parameters.begin(), parameters.end());
  Values outputs;
  {
    const at::AutoGradMode grad_mode(true);
    const std::vector<std::int64_t> no_scalars(n, 0);
    outputs = fn(Inputs(inputs, no_scalars));
  }
  std::vector<at::Tensor> differentiated;
  std::vector<at::Tensor> grad_outputs;
  std::size_t next = n;
  for (std::size_t j = 0; j < outputs.size(); ++j) {
    if (!bit(output_mask, j)) continue;
    const at::Tensor& grad = in[next++];
    if (!outputs[j].defined() || !outputs[j].requires_grad()) continue;  // constant: no gradient flows
    differentiated.push_back(outputs[j]);
    grad_outputs.push_back(grad);
  }
  Values result(n);
  if (differentiated.empty() || targets.empty()) return result;
  const auto grads = ::torch::autograd::grad(differentiated, targets, grad_outputs, /*retain_graph=*/false,
                                             /*create_graph=*/false, /*allow_unused=*/true);
  std::size_t next_grad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!bit(input_mask, i)) continue;
    result[i] = grads[next_grad++];
    // A gradient passed straight through (an addition's) is one of this call's inputs: an
    // output must be memory the call made.
    if (result[i].defined() && aliases_any(result[i], in)) result[i] = result[i].clone();
  }
  if (!with_parameters) return result;
  const at::NoGradGuard no_grad;
  for (std::size_t p = 0; p < parameters.size(); ++p, ++next_grad) {
    if (grads[next_grad].defined()) buffers[p].add_(grads[next_grad]);
  }
  return result;
}

}  // namespace

Result<AutogradFunction> make_autograd_function(Pool& pool, Callable fn, AutogradOptions options) {
  std::string name = std::move(options.name);
  auto device = pool.device();
  if (!device) return std::unexpected(std::move(device.error()));
  auto trained = trained_parameters(options.parameters, name);
  if (!trained) return std::unexpected(std::move(trained.error()));
  auto gradients = [&]() -> Result<Gradients> {
    try {
      return make_gradients(std::move(*trained), device->get());
    } catch (const std::exception& error) {
      return fail(Errc::backend_error,
                  std::string("allocating the gradient buffers of ") + in_quotes(name) + ": " + error.what());
    }
  }();
  if (!gradients) return std::unexpected(std::move(gradients.error()));

  const auto body = std::make_shared<Callable>(std::move(fn));
  auto add = [&](Callable callable, std::string_view suffix, FunctionMode mode) -> Result<Function> {
    return pool.add_function(
        std::move(callable),
        {.name = name + std::string(suffix), .static_inputs = options.static_inputs, .mode = mode});
  };
  auto no_grad = [body](Inputs in) {
    const at::NoGradGuard guard;
    return (*body)(in);
  };
  auto inference = add(no_grad, ".inference", FunctionMode::inference);
  if (!inference) return std::unexpected(std::move(inference.error()));
  auto forward = add(no_grad, ".forward", FunctionMode::forward);
  if (!forward) return std::unexpected(std::move(forward.error()));
  auto backward_stream = std::make_shared<std::optional<c10::cuda::CUDAStream>>();
  auto backward = add(
      [body, parameters = gradients->parameters, buffers = gradients->buffers, backward_stream](Inputs in) {
        *backward_stream = c10::cuda::getCurrentCUDAStream(
            static_cast<c10::DeviceIndex>(parameters.empty() ? -1 : parameters.front().get_device()));
        return recompute_gradients(*body, parameters, buffers, in);
      },
      ".backward", FunctionMode::backward);
  if (!backward) return std::unexpected(std::move(backward.error()));
  return AutogradFunction(
      std::make_shared<AutogradState>(AutogradState{.name = std::move(name),
                                                    .device = device->get().index(),
                                                    .fn = body,
                                                    .inference = std::move(*inference),
                                                    .forward = std::move(*forward),
                                                    .backward = std::move(*backward),
                                                    .gradients = std::move(*gradients),
                                                    .backward_stream = std::move(backward_stream)}));
}

}  // namespace cgt::torch
