// Recording a pool function into a CUDA graph in the pool, and replaying it.
module;
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include "capture_cuts.hpp"
#include "generator_access.hpp"
#include "input_copy.hpp"
#include "node_rewrite.hpp"
#include "shared_exec.hpp"

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
import cgt.core;
import :internal;

namespace cgt::torch {
namespace {

// The offset of the device's default generator, which CUDAGraph::replay advances by what the
// graph draws.
std::uint64_t philox_offset(c10::DeviceIndex index) {
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(index);
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get<at::CUDAGeneratorImpl>()->philox_offset_per_thread();
}

// A segment after the first of a recording whose loops and branches the host decides: its graph
// and its executable (destroyed first).
struct LaterSegment {
  kernels::GraphHandle graph;
  kernels::ExecHandle exec;
};

// A host-decided recording's run (ControlFlow::on_host) on `stream`: segment 0 is `first`, segment
// i `later[i - 1]`; the host reads each decider between them. Such a graph draws no random
// numbers (end_capture refuses them), so every segment is launched directly.
Result<void> run_segments(const backend::HostDecisions& decisions, cudaGraphExec_t first,
                          const std::vector<LaterSegment>& later, cudaStream_t stream) {
  return kernels::run_segments(decisions, first, [&](std::size_t i) { return later[i - 1].exec.get(); }, stream);
}

}  // namespace

std::uint64_t random_offset_in_capture(c10::DeviceIndex index) {
  at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(index);
  const std::lock_guard<std::mutex> lock(generator.mutex());
  return cgt_torch_generator_access::state_of(*generator.get<at::CUDAGeneratorImpl>())->offset_intragraph_;
}

namespace {

// libtorch's CUDA generator is one per device, and CUDAGraph registers with it, unlocked, in
// capture_begin and its destructor (an unordered_set of graphs) and switches its capture mode in
// capture_begin and capture_end. Pools on several threads therefore take this lock around those
// steps; the function itself is captured without it, so captures on several threads overlap.
std::mutex& generator_registration() {
  static std::mutex mutex;
  return mutex;
}

// Deletes a graph under that lock (its destructor unregisters it from the generator).
struct GraphDeleter {
  void operator()(at::cuda::CUDAGraph* graph) const {
    const std::lock_guard<std::mutex> lock(generator_registration());
    delete graph;  // NOLINT(cppcoreguidelines-owning-memory)
  }
};
using GraphPtr = std::unique_ptr<at::cuda::CUDAGraph, GraphDeleter>;

// An input copied into a pool slot on every replay.
struct CopiedInput {
  std::size_t index = 0;
  at::Tensor slot;         // the slot without broadcast dimensions, over memory the pool owns
  bool memcpy_ok = false;  // contiguous, not broadcast: the graph's copy nodes copy it
  std::size_t bytes = 0;
  std::size_t node = 0;  // memcpy_ok: the copy node, and the job in it
  int job = 0;
};

// How to rebuild an output over a storage on replay.
struct OutputLayout {
  bool defined = false;
  std::vector<std::int64_t> sizes;
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  // A lazily conjugated or negated view (`y.conj()`, its imaginary part): the bit is part of its
  // values, and a replay's tensor over the storage must carry it too.
  bool conj = false;
  bool neg = false;
  at::Tensor recorded;  // outputs that are not pool memory (parameters, constants) are returned as recorded
};

// Are `tensor`'s bytes its values? Not for a lazily conjugated or negated view (`z.conj()`, the
// imaginary part of one): libtorch applies the bit when it reads it, and `copy_` writes the values
// it stands for, but a copy node copying its bytes would hand the function the unconjugated ones.
bool bytes_are_values(const at::Tensor& tensor) {
  return !tensor.is_conj() && !tensor.is_neg();
}

// Is `tensor`, a replay's output, still the tensor bind_outputs built: over `storage`, with the
// recorded layout, not requiring grad? A borrowed `const at::Tensor&` still allows in-place changes
// of its metadata (`t_()`, `unsqueeze_()`, `resize_()`, `as_strided_()`, `requires_grad_()`), and the
// recording hands the same tensor out again on its next replay: a changed one must be rebuilt, or
// the next replay would return another shape than the function's. A few comparisons per output.
bool as_built(const at::Tensor& tensor, const OutputLayout& layout, const c10::StorageImpl* storage) {
  const c10::TensorImpl* impl = tensor.unsafeGetTensorImpl();
  return impl->unsafe_storage().unsafeGetStorageImpl() == storage && impl->storage_offset() == layout.offset &&
         impl->sizes().equals(layout.sizes) && impl->strides().equals(layout.strides) &&
         impl->dtype() == caffe2::TypeMeta::fromScalarType(layout.dtype) && impl->is_conj() == layout.conj &&
         impl->is_neg() == layout.neg && !impl->requires_grad();
}

// The executable recordings share (kernels::SharedExec), owned by the CUDAGraph it was instantiated
// from. Graphs that draw random numbers are never shared: they replay through their own
// CUDAGraph::replay, which advances the generator.
using SharedExec = kernels::SharedExec<GraphPtr>;

// A recorded graph that begins with the copy nodes of its contiguous copied inputs; each replay
// points them at the call's inputs.
class TorchRecording final : public backend::Recording {
 public:
  // `own_graph`: a re-recording's graph, captured but not instantiated (it runs in `exec`); null
  // for the recording that instantiated `exec`. `direct_launch`: replays launch the executable
  // themselves, skipping CUDAGraph::replay (which the graph needs only when it draws random numbers).
  // `later`, `decisions`: where the host decides the function's loops and branches, the segments
  // after the first (this graph) and their order; empty otherwise.
  TorchRecording(const std::shared_ptr<SharedExec>& exec, GraphPtr own_graph, std::vector<kernels::CopyBatch> captured,
                 bool direct_launch, std::vector<CopiedInput> copies, std::vector<OutputLayout> layouts,
                 TorchDevice::State& state, std::vector<LaterSegment> later, backend::HostDecisions decisions)
      : later_(std::move(later)),
        decisions_(std::move(decisions)),
        own_graph_(std::move(own_graph)),
        graph_(exec, own_graph_ ? own_graph_->raw_cuda_graph() : exec->owner->raw_cuda_graph(), std::move(captured)),
        direct_launch_(direct_launch),
        copies_(std::move(copies)),
        layouts_(std::move(layouts)),
        outputs_(layouts_.size()),
        bound_(layouts_.size()),
        state_(state) {}
  TorchRecording(const TorchRecording&) = delete;
  TorchRecording& operator=(const TorchRecording&) = delete;
  ~TorchRecording() override {
    for (std::size_t i = 0; i < bound_.size(); ++i) {
      unbind(i);
    }
  }

