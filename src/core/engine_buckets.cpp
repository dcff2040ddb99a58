// Batch buckets with padding (`FunctionOptions::buckets`): a call between two bucket sizes is
// padded up to the next one, runs the graph of that bucket, and hands out its outputs sliced back.
// The padding and slicing themselves are the backend's (`Device::pad`, `Device::slice`).
module;
#include <expected>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.core;
import :engine;

namespace cgt::detail {
namespace {

bool listed(const std::vector<std::size_t>& list, std::size_t i) noexcept {
  return std::ranges::find(list, i) != list.end();
}

// The outputs `whole_outputs` and `output_dims` name must exist: how many outputs the function
// has is known only once it ran (their repeats and overlaps are refused by `add_function`).
Result<CallOutputs> checked_whole_outputs(Result<CallOutputs> out, const FunctionRecord& function) {
  if (!out) return out;
  const Buckets& buckets = function.options.buckets;
  const auto out_of_range = [&](const char* list, std::size_t index) {
    return fail(Errc::invalid_argument,
                std::string("buckets.") + list + " names output " + std::to_string(index) + " of '" + function.name +
                    "', which is out of range: it returned " + std::to_string(out->leases.size()) + " outputs",
                function.name);
  };
  for (const std::size_t index : buckets.whole_outputs) {
    if (index >= out->leases.size()) return out_of_range("whole_outputs", index);
  }
  for (const auto& [index, dim] : buckets.output_dims) {
    if (index >= out->leases.size()) return out_of_range("output_dims", index);
  }
  return out;
}

// Whether input `i` grows with the call's size: a value that is not static and has `size` rows
// along `dim`. Static inputs (weights, tables, caches) are never padded: a graph reads them in
// place, and their sizes are not the batch's even when they happen to be equal.
bool is_padded(const FunctionRecord& function, std::size_t i, const backend::ArgDesc& desc, std::size_t dim,
               std::int64_t size) noexcept {
  return desc.kind == backend::ArgKind::value && !function.is_static[i] && dim < desc.rank && desc.sizes[dim] == size &&
         !listed(function.options.buckets.unpadded_inputs, i);
}

// Warns once when output `index` of a padded call (`value`, sliced along `sliced` or not at all)
// has `bucket` elements on another dimension: its padded rows may be in it.
void warn_if_padding_shows(FunctionRecord& function, std::size_t index, const void* value,
                           std::span<const std::size_t> sliced, std::int64_t bucket, const backend::Device& device,
                           Events& events) {
  if (function.warned_padded_output) return;
  const std::vector<std::int64_t> sizes = device.sizes_of(value);
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] != bucket || std::ranges::find(sliced, d) != sliced.end()) continue;
    function.warned_padded_output = true;
    events.count_and_say(
        EventKind::warning, Reason::padded_output, function,
        "output " + std::to_string(index) + " of '" + function.name + "' has " + std::to_string(bucket) +
            " elements on dimension " + std::to_string(d) +
            " at a call padded to that bucket, and is not sliced there: it may carry the padded rows (a transpose, "
            "a [seq, batch] or [n, n] output); declare its batch dimensions in buckets.output_dims, or list it in "
            "buckets.whole_outputs if it has none");
    return;
  }
}

// Makes each lease of `out` hand out its value's first `size` rows along `dim`, where the value
// has `bucket` of them there; the leases keep holding the whole storage.
Result<void> slice_outputs(CallOutputs& out, FunctionRecord& function, std::int64_t bucket, std::int64_t size,
                           backend::Device& device, Events& events) {
  const Buckets& buckets = function.options.buckets;
  for (std::size_t o = 0; o < out.leases.size(); ++o) {
    LeaseCore& lease = out.leases[o];
    if (lease.value == nullptr || listed(buckets.whole_outputs, o)) continue;
    std::vector<std::size_t> dims;
    for (const auto& [index, dim] : buckets.output_dims) {
      if (index == o) dims.push_back(dim);
    }
    const bool declared = !dims.empty();
    if (!declared) dims.push_back(function.options.size_source.dim);
    // The lease keeps its cell: the whole bucket's storage stays live (and protected from
    // replays) while the caller holds the view of its first rows.
    const backend::StorageHandle* storage = lease.cell != nullptr ? &lease.cell->storage : nullptr;
    std::vector<std::size_t> sliced;
    for (const std::size_t dim : dims) {
      auto view = device.slice(lease.value, storage, dim, bucket, size);
      if (!view) {
        return std::unexpected(in_call(std::move(view.error()), function, "slicing an output to the call's size"));
      }
      if (*view == nullptr) {
        if (!declared) continue;  // not `bucket` rows along the input's dimension: handed out whole
        return fail(Errc::invalid_argument,
                    "buckets.output_dims says output " + std::to_string(o) + " of '" + function.name +
                        "' has its batch on dimension " + std::to_string(dim) + ", but it has no " +
                        std::to_string(bucket) + " elements there at bucket " + std::to_string(bucket),
                    function.name);
      }
      lease.value = view->get();
      lease.owner = std::move(*view);
      sliced.push_back(dim);
    }
    if (!declared) warn_if_padding_shows(function, o, lease.value, sliced, bucket, device, events);
  }
  return {};
}

}  // namespace

