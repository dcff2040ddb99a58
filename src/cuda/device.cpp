// The cuda device of a pool: runs, warms up and records pool functions over the arena of device
// segments, replays graphs, and implements the memory side of the tree for the engine.
module;
#include <cuda_runtime_api.h>

#include "input_copy.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

module cgt.cuda;

namespace cgt::cuda {
namespace {

Result<void> checked(cudaError_t status, const char* doing) {
  if (status == cudaSuccess) return {};
  (void)cudaGetLastError();  // clear a non-sticky error for the next call
  return fail(Errc::backend_error, std::string("CUDA failed while ") + doing + ": " + cudaGetErrorString(status));
}

std::uintptr_t address_of(const void* pointer) noexcept {
  return reinterpret_cast<std::uintptr_t>(pointer);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

std::byte* pointer_to(std::uintptr_t address) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast,performance-no-int-to-ptr): inverse of address_of
  return reinterpret_cast<std::byte*>(address);
}

struct CudaInvoker final : backend::Invoker {
  explicit CudaInvoker(Callable&& callable) : fn(std::move(callable)) {}
  Callable fn;
};

struct CudaCheckpoint final : backend::Checkpoint {
  explicit CudaCheckpoint(ArenaCheckpoint arena_state) : state(std::move(arena_state)) {}
  ArenaCheckpoint state;
};

struct CallInputs {
  explicit CallInputs(std::span<const backend::ArgSlot> args) : buffers(args.size()), scalars(args.size(), 0) {
    for (std::size_t i = 0; i < args.size(); ++i) {
      if (args[i].kind == backend::ArgKind::scalar) {
        scalars[i] = args[i].scalar;
      } else {
        buffers[i] = *static_cast<const Buffer*>(args[i].value);
      }
    }
  }
  [[nodiscard]] Inputs view() const noexcept { return {buffers, scalars}; }
  std::vector<Buffer> buffers;
  std::vector<std::int64_t> scalars;
};

// Runs the user's function, turning what it throws (and a failed kernel launch) into an error.
Result<Values> invoke(backend::Invoker& invoker, Context& context, const Inputs& inputs) {
  Values outputs;
  try {
    outputs = static_cast<CudaInvoker&>(invoker).fn(context, inputs);
  } catch (const OutOfMemory& error) {
    return fail(Errc::out_of_memory, std::string("the pool's memory is exhausted: ") + error.what());
  } catch (const std::exception& error) {
    return fail(Errc::function_failed, std::string("the function threw: ") + error.what());
  } catch (...) {
    return fail(Errc::function_failed, "the function threw an exception that is not a std::exception");
  }
  if (const cudaError_t launch = cudaGetLastError(); launch != cudaSuccess) {
    return fail(Errc::function_failed,
                std::string("a kernel of the function failed to launch: ") + cudaGetErrorString(launch));
  }
  return outputs;
}

// A captured graph, instantiated and uploaded, with its input slots and outputs.
class CudaRecording final : public backend::Recording {
 public:
  struct Copy {
    std::size_t input = 0;
    Buffer slot;
    std::size_t bytes = 0;  // the span the layout covers, from its first element
  };

  CudaRecording(cudaGraphExec_t exec, cudaStream_t stream, std::vector<Copy> copies, Values outputs)
      : exec_(exec), stream_(stream), copies_(std::move(copies)), outputs_(std::move(outputs)) {}
  CudaRecording(const CudaRecording&) = delete;
  CudaRecording& operator=(const CudaRecording&) = delete;
  ~CudaRecording() override { (void)cudaGraphExecDestroy(exec_); }