  // The executable a re-recording of the same topology may update: none when the graph draws
  // random numbers (it replays through its own CUDAGraph::replay).
  [[nodiscard]] std::shared_ptr<SharedExec> shareable() const {
    return direct_launch_ && decisions_.empty() ? graph_.share() : nullptr;
  }

  Result<void> replay(std::span<const backend::ArgSlot> args) override {
    return guarded("replaying a graph", [&]() -> Result<void> {
      // Not c10's CUDAGuard: it also asks the driver, on every destruction, whether the previous
      // device has a primary context.
      kernels::CurrentDevice device;
      if (auto entered = device.enter(state_.index, state_.context); !entered) return entered;
      const c10::cuda::CUDAStream current = follow_last_caller(state_);
      if (!graph_.is_loaded()) {
        if (auto loaded = checked(graph_.load(), "loading a graph into its shared executable"); !loaded) return loaded;
        ++state_.graph_counts.switched;
      }
      if (auto pointed = point_copies_at(args); !pointed) return pointed;
      if (!decisions_.empty()) {
        if (auto ran = run_segments(decisions_, graph_.exec(), later_, current.stream()); !ran) return ran;
      } else if (!direct_launch_) {
        // Draws random numbers: CUDAGraph advances the generator's offset (unlocked in libtorch).
        const std::lock_guard<std::mutex> lock(generator_registration());
        graph_.shared().owner->replay();
      } else if (auto ran = kernels::launch_graph(graph_.exec(), current.stream(), device, "launching a graph"); !ran) {
        return ran;
      }
      for (std::size_t i = 0; i < bound_.size(); ++i) {
        TorchStorage* bound = bound_[i].get();
        if (bound == nullptr) continue;
        bound->held_by_replay = true;  // handed out now, until released (TorchDevice::memory)
        // A caller changed its metadata in place after an earlier replay (see as_built): rebuilt
        // at the same address, which stays registered as a view of the storage.
        if (!as_built(outputs_[i], layouts_[i], bound->impl.get())) rebuild(i, *bound);
      }
      return {};
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
      rebuild(i, *record);
      bound_[i] = std::static_pointer_cast<TorchStorage>(storages[i]->native_owner);
      record->add_view(&outputs_[i]);
    }
  }

  [[nodiscard]] const void* output(std::size_t i) const override { return &outputs_[i]; }

 private:
  // Contiguous inputs are copied by the graph's copy nodes, without the dispatcher; the rest by
  // copy_ (and their job in a copy node is emptied). Their dtype is the recorded one: the engine
  // checks every call's against the first call's. Copies are in node order, and every node has
  // at least one job.
  Result<void> point_copies_at(std::span<const backend::ArgSlot> args) {
    std::vector<kernels::CopyNode>& nodes = graph_.nodes();
    std::size_t node = 0;
    kernels::CopyBatch batch = nodes.empty() ? kernels::CopyBatch{} : nodes.front().batch;
    for (const CopiedInput& copy : copies_) {
      const at::Tensor& source = *static_cast<const at::Tensor*>(args[copy.index].value);
      const bool by_node = copy.memcpy_ok && source.is_contiguous() && bytes_are_values(source);
      if (!by_node) copy.slot.copy_(without_broadcast(source), /*non_blocking=*/true);
      if (!copy.memcpy_ok) continue;
      if (copy.node != node) {
        if (auto pointed = retarget(node, batch); !pointed) return pointed;
        node = copy.node;
        batch = nodes[node].batch;
      }
      kernels::CopyJob& job = batch.jobs[copy.job];  // NOLINT(cppcoreguidelines-pro-bounds-constant-array-index)
      job.source = by_node ? source.data_ptr() : nullptr;
      job.bytes = by_node ? copy.bytes : 0;
    }
    return nodes.empty() ? Result<void>{} : retarget(node, batch);
  }

  // Output `i` as the recording returned it, over `record`'s storage.
  void rebuild(std::size_t i, const TorchStorage& record) {
    const OutputLayout& layout = layouts_[i];
    outputs_[i] = tensor_over(record.impl, layout.dtype, layout.sizes, layout.strides, layout.offset);
    if (layout.conj) outputs_[i]._set_conj(true);
    if (layout.neg) outputs_[i]._set_neg(true);
  }

  Result<void> retarget(std::size_t node, const kernels::CopyBatch& batch) {
    return checked(graph_.retarget(node, batch), "pointing a graph at its inputs");
  }

  void unbind(std::size_t i) {
    if (bound_[i]) bound_[i]->remove_view(&outputs_[i]);
    bound_[i].reset();
  }

  std::vector<LaterSegment> later_;
  backend::HostDecisions decisions_;
  GraphPtr own_graph_;                    // a re-recording's graph, or null: the executable's owner's
  kernels::GraphInExec<GraphPtr> graph_;  // this recording's graph in its (shared) executable
  bool direct_launch_;
  std::vector<CopiedInput> copies_;
  std::vector<OutputLayout> layouts_;
  std::vector<at::Tensor> outputs_;  // handed out on replay; never resized (their addresses are registered)
  std::vector<std::shared_ptr<TorchStorage>> bound_;
  TorchDevice::State& state_;  ///< the pool's: its device, graph counts and last caller's stream
};

// Abandons a capture that failed, wherever it stopped (in capture_begin, in the function, in
// capture_end), and puts back everything capture_begin changed: the stream's capture, the device
// and pinned-host allocators' routing into the pool (and the pool use each counted), and the
// default generator's capture mode. Returns why the capture itself broke: a CUDA error when the
// stream's capture was invalidated or could not end (the function did something a graph cannot
// hold), cudaSuccess when it was intact (the function merely failed).
cudaError_t abandon_capture(at::cuda::CUDAGraph& graph, TorchDevice::State& state) {
  // It undoes what capture_begin registered with the generator, under the same lock.
  const std::lock_guard<std::mutex> registration(generator_registration());
  cudaError_t broken = cudaSuccess;
  cudaStream_t stream = state.stream.stream();
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (const cudaError_t asked = cudaStreamIsCapturing(stream, &status); asked != cudaSuccess) broken = asked;
  if (status == cudaStreamCaptureStatusInvalidated) broken = cudaErrorStreamCaptureInvalidated;
  if (status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &partial);
    if (ended != cudaSuccess && broken == cudaSuccess) broken = ended;
    if (partial != nullptr) (void)cudaGraphDestroy(partial);
  }
  // Routing that capture_begin started and capture_end did not end: ending it succeeds only then,
  // and only then is the pool use that capture_begin counted given back.
  try {
    allocator::endAllocateToPool(state.index, state.pool);
    allocator::releasePool(state.index, state.pool);
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): not routing, nothing to undo
  }
  try {
    at::HostAllocator* host = at::getHostAllocator(at::kCUDA);
    host->end_allocate_to_pool(state.pool);
    // The use capture_begin counted is kept, not given back: the host allocator refuses to count
    // a new use of a private pool whose uses fell to 0 (an internal assert in the next
    // capture_begin), and no other graph may hold one. Shutdown gives it back.
    ++state.host_pool_uses_kept;
  } catch (const std::exception&) {  // NOLINT(bugprone-empty-catch): not routing, nothing to undo
  }
  // capture_begin put the default generator in capture mode for this graph; capture_end would
  // have ended it. Left on, every later random draw of the process throws.
  try {
    at::Generator generator = at::cuda::detail::getDefaultCUDAGenerator(state.index);
    const std::lock_guard<std::mutex> lock(generator.mutex());
    at::CUDAGeneratorState* rng = cgt_torch_generator_access::state_of(*generator.get<at::CUDAGeneratorImpl>());
    // What capture_epilogue() does (it is not exported from libtorch_cuda).
    if (rng->capturing_ && rng->registered_graphs_.contains(&graph)) rng->capturing_ = false;
  } catch (const std::exception& error) {
    report_unreturnable("ending a failed capture's generator state", error);
  }
  (void)cudaGetLastError();  // a failed capture's error is not sticky: clear it for the next call
  return broken;
}

// What a capture that broke says, after "capture failed: " (the pipeline makes it an
// `uncapturable` error: permanent for this function and shape).
std::string why_uncapturable(cudaError_t why) {
  return std::string(cudaGetErrorName(why)) + " (" + cudaGetErrorString(why) +
         "): the function does something a CUDA graph cannot capture (a synchronisation such as .item() or nonzero, "
         "a copy to the host, work on a stream it does not join back)";
}

// Slots in the pool for the inputs that are copied, with the same layout as the inputs.
std::vector<at::Tensor> make_slots(TorchDevice::State& state, CallInputs& inputs, const backend::RecordPlan& plan) {
  std::vector<at::Tensor> slots(inputs.values.size());
  const PoolAllocation allocation(state);
  const NormalTensors normal;  // the function's writes to a slot must be seen
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!plan.copy_input[i]) continue;
    const at::Tensor& source = inputs.values[i];
    slots[i] = at::empty_strided(source.sizes(), source.strides(), source.options());
    without_broadcast(slots[i]).copy_(without_broadcast(source));
    inputs.values[i] = slots[i];
  }
  return slots;
}

