// Models as pool functions: flattening a call's inputs into the pool function's arguments and
// rebuilding them inside it, flattening the model's output into tensors and rebuilding it for
// the caller, and calling the pool function.
module;
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <expected>
#include <functional>
#include <memory>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :model_runner;

namespace cgt::torch {

namespace {

// The call whose pool function runs on this thread (set by Model::operator() around the call):
// the runner rebuilds the model's inputs from its structure. Mutable and global to the unit: the
// pool calls the runner with the flat inputs only, so this is how the call's structure reaches it.
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): see above
thread_local const ModelCall* current_call = nullptr;

class CurrentCall {
 public:
  explicit CurrentCall(const ModelCall* call) noexcept : saved_(current_call) { current_call = call; }
  ~CurrentCall() { current_call = saved_; }
  CurrentCall(const CurrentCall&) = delete;
  CurrentCall& operator=(const CurrentCall&) = delete;

 private:
  const ModelCall* saved_;
};

void mix(std::uint64_t& hash, std::uint64_t value) noexcept {
  hash ^= value + 0x9e3779b97f4a7c15ULL + (hash << 6U) + (hash >> 2U);
}

std::uint64_t hash_of(const std::string& text) {
  return std::hash<std::string>{}(text);
}

std::string tag_of(const c10::IValue& value) {
  return value.tagKind();
}

std::string path_of(const std::string& parent, const c10::IValue& key) {
  std::ostringstream out;
  out << parent << '[' << key << ']';
  return out.str();
}

// ---- inputs -------------------------------------------------------------------------------------

struct InputFlattener {
  std::vector<Arg>& args;
  std::uint64_t hash = 0;

  // A dict key or constant: hashed by value; only kinds TorchScript allows there.
  Result<void> hash_constant(const c10::IValue& value, const std::string& path) {
    if (value.isNone()) {
      mix(hash, 1);
    } else if (value.isDouble()) {
      mix(hash, std::bit_cast<std::uint64_t>(value.toDouble()));
    } else if (value.isString()) {
      mix(hash, hash_of(value.toStringRef()));
    } else if (value.isInt()) {
      mix(hash, static_cast<std::uint64_t>(value.toInt()));
    } else if (value.isBool()) {
      mix(hash, value.toBool() ? 3 : 2);
    } else if (value.isDevice()) {
      mix(hash, hash_of(value.toDevice().str()));
    } else {
      return fail(Errc::invalid_argument, path + " is a " + tag_of(value) +
                                              ": a model's inputs are tensors, integers, bools, floats, strings, "
                                              "devices, None, and tuples, lists and dicts of them");
    }
    return {};
  }

