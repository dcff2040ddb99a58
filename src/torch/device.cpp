// The libtorch device of a pool: its private memory pool, checkpoints, storages' lifetimes, and the
// description of tensors for the engine.
module;
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/UniqueVoidPtr.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <expected>
#include <memory>
#include <optional>
#include <sstream>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

module cgt.torch;
import cgt.core;
import :internal;

namespace cgt::torch {
namespace {

struct TorchCheckpoint final : backend::Checkpoint {
  explicit TorchCheckpoint(std::shared_ptr<allocator::AllocatorState> allocator_state)
      : state(std::move(allocator_state)) {}
  std::shared_ptr<allocator::AllocatorState> state;
};

// A copy of a storage in ordinary CUDA memory (Options::copy_out_on_new_step).
struct Rescued {
  at::Tensor bytes;
};

// Frees the block of a storage whose memory the pool's allocator owns, and makes the storage's
// DataPtr forget its deleter, so that the StorageImpl dying later frees nothing twice
// (PyTorch's `_free_And_Remove_DeleterFn`).
void free_block(TorchStorage& record) {
  void* pointer = record.impl->data_ptr().get();
  (void)record.impl->mutable_data_ptr().compare_exchange_deleter(allocator::get()->raw_deleter(),
                                                                 &c10::detail::deleteNothing);
  allocator::raw_delete(pointer);
}

std::string poison_message(std::string_view function) {
  return "cgt: this tensor views memory of an output of '" + std::string(function) +
         "' that its pool has reclaimed (its lease was dropped, or a new step began); keep the OutputLease while "
         "you use the tensor, or take() a copy";
}

}  // namespace

int device_count() noexcept {
  return c10::cuda::device_count();
}

TorchDevice::TorchDevice(std::int16_t device, bool update_graphs_in_place, bool rewrite_memset_nodes,
                         bool rewrite_memcpy_nodes) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard device_guard(index);
  // The caching allocator must be initialised before its pool functions are used.
  (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, index));
  // One stream for every warm-up and recording: the allocator binds segments to streams, and
  // graphs recorded on different streams would not reuse each other's memory.
  // Its own stream, not one of libtorch's shared pool of streams: pools on other threads capture
  // on their streams at the same time, and work of another pool on a stream being captured
  // would join (and break) that capture.
  cudaStream_t stream = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  state_ =
      std::make_unique<State>(index, c10::cuda::getStreamFromExternal(stream, index), at::cuda::graph_pool_handle());
  state_->own_stream = stream;
  state_->context = kernels::current_context();  // the device is current (device_guard)
  state_->update_graphs_in_place = update_graphs_in_place;
  state_->rewrite_memset_nodes = rewrite_memset_nodes;
  state_->rewrite_memcpy_nodes = rewrite_memcpy_nodes;
  // Keeps the private pool alive between graphs (PyTorch keeps an empty graph for this).
  allocator::createOrIncrefPool(index, state_->pool);
}

Result<void> TorchDevice::begin_call() {
  State& state = *state_;
  CUcontext caller = nullptr;
  const bool known = kernels::read_current_context(caller);
  // A thread with no context current has no stream that could be capturing.
  if (!known || caller != nullptr) {
    try {
      if (kernels::is_capturing(c10::cuda::getCurrentCUDAStream(state.index).stream())) {
        return fail(Errc::nested_capture,
                    "the caller's current stream is capturing a CUDA graph of the program's own (an "
                    "at::cuda::CUDAGraph or torch.cuda.graph around this call): the pool's work would be captured "
                    "into that graph, which would replay it without the pool knowing, over memory the pool hands to "
                    "other outputs; call the pool outside the capture (cgt records and replays its own graphs), or "
                    "capture that region without cgt");
      }
    } catch (const std::exception& error) {
      return std::unexpected(backend_failure("reading the caller's stream", error));
    }
  }
  // The call's work (libtorch's, which follows the runtime's current device) runs in the pool's
  // context, where its stream and memory are: a context the program made itself on the pool's
  // device would otherwise pass for it.
  if (!known || caller == state.context || state.context == nullptr) return {};
  if (!kernels::make_context_current(
          static_cast<CUcontext>(const_cast<void*>(state.context)))) {  // NOLINT(cppcoreguidelines-pro-type-const-cast)
    return fail(Errc::backend_error, "making the pool's CUDA context current failed");
  }
  state.caller_context = caller;
  state.switched_context = true;
  return {};
}

