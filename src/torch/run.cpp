// Eager runs and warm-ups of pool functions, and what their outputs are.
module;
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <utility>
#include <vector>

module cgt.torch;
import :internal;

namespace cgt::torch {

std::vector<std::pair<std::uintptr_t, std::size_t>> pool_segments(const Device::State& state) {
  std::vector<std::pair<std::uintptr_t, std::size_t>> segments;
  for (const auto& segment : allocator::snapshot(state.pool, false).segments) {
    if (segment.owner_private_pool_id == state.pool) segments.emplace_back(segment.address, segment.total_size);
  }
  return segments;
}

backend::RunResult describe_outputs(Device::State& state, Values&& outputs, bool may_be_pool_memory) {
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
    } else {
      const c10::Storage& storage = tensor.storage();
      desc.storage = backend::address_of(storage.data_ptr().get());
      desc.storage_bytes = storage.nbytes();
      desc.in_pool = desc.storage != 0 && in_pool(desc.storage);
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

Result<backend::RunResult> Device::run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                       backend::RunMode mode) {
  State& state = *state_;
  const CallInputs inputs(args);
  if (mode == backend::RunMode::eager) {
    auto outputs = invoke(fn, inputs);
    if (!outputs) return std::unexpected(std::move(outputs.error()));
    return guarded("describing eager outputs",
                   [&]() -> Result<backend::RunResult> { return describe_outputs(state, std::move(*outputs), false); });
  }
  // A warm-up runs eagerly on the pool's stream, allocating in the pool, so that its memory is
  // accounted for like a recording's (cuBLAS workspaces would otherwise outlive it).
  auto before = guarded("preparing a warm-up", [&]() -> Result<c10::cuda::CUDAStream> {
    c10::cuda::CUDAGuard device_guard(state.index);
    c10::cuda::device_synchronize();
    return c10::cuda::getCurrentCUDAStream(state.index);
  });
  if (!before) return std::unexpected(std::move(before.error()));
  Result<Values> outputs = std::unexpected(Error{});
  auto ran = guarded("warming up", [&]() -> Result<void> {
    c10::cuda::CUDAGuard device_guard(state.index);
    {
      const PoolAllocation allocation(state);
      at::cuda::clearCublasWorkspaces();
      outputs = invoke(fn, inputs);
      at::cuda::clearCublasWorkspaces();
    }
    c10::cuda::CUDAEvent done;
    done.record(state.stream);
    done.block(*before);
    return {};
  });
  if (!ran) return std::unexpected(std::move(ran.error()));
  if (!outputs) return std::unexpected(std::move(outputs.error()));
  return guarded("describing warm-up outputs",
                 [&]() -> Result<backend::RunResult> { return describe_outputs(state, std::move(*outputs), true); });
}

}  // namespace cgt::torch