// Non-owning views of the slots, for replays: the slot memory itself returns to the pool after the
// recording, like any memory the graph used (later graphs may reuse it between replays).
// `args`: the recording's inputs, which its copy nodes copy at the graph's first run (one whose bytes
// are not its values is copied by copy_ on every call instead).
std::vector<CopiedInput> describe_copies(const std::vector<at::Tensor>& slots, std::span<const backend::ArgSlot> args,
                                         c10::DeviceIndex device) {
  std::vector<CopiedInput> copies;
  std::size_t nodes = 0;  // copies by node so far
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (!slots[i].defined()) continue;
    const at::Tensor& slot = slots[i];
    const c10::Storage& storage = slot.storage();
    const at::Tensor view =
        tensor_over(storage_over(backend::address_of(storage.data_ptr().get()), storage.nbytes(), device),
                    slot.scalar_type(), slot.sizes(), slot.strides(), slot.storage_offset());
    CopiedInput copy;
    copy.index = i;
    copy.memcpy_ok = slot.is_contiguous() && bytes_are_values(*static_cast<const at::Tensor*>(args[i].value));
    copy.slot = without_broadcast(view);
    copy.bytes = static_cast<std::size_t>(slot.numel()) * slot.element_size();
    if (copy.memcpy_ok) {
      copy.node = nodes / kernels::max_copies;
      copy.job = static_cast<int>(nodes % kernels::max_copies);
      ++nodes;
    }
    copies.push_back(std::move(copy));
  }
  return copies;
}