  [[nodiscard]] Result<void> replay(std::span<const backend::ArgSlot> args) override {
    // Equal layouts: the covered span is copied as it is (a broadcast dimension once), by one
    // kernel for up to kernels::max_copies inputs instead of one cudaMemcpyAsync each.
    kernels::CopyBatch batch;
    for (const Copy& copy : copies_) {
      const Buffer& source = *static_cast<const Buffer*>(args[copy.input].value);
      if (source.type() != copy.slot.type() || !std::ranges::equal(source.strides(), copy.slot.strides())) {
        return fail(Errc::wrong_shape, "input " + std::to_string(copy.input) +
                                           " has another layout than when its graph was recorded; pass it with the "
                                           "recorded strides (a contiguous buffer keeps them)");
      }
      batch.jobs[batch.count++] = {.source = source.data(), .target = copy.slot.data(), .bytes = copy.bytes};
      if (batch.count == kernels::max_copies) {
        if (auto copied = checked(kernels::copy_inputs(batch, stream_), "copying inputs into their slots"); !copied)
          return copied;
        batch.count = 0;
      }
    }
    if (auto copied = checked(kernels::copy_inputs(batch, stream_), "copying inputs into their slots"); !copied)
      return copied;
    return checked(cudaGraphLaunch(exec_, stream_), "launching a graph");
  }
  // Outputs are plain device addresses: they never need rebinding.
  void bind_outputs(std::span<backend::StorageHandle* const> /*storages*/) override {}
  [[nodiscard]] const void* output(std::size_t i) const override { return &outputs_[i]; }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  std::vector<Copy> copies_;
  Values outputs_;
};

}  // namespace

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

cudaStream_t Context::stream() const noexcept {
  return device_.stream_;
}

Buffer Context::allocate(ElementType type, std::span<const std::int64_t> sizes) {
  if (target_ == Target::device_memory) {
    auto buffer = Buffer::make(type, sizes, device_.device_);
    if (!buffer) throw OutOfMemory(buffer.error().message);
    return *buffer;
  }
  return device_.allocate_in_pool(*this, type, sizes);
}

Device::Device(int device, cudaStream_t stream, const ArenaOptions& arena, bool poison_dead_memory)
    : device_(device), stream_(stream), poison_(poison_dead_memory) {
  ArenaOptions options = arena;
  options.source.obtain = [device](std::size_t bytes, std::size_t /*alignment*/) -> std::byte* {
    void* memory = nullptr;  // cudaMalloc aligns to at least 256 bytes
    if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&memory, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return static_cast<std::byte*>(memory);
  };
  options.source.give_back = [](std::byte* segment, std::size_t /*bytes*/, std::size_t /*alignment*/) {
    (void)cudaFree(segment);
  };
  arena_ = std::make_unique<Arena>(std::move(options));
}

Device::~Device() {
  shutdown();
}

Result<void> Device::synchronize() const {
  return checked(cudaStreamSynchronize(stream_), "waiting for the pool's stream");
}

Buffer Device::allocate_in_pool(Context& context, ElementType type, std::span<const std::int64_t> sizes) {
  std::size_t count = 1;
  for (const std::int64_t size : sizes) count *= static_cast<std::size_t>(size);
  const std::size_t bytes = std::max<std::size_t>(count * element_size(type), 1);
  auto memory = arena_->allocate(bytes);
  if (!memory) throw OutOfMemory(memory.error().message);
  context.allocations_.push_back(address_of(*memory));
  return Buffer::view_of(*memory, bytes, type, sizes, device_);
}

void Device::free_unreturned(Context& context, const Values& outputs) {
  // Temporaries die with the call (kernels on the pool's stream that use them run before any
  // later allocation's kernels, so the memory can be reused at once).
  for (const std::uintptr_t address : context.allocations_) {
    const bool returned =
        std::ranges::any_of(outputs, [address](const Buffer& out) { return address_of(out.storage()) == address; });
    if (!returned) (void)arena_->free(address);  // NOLINT(bugprone-unused-return-value): fails only if already free
  }
  context.allocations_.clear();
}

backend::RunResult Device::describe_outputs(Values&& outputs) const {
  backend::RunResult result;
  auto owned = std::make_shared<Values>(std::move(outputs));
  result.outputs.reserve(owned->size());
  result.values.reserve(owned->size());
  for (const Buffer& out : *owned) {
    backend::OutputDesc desc;
    if (out.empty()) {
      desc.kind = backend::OutputKind::none;
    } else {
      desc.storage = address_of(out.storage());
      desc.storage_bytes = out.storage_bytes();
      desc.in_pool = arena_->contains(desc.storage);
    }
    result.outputs.push_back(desc);
    result.values.push_back(&out);
  }
  result.owner = std::move(owned);
  return result;
}