  Result<InputNode> flatten(const c10::IValue& value, const std::string& path) {
    InputNode node;
    if (value.isTensor()) {
      node.kind = InputNode::Kind::tensor;
      mix(hash, 11);
      args.emplace_back(value.toTensor());
    } else if (value.isInt()) {
      node.kind = InputNode::Kind::integer;
      mix(hash, 12);
      args.emplace_back(value.toInt());
    } else if (value.isBool()) {
      node.kind = InputNode::Kind::boolean;
      mix(hash, 13);
      args.emplace_back(static_cast<std::int64_t>(value.toBool() ? 1 : 0));
    } else if (value.isTuple() || value.isList()) {
      const bool tuple = value.isTuple();
      node.kind = tuple ? InputNode::Kind::tuple : InputNode::Kind::list;
      const c10::ArrayRef<c10::IValue> elements = tuple ? value.toTupleRef().elements() : value.toListRef();
      mix(hash, tuple ? 14 : 15);
      mix(hash, elements.size());
      if (!tuple) {
        node.element_type = value.toList().elementType();
        mix(hash, hash_of(node.element_type->str()));
      }
      for (std::size_t i = 0; i < elements.size(); ++i) {
        auto child = flatten(elements[i], path + "[" + std::to_string(i) + "]");
        if (!child) return std::unexpected(std::move(child.error()));
        node.children.push_back(std::move(*child));
      }
    } else if (value.isGenericDict()) {
      node.kind = InputNode::Kind::dict;
      const c10::Dict<c10::IValue, c10::IValue> dict = value.toGenericDict();
      node.element_type = dict.keyType();
      node.value_type = dict.valueType();
      mix(hash, 16);
      mix(hash, dict.size());
      mix(hash, hash_of(node.element_type->str() + node.value_type->str()));
      for (const auto& entry : dict) {
        const std::string child_path = path_of(path, entry.key());
        if (auto hashed = hash_constant(entry.key(), child_path); !hashed) return std::unexpected(hashed.error());
        node.keys.push_back(entry.key());
        auto child = flatten(entry.value(), child_path);
        if (!child) return std::unexpected(std::move(child.error()));
        node.children.push_back(std::move(*child));
      }
    } else {
      node.kind = InputNode::Kind::constant;
      mix(hash, 17);
      if (auto hashed = hash_constant(value, path); !hashed) return std::unexpected(hashed.error());
      node.constant = value;
    }
    return node;
  }
};

// The model's argument `node`, from the pool function's inputs from `next` on.
c10::IValue rebuild_input(const InputNode& node, const Inputs& in, std::size_t& next) {
  switch (node.kind) {
    case InputNode::Kind::tensor: return in[next++];
    case InputNode::Kind::integer: return in.scalar(next++);
    case InputNode::Kind::boolean: return in.scalar(next++) != 0;
    case InputNode::Kind::constant: return node.constant;
    case InputNode::Kind::tuple: {
      std::vector<c10::IValue> elements;
      elements.reserve(node.children.size());
      for (const InputNode& child : node.children) elements.push_back(rebuild_input(child, in, next));
      return c10::ivalue::Tuple::create(std::move(elements));
    }
    case InputNode::Kind::list: {
      const c10::impl::GenericList list(node.element_type);
      list.reserve(node.children.size());
      for (const InputNode& child : node.children) list.push_back(rebuild_input(child, in, next));
      return list;
    }
    case InputNode::Kind::dict: {
      const c10::impl::GenericDict dict(node.element_type, node.value_type);
      dict.reserve(node.children.size());
      for (std::size_t i = 0; i < node.children.size(); ++i) {
        dict.insert(node.keys[i], rebuild_input(node.children[i], in, next));
      }
      return dict;
    }
  }
  return {};
}

// The signature a model is primed on: the call's structure, each tensor's type, sizes and
// strides, each scalar's value.
std::uint64_t signature_of(const Inputs& in, std::uint64_t structure_hash) {
  std::uint64_t hash = structure_hash;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const at::Tensor& tensor = in[i];
    if (!tensor.defined()) {
      mix(hash, static_cast<std::uint64_t>(in.scalar(i)));
      continue;
    }
    mix(hash, static_cast<std::uint64_t>(tensor.scalar_type()));
    for (const std::int64_t size : tensor.sizes()) mix(hash, static_cast<std::uint64_t>(size));
    for (const std::int64_t stride : tensor.strides()) mix(hash, static_cast<std::uint64_t>(stride));
  }
  return hash;
}

// ---- outputs ------------------------------------------------------------------------------------

// Flattens a model's output into `tensors`; throws (the call fails with `function_failed`) for
// what a graph cannot hand out.
OutputStructure flatten_output(const c10::IValue& value, Values& tensors, const std::string& path,
                               c10::DeviceIndex device, const std::string& kind) {
  OutputStructure node;
  if (value.isTensor()) {
    const at::Tensor& tensor = value.toTensor();
    if (tensor.defined() && tensor.device() != at::Device(at::kCUDA, device)) {
      throw std::runtime_error(path + " of the " + kind + " is on " + tensor.device().str() +
                               ": a graph of the pool computes on cuda:" + std::to_string(device) +
                               " only; return it on that device (move the module there, or call .to() inside it)");
    }
    node.kind = OutputStructure::Kind::tensor;
    node.index = tensors.size();
    tensors.push_back(tensor);
  } else if (value.isNone()) {
    node.kind = OutputStructure::Kind::none;
  } else if (value.isTuple() || value.isList()) {
    const bool tuple = value.isTuple();
    node.kind = tuple ? OutputStructure::Kind::tuple : OutputStructure::Kind::list;
    if (!tuple) node.element_type = value.toList().elementType();
    const c10::ArrayRef<c10::IValue> elements = tuple ? value.toTupleRef().elements() : value.toListRef();
    for (std::size_t i = 0; i < elements.size(); ++i) {
      node.children.push_back(flatten_output(elements[i], tensors, path + "[" + std::to_string(i) + "]", device, kind));
    }
  } else if (value.isGenericDict()) {
    node.kind = OutputStructure::Kind::dict;
    const c10::Dict<c10::IValue, c10::IValue> dict = value.toGenericDict();
    node.element_type = dict.keyType();
    node.value_type = dict.valueType();
    for (const auto& entry : dict) {
      node.keys.push_back(entry.key());
      node.children.push_back(flatten_output(entry.value(), tensors, path_of(path, entry.key()), device, kind));
    }
  } else {
    std::ostringstream shown;
    shown << value;
    throw std::runtime_error(path + " of the " + kind + " is a " + tag_of(value) + " (" + shown.str() +
                             "): a graph hands out tensors only (and None, and tuples, lists and dicts of "
                             "them); return the value as a tensor, or compute it outside the model");
  }
  return node;
}