void TorchDevice::end_call() noexcept {
  State& state = *state_;
  if (!state.switched_context) return;
  (void)kernels::make_context_current(static_cast<CUcontext>(state.caller_context));
  state.switched_context = false;
  state.caller_context = nullptr;
}

TorchDevice::~TorchDevice() {
  shutdown();
  if (state_ && state_->own_stream != nullptr) {
    const c10::cuda::CUDAGuard device_guard(state_->index);
    (void)cudaStreamSynchronize(state_->own_stream);
    (void)cudaStreamDestroy(state_->own_stream);
  }
}

std::int16_t TorchDevice::index() const noexcept {
  return state_->index;
}

const GraphCounts& TorchDevice::graph_counts() const noexcept {
  return state_->graph_counts;
}

bool TorchDevice::contains(std::uintptr_t address) const {
  return std::ranges::any_of(pool_segments(*state_), [address](const auto& segment) {
    return address >= segment.first && address < segment.first + segment.second;
  });
}

Result<std::unique_ptr<backend::Checkpoint>> TorchDevice::checkpoint() {
  return guarded("checkpointing the pool", [&]() -> Result<std::unique_ptr<backend::Checkpoint>> {
    const c10::cuda::CUDAGuard device_guard(state_->index);
    // Only the allocator's books, which the pool's queued work does not change: no waiting for it.
    // (A restore waits, since it frees blocks that work may still use.) A warm-up or recording
    // starts without waiting for the previous call's graph to finish.
    return std::make_unique<TorchCheckpoint>(allocator::getCheckpointState(state_->index, state_->pool));
  });
}

Result<void> TorchDevice::restore(const backend::Checkpoint& checkpoint, std::span<backend::StorageHandle* const> live,
                                  std::span<const std::uintptr_t> dead) {
  return guarded("restoring a checkpoint", [&]() -> Result<void> {
    const State& state = *state_;
    const c10::cuda::CUDAGuard device_guard(state.index);
    synchronize_pool_streams(state);
    std::unordered_map<std::uintptr_t, TorchStorage*> live_by_address;
    for (backend::StorageHandle* handle : live) {
      auto* record = static_cast<TorchStorage*>(handle->native);
      if (record == nullptr || !record->impl) continue;
      record->held_by_replay = false;  // allocated again: the allocator counts it from now on
      // The restore frees every block of the pool: a storage that owned its block must not free it again.
      if (handle->owned_by_allocator) {
        (void)record->impl->mutable_data_ptr().compare_exchange_deleter(allocator::get()->raw_deleter(),
                                                                        &c10::detail::deleteNothing);
      }
      live_by_address[handle->address] = record;
    }
    allocator::CheckpointDelta delta =
        allocator::setCheckpointPoolState(state.index, static_cast<const TorchCheckpoint&>(checkpoint).state);
    // Blocks allocated in the checkpoint come back as owning DataPtrs: live storages take theirs,
    // so they free their block when they die; the others stay allocated until freed below.
    for (at::DataPtr& data : delta.dataptrs_allocd) {
      auto found = live_by_address.find(backend::address_of(data.get()));
      if (found != live_by_address.end()) {
        found->second->impl->set_data_ptr_noswap(std::move(data));
      } else {
        (void)data.release_context();
      }
    }
    for (std::uintptr_t address : dead) allocator::raw_delete(reinterpret_cast<void*>(address));  // NOLINT
    return {};
  });
}

void TorchDevice::release(backend::StorageHandle& storage, backend::Release why, std::string_view function) {
  auto* record = static_cast<TorchStorage*>(storage.native);
  if (record == nullptr || !record->impl || state_->shut_down) return;
  record->held_by_replay = false;
  try {
    const bool escaped = record->escaped();
    if (storage.owned_by_allocator) free_block(*record);
    // A storage someone still holds, or memory a new step took back, is poisoned: using it raises
    // an error instead of reading what the next replay writes there. It cannot be reused.
    if (escaped || why == backend::Release::reclaimed) {
      record->impl->release_data_and_set_meta_custom_data_ptr_error_msg_(poison_message(function));
      storage.native = nullptr;
      storage.native_owner.reset();
    }
  } catch (const std::exception& error) {
    report_unreturnable("releasing an output's storage", error);
  }
}

