// The cuda device of a pool: runs, warms up and records pool functions over the arena of device
// segments, replays graphs, and implements the memory side of the tree for the engine.
module;
#include <cuda_runtime_api.h>

#include "capture_cuts.hpp"
#include "input_copy.hpp"
#include "node_rewrite.hpp"
#include "shared_exec.hpp"
#include "virtual_memory.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

module cgt.cuda;
import cgt.core;
import :internal;

namespace cgt::cuda {
namespace {

using CudaInvoker = backend::InvokerOf<Callable>;
using CallInputs = backend::CallInputs<Buffer>;

// Runs the user's function, turning what it throws (and a failed kernel launch) into an error.
Result<Values> invoke(backend::Invoker& invoker, Context& context, const Inputs& inputs) {
  auto outputs = backend::call_function(static_cast<CudaInvoker&>(invoker).fn, context, inputs);
  if (!outputs) return outputs;
  if (const cudaError_t launch = cudaGetLastError(); launch != cudaSuccess) {
    return fail(Errc::function_failed,
                std::string("a kernel of the function failed to launch: ") + cudaGetErrorString(launch));
  }
  return outputs;
}

// Whether the graph's byte-span copy reproduces `source` (a view inside its storage, which
// Backend::describe checked): its elements must not overlap (broadcast dimensions aside, copied
// once) nor run backwards. Other views are gathered element by element into a contiguous slot.
bool copies_as_span(const Buffer& source);

// Free memory of the current device (0 if CUDA cannot tell).
std::size_t free_device_bytes() {
  std::size_t free = 0;
  std::size_t total = 0;
  return cudaMemGetInfo(&free, &total) == cudaSuccess ? free : 0;
}

// The layout of a copied input's slot (`CudaCapture::make_slots`): the source's, or contiguous where
// it is gathered.
Layout slot_layout(const Buffer& source) {
  return copies_as_span(source) ? source.layout().restrided(0, source.sizes(), source.strides())
                                : Layout::contiguous(source.type(), source.sizes());
}

bool copies_as_span(const Buffer& source) {
  return std::ranges::none_of(source.strides(), [](std::int64_t stride) { return stride < 0; }) &&
         source.layout().is_injective_apart_from_broadcast();
}

// Whether `source` has `slot`'s layout wherever it steps: equal strides along every dimension of
// more than one element. The stride of a dimension of size 1 is never stepped along (the shape key
// counts it as 0, so calls that differ only there share a graph), and the span a copy covers is
// the same whatever it is.
bool same_steps(const Buffer& source, const Buffer& slot) {
  const auto sizes = source.sizes();
  const auto a = source.strides();
  const auto b = slot.strides();
  if (a.size() != b.size()) return false;
  for (std::size_t d = 0; d < a.size(); ++d) {
    if (sizes[d] != 1 && a[d] != b[d]) return false;
  }
  return true;
}

// The gather of `source`'s elements, row-major, into the contiguous `slot`.
kernels::Gather gather_of(const Buffer& source, const Buffer& slot) {
  kernels::Gather gather;
  gather.source = source.data();
  gather.target = slot.data();
  gather.rank = static_cast<int>(source.rank());
  for (std::size_t d = 0; d < source.rank(); ++d) {
    gather.sizes[d] = source.sizes()[d];      // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index)
    gather.strides[d] = source.strides()[d];  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index)
  }
  gather.element_bytes = static_cast<int>(element_size(source.type()));
  gather.count = static_cast<long long>(source.numel());
  return gather;
}

// What owns a cuda pool's instantiated graph: the executable and the graph it came from (destroyed
// in that order).
struct Instantiated {
  kernels::GraphHandle origin;
  kernels::ExecHandle exec;
};
using SharedExec = kernels::SharedExec<Instantiated>;

// A host-decided recording's run (ControlFlow::on_host): segment 0 is `first`, segment i
// `later[i - 1]`.
Result<void> run_segments(const backend::HostDecisions& decisions, cudaGraphExec_t first,
                          const std::vector<Instantiated>& later, cudaStream_t stream) {
  return kernels::run_segments(decisions, first, [&](std::size_t i) { return later[i - 1].exec.get(); }, stream);
}

// A captured graph, instantiated (or sharing an executable) and uploaded, with its input slots
// and outputs. The graph begins with the copy nodes of the copied inputs (kernels::max_copies
// inputs each, in input order), which each replay points at the call's inputs.
class CudaRecording final : public backend::Recording {
 public:
  struct Copy {
    std::size_t input = 0;
    Buffer slot;
    /// Gathered element by element before each launch (its job in the copy node is empty): an
    /// input whose elements overlap or run backwards, in a contiguous slot.
    bool gathered = false;
  };

