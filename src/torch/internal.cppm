// cgt.torch:internal — what the libtorch backend's units share: the per-storage record, the
// device's state, and the guards that turn libtorch exceptions and CUDA statuses into cgt errors.
module;
#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>  // the driver's types only (current_device.hpp)
#include <cuda_runtime_api.h>

#include "capture_cuts.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <expected>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

module cgt.torch:internal;
import cgt;
import cgt.core;
import :api;

#include "cuda_status.hpp"     // in the purview: it names cgt types (see there)
#include "current_device.hpp"  // likewise
#include "host_segments.hpp"   // likewise

namespace cgt::torch {

namespace allocator = c10::cuda::CUDACachingAllocator;

/// CUDA statuses as cgt errors, as cgt.cuda makes them.
using kernels::checked;  // NOLINT(misc-unused-using-decls): for the module's other units

/// One storage of the pool as libtorch sees it: the StorageImpl that outputs view, and the tensors
/// cgt itself holds over it. Anything else holding the StorageImpl or one of those tensors has
/// escaped its lease.
struct TorchStorage {
  c10::intrusive_ptr<c10::StorageImpl> impl;
  std::vector<const at::Tensor*> views;
  /// A replay handed it out and no release came since: it is in use, though the pool's allocator,
  /// which never saw a replay's outputs, counts its memory as free (`TorchDevice::memory`).
  bool held_by_replay = false;

  void add_view(const at::Tensor* tensor) { views.push_back(tensor); }
  void remove_view(const at::Tensor* tensor) { std::erase(views, tensor); }
  /// Does anything but cgt hold the storage, or a tensor cgt handed out (a copy, a view)?
  [[nodiscard]] bool escaped() const {
    if (!impl) return false;
    if (impl.use_count() != 1 + views.size()) return true;
    return std::ranges::any_of(views, [](const at::Tensor* view) { return view->use_count() > 1; });
  }
};

/// The tensors a run returned, owned by the leases of that run, registered as views of their
/// storages while they live.
struct RunOwner {
  RunOwner() = default;
  RunOwner(const RunOwner&) = delete;
  RunOwner& operator=(const RunOwner&) = delete;
  ~RunOwner() {
    for (std::size_t i = 0; i < storages.size(); ++i) {
      if (storages[i]) storages[i]->remove_view(&values[i]);
    }
  }
  Values values;
  std::vector<std::shared_ptr<TorchStorage>> storages;
};

// The engine's side of the CUDA device of one pool: its private memory pool and its stream, held
// in `State`. A program sees it through its view (`torch::Device`), which it owns.
class TorchDevice final : public backend::Device {
 public:
  explicit TorchDevice(std::int16_t device, bool update_graphs_in_place = true, bool rewrite_memset_nodes = true,
                       bool rewrite_memcpy_nodes = false);
  ~TorchDevice() override;
  TorchDevice(const TorchDevice&) = delete;
  TorchDevice& operator=(const TorchDevice&) = delete;

  [[nodiscard]] torch::Device& view() noexcept { return view_; }

  /// See `torch::Device`, the view.
  [[nodiscard]] std::int16_t index() const noexcept;
  [[nodiscard]] bool contains(std::uintptr_t address) const;
  [[nodiscard]] const GraphCounts& graph_counts() const noexcept;