void TorchDevice::adopt(backend::StorageHandle& storage) {
  auto record = std::make_shared<TorchStorage>();
  record->impl = storage_over(storage.address, storage.bytes, state_->index);
  state_->records[record->impl.get()] = record;
  storage.native = record.get();
  storage.native_owner = std::move(record);
}

Result<std::shared_ptr<void>> TorchDevice::rescue(const backend::StorageHandle& storage) {
  return guarded("copying an output out of the pool", [&]() -> Result<std::shared_ptr<void>> {
    const c10::cuda::CUDAGuard device_guard(state_->index);
    auto rescued = std::make_shared<Rescued>();
    rescued->bytes = at::empty({static_cast<std::int64_t>(storage.bytes)},
                               at::TensorOptions().dtype(at::kByte).device(at::kCUDA, state_->index));
    if (auto copied =
            checked(cudaMemcpyAsync(rescued->bytes.data_ptr(), backend::pointer_to(storage.address), storage.bytes,
                                    cudaMemcpyDeviceToDevice, c10::cuda::getCurrentCUDAStream(state_->index).stream()),
                    "copying an output out of the pool");
        !copied) {
      return std::unexpected(std::move(copied.error()));
    }
    return std::shared_ptr<void>(rescued, rescued.get());
  });
}

std::shared_ptr<const void> TorchDevice::rebase(const void* value, const backend::StorageHandle& /*from*/,
                                                const std::shared_ptr<void>& rescued) {
  const at::Tensor& original = *static_cast<const at::Tensor*>(value);
  const at::Tensor& bytes = static_cast<Rescued*>(rescued.get())->bytes;
  auto copy =
      std::make_shared<at::Tensor>(tensor_over(bytes.storage().getWeakStorageImpl().lock(), original.scalar_type(),
                                               original.sizes(), original.strides(), original.storage_offset()));
  copy->_set_conj(original.is_conj());  // a lazily conjugated or negated view stays one
  copy->_set_neg(original.is_neg());
  return copy;
}

std::vector<Block> TorchDevice::live_blocks() const {
  if (state_->shut_down) return {};
  try {
    return allocated_blocks(*state_);
  } catch (const std::exception& error) {
    report_unreturnable("listing the pool's blocks", error);
  }
  return {};
}

MemoryInfo measure_memory(TorchDevice::State& state) {
  MemoryInfo info;
  for (const auto& [address, bytes] : pool_segments(state)) info.reserved_bytes += bytes;
  for (const Block& block : allocated_blocks(state)) {
    info.allocated_bytes += block.bytes;
    ++info.live_blocks;
  }
  // Outputs of replays still leased: the allocator never allocated them, but they are in use.
  // Counted by storage (aliases share one record), rounded up as the allocator rounds a block.
  constexpr std::size_t kBlockRounding = 512;
  for (const auto& [impl, weak] : state.records) {
    const std::shared_ptr<TorchStorage> record = weak.lock();
    if (!record || !record->held_by_replay) continue;
    info.allocated_bytes += (impl->nbytes() + kBlockRounding - 1) / kBlockRounding * kBlockRounding;
    ++info.live_blocks;
  }
  state.peak_allocated = std::max(state.peak_allocated, info.allocated_bytes);
  info.peak_allocated_bytes = state.peak_allocated;
  return info;
}

MemoryInfo TorchDevice::memory() const {
  if (state_->shut_down) return {};
  try {
    return measure_memory(*state_);
  } catch (const std::exception& error) {
    report_unreturnable("measuring the pool", error);
  }
  return {};
}

void TorchDevice::shutdown() {
  if (!state_ || state_->shut_down) return;
  state_->shut_down = true;
  try {
    const c10::cuda::CUDAGuard device_guard(state_->index);
    synchronize_pool_streams(*state_);
    allocator::releasePool(state_->index, state_->pool);
    allocator::emptyCache(state_->pool);  // frees the pool's segments once nothing uses them
    if (state_->body_pool != c10::MempoolId_t{0, 0}) {
      for (; state_->body_pool_uses > 0; --state_->body_pool_uses)
        allocator::releasePool(state_->index, state_->body_pool);
      allocator::emptyCache(state_->body_pool);
    }
    at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
    for (; state_->host_pool_uses_kept > 0; --state_->host_pool_uses_kept) host->release_pool(state_->pool);
  } catch (const std::exception& error) {
    report_unreturnable("shutting the pool down", error);
  }
}