  // `own_graph` is null when the recording's graph is `exec`'s origin (owned there).
  CudaRecording(const std::shared_ptr<SharedExec>& exec, kernels::GraphHandle own_graph,
                std::vector<kernels::CopyBatch> captured, cudaStream_t stream, int device, const void* context,
                std::vector<Copy> copies, Values outputs, GraphCounts& counts, std::vector<Instantiated> later,
                backend::HostDecisions decisions, SegmentHold uses, std::size_t executable_bytes)
      : later_(std::move(later)),
        decisions_(std::move(decisions)),
        own_graph_(std::move(own_graph)),
        graph_(exec, own_graph_ ? own_graph_.get() : exec->owner.origin.get(), std::move(captured)),
        stream_(stream),
        device_(device),
        context_(context),
        copies_(std::move(copies)),
        outputs_(std::make_shared<Values>(std::move(outputs))),
        counts_(counts),
        uses_(std::move(uses)),
        executable_bytes_(executable_bytes) {
    for (const Copy& copy : copies_) slot_bytes_ += copy.slot.storage_bytes();
  }
  CudaRecording(const CudaRecording&) = delete;
  CudaRecording& operator=(const CudaRecording&) = delete;
  ~CudaRecording() override = default;

  [[nodiscard]] const std::shared_ptr<SharedExec>& shared_exec() const noexcept { return graph_.share(); }

  [[nodiscard]] bool checks_arguments() const noexcept override {
    return std::ranges::any_of(copies_, [](const Copy& copy) { return !copy.gathered; });
  }
  // A copy node copies the covered span byte for byte, which is the input's elements only in the
  // layout the slot was made with (a gathered input takes any layout).
  [[nodiscard]] Result<void> check(std::span<const backend::ArgSlot> args) const override {
    for (const Copy& copy : copies_) {
      if (copy.gathered) continue;
      const Buffer& source = *static_cast<const Buffer*>(args[copy.input].value);
      if (same_steps(source, copy.slot)) continue;
      return fail(Errc::wrong_shape,
                  "input " + std::to_string(copy.input) +
                      " has another layout than when its graph was recorded; pass it with the recorded strides (a "
                      "contiguous buffer keeps them)",
                  {}, -1, static_cast<std::int32_t>(copy.input));
    }
    return {};
  }

  [[nodiscard]] Result<void> replay(std::span<const backend::ArgSlot> args) override {
    // The gathers and the node updates act on the current device: the pool's, for this replay.
    CurrentDevice current;
    if (auto set = current.enter(device_, context_); !set) return set;
    if (!graph_.is_loaded()) {
      if (auto loaded = checked(graph_.load(), "loading a graph into its shared executable"); !loaded) return loaded;
      ++counts_.switched;
    }
    // Equal layouts: the covered span is copied as it is (a broadcast dimension once). Element
    // types are equal: the engine checks every call's against the first call's.
    for (std::size_t first = 0; first < copies_.size(); first += kernels::max_copies) {
      const std::size_t node = first / kernels::max_copies;
      kernels::CopyBatch batch = graph_.nodes()[node].batch;
      for (int job = 0; job < batch.count; ++job) {
        const Copy& copy = copies_[first + static_cast<std::size_t>(job)];
        const Buffer& source = *static_cast<const Buffer*>(args[copy.input].value);
        if (copy.gathered) {
          if (auto gathered = checked(kernels::gather(gather_of(source, copy.slot), stream_), "gathering an input");
              !gathered) {
            return gathered;
          }
          continue;
        }
        // Backend::describe checked that the source fits its storage, check() that it steps as the slot.
        batch.jobs[job].source = source.data();  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index)
      }
      if (auto pointed = checked(graph_.retarget(node, batch), "pointing a graph at its inputs"); !pointed) {
        return pointed;
      }
    }
    if (!decisions_.empty()) return run_segments(decisions_, graph_.exec(), later_, stream_);
    return launch_graph(graph_.exec(), stream_, current, "launching a graph");
  }
  // Outputs are plain device addresses: they never need rebinding.
  void bind_outputs(std::span<backend::StorageHandle* const> /*storages*/) override {}
  [[nodiscard]] const void* output(std::size_t i) const override { return &(*outputs_)[i]; }
  /// Held apart: an evicted recording goes, its outputs stay for the leases of its past replays.
  [[nodiscard]] std::shared_ptr<const void> outputs_owner() const override { return outputs_; }
  [[nodiscard]] std::size_t executable_bytes() const noexcept override { return executable_bytes_; }
  [[nodiscard]] std::size_t slot_bytes() const noexcept override { return slot_bytes_; }