// Captures the copy nodes of the contiguous copied inputs, from the recording's inputs.
cudaError_t capture_copies(const std::vector<CopiedInput>& copies, std::span<const backend::ArgSlot> args,
                           cudaStream_t stream, std::vector<kernels::CopyNode>& nodes) {
  std::vector<kernels::CopyJob> jobs;
  for (const CopiedInput& copy : copies) {
    if (!copy.memcpy_ok) continue;
    const at::Tensor& source = *static_cast<const at::Tensor*>(args[copy.index].value);
    jobs.push_back({.source = source.data_ptr(), .target = copy.slot.data_ptr(), .bytes = copy.bytes});
  }
  return kernels::capture_copies(jobs, stream, nodes);
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
    layout.conj = tensor.is_conj();
    layout.neg = tensor.is_neg();
  }
  return layouts;
}

// What a recording carries from one step to the next.
struct CaptureState {
  explicit CaptureState(std::span<const backend::ArgSlot> args) : inputs(args) {}
  CallInputs inputs;              // the function's inputs: the copied ones replaced by their slots
  std::vector<at::Tensor> slots;  // per input: its slot, or undefined when it is not copied
  std::vector<CopiedInput> copies;
  std::vector<kernels::CopyNode> nodes;      // the graph's copy nodes
  std::vector<kernels::CopyBatch> captured;  // what they copied when captured
  // Kept after instantiation: the copy nodes are updated through its nodes, and a re-recording may
  // load it into an earlier recording's executable instead of instantiating.
  GraphPtr graph{new at::cuda::CUDAGraph(/*keep_graph=*/true)};  // NOLINT(cppcoreguidelines-owning-memory)
  std::vector<std::uintptr_t> allocated_before;                  // the pool's allocated blocks before the call
  Values outputs;                                                // the function's, from the capture
  std::vector<std::uint32_t> written;     // inputs it wrote in place (a slot's version: a copied input)
  std::string given_up;                   // why a loop or branch of the function gave the recording up
  bool given_up_host_may_decide = false;  // with given_up: only a conditional node failed
  bool made_conditional_nodes = false;    // the graph holds a conditional node
  bool host_decides = false;              // the plan's ControlFlow::on_host
  kernels::HostSegments segments;         // its cuts, where the host decides
  std::vector<LaterSegment> later;        // the segments after the first, once split (then instantiated)
};