Result<CallOutputs> Engine::run_bucketed(CallFrame& frame) {
  FunctionRecord& function = *frame.function;
  const std::vector<std::int64_t>& buckets = function.options.buckets.sizes;
  const std::size_t dim = function.options.size_source.dim;
  const std::int64_t size = frame.descs[function.options.size_source.input].sizes[dim];
  // Size 0 has no row to pad from (or to replicate): it runs eagerly, where it computes nothing.
  if (size == 0) {
    frame.unfit = Reason::size_not_graphed;  // `run_decided` runs it eagerly, with no variant
    return run_decided(frame);
  }
  const auto bucket = std::ranges::lower_bound(buckets, size);
  if (bucket == buckets.end()) {
    frame.unfit = Reason::size_above_buckets;
    return run_decided(frame);
  }
  // Inputs that grow with the batch are copied into the graph's slots whatever memory they are in:
  // a padded copy never is pool memory, and a call at a bucket's own size must replay the same graph.
  // (Mutated ones are read in place at a bucket's size, or the mutation would go to the slot.)
  const std::size_t count = frame.descs.size();
  SmallArray<bool, 8> copied_array(count);
  const std::span<bool> copied = copied_array.span();
  for (std::size_t i = 0; i < count; ++i) {
    copied[i] = !function.is_mutated[i] && is_padded(function, i, frame.descs[i], dim, size);
  }
  frame.always_copied = copied;
  if (*bucket == size) return checked_whole_outputs(run_decided(frame), function);  // nothing to pad or slice

  for (std::size_t i = 0; i < count; ++i) {
    if (function.is_mutated[i] && is_padded(function, i, frame.descs[i], dim, size)) {
      // The function would write into the padded copy, and the caller's input would never see it.
      events_.say(EventKind::eager_fallback, Reason::mutated_input, function,
                  "skipping graphs for '" + function.name + "' at size " + std::to_string(size) +
                      ": it mutates input " + std::to_string(i) + ", which would be padded to bucket " +
                      std::to_string(*bucket) + " (a copy); make that input static, or call at a bucket size");
      frame.unfit = Reason::mutated_input;
      return run_decided(frame);
    }
  }

  SmallArray<backend::ArgSlot, 8> slot_array(count);
  SmallArray<backend::ArgDesc, 8> desc_array(count);
  const std::span<backend::ArgSlot> slots = slot_array.span();
  const std::span<backend::ArgDesc> descs = desc_array.span();
  std::vector<std::shared_ptr<const void>> padded_values;  // alive until the call is done
  for (std::size_t i = 0; i < count; ++i) {
    slots[i] = frame.args[i];
    descs[i] = frame.descs[i];
    if (!is_padded(function, i, frame.descs[i], dim, size)) continue;
    auto padded = device_->pad(frame.args[i].value, frame.descs[i], dim, *bucket, function.options.buckets.pad_of(i));
    if (!padded) {
      Error error = in_call(std::move(padded.error()), function, "padding an input to its bucket");
      error.input = static_cast<std::int32_t>(i);
      return std::unexpected(std::move(error));
    }
    slots[i].value = padded->value;  // a consumed lease stays consumed: the call still ends it
    descs[i] = padded->desc;
    padded_values.push_back(std::move(padded->owner));
  }
  ++stats_.padded_calls;

  const Padding padding{.caller_args = frame.args, .dim = dim, .rows = size};
  CallFrame padded_frame{.args = slots,
                         .descs = descs,
                         .function = frame.function,
                         .variant = nullptr,
                         .rerecording_of = nullptr,
                         .generation = frame.generation,
                         .always_copied = copied,
                         .padding = &padding};
  auto out = checked_whole_outputs(run_decided(padded_frame), function);
  if (!out) return out;
  if (auto sliced = slice_outputs(*out, function, *bucket, size, *device_, events_); !sliced)
    return std::unexpected(sliced.error());
  return out;
}

}  // namespace cgt::detail