bool same_key(const c10::IValue& a, const c10::IValue& b) {
  if (a.isString() && b.isString()) return a.toStringRef() == b.toStringRef();
  if (a.isInt() && b.isInt()) return a.toInt() == b.toInt();
  if (a.isBool() && b.isBool()) return a.toBool() == b.toBool();
  if (a.isDouble() && b.isDouble()) return a.toDouble() == b.toDouble();
  return a.isSameIdentity(b);
}

bool same_type(const c10::TypePtr& a, const c10::TypePtr& b) {
  if (!a || !b) return !a && !b;
  return *a == *b;
}

bool same_structure(const OutputStructure& a, const OutputStructure& b) {
  if (a.kind != b.kind || a.index != b.index || a.children.size() != b.children.size() ||
      a.keys.size() != b.keys.size() || !same_type(a.element_type, b.element_type) ||
      !same_type(a.value_type, b.value_type)) {
    return false;
  }
  for (std::size_t i = 0; i < a.keys.size(); ++i) {
    if (!same_key(a.keys[i], b.keys[i])) return false;
  }
  for (std::size_t i = 0; i < a.children.size(); ++i) {
    if (!same_structure(a.children[i], b.children[i])) return false;
  }
  return true;
}

c10::IValue rebuild_output(const OutputStructure& node, const std::vector<at::Tensor>& tensors) {
  switch (node.kind) {
    case OutputStructure::Kind::tensor: return tensors.at(node.index);
    case OutputStructure::Kind::none: return {};
    case OutputStructure::Kind::tuple: {
      std::vector<c10::IValue> elements;
      elements.reserve(node.children.size());
      for (const OutputStructure& child : node.children) elements.push_back(rebuild_output(child, tensors));
      return c10::ivalue::Tuple::create(std::move(elements));
    }
    case OutputStructure::Kind::list: {
      const c10::impl::GenericList list(node.element_type);
      list.reserve(node.children.size());
      for (const OutputStructure& child : node.children) list.push_back(rebuild_output(child, tensors));
      return list;
    }
    case OutputStructure::Kind::dict: {
      const c10::impl::GenericDict dict(node.element_type, node.value_type);
      for (std::size_t i = 0; i < node.children.size(); ++i) {
        dict.insert(node.keys[i], rebuild_output(node.children[i], tensors));
      }
      return dict;
    }
  }
  return {};
}

}  // namespace

std::string message_of(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) return c10_error->what_without_backtrace();
  return error.what();
}

// ---- the runner ---------------------------------------------------------------------------------

Result<void> Model::Runner::flatten_inputs(const std::vector<c10::IValue>& inputs, ModelCall& call,
                                           std::vector<Arg>& args) const {
  call.runner = this;
  // The usual call, tensors only: the same arguments and structure hash as the flattener's (each
  // tensor mixes 11), without building the structure (a node, a path string per input): a replay
  // never reads it, and the runner rebuilds such a call from the pool function's inputs.
  if (std::ranges::all_of(inputs, [](const c10::IValue& input) { return input.isTensor(); })) {
    std::uint64_t hash = 0;
    for (const c10::IValue& input : inputs) {
      mix(hash, 11);
      args.emplace_back(input.toTensor());
    }
    call.structure_hash = hash;
    call.tensors_only = true;
    return {};
  }
  InputFlattener flattener{.args = args};
  call.inputs.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!structured_inputs && !inputs[i].isTensor()) {
      return fail(Errc::invalid_argument,
                  "input " + std::to_string(i) + " is a " + tag_of(inputs[i]) + ": an " + kind + " takes tensors only",
                  {}, -1, static_cast<std::int32_t>(i));
    }
    auto node = flattener.flatten(inputs[i], "input " + std::to_string(i));
    if (!node) {
      node.error().input = static_cast<std::int32_t>(i);
      return std::unexpected(std::move(node.error()));
    }
    call.inputs.push_back(std::move(*node));
  }
  call.structure_hash = flattener.hash;
  return {};
}