Result<backend::RunResult> Device::run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                       backend::RunMode mode) {
  if (auto set = checked(cudaSetDevice(device_), "selecting the device"); !set) return std::unexpected(set.error());
  const CallInputs inputs(args);
  Context context(*this, mode == backend::RunMode::warmup ? Context::Target::pool : Context::Target::device_memory,
                  false);
  auto outputs = invoke(fn, context, inputs.view());
  if (!outputs) {
    free_unreturned(context, {});
    return std::unexpected(std::move(outputs.error()));
  }
  free_unreturned(context, *outputs);
  return describe_outputs(std::move(*outputs));
}

Result<backend::Recorded> Device::record(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                         const backend::RecordPlan& plan) {
  if (auto set = checked(cudaSetDevice(device_), "selecting the device"); !set) return std::unexpected(set.error());
  CallInputs inputs(args);
  Context context(*this, Context::Target::pool, true);
  // Copied inputs get a slot of the same layout in the pool; replays copy the covered span.
  std::vector<CudaRecording::Copy> copies;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (!plan.copy_input[i]) continue;
    const Buffer& source = inputs.buffers[i];
    const Layout layout = source.layout().restrided(0, source.sizes(), source.strides());
    const std::size_t bytes = std::max<std::size_t>(layout.required_bytes(), 1);
    auto memory = arena_->allocate(bytes);
    if (!memory) {
      free_unreturned(context, {});
      return std::unexpected(std::move(memory.error()));
    }
    context.allocations_.push_back(address_of(*memory));
    const Buffer slot = source.on_storage(*memory, bytes).with_layout(layout);
    if (auto copied = checked(cudaMemcpyAsync(slot.data(), source.data(), bytes, cudaMemcpyDeviceToDevice, stream_),
                              "copying an input into its slot");
        !copied) {
      free_unreturned(context, {});
      return std::unexpected(copied.error());
    }
    copies.push_back({i, slot, bytes});
    inputs.buffers[i] = slot;
  }

  if (auto began = checked(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "beginning a capture");
      !began) {
    free_unreturned(context, {});
    return std::unexpected(began.error());
  }
  auto outputs = invoke(fn, context, inputs.view());
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);  // always: the stream must leave capture
  if (!outputs || ended != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    free_unreturned(context, {});
    if (!outputs) return std::unexpected(std::move(outputs.error()));
    return fail(Errc::function_failed,
                std::string("the function's work cannot be captured into a graph: ") + cudaGetErrorString(ended));
  }
  free_unreturned(context, *outputs);  // slots and temporaries the outputs do not view
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  if (auto ok = checked(instantiated, "instantiating a graph"); !ok) return std::unexpected(ok.error());
  auto recording = std::make_unique<CudaRecording>(exec, stream_, std::move(copies), *outputs);
  if (auto uploaded = checked(cudaGraphUpload(exec, stream_), "uploading a graph"); !uploaded) {
    return std::unexpected(uploaded.error());
  }
  // Capture ran nothing: this launch produces the first outputs.
  if (auto launched = checked(cudaGraphLaunch(exec, stream_), "launching a new graph"); !launched) {
    return std::unexpected(launched.error());
  }
  backend::Recorded recorded;
  recorded.recording = std::move(recording);
  recorded.first_outputs = describe_outputs(std::move(*outputs));
  return recorded;
}

Result<std::unique_ptr<backend::Checkpoint>> Device::checkpoint() {
  return std::make_unique<CudaCheckpoint>(arena_->checkpoint());
}

Result<void> Device::restore(const backend::Checkpoint& checkpoint, std::span<backend::StorageHandle* const> live,
                             std::span<const std::uintptr_t> dead) {
  arena_->restore(static_cast<const CudaCheckpoint&>(checkpoint).state);
  for (const backend::StorageHandle* storage : live) {
    if (!arena_->is_allocated(storage->address)) {
      return fail(Errc::invariant_violation, "a live output's block is not allocated in the restored checkpoint");
    }
  }
  for (const std::uintptr_t address : dead) {
    if (auto freed = arena_->free(address); !freed) {
      return fail(Errc::invariant_violation, "a dead output's block is not allocated in the restored checkpoint");
    }
  }
  return {};
}