 private:
  // Where the host decides the loops and branches: the segments after the first (graph_), and
  // their order. Empty otherwise.
  std::vector<Instantiated> later_;
  backend::HostDecisions decisions_;
  kernels::GraphHandle own_graph_;            // a re-recording's graph, or null: the executable's origin
  kernels::GraphInExec<Instantiated> graph_;  // this recording's graph in its (shared) executable
  cudaStream_t stream_;
  int device_;
  const void* context_;  // the pool's (CudaDevice::context_)
  std::vector<Copy> copies_;
  std::shared_ptr<Values> outputs_;  // shared: see outputs_owner (stamped through `output`: not const)
  GraphCounts& counts_;
  SegmentHold uses_;  // the arena's segments its capture allocated in: its replays use them
  std::size_t executable_bytes_;
  std::size_t slot_bytes_ = 0;
};

}  // namespace

// The engine's side of the CUDA device of one pool: its arena, its stream, its graphs' counts. A
// program sees it through its view (`cuda::Device`), which it owns.
class CudaDevice final : public backend::ArenaDevice<Buffer> {
 public:
  /// `sleepable`: the arena's segments are virtual memory (`kernels::virtual_segments`, which the
  /// caller found available). REQUIRES: `device` current.
  CudaDevice(int device, cudaStream_t stream, const ArenaOptions& arena, bool poison_dead_memory,
             bool update_graphs_in_place = true, bool rewrite_memset_nodes = true, bool rewrite_memcpy_nodes = false,
             std::optional<kernels::VirtualSegments> sleepable = std::nullopt);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  [[nodiscard]] cuda::Device& view() noexcept { return view_; }

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  /// See `cuda::Device`, the view.
  [[nodiscard]] Result<void> synchronize() const;
  [[nodiscard]] Result<void> wait_for(const CudaDevice& producer) const;
  [[nodiscard]] const GraphCounts& graph_counts() const noexcept { return counts_; }

  [[nodiscard]] std::int32_t device_index() const noexcept override { return device_; }
  [[nodiscard]] Result<backend::RunResult> run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                               backend::RunMode mode) override;
  [[nodiscard]] Result<std::unique_ptr<backend::Capture>> begin_recording(backend::Invoker& fn,
                                                                          std::span<const backend::ArgSlot> args,
                                                                          const backend::RecordPlan& plan) override;
  void release(backend::StorageHandle& storage, backend::Release why, std::string_view function) override;
  void adopt(backend::StorageHandle& storage) override;
  [[nodiscard]] Result<std::shared_ptr<void>> rescue(const backend::StorageHandle& storage) override;
  [[nodiscard]] std::shared_ptr<const void> rebase(const void* value, const backend::StorageHandle& from,
                                                   const std::shared_ptr<void>& rescued) override;
  /// Batch buckets are not supported: padding needs a fill kernel per element type, which cgt.cuda
  /// does not have (`add_function` with `buckets` fails with `invalid_argument`, saying this).
  [[nodiscard]] std::string why_no_buckets() const override {
    return "cgt.cuda cannot pad inputs yet (it has no fill kernel for its buffers): use graph_sizes and pad to "
           "those sizes yourself, or cgt.torch, which pads";
  }
  void shutdown() override;

  [[nodiscard]] Buffer allocate_in_pool(Context& context, ElementType type, std::span<const std::int64_t> sizes);
  [[nodiscard]] Result<backend::RunResult> finish(Context& context, Values&& outputs);
  /// Makes the streams that capture conditional nodes' bodies, once, before a capture begins (a
  /// stream is not made during one).
  [[nodiscard]] Result<void> make_body_streams();

 private:
  friend class Context;
  friend class CudaCapture;
  [[nodiscard]] std::size_t slot_bytes(const Buffer& source) const override;
  /// Segments are obtained and given back with the pool's device current.
  [[nodiscard]] Result<void> on_pool_device(const std::function<void()>& change) override;

  cuda::Device view_{*this};

  int device_;
  cudaStream_t stream_;
  const void* context_;  // the driver context `stream_` was made in: a replay's test that the device is current
  bool update_in_place_;
  bool rewrite_memsets_;
  bool rewrite_memcpys_;
  GraphCounts counts_;
  // One per level of conditional nodes nested in one another (Context::body_stream); empty until
  // the first recording.
  std::vector<cudaStream_t> body_streams_;
};

int device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

cudaStream_t Context::stream() const noexcept {
  return body_stream_ != nullptr ? body_stream_ : device_.stream_;
}

int Context::pool_device() const noexcept {
  return device_.device_;
}

void Context::free_allocations_since(std::size_t from) {
  if (target_ == Target::pool) backend::free_since(*device_.arena_, allocations_, from);
}

cudaStream_t Context::body_stream(std::size_t depth) const noexcept {
  return depth < device_.body_streams_.size() ? device_.body_streams_[depth] : nullptr;
}

Buffer Context::allocate(ElementType type, std::span<const std::int64_t> sizes) {
  if (target_ == Target::device_memory) {
    auto buffer = Buffer::make(type, sizes, device_.device_);
    if (buffer) return *std::move(buffer);
    if (buffer.error().code == Errc::invalid_argument) throw InvalidArgument(buffer.error().message);
    throw OutOfMemory(buffer.error().message);
  }
  return device_.allocate_in_pool(*this, type, sizes);
}