// The copied inputs' slots in the pool, written on the pool's stream after the caller's work so
// far (its inputs), ordered by an event: a device-wide synchronisation would break another
// thread's capture.
Result<void> prepare_slots(TorchDevice::State& state, CaptureState& capture, std::span<const backend::ArgSlot> args,
                           const backend::RecordPlan& plan) {
  return guarded("recording", [&]() -> Result<void> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    capture.allocated_before = addresses_of(allocated_blocks(state));
    follow(state.stream, c10::cuda::getCurrentCUDAStream(state.index));
    capture.slots = make_slots(state, capture.inputs, plan);
    capture.copies = describe_copies(capture.slots, args, state.index);
    return {};
  });
}

// Starts capturing the pool's stream into `graph`, allocating in the pool; on failure nothing is
// left capturing.
Result<void> begin_capture(TorchDevice::State& state, at::cuda::CUDAGraph& graph) {
  try {
    const std::lock_guard<std::mutex> lock(generator_registration());
    graph.capture_begin(state.pool, cudaStreamCaptureModeThreadLocal);
    return {};
  } catch (const std::exception& error) {
    (void)abandon_capture(graph, state);
    return fail(Errc::backend_error, std::string("starting a capture failed: ") + error.what());
  }
}

// Inside the capture: the copy nodes of the copied inputs (from the call's inputs), then the
// function on the slots. The inputs it wrote are noted (their version counters moved): for a
// write to a slot, the pipeline carries the first run's write back to the caller's input
// (`write_back`) and does not keep the graph, whose replays would write the slot only.
Result<Values> run_in_capture(TorchDevice::State& state, backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                              CaptureState& capture) {
  if (const cudaError_t copied = capture_copies(capture.copies, args, state.stream.stream(), capture.nodes);
      copied != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(Errc::backend_error, std::string("capturing the input copies failed: ") + cudaGetErrorString(copied));
  }
  const InputVersions versions(capture.inputs);
  ConditionalRecording conditional{.state = &state, .segments = capture.host_decides ? &capture.segments : nullptr};
  const std::uint64_t random_before = random_offset_in_capture(state.index);
  Result<Values> outputs = [&] {
    const ConditionalScope scope(conditional);
    return invoke(fn, capture.inputs);
  }();
  if (capture.host_decides && outputs && conditional.given_up.empty()) {
    if (random_offset_in_capture(state.index) != random_before) {
      // Its segments are launched directly, without CUDAGraph::replay's generator bookkeeping.
      conditional.given_up =
          "a recording whose loops and branches the host decides cannot draw random numbers (its segments would "
          "draw the same ones at every replay)";
    } else if (const cudaError_t cut = capture.segments.cut(state.stream.stream()); cut != cudaSuccess) {
      (void)cudaGetLastError();
      conditional.given_up = std::string("cutting the capture's last segment failed: ") + cudaGetErrorString(cut);
    }
  }
  capture.given_up = std::move(conditional.given_up);
  capture.given_up_host_may_decide = conditional.host_may_decide;
  capture.made_conditional_nodes = conditional.made_nodes;
  if (!outputs) return outputs;
  capture.written = versions.written(capture.inputs);
  return outputs;
}

