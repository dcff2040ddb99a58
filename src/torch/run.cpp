// Eager runs and warm-ups of pool functions, and what their outputs are.
module;
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :internal;

namespace cgt::torch {

std::vector<std::pair<std::uintptr_t, std::size_t>> pool_segments(const TorchDevice::State& state) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> segments;
  for (const auto& segment : allocator::snapshot(state.pool, false).segments) {
    if (segment.owner_private_pool_id == state.pool) segments.emplace_back(segment.address, segment.total_size);
  }
  return segments;
}

std::vector<Block> allocated_blocks(const TorchDevice::State& state) {
  std::vector<Block> blocks;
  for (const auto& segment : allocator::snapshot(state.pool, false).segments) {
    if (segment.owner_private_pool_id != state.pool) continue;
    std::size_t address = segment.address;  // blocks carry no address: they follow each other
    for (const auto& block : segment.blocks) {
      if (block.allocated) blocks.push_back({address, block.size});
      address += block.size;
    }
  }
  return blocks;
}

std::vector<std::uintptr_t> addresses_of(const std::vector<Block>& blocks) {
  std::vector<std::uintptr_t> addresses;
  addresses.reserve(blocks.size());
  for (const Block& block : blocks) addresses.push_back(block.address);
  std::ranges::sort(addresses);
  return addresses;
}

namespace {

// Whether a graph can hand `tensor` out: it has strided storage, whose memory cgt can track.
bool graphable(const at::Tensor& tensor) {
  return tensor.layout() == at::kStrided && !tensor.is_nested() && tensor.has_storage();
}

// Why output `i` (not graphable) cannot come from a graph.
std::string not_graphable_message(const at::Tensor& tensor, std::size_t i) {
  std::ostringstream layout;
  layout << tensor.layout();
  return "output " + std::to_string(i) + " is a " + (tensor.is_nested() ? std::string("nested") : layout.str()) +
         " tensor (" + tensor.toString() +
         "): it has no strided storage whose memory cgt could track or a graph could hand out on replay; return "
         "dense tensors (to_dense()) to graph it";
}

// The first output a graph cannot hand out, as an `unsupported_output` error; none if all can be.
std::optional<Error> first_not_graphable(const Values& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined() || graphable(outputs[i])) continue;
    return Error{.code = Errc::function_failed,
                 .message = not_graphable_message(outputs[i], i),
                 .cause = Cause::unsupported_output};
  }
  return std::nullopt;
}

// A warm-up's outputs that a graph cannot hand out, copied out of the pool (on the current stream,
// outside the pool's allocation): its memory could not be tracked, and the warm-up's values must
// stay the call's, since the function is not run again.
void copy_out_of_pool(Values& outputs) {
  for (at::Tensor& output : outputs) {
    if (output.defined() && !graphable(output)) output = output.clone();
  }
}

}  // namespace

Result<void> check_outputs(const Values& outputs, bool eager) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& tensor = outputs[i];
    if (!tensor.defined()) continue;
    if (!graphable(tensor)) {
      if (eager) continue;  // an eager run's outputs are not pool memory cgt tracks
      return fail(Cause::unsupported_output, Errc::function_failed, not_graphable_message(tensor, i));
    }
    try {
      (void)tensor.storage().data_ptr();
    } catch (const c10::Error& error) {
      return fail(Errc::function_failed,
                  "output " + std::to_string(i) +
                      " views pool memory that was reclaimed: the function returned a tensor it kept from an "
                      "earlier call (" +
                      error.what_without_backtrace() + ")");
    }
  }
  return {};
}