void Device::release(backend::StorageHandle& storage, backend::Release /*why*/, std::string_view /*function*/) {
  if (!arena_) return;
  if (poison_) (void)cudaMemsetAsync(pointer_to(storage.address), 0xFF, storage.bytes, stream_);
  if (storage.owned_by_allocator) (void)arena_->free(storage.address);  // NOLINT(bugprone-unused-return-value)
}

void Device::adopt(backend::StorageHandle& /*storage*/) {}

Result<std::shared_ptr<void>> Device::rescue(const backend::StorageHandle& storage) {
  void* copy = nullptr;
  if (auto allocated = checked(cudaMalloc(&copy, storage.bytes), "copying an output out of the pool"); !allocated) {
    return std::unexpected(allocated.error());
  }
  std::shared_ptr<void> owner(copy, [](void* pointer) { (void)cudaFree(pointer); });
  if (auto copied =
          checked(cudaMemcpyAsync(copy, pointer_to(storage.address), storage.bytes, cudaMemcpyDeviceToDevice, stream_),
                  "copying an output out of the pool");
      !copied) {
    return std::unexpected(copied.error());
  }
  return owner;
}

std::shared_ptr<const void> Device::rebase(const void* value, const backend::StorageHandle& from,
                                           const std::shared_ptr<void>& rescued) {
  const Buffer& original = *static_cast<const Buffer*>(value);
  return std::make_shared<Buffer>(original.on_storage(static_cast<std::byte*>(rescued.get()), from.bytes, rescued));
}

std::vector<Block> Device::live_blocks() const {
  return arena_ ? arena_->live_blocks() : std::vector<Block>{};
}

MemoryInfo Device::memory() const {
  return arena_ ? arena_->memory() : MemoryInfo{};
}

void Device::shutdown() {
  if (!arena_) return;
  (void)cudaStreamSynchronize(stream_);
  arena_.reset();  // gives the segments back (cudaFree)
  (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

Result<Buffer> Backend::take(const Buffer& buffer) {
  if (buffer.empty()) return Buffer{};
  void* copy = nullptr;
  if (auto allocated = checked(cudaMalloc(&copy, buffer.storage_bytes()), "copying an output"); !allocated) {
    return std::unexpected(allocated.error());
  }
  std::shared_ptr<void> owner(copy, [](void* pointer) { (void)cudaFree(pointer); });
  if (auto copied = checked(cudaMemcpy(copy, buffer.storage(), buffer.storage_bytes(), cudaMemcpyDeviceToDevice),
                            "copying an output");
      !copied) {
    return std::unexpected(copied.error());
  }
  return buffer.on_storage(static_cast<std::byte*>(copy), buffer.storage_bytes(), std::move(owner));
}

std::unique_ptr<backend::Invoker> Backend::make_invoker(Callable&& fn) {
  return std::make_unique<CudaInvoker>(std::move(fn));
}

Result<Pool> make_pool(PoolOptions options) {
  if (options.device < 0 || options.device >= device_count()) {
    return fail(Errc::backend_error, "no usable CUDA device " + std::to_string(options.device) + " (this machine has " +
                                         std::to_string(device_count()) + ")");
  }
  if (auto set = checked(cudaSetDevice(options.device), "selecting the device"); !set)
    return std::unexpected(set.error());
  cudaStream_t stream = nullptr;
  const unsigned flags = options.blocking_stream ? cudaStreamDefault : cudaStreamNonBlocking;
  if (auto created = checked(cudaStreamCreateWithFlags(&stream, flags), "creating the pool's stream"); !created) {
    return std::unexpected(created.error());
  }
  auto device = std::make_unique<Device>(options.device, stream, options.arena, options.poison_dead_memory);
  return Pool::adopt(detail::make_engine(std::move(device), std::move(options.tree)));
}

}  // namespace cgt::cuda