// Ends the capture of a function that returned `outputs`, which `capture` keeps. A capture the
// function broke, or that cannot end, is abandoned and reported broken (the pipeline runs the
// function eagerly at these shapes from then on); a function that failed in an intact capture is
// reported as it failed.
backend::CaptureOutcome end_capture(TorchDevice::State& state, CaptureState& capture, Result<Values> outputs) {
  at::cuda::CUDAGraph& graph = *capture.graph;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const bool intact =
      cudaStreamIsCapturing(state.stream.stream(), &status) == cudaSuccess && status == cudaStreamCaptureStatusActive;
  if (!outputs || !intact || !capture.given_up.empty()) {
    cudaError_t broken = abandon_capture(graph, state);
    // A loop or branch that could not be a conditional node: the shapes run eagerly.
    if (!capture.given_up.empty()) {
      return {.work = backend::status_of(outputs),
              .broken = true,
              .broken_because = capture.given_up,
              .needs_host_decisions = capture.given_up_host_may_decide};
    }
    // The function returned, but its capture is not active: it cannot be used.
    if (broken == cudaSuccess && outputs) broken = cudaErrorStreamCaptureInvalidated;
    return {.work = backend::status_of(outputs),
            .broken = broken != cudaSuccess,
            .broken_because = broken != cudaSuccess ? why_uncapturable(broken) : std::string()};
  }
  try {
    const std::lock_guard<std::mutex> lock(generator_registration());
    graph.capture_end();
  } catch (const std::exception& error) {
    const cudaError_t broken = abandon_capture(graph, state);
    return {.broken = true,
            .broken_because = why_uncapturable(broken != cudaSuccess ? broken : cudaErrorStreamCaptureInvalidated) +
                              "; ending the capture failed: " + error.what()};
  }
  // A graph CUDA cannot cut (a clone refused): those shapes run eagerly.
  if (capture.host_decides) {
    std::vector<kernels::GraphHandle> later;
    if (const cudaError_t split = capture.segments.cuts.split(graph.raw_cuda_graph(), later); split != cudaSuccess) {
      (void)cudaGetLastError();
      return {.broken = true,
              .broken_because = std::string("cutting the graph into segments failed: ") + cudaGetErrorString(split)};
    }
    for (kernels::GraphHandle& segment : later) capture.later.push_back(LaterSegment{.graph = std::move(segment)});
  }
  capture.outputs = std::move(*outputs);
  capture.captured = kernels::batches_of(capture.nodes);
  return {};
}

// Captures the input copies and the function into `capture.graph` on the pool's stream. cuBLAS
// keeps workspaces between calls; cleared around the capture, the graph's workspace is allocated
// in the pool and accounted for there.
backend::CaptureOutcome capture_function(TorchDevice::State& state, backend::Invoker& fn,
                                         std::span<const backend::ArgSlot> args, CaptureState& capture) {
  auto outcome = guarded("recording", [&]() -> Result<backend::CaptureOutcome> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    const c10::cuda::CUDAStreamGuard stream_guard(state.stream);
    clear_workspaces_of(state.stream);
    make_body_streams(state);
    if (auto began = begin_capture(state, *capture.graph); !began) {
      return backend::CaptureOutcome{.work = std::move(began)};
    }
    backend::CaptureOutcome ended = end_capture(state, capture, run_in_capture(state, fn, args, capture));
    clear_workspaces_of(state.stream);
    return ended;
  });
  if (!outcome) return {.work = std::unexpected(std::move(outcome.error()))};
  return std::move(*outcome);
}

// The captured graph's memset nodes (and, when asked, its one-row device-to-device memcpy nodes)
// replaced by kernel nodes (node_rewrite.hpp), before anything compares or instantiates it:
// launches of the graph then cost what its kernels cost. A graph half rewritten on failure is
// given up.
Result<backend::NodeRewrites> rewrite_graph_nodes(TorchDevice::State& state, CaptureState& capture) {
  kernels::NodeRewrites rewrites;
  auto rewritten = guarded("replacing a graph's memset and memcpy nodes by kernels", [&]() -> Result<void> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    return checked(kernels::rewrite_for_launch(
                       capture.graph->raw_cuda_graph(),
                       {.memsets = state.rewrite_memset_nodes, .memcpys = state.rewrite_memcpy_nodes}, rewrites),
                   "replacing a graph's memset and memcpy nodes by kernels");
  });
  if (!rewritten) return std::unexpected(std::move(rewritten.error()));
  return backend::NodeRewrites{.memsets_rewritten = rewrites.memsets_rewritten,
                               .memsets_kept = rewrites.memsets_kept,
                               .memcpys_rewritten = rewrites.memcpys_rewritten,
                               .memcpys_kept = rewrites.memcpys_kept};
}

// Where a new recording's graph runs: an executable it shares (the graph is then its own), or
// one instantiated from its graph.
struct Placement {
  std::shared_ptr<SharedExec> exec;
  GraphPtr own_graph;  // a re-recording's graph, when it shares an executable
};

// The executables of a host-decided recording's later segments, uploaded on the pool's stream.
Result<void> instantiate_later_segments(TorchDevice::State& state, std::vector<LaterSegment>& later) {
  const c10::cuda::CUDAGuard device_guard(state.index);
  for (LaterSegment& segment : later) {
    cudaGraphExec_t exec = nullptr;
    if (auto made = checked(cudaGraphInstantiate(&exec, segment.graph.get(), 0), "instantiating a graph segment");
        !made) {
      return made;
    }
    segment.exec.reset(exec);
    if (auto uploaded = checked(cudaGraphUpload(exec, state.stream.stream()), "uploading a graph segment"); !uploaded) {
      return uploaded;
    }
  }
  return {};
}