Result<void> Backend::describe(const at::Tensor& tensor, backend::ArgDesc& desc) {
  if (!tensor.defined()) return fail(Errc::invalid_argument, "an undefined tensor");
  // A graph reads its inputs as strided memory at fixed addresses; a sparse, nested or mkldnn
  // tensor has none (its memory is in several buffers, or opaque). Refused before any work, with
  // the pool left as it was; a meta tensor is strided (without memory) and runs eagerly.
  if (tensor.layout() != at::kStrided || tensor.is_nested() || !tensor.has_storage()) {
    std::ostringstream what;
    if (tensor.is_nested()) {
      what << "nested";
    } else {
      what << tensor.layout();
    }
    return fail(Errc::invalid_argument,
                "a " + what.str() + " tensor (" + tensor.toString() +
                    ") has no strided storage that a CUDA graph could read: pass a dense tensor (to_dense()), or "
                    "call the function outside the pool");
  }
  try {
    desc.storage = backend::address_of(tensor.storage().data_ptr().get());
    desc.data = backend::address_of(tensor.data_ptr());
  } catch (const c10::Error& error) {
    return fail(Errc::output_overwritten,
                std::string("the tensor's memory was reclaimed: ") + error.what_without_backtrace());
  }
  const c10::IntArrayRef sizes = tensor.sizes();
  const c10::IntArrayRef strides = tensor.strides();
  desc.kind = backend::ArgKind::value;
  desc.sizes = sizes.data();
  desc.strides = strides.data();
  desc.rank = static_cast<std::uint8_t>(sizes.size());
  desc.expanded = 0;
  for (std::size_t d = 0; d < sizes.size() && d < 32; ++d) {
    if (strides[d] == 0 && sizes[d] > 1) desc.expanded |= 1U << d;
  }
  desc.dtype = static_cast<std::uint16_t>(tensor.scalar_type());
  // A lazily conjugated or negated view (`z.conj()`) at a static input's address is another input.
  desc.view = static_cast<std::uint8_t>((tensor.is_conj() ? 1U : 0U) | (tensor.is_neg() ? 2U : 0U));
  desc.device = tensor.is_cuda() ? tensor.get_device() : -1;
  return {};
}

Result<at::Tensor> Backend::take(const at::Tensor& tensor) {
  return guarded("copying an output",
                 [&]() -> Result<at::Tensor> { return tensor.defined() ? tensor.clone() : at::Tensor(); });
}

std::unique_ptr<backend::Invoker> Backend::make_invoker(Callable&& fn) {
  return std::make_unique<TorchInvoker>(std::move(fn));
}

Device& Backend::view(backend::Device& device) noexcept {
  return static_cast<TorchDevice&>(device).view();
}

std::int16_t Device::index() const noexcept {
  return device_->index();
}

const GraphCounts& Device::graph_counts() const noexcept {
  return device_->graph_counts();
}

bool Device::contains(std::uintptr_t address) const {
  return device_->contains(address);
}

Result<Pool> make_pool(PoolOptions options) {
  if (options.tree.memory_budget_bytes != 0) {
    // libtorch's caching allocator serves the pool: cgt cannot replay its decisions ahead of a
    // recording, so it cannot predict one, and a budget it cannot keep is refused.
    return fail(Errc::invalid_argument,
                "Options::memory_budget_bytes: cgt.torch cannot predict what a recording adds to libtorch's private "
                "pool, so it cannot keep a budget (cgt.host and cgt.cuda can)");
  }
  if (options.device < 0 || options.device >= device_count()) {
    return fail(Errc::backend_error, "no usable CUDA device " + std::to_string(options.device) + " (this machine has " +
                                         std::to_string(device_count()) + ")");
  }
  auto device = guarded("making the pool", [&]() -> Result<std::unique_ptr<TorchDevice>> {
    return std::make_unique<TorchDevice>(options.device, options.update_graphs_in_place, options.rewrite_memset_nodes,
                                         options.rewrite_memcpy_nodes);
  });
  if (!device) return std::unexpected(std::move(device.error()));
  return backend::make_pool<Pool>(std::move(*device), std::move(options.tree));
}

}  // namespace cgt::torch
