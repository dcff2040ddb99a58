// The functions a pool registered and their shape variants (functions.cppm has the contract):
// the shape key, the signature a function's first call fixes, and the variant a call selects.
module;
#include <expected>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :functions;

namespace cgt::detail {
Error in_call(Error error, const FunctionRecord& function, const char* doing, std::int64_t node) {
  error.message = "'" + function.name + "' failed while " + doing + ": " + error.message;
  error.function = function.name;
  if (node >= 0) error.node = node;
  return error;
}

std::vector<std::int64_t> shape_key(std::span<const backend::ArgDesc> descs) {
  std::vector<std::int64_t> key;
  for (const auto& desc : descs) {
    key.push_back(opening_word(desc));
    if (desc.kind == backend::ArgKind::scalar) {
      key.push_back(desc.scalar);
      continue;
    }
    key.insert(key.end(), desc.sizes, desc.sizes + desc.rank);
    for (std::size_t d = 0; d < desc.rank; ++d) key.push_back(key_stride(desc, d));
    key.push_back(key_layout_bits(desc));
  }
  return key;
}

std::uint32_t Functions::add(std::string name, std::unique_ptr<backend::Invoker> invoker, FunctionOptions options) {
  auto record = std::make_unique<FunctionRecord>();
  record->id = static_cast<std::uint32_t>(records_.size());
  record->name = std::move(name);
  record->invoker = std::move(invoker);
  record->options = std::move(options);
  const std::lock_guard names(records_mutex_);
  records_.push_back(std::move(record));
  return records_.back()->id;
}

const std::string& Functions::name(std::uint32_t id) const noexcept {
  // The record is on the heap, and its name never changes: it stays put when another thread adds
  // a function. Only the vector's structure needs the (short) guard.
  const std::lock_guard names(records_mutex_);
  return records_[id]->name;
}

Result<void> Functions::check_signature(FunctionRecord& function, std::span<const backend::ArgDesc> descs,
                                        const backend::Device& device) const {
  if (!function.signature) {
    // The first call fixes the signature, and lets us check the options' input indices.
    for (const std::size_t index : function.options.static_inputs) {
      if (index >= descs.size()) {
        return fail(Errc::invalid_argument,
                    "static input " + std::to_string(index) + " of " + in_quotes(function.name) +
                        " is out of range: the call has " + std::to_string(descs.size()) + " inputs",
                    function.name);
      }
    }
    for (const std::size_t index : function.options.mutated_inputs) {
      if (index >= descs.size()) {
        return fail(Errc::invalid_argument,
                    "mutated input " + std::to_string(index) + " of " + in_quotes(function.name) +
                        " is out of range: the call has " + std::to_string(descs.size()) + " inputs",
                    function.name);
      }
    }
    const bool has_buckets = !function.options.buckets.sizes.empty();
    if (!function.options.graph_sizes.empty() || has_buckets) {
      const SizeSource source = function.options.size_source;
      if (source.input >= descs.size() || descs[source.input].kind != backend::ArgKind::value ||
          source.dim >= descs[source.input].rank) {
        return fail(Errc::invalid_argument,
                    std::string(has_buckets ? "buckets" : "graph_sizes") + " of " + in_quotes(function.name) +
                        " read dimension " + std::to_string(source.dim) + " of input " + std::to_string(source.input) +
                        ", which the call does not have",
                    function.name);
      }
    }
    const auto out_of_range = [&](const char* field, std::size_t index) {
      return fail(Errc::invalid_argument,
                  std::string("buckets.") + field + " names input " + std::to_string(index) + " of " +
                      in_quotes(function.name) + ", which is out of range: the call has " +
                      std::to_string(descs.size()) + " inputs",
                  function.name);
    };
    for (const auto& [index, pad] : function.options.buckets.per_input) {
      if (index >= descs.size()) return out_of_range("per_input", index);
    }
    for (const std::size_t index : function.options.buckets.unpadded_inputs) {
      if (index >= descs.size()) return out_of_range("unpadded_inputs", index);
    }
    Signature signature;
    for (const auto& desc : descs) {
      signature.kinds.push_back(desc.kind);
      signature.dtypes.push_back(desc.dtype);
      signature.ranks.push_back(desc.rank);
    }
    function.is_static.assign(descs.size(), false);
    function.is_mutated.assign(descs.size(), false);
    for (const std::size_t index : function.options.static_inputs) function.is_static[index] = true;
    for (const std::size_t index : function.options.mutated_inputs) function.is_mutated[index] = true;
    function.mutates_an_input = !function.options.mutated_inputs.empty();
    function.signature = std::move(signature);
    return {};
  }
  const Signature& signature = *function.signature;
  if (descs.size() != signature.kinds.size()) {
    return fail(Errc::wrong_input_count,
                in_quotes(function.name) + " takes " + std::to_string(signature.kinds.size()) +
                    " inputs (as in its first call), not " + std::to_string(descs.size()),
                function.name);
  }
  for (std::size_t i = 0; i < descs.size(); ++i) {
    const auto input = static_cast<std::int32_t>(i);
    if (descs[i].kind != signature.kinds[i]) {
      const bool was_scalar = signature.kinds[i] == backend::ArgKind::scalar;
      return fail(Errc::wrong_input_type,
                  "input " + std::to_string(i) + " of " + in_quotes(function.name) + " must be a " +
                      (was_scalar ? "scalar" : "value") + ", as in its first call",
                  function.name, -1, input);
    }
    if (descs[i].kind == backend::ArgKind::scalar) continue;
    if (descs[i].dtype != signature.dtypes[i]) {
      return fail(Errc::wrong_input_type,
                  "input " + std::to_string(i) + " of " + in_quotes(function.name) + " has element type " +
                      device.type_name(descs[i].dtype) + ", but its first call had " +
                      device.type_name(signature.dtypes[i]),
                  function.name, -1, input);
    }
    if (descs[i].rank != signature.ranks[i]) {
      return fail(Errc::wrong_shape,
                  "input " + std::to_string(i) + " of " + in_quotes(function.name) + " has " +
                      std::to_string(descs[i].rank) + " dimensions, but its first call had " +
                      std::to_string(signature.ranks[i]) + "; sizes may change between calls, ranks may not",
                  function.name, -1, input);
    }
  }
  return {};
}

Selection Functions::select(FunctionRecord& function, std::span<const backend::ArgDesc> descs,
                            std::int32_t device_index, const Options& options) {
  for (const auto& desc : descs) {
    if (desc.kind == backend::ArgKind::value && desc.device != device_index) {
      return {.unfit = Reason::input_on_other_device};
    }
  }
  if (!function.options.graph_sizes.empty()) {
    const SizeSource source = function.options.size_source;
    const std::int64_t size = descs[source.input].sizes[source.dim];
    if (std::ranges::find(function.options.graph_sizes, size) == function.options.graph_sizes.end()) {
      return {.unfit = Reason::size_not_graphed};
    }
  }
  std::vector<std::int64_t> key = shape_key(descs);
  if (auto found = function.variants.find(key); found != function.variants.end()) {
    function.last_variant = found->second;
    return {.variant = variants_[found->second].get()};
  }
  if (options.shape_key_limit != 0 && function.variants.size() >= options.shape_key_limit) {
    return {.unfit = Reason::shape_key_limit};
  }
  auto variant = std::make_unique<Variant>();
  variant->id = static_cast<std::uint32_t>(variants_.size());
  variant->function = function.id;
  variant->key = key;
  function.variants.emplace(std::move(key), variant->id);
  function.last_variant = variant->id;
  variants_.push_back(std::move(variant));
  const bool passed = options.shape_key_warn_limit != 0 && function.variants.size() > options.shape_key_warn_limit &&
                      !function.warned_many_keys;
  if (passed) function.warned_many_keys = true;
  return {.variant = variants_.back().get(), .passed_warn_limit = passed};
}

bool Functions::note_write(FunctionRecord& function, std::size_t input) noexcept {
  if (input >= function.is_mutated.size() || function.is_mutated[input]) return false;
  function.is_mutated[input] = true;
  function.mutates_an_input = true;
  return true;
}

std::vector<std::unique_ptr<backend::Invoker>> Functions::take_invokers() noexcept {
  std::vector<std::unique_ptr<backend::Invoker>> callables;
  callables.reserve(records_.size());
  for (auto& record : records_) callables.push_back(std::move(record->invoker));
  return callables;
}

}  // namespace cgt::detail