// The executable of `earlier`, the recording a re-recording redoes (a static input moved),
// updated in place, when the new graph has its topology; null when it has another, or the old
// graph draws random numbers (it replays through its own CUDAGraph::replay).
Result<std::shared_ptr<SharedExec>> update_in_place(TorchDevice::State& state, backend::Recording& earlier,
                                                    CaptureState& capture) {
  std::shared_ptr<SharedExec> candidate = static_cast<TorchRecording&>(earlier).shareable();
  if (candidate == nullptr) return nullptr;
  auto updated = guarded("updating a graph in place", [&]() -> Result<bool> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    return kernels::load_if_same_topology(candidate->exec, candidate->nodes, capture.graph->raw_cuda_graph(),
                                          capture.nodes, capture.captured);
  });
  if (!updated) return std::unexpected(std::move(updated.error()));
  if (!*updated) return nullptr;
  return candidate;
}

// The new graph's own executable.
Result<Placement> instantiate_graph(TorchDevice::State& state, CaptureState& capture) {
  auto instantiated = guarded("instantiating a graph", [&]() -> Result<void> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    capture.graph->instantiate();
    return {};
  });
  if (!instantiated) {  // the capture ended: the graph's destructor gives its pool use back
    // A body the checks let through but CUDA refuses in a conditional node (NCCL collectives,
    // NCCL issue 1986): the host decides instead.
    return std::unexpected(
        Error{.code = Errc::function_failed,
              .message = "the captured graph cannot be instantiated: " + instantiated.error().message,
              .cause = capture.made_conditional_nodes ? Cause::conditional_unavailable : Cause::unspecified});
  }
  if (auto later = instantiate_later_segments(state, capture.later); !later) return std::unexpected(later.error());
  cudaGraphExec_t exec = capture.graph->raw_cuda_graph_exec();
  return Placement{.exec = std::make_shared<SharedExec>(std::move(capture.graph), exec, std::move(capture.nodes)),
                   .own_graph = nullptr};
}

// The graph's first run (capture ran nothing): it copies the inputs and produces the first outputs.
// Returns whether the graph's replays may launch it directly: it draws no random numbers.
Result<bool> run_graph_first(TorchDevice::State& state, const Placement& placement, const CaptureState& capture) {
  return guarded("running a new graph", [&]() -> Result<bool> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    // capture_begin reset the generator's graph state (seed and offset tensors) with kernels on
    // the pool's stream, which is not ordered with the replay's: the replay's own reset must come
    // after them, or a loaded GPU can run the graph with offset 0 (seen as a repeated draw). The
    // slots were written there too.
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(state.index);
    follow(current, state.stream);
    bool direct_launch = true;
    if (!capture.segments.decisions.empty()) {
      // Its segments, as the host decides; it draws no random numbers (end_capture).
      if (auto ran = run_segments(capture.segments.decisions, placement.exec->exec, capture.later, current.stream());
          !ran) {
        return std::unexpected(std::move(ran.error()));
      }
    } else if (placement.own_graph != nullptr) {
      // It shares an executable whose graph draws no random numbers and has its topology: nor does it.
      if (auto ran = checked(cudaGraphLaunch(placement.exec->exec, current.stream()), "launching a new graph"); !ran) {
        return std::unexpected(std::move(ran.error()));
      }
    } else {
      const std::lock_guard<std::mutex> lock(generator_registration());
      const std::uint64_t offset_before = philox_offset(state.index);
      placement.exec->owner->replay();
      // A graph that left the default generator's offset alone draws no random numbers: its
      // replays launch it directly, without CUDAGraph::replay's generator bookkeeping.
      direct_launch = philox_offset(state.index) == offset_before;
    }
    // The slots' memory goes back to the pool (outputs may keep some) while this run may still be
    // reading it. The pool's stream, where the pool's next allocations run (a warm-up, the next
    // recording's slots), waits for the run; a later graph reuses it in the caller's stream order,
    // as it reuses any graph's memory. No host synchronisation: a loop recording one size after
    // another captures the next size while this one runs.
    follow(state.stream, current);
    return direct_launch;
  });
}

// The recording, after its first run, and that run's outputs.
Result<backend::Recorded> make_recording(TorchDevice::State& state, CaptureState& capture, Placement placement,
                                         bool direct_launch) {
  return guarded("running a new graph", [&]() -> Result<backend::Recorded> {
    const c10::cuda::CUDAGuard device_guard(state.index);
    capture.inputs.values.clear();
    capture.slots.clear();
    backend::Recorded recorded;
    recorded.first_outputs = describe_outputs(state, std::move(capture.outputs), true, capture.allocated_before);
    recorded.recording = std::make_unique<TorchRecording>(
        std::move(placement.exec), std::move(placement.own_graph), std::move(capture.captured), direct_launch,
        std::move(capture.copies), describe_layouts(recorded.first_outputs), state, std::move(capture.later),
        std::move(capture.segments.decisions));
    note_peak(state);
    return recorded;
  });
}