CudaDevice::CudaDevice(int device, cudaStream_t stream, const ArenaOptions& arena, bool poison_dead_memory,
                       bool update_graphs_in_place, bool rewrite_memset_nodes, bool rewrite_memcpy_nodes,
                       std::optional<kernels::VirtualSegments> sleepable)
    : ArenaDevice(poison_dead_memory),
      device_(device),
      stream_(stream),
      context_(current_context()),  // make_pool made the stream with the device current
      update_in_place_(update_graphs_in_place),
      rewrite_memsets_(rewrite_memset_nodes),
      rewrite_memcpys_(rewrite_memcpy_nodes) {
  ArenaOptions options = arena;
  options.source.obtain = [device, context = context_](std::size_t bytes, std::size_t /*alignment*/) -> std::byte* {
    void* memory = nullptr;  // cudaMalloc aligns to at least 256 bytes
    CurrentDevice current;
    if (!current.enter(device, context)) return nullptr;
    // A recording may need a segment its warm-up did not (a loop's counter, made only when
    // recording): cudaMalloc is no work of the stream, but the capturing thread's mode refuses it
    // and breaks the capture. Relaxed for this call only, as libtorch's allocator does.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    const cudaError_t made = cudaMalloc(&memory, bytes);
    if (exchanged) (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (made != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return static_cast<std::byte*>(memory);
  };
  options.source.give_back = [](std::byte* segment, std::size_t /*bytes*/, std::size_t /*alignment*/) {
    (void)cudaFree(segment);
  };
  if (sleepable) {
    // Virtual memory: the arena asks with the device current (a call, on_pool_device, shutdown);
    // obtain enters it too, as above, since a segment may be made from any of those.
    options.source.obtain = [device, context = context_, obtain = std::move(sleepable->obtain)](
                                std::size_t bytes, std::size_t alignment) -> std::byte* {
      CurrentDevice current;
      if (!current.enter(device, context)) return nullptr;
      return obtain(bytes, alignment);
    };
    options.source.give_back = std::move(sleepable->give_back);
    options.source.unback = std::move(sleepable->unback);
    options.source.reback = std::move(sleepable->reback);
  }
  arena_ = std::make_unique<Arena>(std::move(options));
}

CudaDevice::~CudaDevice() {
  shutdown();
}

Result<void> CudaDevice::synchronize() const {
  return checked(cudaStreamSynchronize(stream_), "waiting for the pool's stream");
}

Result<void> CudaDevice::wait_for(const CudaDevice& producer) const {
  if (&producer == this) return {};
  CurrentDevice on_producer;  // an event is recorded on a stream of its own device
  if (auto entered = on_producer.enter(producer.device_, producer.context_); !entered) return entered;
  cudaEvent_t event = nullptr;
  if (auto made = checked(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "making an event"); !made) {
    return made;
  }
  // Destroying the event right after the wait is enqueued is allowed: the wait keeps what it needs.
  auto recorded = checked(cudaEventRecord(event, producer.stream_), "recording an event on the producer's stream");
  if (recorded) recorded = checked(cudaStreamWaitEvent(stream_, event, 0), "waiting for the producer's stream");
  (void)cudaEventDestroy(event);
  return recorded;
}

Buffer CudaDevice::allocate_in_pool(Context& context, ElementType type, std::span<const std::int64_t> sizes) {
  const auto bytes = contiguous_bytes(type, sizes);
  if (!bytes) throw InvalidArgument("Context::allocate: " + bytes.error().message);
  auto memory = arena_->allocate(*bytes);
  if (!memory) throw OutOfMemory(memory.error().message);
  context.allocations_.push_back(backend::address_of(*memory));
  return Buffer::view_of(*memory, *bytes, type, sizes, device_);
}

Result<backend::RunResult> CudaDevice::finish(Context& context, Values&& outputs) {
  // Temporaries die with the call (kernels on the pool's stream that use them run before any
  // later allocation's kernels, so the memory can be reused at once).
  return backend::finish_call(*arena_, context.allocations_, std::move(outputs));
}

Result<backend::RunResult> CudaDevice::run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                           backend::RunMode mode) {
  CurrentDevice current;
  if (auto set = current.enter(device_, context_); !set) return std::unexpected(set.error());
  const CallInputs inputs(args);
  const bool warmup = mode == backend::RunMode::warmup;
  Context context(*this, warmup ? Context::Target::pool : Context::Target::device_memory, false);
  std::optional<backend::ArenaTraceScope> trace;
  if (warmup) trace.emplace(*arena_);
  auto outputs = invoke(fn, context, inputs.view());
  if (!outputs) {
    backend::free_all(*arena_, context.allocations_);
    return std::unexpected(std::move(outputs.error()));
  }
  auto finished = finish(context, std::move(*outputs));
  if (finished && trace) finished->allocations = std::make_shared<const ArenaTrace>(trace->take());
  return finished;
}

namespace {

// Why a capture cannot end: the function broke it (a synchronisation, a copy to the host), and
// would again at these shapes; the engine runs them eagerly, as on the other backends.
std::string why_uncapturable(cudaError_t ended) {
  return std::string(cudaGetErrorName(ended)) + " (" + cudaGetErrorString(ended) +
         "): the function's work cannot be captured into a graph (a synchronisation such as cudaDeviceSynchronize or "
         "cudaStreamSynchronize, a copy to pageable host memory, work on a stream it does not join back)";
}

}  // namespace

// A recording in progress on the pool's device (backend::Capture): slots for the copied inputs,
// the input copies and the function captured on the pool's stream, the executable, the first launch.
// The pool's device is current while it lives.
class CudaCapture final : public backend::Capture {
 public:
  CudaCapture(CudaDevice& device, backend::Invoker& fn, std::span<const backend::ArgSlot> args,
              const backend::RecordPlan& plan)
      : device_(device),
        fn_(fn),
        plan_(plan),
        inputs_(args),
        context_(device, Context::Target::pool, true),
        trace_(*device.arena_) {}
  CudaCapture(const CudaCapture&) = delete;
  CudaCapture& operator=(const CudaCapture&) = delete;
  // Unfinished, it gives back every block it allocated; finished, the outputs hold them.
  ~CudaCapture() override { backend::free_all(arena(), context_.allocations_); }

  [[nodiscard]] Result<void> enter_device() { return current_.enter(device_.device_, device_.context_); }

  // Copied inputs get a slot of the same layout in the pool; the graph copies the covered span,
  // byte for byte. That is the view's elements only when no two share memory (broadcast aside,
  // copied once) and the first is the lowest; other views get a contiguous slot, gathered element
  // by element before each launch of the graph.
  [[nodiscard]] Result<void> make_slots() override {
    for (std::size_t i = 0; i < inputs_.values.size(); ++i) {
      if (!plan_.copy_input[i]) continue;
      const Buffer& source = inputs_.values[i];
      const bool gathered = !copies_as_span(source);
      const Layout layout = slot_layout(source);
      const std::size_t bytes = std::max<std::size_t>(layout.required_bytes(), 1);
      auto memory = arena().allocate(bytes);
      if (!memory) return std::unexpected(std::move(memory.error()));
      context_.allocations_.push_back(backend::address_of(*memory));
      const Buffer slot = source.on_storage(*memory, bytes).with_layout(layout);
      copies_.push_back({.input = i, .slot = slot, .gathered = gathered});
      if (gathered) {
        // Filled now, before the capture (the graph's first launch reads it), and before each replay.
        if (auto filled = checked(kernels::gather(gather_of(source, slot), stream()), "gathering an input"); !filled) {
          return filled;
        }
      }
      // The covered span only (0 bytes for a view without elements, or one gathered apart).
      jobs_.push_back(
          {.source = source.data(), .target = slot.data(), .bytes = gathered ? 0 : layout.required_bytes()});
      inputs_.values[i] = slot;
    }
    return {};
  }

  [[nodiscard]] backend::CaptureOutcome capture() override {
    const bool host_decides = plan_.control_flow == backend::ControlFlow::on_host;
    if (!host_decides) {
      if (auto streams = device_.make_body_streams(); !streams) return {.work = std::move(streams)};
    }
    if (auto began = checked(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "beginning a capture");
        !began) {
      return {.work = std::move(began)};
    }
    const cudaError_t copy_captured = kernels::capture_copies(jobs_, stream(), nodes_);
    if (host_decides) context_.segments_ = &segments_;
    auto outputs = copy_captured == cudaSuccess
                       ? invoke(fn_, context_, inputs_.view())
                       : Result<Values>(fail(Errc::backend_error, std::string("capturing the input copies failed: ") +
                                                                      cudaGetErrorString(copy_captured)));
    context_.segments_ = nullptr;
    if (host_decides && outputs && context_.uncapturable_.empty()) {
      if (const cudaError_t cut = segments_.cut(stream()); cut != cudaSuccess) {
        context_.give_up_recording(std::string("cutting the capture's last segment failed: ") + cudaGetErrorString(cut),
                                   false);
      }
    }
    cudaGraph_t ended_graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream(), &ended_graph);  // always: the stream must leave capture
    graph_.reset(ended_graph);
    // A loop or branch that could not be a conditional node: recorded again, the host deciding.
    const bool given_up = !context_.uncapturable_.empty();
    if (!outputs || ended != cudaSuccess || given_up) {
      graph_.reset();
      (void)cudaGetLastError();
      return {.work = backend::status_of(outputs),
              .broken = ended != cudaSuccess || given_up,
              .broken_because = ended != cudaSuccess ? why_uncapturable(ended) : context_.uncapturable_,
              .needs_host_decisions = ended == cudaSuccess && given_up && context_.host_may_decide_};
    }
    // A graph CUDA cannot cut (a clone refused): those shapes run eagerly.
    if (host_decides) {
      if (const cudaError_t split = segments_.cuts.split(graph_.get(), later_graphs_); split != cudaSuccess) {
        (void)cudaGetLastError();
        graph_.reset();
        later_graphs_.clear();
        return {.broken = true,
                .broken_because = std::string("cutting the graph into segments failed: ") + cudaGetErrorString(split)};
      }
    }
    outputs_ = std::move(*outputs);
    captured_ = kernels::batches_of(nodes_);
    return {};
  }

  // Slots and temporaries the outputs do not view are freed; what they keep stays in allocations_
  // until the recording is made.
  [[nodiscard]] Result<void> settle_outputs() override {
    return backend::settle_outputs(arena(), context_.allocations_, std::span<Buffer>(outputs_));
  }

  // Memset nodes (and, when asked, one-row device-to-device memcpy nodes) become kernel nodes: the
  // graph's launches then cost what its kernels cost (node_rewrite.hpp).
  [[nodiscard]] Result<backend::NodeRewrites> rewrite_nodes() override {
    kernels::NodeRewrites rewrites;
    if (auto rewritten = checked(
            kernels::rewrite_for_launch(
                graph_.get(), {.memsets = device_.rewrite_memsets_, .memcpys = device_.rewrite_memcpys_}, rewrites),
            "replacing a graph's memset and memcpy nodes by kernels");
        !rewritten) {
      return std::unexpected(rewritten.error());
    }
    return backend::NodeRewrites{.memsets_rewritten = rewrites.memsets_rewritten,
                                 .memsets_kept = rewrites.memsets_kept,
                                 .memcpys_rewritten = rewrites.memcpys_rewritten,
                                 .memcpys_kept = rewrites.memcpys_kept};
  }

  // A host-decided recording has executables of its own for every segment.
  [[nodiscard]] bool allows_update_in_place() const noexcept override {
    return device_.update_in_place_ && segments_.decisions.empty();
  }

  // The earlier recording's executable, updated to run this graph when the topology is the same;
  // the recording then owns its graph.
  [[nodiscard]] Result<bool> load_into(backend::Recording& earlier) override {
    const std::shared_ptr<SharedExec>& candidate = static_cast<CudaRecording&>(earlier).shared_exec();
    if (!kernels::load_if_same_topology(candidate->exec, candidate->nodes, graph_.get(), nodes_, captured_)) {
      return false;
    }
    shared_ = candidate;
    // It runs this graph now, no recording's until `finish` makes this one's: a capture given up
    // before then leaves the earlier recording to load its graph back at its next replay.
    shared_->loaded = nullptr;
    return true;
  }

  [[nodiscard]] Result<void> instantiate() override {
    // What the executables take is measured: CUDA has no query for it. Another thread's
    // allocation meanwhile would count too.
    const std::size_t free_before = free_device_bytes();
    if (auto made = instantiate_and_upload(); !made) return made;
    const std::size_t free_after = free_device_bytes();
    executable_bytes_ = free_before > free_after ? free_before - free_after : 0;
    return {};
  }

  [[nodiscard]] Result<void> instantiate_and_upload() {
    cudaGraphExec_t exec = nullptr;
    if (auto ok = checked(cudaGraphInstantiate(&exec, graph_.get(), 0), "instantiating a graph"); !ok) {
      // A body the checks let through but CUDA refuses in a conditional node (NCCL collectives,
      // NCCL issue 1986): the host decides instead.
      if (context_.made_conditional_nodes_) ok.error().cause = Cause::conditional_unavailable;
      return ok;
    }
    shared_ = std::make_shared<SharedExec>(Instantiated{.origin = std::move(graph_), .exec = kernels::ExecHandle(exec)},
                                           exec, std::move(nodes_));
    if (auto uploaded = checked(cudaGraphUpload(exec, stream()), "uploading a graph"); !uploaded) return uploaded;
    for (kernels::GraphHandle& segment : later_graphs_) {
      cudaGraphExec_t made = nullptr;
      if (auto ok = checked(cudaGraphInstantiate(&made, segment.get(), 0), "instantiating a graph segment"); !ok) {
        return ok;
      }
      later_.push_back(Instantiated{.origin = std::move(segment), .exec = kernels::ExecHandle(made)});
      if (auto uploaded = checked(cudaGraphUpload(made, stream()), "uploading a graph segment"); !uploaded) {
        return uploaded;
      }
    }
    later_graphs_.clear();
    return {};
  }

  // Capture ran nothing: this launch copies the inputs and produces the first outputs.
  [[nodiscard]] Result<void> run_first() override {
    if (!segments_.decisions.empty()) return run_segments(segments_.decisions, shared_->exec, later_, stream());
    return checked(cudaGraphLaunch(shared_->exec, stream()), "launching a new graph");
  }

  [[nodiscard]] Result<backend::Recorded> finish() override {
    backend::Recorded recorded;
    recorded.recording = std::make_unique<CudaRecording>(
        shared_, std::move(graph_), std::move(captured_), stream(), device_.device_, device_.context_,
        std::move(copies_), outputs_, device_.counts_, std::move(later_), std::move(segments_.decisions),
        arena().hold(trace_.take().segments()), executable_bytes_);
    recorded.first_outputs = backend::describe_outputs(arena(), context_.allocations_, std::move(outputs_));
    context_.allocations_.clear();
    return recorded;
  }

  [[nodiscard]] GraphCounts* counts() noexcept override { return &device_.counts_; }

 private:
  [[nodiscard]] Arena& arena() const noexcept { return *device_.arena_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return device_.stream_; }

  CurrentDevice current_;  // declared first: the device is put back after everything below is gone
  CudaDevice& device_;
  backend::Invoker& fn_;
  backend::RecordPlan plan_;
  CallInputs inputs_;               // the function's inputs: the copied ones replaced by their slots
  Context context_;                 // the pool blocks allocated so far, slots first
  backend::ArenaTraceScope trace_;  // which segments its blocks fall in (its graph uses them)
  std::size_t executable_bytes_ = 0;
  std::vector<CudaRecording::Copy> copies_;
  std::vector<kernels::CopyJob> jobs_;              // the graph's copy nodes copy the covered spans
  std::vector<kernels::CopyNode> nodes_;            // the copy nodes, as captured
  std::vector<kernels::CopyBatch> captured_;        // what they copied then
  kernels::GraphHandle graph_;                      // the captured graph, until an executable of its own owns it
  std::shared_ptr<SharedExec> shared_;              // the executable it runs in: its own, or an earlier recording's
  Values outputs_;                                  // the function's, from the capture
  HostSegments segments_;                           // where the host decides its loops and branches: its cuts
  std::vector<kernels::GraphHandle> later_graphs_;  // segments after the first, as cut, until instantiated
  std::vector<Instantiated> later_;                 // their executables
};