  /// A tensor's element type by name ("Float"), for messages.
  [[nodiscard]] std::string type_name(std::uint16_t dtype) const override {
    return c10::toString(static_cast<c10::ScalarType>(dtype));
  }
  [[nodiscard]] Result<backend::RunResult> run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                               backend::RunMode mode) override;
  [[nodiscard]] Result<std::unique_ptr<backend::Capture>> begin_recording(backend::Invoker& fn,
                                                                          std::span<const backend::ArgSlot> args,
                                                                          const backend::RecordPlan& plan) override;
  [[nodiscard]] Result<std::unique_ptr<backend::Checkpoint>> checkpoint() override;
  [[nodiscard]] Result<void> restore(const backend::Checkpoint& checkpoint,
                                     std::span<backend::StorageHandle* const> live,
                                     std::span<const std::uintptr_t> dead) override;
  void release(backend::StorageHandle& storage, backend::Release why, std::string_view function) override;
  [[nodiscard]] std::int32_t device_index() const noexcept override { return index(); }
  /// A call whose caller's current stream is capturing a graph of the program's own (an
  /// `at::cuda::CUDAGraph` around it) is refused: the pool's work would be captured into that
  /// graph, which replays it without the pool knowing. The call's work runs in the pool's context,
  /// and the caller's (one the program made, or none) is current again after it.
  [[nodiscard]] bool scopes_calls() const noexcept override { return true; }
  [[nodiscard]] Result<void> begin_call() override;
  void end_call() noexcept override;
  /// `release` acts on a storage's libtorch record only: one with none has nothing to release.
  [[nodiscard]] bool releases_unowned_storage() const noexcept override { return false; }
  void adopt(backend::StorageHandle& storage) override;
  [[nodiscard]] Result<std::shared_ptr<void>> rescue(const backend::StorageHandle& storage) override;
  [[nodiscard]] std::shared_ptr<const void> rebase(const void* value, const backend::StorageHandle& from,
                                                   const std::shared_ptr<void>& rescued) override;
  /// Batch buckets: inputs padded with libtorch ops on the caller's stream, outputs sliced with
  /// `narrow` (views registered with their storage's record, like the outputs they view).
  [[nodiscard]] std::string why_no_buckets() const override { return {}; }
  [[nodiscard]] Result<backend::Padded> pad(const void* value, const backend::ArgDesc& desc, std::size_t dim,
                                            std::int64_t size, Pad pad) override;
  [[nodiscard]] Result<std::shared_ptr<const void>> slice(const void* value, const backend::StorageHandle* storage,
                                                          std::size_t dim, std::int64_t bucket,
                                                          std::int64_t size) override;
  [[nodiscard]] std::vector<std::int64_t> sizes_of(const void* value) const override;
  /// A write to a padded copy (seen through its version counter) copied back into the caller's rows.
  [[nodiscard]] Result<void> write_back(const void* padded, const void* original, std::size_t dim,
                                        std::int64_t rows) override;
  [[nodiscard]] std::vector<Block> live_blocks() const override;
  [[nodiscard]] MemoryInfo memory() const override;
  void shutdown() override;

  struct State;  // the libtorch objects (below)

 private:
  torch::Device view_{*this};
  std::unique_ptr<State> state_;
};

/// A pool's libtorch objects.
struct TorchDevice::State {
  c10::DeviceIndex index = 0;
  /// The pool's own stream (made for it, never shared with another pool: a capture on one
  /// thread must not take in another pool's warm-up on the same stream).
  c10::cuda::CUDAStream stream;
  c10::MempoolId_t pool;
  bool shut_down = false;
  /// Uses of the pinned-host allocator's private pool that failed captures kept (see
  /// end_failed_capture): given back at shutdown, when no graph of the pool is left.
  std::size_t host_pool_uses_kept = 0;
  cudaStream_t own_stream = nullptr;  ///< `stream`, created for this pool; destroyed with it
  /// Streams of libtorch's pool (never `stream`), one per level of conditional nodes nested in
  /// one another, that capture their bodies; taken before the first recording.
  std::vector<c10::cuda::CUDAStream> body_streams;
  /// The private memory pool of what conditional nodes' bodies allocate (libtorch routes one
  /// capture's allocations to one pool only): the bodies' temporaries, dead when each body ends,
  /// at addresses every graph of this pool may reuse, as they run one after another on `stream`.
  /// Made with the body streams ({0, 0} until then); each routing to it counts a use of it, all
  /// given back at shutdown.
  c10::MempoolId_t body_pool{0, 0};
  std::size_t body_pool_uses = 0;
  const void* context = nullptr;  ///< the driver context `own_stream` was made in (kernels::CurrentDevice)
  /// The caller's context, while a call runs in the pool's instead (TorchDevice::begin_call, end_call).
  void* caller_context = nullptr;
  bool switched_context = false;
  bool update_graphs_in_place = true;
  bool rewrite_memset_nodes = true;   ///< `PoolOptions::rewrite_memset_nodes`
  bool rewrite_memcpy_nodes = false;  ///< `PoolOptions::rewrite_memcpy_nodes`
  GraphCounts graph_counts;
  std::size_t peak_allocated = 0;
  /// The stream the last call of the pool came from (see follow_last_caller); none before the first.
  std::optional<c10::cuda::CUDAStream> last_caller;
  /// One record per StorageImpl, so that outputs of several graphs viewing one storage share it.
  std::unordered_map<const c10::StorageImpl*, std::weak_ptr<TorchStorage>> records;

  State(c10::DeviceIndex device, c10::cuda::CUDAStream pool_stream, c10::MempoolId_t id)
      : index(device), stream(pool_stream), pool(std::move(id)) {}

