// Recording a pool function into a CUDA graph in the pool, and replaying it.
module;
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "input_copy.hpp"

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

module cgt.torch;
import :internal;

namespace cgt::torch {
namespace {

Result<void> launched(cudaError_t status, const char* doing) {
  if (status == cudaSuccess) return {};
  (void)cudaGetLastError();  // clear a non-sticky error for the next call
  return fail(Errc::backend_error, std::string("CUDA failed while ") + doing + ": " + cudaGetErrorString(status));
}

// The offset of the device's default generator, which CUDAGraph::replay advances by what the
// graph draws.
std::uint64_t philox_offset(c10::DeviceIndex index) {
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(index);
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CUDAGeneratorImpl>()->philox_offset_per_thread();
}

// An input copied into a pool slot on every replay.
struct CopiedInput {
  std::size_t index = 0;
  at::Tensor slot;         // the slot without broadcast dimensions, over memory the pool owns
  bool memcpy_ok = false;  // contiguous, not broadcast: a plain memcpy will do
  std::size_t bytes = 0;
};

// How to rebuild an output over a storage on replay.
struct OutputLayout {
  bool defined = false;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  at::Tensor recorded;  // outputs that are not pool memory (parameters, constants) are returned as recorded
};

class TorchRecording final : public backend::Recording {
 public:
  // `exec` is the graph's executable to launch directly, or null when replays must go through
  // CUDAGraph::replay (the graph draws random numbers).
  TorchRecording(std::unique_ptr<at::cuda::CUDAGraph> graph, cudaGraphExec_t exec, std::vector<CopiedInput> copies,
                 std::vector<OutputLayout> layouts, c10::DeviceIndex device)
      : graph_(std::move(graph)),
        exec_(exec),
        copies_(std::move(copies)),
        layouts_(std::move(layouts)),
        outputs_(layouts_.size()),
        bound_(layouts_.size()),
        device_(device) {}
  TorchRecording(const TorchRecording&) = delete;
  TorchRecording& operator=(const TorchRecording&) = delete;
  ~TorchRecording() override {
    for (std::size_t i = 0; i < bound_.size(); ++i) {
      if (bound_[i]) bound_[i]->remove_view(&outputs_[i]);
    }
  }

  Result<void> replay(std::span<const backend::ArgSlot> args) override {
    return guarded("replaying a graph", [&]() -> Result<void> {
      const c10::cuda::CUDAGuard device_guard(device_);
      const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device_).stream();
      // The common case without the dispatcher: contiguous inputs of the recorded dtype are
      // copied by one kernel for up to kernels::max_copies of them; the rest by copy_.
      kernels::CopyBatch batch;
      for (const CopiedInput& copy : copies_) {
        const at::Tensor& source = *static_cast<const at::Tensor*>(args[copy.index].value);
        if (!copy.memcpy_ok || !source.is_contiguous() || source.scalar_type() != copy.slot.scalar_type()) {
          copy.slot.copy_(without_broadcast(source), /*non_blocking=*/true);
          continue;
        }
        batch.jobs[batch.count++] = {.source = source.data_ptr(), .target = copy.slot.data_ptr(), .bytes = copy.bytes};
        if (batch.count == kernels::max_copies) {
          if (auto copied = launched(kernels::copy_inputs(batch, stream), "copying inputs into their slots"); !copied)
            return copied;
          batch.count = 0;
        }
      }
      if (auto copied = launched(kernels::copy_inputs(batch, stream), "copying inputs into their slots"); !copied)
        return copied;
      if (exec_ == nullptr) {
        graph_->replay();  // draws random numbers: CUDAGraph advances the generator's offset
        return {};
      }
      return launched(cudaGraphLaunch(exec_, stream), "launching a graph");
    });
  }

  void bind_outputs(std::span<backend::StorageHandle* const> storages) override {
    for (std::size_t i = 0; i < layouts_.size(); ++i) {
      const OutputLayout& layout = layouts_[i];
      if (!layout.defined || storages[i] == nullptr) {
        unbind(i);
        outputs_[i] = layout.recorded;
        continue;
      }
      auto* record = static_cast<TorchStorage*>(storages[i]->native);
      if (bound_[i].get() == record) continue;
      unbind(i);
      outputs_[i] = tensor_over(record->impl, layout.dtype, layout.sizes, layout.strides, layout.offset);
      bound_[i] = std::static_pointer_cast<TorchStorage>(storages[i]->native_owner);
      record->add_view(&outputs_[i]);
    }
  }

  [[nodiscard]] const void* output(std::size_t i) const override { return &outputs_[i]; }