Result<std::unique_ptr<backend::Capture>> CudaDevice::begin_recording(backend::Invoker& fn,
                                                                      std::span<const backend::ArgSlot> args,
                                                                      const backend::RecordPlan& plan) {
  auto capture = std::make_unique<CudaCapture>(*this, fn, args, plan);
  if (auto entered = capture->enter_device(); !entered) return std::unexpected(entered.error());
  return capture;
}

std::size_t CudaDevice::slot_bytes(const Buffer& source) const {
  return std::max<std::size_t>(slot_layout(source).required_bytes(), 1);
}

Result<void> CudaDevice::on_pool_device(const std::function<void()>& change) {
  CurrentDevice current;
  if (auto entered = current.enter(device_, context_); !entered) return entered;
  // Work on the stream may still use the memory about to go (a replay's kernels): unmapping pages,
  // unlike cudaFree, does not wait for it.
  if (auto waited = checked(cudaStreamSynchronize(stream_), "waiting for the pool's stream"); !waited) return waited;
  change();
  return {};
}

void CudaDevice::release(backend::StorageHandle& storage, backend::Release /*why*/, std::string_view /*function*/) {
  if (!arena_) return;
  // Zero bytes: a zero-element output, which points at no device memory (no_elements_storage).
  if (poison_ && storage.bytes != 0) {
    CurrentDevice current;
    // Poisoning is a debugging aid: without the pool's device current, it is skipped.
    if (current.enter(device_, context_)) {
      (void)cudaMemsetAsync(backend::pointer_to(storage.address), 0xFF, storage.bytes, stream_);
    }
  }
  if (storage.owned_by_allocator) (void)arena_->free(storage.address);  // NOLINT(bugprone-unused-return-value)
}