// A recording in progress on the pool's stream (backend::Capture): each primitive is one of the
// steps above.
class TorchCapture final : public backend::Capture {
 public:
  TorchCapture(TorchDevice::State& state, backend::Invoker& fn, std::span<const backend::ArgSlot> args,
               const backend::RecordPlan& plan)
      : state_(state), fn_(fn), args_(args), plan_(plan), capture_(args) {
    capture_.host_decides = plan.control_flow == backend::ControlFlow::on_host;
  }

  [[nodiscard]] Result<void> make_slots() override { return prepare_slots(state_, capture_, args_, plan_); }
  [[nodiscard]] backend::CaptureOutcome capture() override { return capture_function(state_, fn_, args_, capture_); }
  // Version counters move at every in-place write, also inside a capture.
  [[nodiscard]] backend::WritesKnown writes_known() const noexcept override { return backend::WritesKnown::at_capture; }
  [[nodiscard]] std::vector<std::uint32_t> written_inputs() const override { return capture_.written; }
  [[nodiscard]] Result<void> settle_outputs() override { return check_outputs(capture_.outputs, false); }
  [[nodiscard]] Result<backend::NodeRewrites> rewrite_nodes() override { return rewrite_graph_nodes(state_, capture_); }
  // A host-decided recording has executables of its own for every segment.
  [[nodiscard]] bool allows_update_in_place() const noexcept override {
    return state_.update_graphs_in_place && !capture_.host_decides;
  }
  [[nodiscard]] Result<bool> load_into(backend::Recording& earlier) override {
    auto shared = update_in_place(state_, earlier, capture_);
    if (!shared) return std::unexpected(std::move(shared.error()));
    if (*shared == nullptr) return false;
    placement_ = Placement{.exec = std::move(*shared), .own_graph = std::move(capture_.graph)};
    // It runs this graph now, no recording's until `finish` makes this one's: a capture given up
    // before then leaves the earlier recording to load its graph back at its next replay.
    placement_.exec->loaded = nullptr;
    return true;
  }
  [[nodiscard]] Result<void> instantiate() override {
    auto placed = instantiate_graph(state_, capture_);
    if (!placed) return std::unexpected(std::move(placed.error()));
    placement_ = std::move(*placed);
    return {};
  }
  [[nodiscard]] Result<void> run_first() override {
    auto direct_launch = run_graph_first(state_, placement_, capture_);
    if (!direct_launch) return std::unexpected(std::move(direct_launch.error()));
    direct_launch_ = *direct_launch;
    return {};
  }
  // The function wrote these copied inputs' slots (their version counters moved at capture): the
  // run just made wrote the slots, and the caller's inputs get what it wrote, on the caller's
  // stream after that run, as an eager run would have written them.
  [[nodiscard]] Result<void> write_back(std::span<const std::uint32_t> inputs) override {
    return guarded("copying a write to a copied input back", [&]() -> Result<void> {
      const c10::cuda::CUDAGuard device_guard(state_.index);
      const c10::NoGradGuard no_grad;  // the values the function wrote, not a step of autograd
      for (const std::uint32_t i : inputs) {
        const at::Tensor& caller = *static_cast<const at::Tensor*>(args_[i].value);
        without_broadcast(caller).copy_(without_broadcast(capture_.slots[i]), /*non_blocking=*/true);
      }
      return {};
    });
  }
  [[nodiscard]] Result<backend::Recorded> finish() override {
    return make_recording(state_, capture_, std::move(placement_), direct_launch_);
  }
  [[nodiscard]] GraphCounts* counts() noexcept override { return &state_.graph_counts; }

 private:
  TorchDevice::State& state_;
  backend::Invoker& fn_;
  std::span<const backend::ArgSlot> args_;
  backend::RecordPlan plan_;
  CaptureState capture_;
  Placement placement_;  // declared after capture_: destroyed before it
  bool direct_launch_ = true;
};

}  // namespace

Result<std::unique_ptr<backend::Capture>> TorchDevice::begin_recording(backend::Invoker& fn,
                                                                       std::span<const backend::ArgSlot> args,
                                                                       const backend::RecordPlan& plan) {
  State& state = *state_;
  if (auto ordered = order_after_last_caller(state); !ordered) return std::unexpected(std::move(ordered.error()));
  return std::make_unique<TorchCapture>(state, fn, args, plan);
}

}  // namespace cgt::torch