  /// The record of `storage`, made on first sight.
  std::shared_ptr<TorchStorage> record_for(const c10::Storage& storage) {
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    if (auto found = records.find(key); found != records.end()) {
      if (auto record = found->second.lock()) return record;
    }
    if (records.size() > 1024) std::erase_if(records, [](const auto& entry) { return entry.second.expired(); });
    auto record = std::make_shared<TorchStorage>();
    record->impl = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage.unsafeGetStorageImpl());
    records[key] = record;
    return record;
  }
};

/// Makes `later` wait for the work queued on `earlier` so far, without blocking the host (a
/// device-wide synchronisation would break another thread's capture).
inline void follow(const c10::cuda::CUDAStream& later, const c10::cuda::CUDAStream& earlier) {
  if (later == earlier) return;
  c10::cuda::CUDAEvent done;
  done.record(earlier);
  done.block(later);
}

/// Orders a call from a stream other than the last call's after everything the pool queued so far:
/// the caller's stream waits for the last caller's stream and for the pool's (events, no host
/// wait). Without it a stream switch would race: a recording returns with its first run queued,
/// a replay's input copy could land before that run reads the slot, and memory whose lease was
/// dropped is reused in the last caller's stream order. One comparison when the stream is the
/// same. Not while either stream is capturing (a pool called inside another pool's capture): a
/// capture cannot wait for work outside it, and the outer capture orders the call. Returns the
/// caller's stream.
inline c10::cuda::CUDAStream follow_last_caller(TorchDevice::State& state) {
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(state.index);
  if (state.last_caller == current) return current;
  const auto capturing = [](const c10::cuda::CUDAStream& stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    return cudaStreamIsCapturing(stream.stream(), &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
  };
  if (state.last_caller && !capturing(current) && !capturing(*state.last_caller)) {
    follow(current, *state.last_caller);
    follow(current, state.stream);
  }
  state.last_caller = current;
  return current;
}

/// Waits on the host for the pool's stream and the caller's current stream: the only streams that
/// use the pool's memory. Never the whole device: another thread may be capturing.
inline void synchronize_pool_streams(const TorchDevice::State& state) {
  state.stream.synchronize();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(state.index);
  if (current != state.stream) current.synchronize();
}

/// Frees the cuBLAS workspaces kept for `stream` (PyTorch clears them around a capture so that
/// a graph's workspace is allocated in its pool). Only this pool's stream: clearing every
/// workspace (at::cuda::clearCublasWorkspaces) would free one that another thread's capture is
/// using.
inline void clear_workspaces_of(const c10::cuda::CUDAStream& stream) {
  for (at::cuda::WorkspaceMapWithMutex* workspaces :
       {&at::cuda::cublas_handle_stream_to_workspace(), &at::cuda::cublaslt_handle_stream_to_workspace()}) {
    std::vector<at::DataPtr> freed;  // freed outside the lock
    const std::unique_lock<std::shared_mutex> lock(workspaces->mutex);
    for (auto entry = workspaces->map.begin(); entry != workspaces->map.end();) {
      if (std::get<1>(entry->first) == static_cast<void*>(stream.stream())) {
        freed.push_back(std::move(entry->second));
        entry = workspaces->map.erase(entry);
      } else {
        ++entry;
      }
    }
  }
}

/// What a pool function's loops and branches (control_flow.cpp) need of the recording that runs
/// it: the recording sets it on its thread while the function runs (`ConditionalScope`), and
/// reads `given_up` after.
struct ConditionalRecording {
  TorchDevice::State* state = nullptr;
  std::string given_up;          ///< why the recording must be given up; empty: it need not
  bool host_may_decide = false;  ///< with `given_up`: recorded again with the host deciding
  bool made_nodes = false;       ///< the capture holds a conditional node
  std::size_t depth = 0;         ///< bodies being captured, one in another
  /// In a recording whose loops and branches the host decides (`ControlFlow::on_host`): its cuts.
  kernels::HostSegments* segments = nullptr;
};
/// The offset the default generator of device `index` has handed out inside the capture in
/// progress (grows with each random draw captured; recording.cpp).
[[nodiscard]] std::uint64_t random_offset_in_capture(c10::DeviceIndex index);
// NOLINTNEXTLINE(cppcoreguidelines-avoid-non-const-global-variables): each thread's own recording
inline thread_local ConditionalRecording* current_conditional_recording = nullptr;
/// Makes `recording` the current thread's while it lives.
class ConditionalScope {
 public:
  explicit ConditionalScope(ConditionalRecording& recording) noexcept
      : previous_(std::exchange(current_conditional_recording, &recording)) {}
  ConditionalScope(const ConditionalScope&) = delete;
  ConditionalScope& operator=(const ConditionalScope&) = delete;
  ~ConditionalScope() { current_conditional_recording = previous_; }

 private:
  ConditionalRecording* previous_;
};
/// Makes the streams that capture conditional nodes' bodies (`State::body_streams`), before a
/// capture begins: none is made during one (control_flow.cpp).
void make_body_streams(TorchDevice::State& state);

/// Allocations of the calling code on the pool's stream go to the pool while this lives, on the
/// pool's stream (PyTorch's `_use_cuda_memory_pool_manager`).
class PoolAllocation {
 public:
  explicit PoolAllocation(TorchDevice::State& state) : state_(state), stream_guard_(state.stream) {
    allocator::beginAllocateToPool(state.index, state.pool,
                                   [stream = state.stream.stream()](cudaStream_t target) { return target == stream; });
  }
  PoolAllocation(const PoolAllocation&) = delete;
  PoolAllocation& operator=(const PoolAllocation&) = delete;
  ~PoolAllocation() {
    allocator::endAllocateToPool(state_.index, state_.pool);
    allocator::releasePool(state_.index, state_.pool);  // beginAllocateToPool counted a use
  }

 private:
  TorchDevice::State& state_;
  c10::cuda::CUDAStreamGuard stream_guard_;
};

/// A tensor with the given layout over `storage` (no allocation, no dispatch).
inline at::Tensor tensor_over(c10::intrusive_ptr<c10::StorageImpl> storage, c10::ScalarType dtype,
                              c10::IntArrayRef sizes, c10::IntArrayRef strides, std::int64_t offset) {
  at::Tensor tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)),
                                                               c10::DispatchKeySet(c10::DispatchKey::CUDA),
                                                               caffe2::TypeMeta::fromScalarType(dtype));
  tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, std::optional<std::int64_t>(offset));
  return tensor;
}