void CudaDevice::adopt(backend::StorageHandle& /*storage*/) {}

Result<std::shared_ptr<void>> CudaDevice::rescue(const backend::StorageHandle& storage) {
  CurrentDevice current;
  if (auto set = current.enter(device_, context_); !set) return std::unexpected(set.error());
  auto copy = device_allocation(storage.bytes, "copying an output out of the pool");
  if (!copy) return copy;
  if (auto copied = checked(cudaMemcpyAsync(copy->get(), backend::pointer_to(storage.address), storage.bytes,
                                            cudaMemcpyDeviceToDevice, stream_),
                            "copying an output out of the pool");
      !copied) {
    return std::unexpected(copied.error());
  }
  return copy;
}

std::shared_ptr<const void> CudaDevice::rebase(const void* value, const backend::StorageHandle& from,
                                               const std::shared_ptr<void>& rescued) {
  const Buffer& original = *static_cast<const Buffer*>(value);
  return std::make_shared<Buffer>(original.on_storage(static_cast<std::byte*>(rescued.get()), from.bytes, rescued));
}

void CudaDevice::shutdown() {
  if (!arena_) return;
  CurrentDevice current;
  // Without the pool's device current the wait is skipped: the cudaFree of the segments below
  // waits for the device anyway.
  if (current.enter(device_, context_)) (void)cudaStreamSynchronize(stream_);
  arena_.reset();  // gives the segments back (cudaFree)
  (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
  for (cudaStream_t body : body_streams_) (void)cudaStreamDestroy(body);
  body_streams_.clear();
}

Result<void> CudaDevice::make_body_streams() {
  constexpr std::size_t kNestedBodies = 4;  // a loop in a branch in a loop in a branch
  while (body_streams_.size() < kNestedBodies) {
    cudaStream_t body = nullptr;
    if (auto made = checked(cudaStreamCreateWithFlags(&body, cudaStreamNonBlocking), "creating a body's stream");
        !made) {
      return made;
    }
    body_streams_.push_back(body);
  }
  return {};
}

Result<Buffer> Backend::take(const Buffer& buffer) {
  if (buffer.empty()) return Buffer{};
  CurrentDevice current;  // the copy goes on the buffer's device
  if (auto set = current.enter(buffer.device()); !set) return std::unexpected(set.error());
  // The work that wrote the buffer may be on a non-blocking pool stream, which the legacy default
  // stream of cudaMemcpy does not wait for; and a device-to-device cudaMemcpy may return before
  // it is done. So: wait, copy, wait.
  if (auto idle = checked(cudaDeviceSynchronize(), "waiting for the device before copying an output"); !idle) {
    return std::unexpected(idle.error());
  }
  auto copy = device_allocation(buffer.storage_bytes(), "copying an output");
  if (!copy) return std::unexpected(std::move(copy.error()));
  if (auto copied = checked(cudaMemcpy(copy->get(), buffer.storage(), buffer.storage_bytes(), cudaMemcpyDeviceToDevice),
                            "copying an output");
      !copied) {
    return std::unexpected(copied.error());
  }
  if (auto done = checked(cudaDeviceSynchronize(), "copying an output"); !done) return std::unexpected(done.error());
  return buffer.on_storage(static_cast<std::byte*>(copy->get()), buffer.storage_bytes(), std::move(*copy));
}

std::unique_ptr<backend::Invoker> Backend::make_invoker(Callable&& fn) {
  return std::make_unique<CudaInvoker>(std::move(fn));
}

Device& Backend::view(backend::Device& device) noexcept {
  return static_cast<CudaDevice&>(device).view();
}

std::int32_t Device::index() const noexcept {
  return device_->device_index();
}

bool Device::contains(std::uintptr_t address) const noexcept {
  return device_->owns(address);
}

cudaStream_t Device::stream() const noexcept {
  return device_->stream();
}

const Arena& Device::arena() const noexcept {
  return *device_->arena();
}

Result<void> Device::synchronize() const {
  return device_->synchronize();
}

Result<void> Device::wait_for(const Device& producer) const {
  return device_->wait_for(*producer.device_);
}

const GraphCounts& Device::graph_counts() const noexcept {
  return device_->graph_counts();
}

Result<Pool> make_pool(PoolOptions options) {
  if (options.device < 0 || options.device >= device_count()) {
    return fail(Errc::backend_error, "no usable CUDA device " + std::to_string(options.device) + " (this machine has " +
                                         std::to_string(device_count()) + ")");
  }
  CurrentDevice current;
  if (auto set = current.enter(options.device); !set) return std::unexpected(set.error());
  cudaStream_t stream = nullptr;
  const unsigned flags = options.blocking_stream ? cudaStreamDefault : cudaStreamNonBlocking;
  if (auto created = checked(cudaStreamCreateWithFlags(&stream, flags), "creating the pool's stream"); !created) {
    return std::unexpected(created.error());
  }
  std::optional<kernels::VirtualSegments> sleepable;
  if (options.sleepable) {
    sleepable = kernels::virtual_segments(options.device);
    if (!sleepable) {
      (void)cudaStreamDestroy(stream);
      return fail(Errc::backend_error,
                  "PoolOptions::sleepable: the driver offers no virtual memory management (cuMemCreate, cuMemMap)");
    }
  }
  auto device = std::make_unique<CudaDevice>(options.device, stream, options.arena, options.poison_dead_memory,
                                             options.update_graphs_in_place, options.rewrite_memset_nodes,
                                             options.rewrite_memcpy_nodes, std::move(sleepable));
  return backend::make_pool<Pool>(std::move(device), std::move(options.tree));
}

}  // namespace cgt::cuda