Values Model::Runner::operator()(Inputs in) {
  const c10::AutoGradMode no_grad(false);  // serving: no autograd history
  const ModelCall* call = current_call != nullptr && current_call->runner == this ? current_call : nullptr;
  std::vector<c10::IValue> arguments;
  if (call != nullptr && !call->tensors_only) {
    std::size_t next = 0;
    for (const InputNode& node : call->inputs) arguments.push_back(rebuild_input(node, in, next));
  } else {
    // Called through function() directly, or with tensors only: every input is one argument.
    const std::size_t count = structured_inputs && in.size() > 0 ? in.size() - 1 : in.size();
    for (std::size_t i = 0; i < count; ++i) {
      arguments.emplace_back(in[i].defined() ? c10::IValue(in[i]) : c10::IValue(in.scalar(i)));
    }
  }
  if (priming_runs > 0 && c10::cuda::currentStreamCaptureStatusMayInitCtx() == c10::cuda::CaptureStatus::None &&
      primed.insert(prime_each_signature ? signature_of(in, call != nullptr ? call->structure_hash : 0) : 0).second) {
    prime(arguments);
  }
  const c10::IValue result = forward(std::move(arguments));
  Values tensors;
  OutputStructure found = flatten_output(result, tensors, "output", device, kind);
  if (!structure) {
    structure = std::make_shared<const OutputStructure>(std::move(found));
  } else if (!same_structure(*structure, found)) {
    throw std::runtime_error("the " + kind +
                             "'s output has another structure than at its first call (other containers, dict keys "
                             "or element types, or tensors where None was): a model's output must keep its "
                             "structure for cgt to hand it back");
  }
  return tensors;
}

// On a side stream, which the pool's allocator does not route to the pool: what the model keeps
// from its first runs (a TorchScript executor's state, a cuBLAS workspace) is in ordinary memory.
// Ordered after the pool's stream and before its next work, so inputs and outputs stay valid.
// The runs read copies of the arguments (same sizes and, for dense tensors, strides): a model
// that writes an input its options do not declare would otherwise write it once per run.
void Model::Runner::prime(const std::vector<c10::IValue>& arguments) {
  const c10::cuda::CUDAStream pool_stream = c10::cuda::getCurrentCUDAStream(device);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(pool_stream);
  inputs_ready.block(side);
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    std::vector<c10::IValue> copies;
    copies.reserve(arguments.size());
    for (const c10::IValue& argument : arguments) copies.push_back(argument.deepcopy());
    for (std::uint32_t i = 0; i < priming_runs; ++i) (void)forward(copies);
  }
  at::cuda::CUDAEvent primed_done;
  primed_done.record(side);
  primed_done.block(pool_stream);
}

Result<Function> register_model(Pool& pool, std::shared_ptr<Model::Runner> runner, ModelOptions options,
                                bool warm_up_each_shape_by_default) {
  return pool.add_function([runner = std::move(runner)](Inputs in) { return (*runner)(in); },
                           {.name = std::move(options.name),
                            .static_inputs = std::move(options.static_inputs),
                            .mutated_inputs = std::move(options.mutated_inputs),
                            .graph_sizes = std::move(options.graph_sizes),
                            .size_source = options.size_source,
                            .warm_up_each_shape = options.warm_up_each_shape.value_or(warm_up_each_shape_by_default)});
}

// ---- the handles --------------------------------------------------------------------------------

Model::Model(Function function, std::shared_ptr<Runner> runner) noexcept
    : function_(std::move(function)), runner_(std::move(runner)) {}

Model::~Model() = default;

Owning<ModelOutputs> Model::operator()(const std::vector<c10::IValue>& inputs) const {
  if (!runner_) {
    return fail(Errc::invalid_argument,
                "call of an empty Model handle (moved from); call the handle it was moved into");
  }
  ModelCall call;
  std::vector<Arg> args;
  args.reserve(inputs.size() + 1);
  if (auto flat = runner_->flatten_inputs(inputs, call, args); !flat) {
    flat.error().function = std::string(function_.name());
    return std::unexpected(std::move(flat.error()));
  }
  if (runner_->structured_inputs) args.emplace_back(static_cast<std::int64_t>(call.structure_hash >> 1U));
  Owning<Outputs> out = [&] {
    const CurrentCall current(&call);
    return function_(std::span<const Arg>(args));
  }();
  if (!out) return std::unexpected(std::move(out.error()));
  return ModelOutputs(std::move(*out), runner_->structure);
}

Result<c10::IValue> ModelOutputs::value() const& {
  if (!structure_) return fail(Errc::invalid_argument, "value() of an empty ModelOutputs (moved from)");
  std::vector<at::Tensor> tensors;
  tensors.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    auto tensor = tensors_.get(i);
    if (!tensor) return std::unexpected(std::move(tensor.error()));
    tensors.push_back(tensor->get());
  }
  return rebuild_output(*structure_, tensors);
}

Result<c10::IValue> ModelOutputs::take() const {
  if (!structure_) return fail(Errc::invalid_argument, "take() of an empty ModelOutputs (moved from)");
  std::vector<at::Tensor> tensors;
  tensors.reserve(tensors_.size());
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    auto tensor = tensors_.take(i);
    if (!tensor) return std::unexpected(std::move(tensor.error()));
    tensors.push_back(std::move(*tensor));
  }
  return rebuild_output(*structure_, tensors);
}

}  // namespace cgt::torch