backend::RunResult describe_outputs(TorchDevice::State& state, Values&& outputs, bool may_be_pool_memory,
                                    std::span<const std::uintptr_t> allocated_before) {
  const auto segments = may_be_pool_memory ? pool_segments(state) : decltype(pool_segments(state)){};
  auto in_pool = [&](std::uintptr_t address) {
    return std::ranges::any_of(segments, [address](const auto& segment) {
      return address >= segment.first && address < segment.first + segment.second;
    });
  };
  auto owner = std::make_shared<RunOwner>();
  owner->values = std::move(outputs);
  owner->storages.resize(owner->values.size());
  backend::RunResult result;
  result.outputs.reserve(owner->values.size());
  result.values.reserve(owner->values.size());
  for (std::size_t i = 0; i < owner->values.size(); ++i) {
    const at::Tensor& tensor = owner->values[i];
    backend::OutputDesc desc;
    if (!tensor.defined()) {
      desc.kind = backend::OutputKind::none;
    } else if (tensor.layout() != at::kStrided || tensor.is_nested() || !tensor.has_storage()) {
      // An eager run's sparse (nested, mkldnn) output: no storage of the pool, nothing to track.
    } else {
      const c10::Storage& storage = tensor.storage();
      desc.storage = backend::address_of(storage.data_ptr().get());
      desc.storage_bytes = storage.nbytes();
      desc.in_pool = desc.storage != 0 && in_pool(desc.storage);
      // A block allocated before the call that the call returns was not allocated by it: an
      // input it passes through, or a tensor it kept from an earlier call (the engine refuses the
      // latter: another lease may hold that memory).
      desc.allocated_in_call = !desc.in_pool || !std::ranges::binary_search(allocated_before, desc.storage);
      if (desc.in_pool) {
        auto record = state.record_for(storage);
        record->add_view(&tensor);
        owner->storages[i] = record;
        desc.native = record.get();
        desc.native_owner = record;
      }
    }
    result.outputs.push_back(std::move(desc));
    result.values.push_back(&tensor);
  }
  result.owner = std::move(owner);
  return result;
}

Result<backend::RunResult> TorchDevice::run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                            backend::RunMode mode) {
  State& state = *state_;
  if (auto ordered = order_after_last_caller(state); !ordered) return std::unexpected(std::move(ordered.error()));
  const CallInputs inputs(args);
  if (mode == backend::RunMode::eager) {
    const InputVersions versions(inputs);
    auto outputs = invoke(fn, inputs);
    if (!outputs) return std::unexpected(std::move(outputs.error()));
    if (auto checked = check_outputs(*outputs, true); !checked) return std::unexpected(std::move(checked.error()));
    // An eager run allocates nothing in the pool, but may return a view of an input that is a pool
    // output: described as pool memory the call did not allocate, the engine gives its lease that
    // output's cell (and refuses pool memory the call did not receive).
    return guarded("describing eager outputs", [&]() -> Result<backend::RunResult> {
      backend::RunResult described = describe_outputs(state, std::move(*outputs), true);
      for (backend::OutputDesc& desc : described.outputs) desc.allocated_in_call = !desc.in_pool;
      described.written_inputs = versions.written(inputs);
      return described;
    });
  }
  // A warm-up runs eagerly on the pool's stream, allocating in the pool, so that its memory is
  // accounted for like a recording's (cuBLAS workspaces would otherwise outlive it). The pool's
  // stream first waits for the caller's (its inputs, and reads of memory the warm-up may reuse):
  // no host synchronisation, which another thread's capture would not survive.
  std::vector<std::uintptr_t> allocated_before;
  auto before = guarded("preparing a warm-up", [&]() -> Result<c10::cuda::CUDAStream> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    allocated_before = addresses_of(allocated_blocks(state));
    c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(state.index);
    follow(state.stream, caller);
    return caller;
  });
  if (!before) return std::unexpected(std::move(before.error()));
  const InputVersions versions(inputs);
  std::optional<Error> ungraphable;
  auto outputs = guarded("warming up", [&]() -> Result<Values> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    Result<Values> produced;
    {
      const PoolAllocation allocation(state);
      clear_workspaces_of(state.stream);
      produced = invoke(fn, inputs);
      clear_workspaces_of(state.stream);
    }
    if (produced) ungraphable = first_not_graphable(*produced);
    if (ungraphable) {
      // Copied on the pool's stream, after the warm-up's work, before the caller's stream waits for it.
      const c10::cuda::CUDAStreamGuard on_pool_stream(state.stream);
      copy_out_of_pool(*produced);
    }
    c10::cuda::CUDAEvent done;
    done.record(state.stream);
    done.block(*before);
    return produced;
  });
  if (!outputs) return std::unexpected(std::move(outputs.error()));
  // What a graph cannot hand out was copied out of the pool: the rest must be pool memory it may hand out.
  if (auto checked = check_outputs(*outputs, ungraphable.has_value()); !checked) {
    return std::unexpected(std::move(checked.error()));
  }
  return guarded("describing warm-up outputs", [&]() -> Result<backend::RunResult> {
    backend::RunResult described = describe_outputs(state, std::move(*outputs), true, allocated_before);
    described.written_inputs = versions.written(inputs);
    described.ungraphable = std::move(ungraphable);
    note_peak(state);
    return described;
  });
}

}  // namespace cgt::torch