/// A StorageImpl over `bytes` at `address` that does not own the memory (a replay's outputs: the
/// pool's allocator does not know them).
inline c10::intrusive_ptr<c10::StorageImpl> storage_over(std::uintptr_t address, std::size_t bytes,
                                                         c10::DeviceIndex device) {
  return c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<std::int64_t>(bytes),
      at::DataPtr(reinterpret_cast<void*>(address), c10::Device(c10::DeviceType::CUDA, device)),  // NOLINT
      nullptr, false);
}

/// Dimensions broadcast by a stride of 0, narrowed to one element: copying through such views
/// copies each distinct element once (and libtorch refuses to write overlapping elements).
inline at::Tensor without_broadcast(const at::Tensor& tensor) {
  at::Tensor narrowed = tensor;
  for (std::int64_t d = 0; d < tensor.dim(); ++d) {
    if (tensor.stride(d) == 0 && tensor.size(d) > 1) narrowed = narrowed.narrow(d, 0, 1);
  }
  return narrowed;
}

/// Reports a libtorch failure in an operation that has no way to return one (releasing memory,
/// listing blocks): on stderr, since the state it leaves is still safe (at worst a block stays
/// allocated, which Options::debug_checks reports).
inline void report_unreturnable(const char* doing, const std::exception& error) {
  std::cerr << "cgt.torch: libtorch failed while " << doing << ": " << error.what() << '\n';
}

/// The error for an exception libtorch threw while cgt (not the user's function) was working.
inline Error backend_failure(const char* doing, const std::exception& error) {
  const bool out_of_memory = dynamic_cast<const c10::OutOfMemoryError*>(&error) != nullptr;
  return Error{.code = out_of_memory ? Errc::out_of_memory : Errc::backend_error,
               .message = std::string("libtorch failed while ") + doing + ": " + error.what()};
}

/// Runs `work`, turning what libtorch throws into an error.
template <class Work>
auto guarded(const char* doing, Work&& work) -> decltype(std::forward<Work>(work)()) {
  try {
    return std::forward<Work>(work)();
  } catch (const std::exception& error) {
    return std::unexpected(backend_failure(doing, error));
  }
}

/// follow_last_caller, with what libtorch throws as an error: for a warm-up, recording or eager
/// run (a replay calls it inside its own guard).
inline Result<void> order_after_last_caller(TorchDevice::State& state) {
  return guarded("ordering the call after the pool's last caller", [&]() -> Result<void> {
    (void)follow_last_caller(state);
    return {};
  });
}

/// The arguments of a call as the function sees them.
using CallInputs = backend::CallInputs<at::Tensor>;
using TorchInvoker = backend::InvokerOf<Callable>;