 private:
  void unbind(std::size_t i) {
    if (bound_[i]) bound_[i]->remove_view(&outputs_[i]);
    bound_[i].reset();
  }

  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  cudaGraphExec_t exec_;  // owned by graph_
  std::vector<CopiedInput> copies_;
  std::vector<OutputLayout> layouts_;
  std::vector<at::Tensor> outputs_;  // handed out on replay; never resized (their addresses are registered)
  std::vector<std::shared_ptr<TorchStorage>> bound_;
  c10::DeviceIndex device_;
};

// Ends a capture that failed, leaving the stream and the pool as they were.
void end_failed_capture(at::cuda::CUDAGraph& graph, Device::State& state) {
  bool ended = false;
  try {
    graph.capture_end();
    ended = true;
  } catch (const std::exception&) {
    ended = false;  // the stream's capture is over, but the allocator was not told: below
  }
  if (ended) return;
  // capture_end threw before telling the allocator: end the pool's allocation and give back
  // the use capture_begin counted.
  try {
    allocator::endAllocateToPool(state.index, state.pool);
    allocator::releasePool(state.index, state.pool);
  } catch (const std::exception& error) {
    report_unreturnable("ending a failed capture", error);
  }
  (void)cudaGetLastError();  // a failed capture's error is not sticky: clear it for the next call
}

// Slots in the pool for the inputs that are copied, with the same layout as the inputs.
std::vector<at::Tensor> make_slots(Device::State& state, CallInputs& inputs, const backend::RecordPlan& plan) {
  std::vector<at::Tensor> slots(inputs.tensors.size());
  const PoolAllocation allocation(state);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!plan.copy_input[i]) continue;
    const at::Tensor& source = inputs.tensors[i];
    slots[i] = at::empty_strided(source.sizes(), source.strides(), source.options());
    without_broadcast(slots[i]).copy_(without_broadcast(source));
    inputs.tensors[i] = slots[i];
  }
  return slots;
}

// Non-owning views of the slots, for replays: the slot memory itself returns to the pool after the
// recording, like any memory the graph used (later graphs may reuse it between replays).
std::vector<CopiedInput> describe_copies(const std::vector<at::Tensor>& slots, c10::DeviceIndex device) {
  std::vector<CopiedInput> copies;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].defined()) continue;
    const at::Tensor& slot = slots[i];
    const c10::Storage& storage = slot.storage();
    at::Tensor view = tensor_over(storage_over(address_of(storage.data_ptr().get()), storage.nbytes(), device),
                                  slot.scalar_type(), slot.sizes(), slot.strides(), slot.storage_offset());
    CopiedInput copy;
    copy.index = i;
    copy.memcpy_ok = slot.is_contiguous();
    copy.slot = without_broadcast(view);
    copy.bytes = static_cast<std::size_t>(slot.numel()) * slot.element_size();
    copies.push_back(std::move(copy));
  }
  return copies;
}

std::vector<OutputLayout> describe_layouts(const backend::RunResult& first) {
  std::vector<OutputLayout> layouts(first.values.size());
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const at::Tensor& tensor = *static_cast<const at::Tensor*>(first.values[i]);
    OutputLayout& layout = layouts[i];
    layout.defined = tensor.defined();
    if (!layout.defined) continue;
    if (!first.outputs[i].in_pool) {
      layout.recorded = tensor;
      continue;
    }
    layout.sizes.assign(tensor.sizes().begin(), tensor.sizes().end());
    layout.strides.assign(tensor.strides().begin(), tensor.strides().end());
    layout.offset = tensor.storage_offset();
    layout.dtype = tensor.scalar_type();
  }
  return layouts;
}

}  // namespace

Result<backend::Recorded> Device::record(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                         const backend::RecordPlan& plan) {
  State& state = *state_;
  CallInputs inputs(args);
  std::vector<at::Tensor> slots;
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  Result<Values> outputs = std::unexpected(Error{});
  auto captured = guarded("recording", [&]() -> Result<void> {
    c10::cuda::CUDAGuard device_guard(state.index);
    c10::cuda::device_synchronize();
    slots = make_slots(state, inputs, plan);
    c10::cuda::device_synchronize();
    const c10::cuda::CUDAStreamGuard stream_guard(state.stream);
    // cuBLAS keeps workspaces between calls; cleared around the capture, the graph's workspace
    // is allocated in the pool and accounted for there.
    at::cuda::clearCublasWorkspaces();
    graph->capture_begin(state.pool, cudaStreamCaptureModeThreadLocal);
    outputs = invoke(fn, inputs);
    if (!outputs) {
      end_failed_capture(*graph, state);
      at::cuda::clearCublasWorkspaces();
      return {};
    }
    try {
      graph->capture_end();
    } catch (const std::exception& error) {
      end_failed_capture(*graph, state);
      at::cuda::clearCublasWorkspaces();
      outputs = fail(Errc::function_failed, std::string("the captured work cannot be graphed: ") + error.what());
      return {};
    }
    at::cuda::clearCublasWorkspaces();
    return {};
  });
  if (!captured) return std::unexpected(std::move(captured.error()));
  if (!outputs) return std::unexpected(std::move(outputs.error()));

  return guarded("running a new graph", [&]() -> Result<backend::Recorded> {
    c10::cuda::CUDAGuard device_guard(state.index);
    std::vector<CopiedInput> copies = describe_copies(slots, state.index);
    const std::uint64_t offset_before = philox_offset(state.index);
    graph->replay();  // capture ran nothing: this run produces the first outputs
    // A graph that left the default generator's offset alone draws no random numbers: its
    // replays launch it directly, without CUDAGraph::replay's generator bookkeeping.
    cudaGraphExec_t exec = philox_offset(state.index) == offset_before ? graph->raw_cuda_graph_exec() : nullptr;
    c10::cuda::device_synchronize();
    inputs.tensors.clear();  // the slots' memory is free for the pool again (outputs may keep some)
    slots.clear();
    backend::Recorded recorded;
    recorded.first_outputs = describe_outputs(state, std::move(*outputs), true);
    recorded.recording = std::make_unique<TorchRecording>(std::move(graph), exec, std::move(copies),
                                                          describe_layouts(recorded.first_outputs), state.index);
    return recorded;
  });
}

}  // namespace cgt::torch