/// Calls the user's function, turning what it throws into `function_failed` (or `out_of_memory`,
/// or `invalid_argument` for what cgt refused in it).
inline Result<Values> invoke(backend::Invoker& invoker, const CallInputs& inputs) {
  try {
    return static_cast<TorchInvoker&>(invoker).fn(inputs.view());
  } catch (const c10::OutOfMemoryError& error) {
    return fail(Errc::out_of_memory, std::string("CUDA out of memory: ") + error.what_without_backtrace());
  } catch (const c10::Error& error) {
    return fail(Errc::function_failed, std::string("the function threw: ") + error.what_without_backtrace());
  } catch (const backend::InvalidArgument& error) {  // cgt's own refusal (cgt::torch::loop_while's)
    return fail(Errc::invalid_argument, error.what());
  } catch (const std::exception& error) {
    return fail(Errc::function_failed, std::string("the function threw: ") + error.what());
  } catch (...) {
    return fail(Errc::function_failed, "the function threw an exception that is not a std::exception");
  }
}

/// The version counters of a call's input tensors before it runs, to tell which ones it wrote
/// (`RunResult::written_inputs`): libtorch bumps a tensor's counter, which its views share, at
/// every in-place write, also inside a capture. Inference tensors keep no counter: writes to them
/// are not seen (`NormalTensors` makes the backend's own copies normal ones).
class InputVersions {
 public:
  explicit InputVersions(const CallInputs& inputs) : before_(inputs.values.size()) {
    for (std::size_t i = 0; i < before_.size(); ++i) {
      const at::Tensor& tensor = inputs.values[i];
      if (tensor.defined() && !tensor.is_inference()) before_[i] = tensor._version();
    }
  }
  /// The inputs whose counter moved.
  [[nodiscard]] std::vector<std::uint32_t> written(const CallInputs& inputs) const {
    std::vector<std::uint32_t> changed;
    for (std::size_t i = 0; i < before_.size(); ++i) {
      const std::optional<std::int64_t>& before = before_[i];
      if (before && inputs.values[i]._version() != *before) changed.push_back(static_cast<std::uint32_t>(i));
    }
    return changed;
  }

 private:
  std::vector<std::optional<std::int64_t>> before_;
};

/// Makes the tensors created in its scope normal ones (with a version counter), even inside the
/// caller's `c10::InferenceMode`, without turning gradients on: for copies of inputs (slots,
/// padded copies) whose writes must be seen.
class NormalTensors {
 public:
  NormalTensors() {
    if (!c10::InferenceMode::is_enabled()) return;
    normal_.emplace(/*enabled=*/false);
    no_grad_.emplace();  // InferenceMode(false) turns grad mode on; inference mode had it off
  }

 private:
  std::optional<c10::InferenceMode> normal_;
  std::optional<c10::NoGradGuard> no_grad_;  // declared last: restored first
};

/// Segments of the pool's private memory pool: [address, address + size).
std::vector<std::pair<std::uintptr_t, std::size_t>> pool_segments(const TorchDevice::State& state);
/// The blocks of the pool's private memory pool that its allocator counts as allocated.
std::vector<Block> allocated_blocks(const TorchDevice::State& state);
/// Fails with `function_failed` for an output cgt cannot hand out: a tensor without strided
/// storage (sparse, nested, mkldnn: `Cause::unsupported_output`, so that the engine runs those
/// shapes eagerly), or one whose pool memory was reclaimed (a tensor the function kept from an
/// earlier call). `eager`: an eager run's outputs, which stay the caller's, may be any tensor.
Result<void> check_outputs(const Values& outputs, bool eager);
/// The outputs of a run, described for the engine; pool memory is recognised by address.
/// `allocated_before`: the pool's allocated blocks before the call (sorted); an output in one of
/// them was not allocated by the call (`OutputDesc::allocated_in_call`).
backend::RunResult describe_outputs(TorchDevice::State& state, Values&& outputs, bool may_be_pool_memory,
                                    std::span<const std::uintptr_t> allocated_before = {});
/// What the pool has in use now (see MemoryInfo in cgt.vocabulary-info.cppm); raises the recorded peak.
MemoryInfo measure_memory(TorchDevice::State& state);
/// Raises the recorded peak to what is in use now (after a warm-up or a recording).
inline void note_peak(TorchDevice::State& state) {
  (void)measure_memory(state);
}
/// The sorted addresses of `blocks`.
std::vector<std::uintptr_t> addresses_of(const std::vector<Block>& blocks);

}  // namespace cgt::torch
