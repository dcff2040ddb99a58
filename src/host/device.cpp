// The host device: runs, warms up and records pool functions over the arena, and implements the
// memory side of the tree (checkpoints, releases, rescues) for the engine.
module;
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <expected>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

module cgt.host;
import cgt.core;
import :internal;

namespace cgt::host {
namespace {

using HostInvoker = backend::InvokerOf<Callable>;
using CallInputs = backend::CallInputs<Buffer>;
// Storage handles carry addresses; on the host they are plain pointers into the arena.
using backend::address_of;
using backend::pointer_to;

bool same_strides(const Buffer& a, const Buffer& b) noexcept {
  const auto x = a.strides();
  const auto y = b.strides();
  if (x.size() != y.size()) return false;
  for (std::size_t d = 0; d < x.size(); ++d) {  // ranks are small: a loop beats memcmp here
    if (x[d] != y[d]) return false;
  }
  return true;
}

// The error for a copied input whose view is invalid or reaches outside its storage: copying it
// would read memory the caller did not pass.
std::unexpected<Error> outside_storage(std::size_t input) {
  return fail(Errc::invalid_argument,
              "input " + std::to_string(input) +
                  " is a view whose layout is invalid or reaches outside its storage (Buffer::fits is false)",
              {}, -1, static_cast<std::int32_t>(input));
}

// Copies of a call's inputs taken before it runs, to tell which ones it wrote, byte for byte
// (`RunResult::written_inputs`): a graph reads a caller's input through a slot, so a write to an
// input the options do not declare mutated would be lost. Inputs in pool memory are not watched:
// a graph writes them in place, and one that dies during the call (a lease the function dropped)
// is poisoned, which is not a write.
class InputSnapshots {
 public:
  InputSnapshots() = default;  // watches nothing
  // Copies `values[i]` where `watched(i)`; a value that cannot be copied (out of memory, a view
  // outside its storage) is not watched.
  template <class Watched>
  InputSnapshots(std::span<const Buffer> values, Watched watched) : before_(values.size()) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (values[i].empty() || !values[i].fits() || !watched(i)) continue;
      if (auto copy = values[i].clone()) before_[i] = *std::move(copy);
    }
  }

  // The watched inputs whose elements changed.
  [[nodiscard]] std::vector<std::uint32_t> written(std::span<const Buffer> values) const {
    std::vector<std::uint32_t> changed;
    for (std::size_t i = 0; i < before_.size(); ++i) {
      if (before_[i].empty()) continue;
      auto now = values[i].clone();
      const std::size_t bytes = before_[i].numel() * element_size(before_[i].type());
      if (now && std::memcmp(now->data(), before_[i].data(), bytes) != 0) {
        changed.push_back(static_cast<std::uint32_t>(i));
      }
    }
    return changed;
  }

 private:
  std::vector<Buffer> before_;  // empty where not watched
};

}  // namespace

// A recorded host graph with its input slots and outputs; where the host decides its loops and
// branches, cut into segments.
class HostRecording final : public backend::Recording {
 public:
  HostRecording(Graph graph, HostSegments segments, std::vector<Buffer> slots, const std::vector<bool>& copied,
                Values outputs, SegmentHold uses)
      : graph_(std::move(graph)),
        segments_(std::move(segments)),
        outputs_(std::make_shared<Values>(std::move(outputs))),
        uses_(std::move(uses)) {
    for (std::size_t i = 0; i < copied.size(); ++i) {
      if (!copied[i]) continue;
      const Buffer& slot = slots[i];
      copies_.push_back({.input = i,
                         .slot = slot,
                         .slot_data = slot.data(),
                         .dense = slot.layout().is_dense(),
                         .bytes = slot.numel() * element_size(slot.type())});
      slot_bytes_ += slot.storage_bytes();
    }
  }

  [[nodiscard]] Result<void> replay(std::span<const backend::ArgSlot> args) override {
    for (Copy& copy : copies_) {
      const Buffer& source = *static_cast<const Buffer*>(args[copy.input].value);
      // The source fits its storage (Backend::describe checked it). Same sizes and strides (the shape key says so: a
      // graph replays only for calls of its key) and type (the engine checks every call's element types against the
      // first call's): whether one memcpy will do is the same for every replay, decided at the first.
      if (copy.by_memcpy == Copy::Way::memcpy) [[likely]] {
        std::memcpy(copy.slot_data, source.data(), copy.bytes);
        continue;
      }
      if (copy.by_memcpy == Copy::Way::unknown) {
        copy.by_memcpy = copy.dense && same_strides(source, copy.slot) ? Copy::Way::memcpy : Copy::Way::elementwise;
      }
      if (copy.by_memcpy == Copy::Way::memcpy) {
        std::memcpy(copy.slot_data, source.data(), copy.bytes);
      } else {
        host::copy(source, copy.slot);
      }
    }
    try {
      if (segments_.decisions.empty()) [[likely]] {
        graph_.replay();
      } else {
        run(graph_, segments_);
      }
    } catch (const std::exception& error) {
      return fail(Errc::function_failed, std::string("a kernel threw during replay: ") + error.what());
    } catch (...) {
      return fail(Errc::function_failed, "a kernel threw during replay");
    }
    return {};
  }
  // Host outputs are plain addresses: they never need rebinding.
  void bind_outputs(std::span<backend::StorageHandle* const> /*storages*/) override {}
  [[nodiscard]] const void* output(std::size_t i) const override { return &(*outputs_)[i]; }
  /// Held apart: an evicted recording goes, its outputs stay for the leases of its past replays.
  [[nodiscard]] std::shared_ptr<const void> outputs_owner() const override { return outputs_; }
  [[nodiscard]] std::size_t slot_bytes() const noexcept override { return slot_bytes_; }

  /// Runs `graph` once: whole, or, cut into `segments`, as their decisions say (the host reads
  /// each decider between segments).
  static void run(const Graph& graph, const HostSegments& segments) {
    if (segments.decisions.empty()) {
      graph.replay();
      return;
    }
    const Result<void> ran = segments.decisions.run(
        [&](std::size_t i) -> Result<void> {
          graph.replay(i == 0 ? 0 : segments.ends[i - 1], segments.ends[i]);
          return {};
        },
        [](const void* decider) -> Result<std::int32_t> { return *static_cast<const std::int32_t*>(decider); });
    if (!ran) throw std::runtime_error(ran.error().message);  // neither step fails on the host
  }

 private:
  struct Copy {
    enum class Way : std::uint8_t { unknown, memcpy, elementwise };
    std::size_t input;
    Buffer slot;
    std::byte* slot_data;  // slot.data(), fixed with the slot
    bool dense;            // no gaps, overlap or broadcast: a copy with equal strides is one memcpy
    std::size_t bytes;
    Way by_memcpy = Way::unknown;
  };
  Graph graph_;
  HostSegments segments_;
  std::vector<Copy> copies_;
  std::shared_ptr<Values> outputs_;  // shared: see outputs_owner (stamped through `output`: not const)
  SegmentHold uses_;                 // the arena's segments its capture allocated in: its replays use them
  std::size_t slot_bytes_ = 0;
};

namespace {
// The bytes of a copied input's slot (`HostCapture::make_slots`): the source's sizes and broadcast
// dimensions, dense otherwise.
std::size_t slot_bytes_for(const Buffer& source) {
  return std::max<std::size_t>(source.layout().dense_like().required_bytes(), 1);
}
}  // namespace

Buffer Context::allocate(ElementType type, std::span<const std::int64_t> sizes) {
  if (target_ == Target::pool) return device_.allocate_in_pool(*this, type, sizes);
  auto buffer = Buffer::make(type, sizes);
  if (buffer) return *std::move(buffer);
  if (buffer.error().code == Errc::out_of_memory) throw OutOfMemory(buffer.error().message);
  throw InvalidArgument(buffer.error().message);
}

void Context::launch(Kernel kernel) {
  device_.stream().launch(std::move(kernel));
}

void Context::free_allocations_since(std::size_t from) {
  if (target_ == Target::pool) device_.free_pool_blocks_since(*this, from);
}

void HostDevice::free_pool_blocks_since(Context& context, std::size_t from) {
  if (arena_) backend::free_since(*arena_, context.allocations_, from);
}

void Context::call_on_host(Kernel fn) {
  Stream& stream = device_.stream();
  if (stream.is_capturing() && stream.in_body()) stream.forbid_in_body("a host function (Context::call_on_host)");
  stream.launch(std::move(fn));
}

bool Context::is_capturing() const noexcept {
  return device_.stream().is_capturing();
}

void Context::synchronize() noexcept {
  device_.stream().synchronize();
}

HostDevice::HostDevice(ArenaOptions arena, bool poison_dead_memory) : ArenaDevice(poison_dead_memory) {
  arena_ = std::make_unique<Arena>(std::move(arena));
}

Buffer HostDevice::allocate_in_pool(Context& context, ElementType type, std::span<const std::int64_t> sizes) {
  const auto bytes = contiguous_bytes(type, sizes);
  if (!bytes) throw InvalidArgument("Context::allocate: " + bytes.error().message);
  auto memory = arena_->allocate(*bytes);
  if (!memory) throw OutOfMemory(memory.error().message);
  context.allocations_.push_back(address_of(*memory));
  return Buffer::view_of(*memory, *bytes, type, sizes);
}

Result<backend::RunResult> HostDevice::finish(Context& context, Values&& outputs) {
  // Temporaries die with the call, as a tensor does when its last reference goes.
  return backend::finish_call(*arena_, context.allocations_, std::move(outputs));
}

Result<backend::RunResult> HostDevice::run(backend::Invoker& fn, std::span<const backend::ArgSlot> args,
                                           backend::RunMode mode) {
  const CallInputs inputs(args);
  const bool warmup = mode == backend::RunMode::warmup;
  Context context(*this, warmup ? Context::Target::pool : Context::Target::heap);
  const InputSnapshots snapshots(inputs.values, [&](std::size_t i) { return !in_pool(inputs.values[i]); });
  std::optional<backend::ArenaTraceScope> trace;
  if (warmup) trace.emplace(*arena_);
  auto outputs = backend::call_function(static_cast<HostInvoker&>(fn).fn, context, inputs.view());
  if (!outputs) {
    backend::free_all(*arena_, context.allocations_);
    return std::unexpected(std::move(outputs.error()));
  }
  auto finished = finish(context, std::move(*outputs));
  if (finished) {
    finished->written_inputs = snapshots.written(inputs.values);
    if (trace) finished->allocations = std::make_shared<const ArenaTrace>(trace->take());
  }
  return finished;
}

bool HostDevice::in_pool(const Buffer& value) const noexcept {
  return owns(address_of(value.storage()));
}

// A recording in progress on the host (backend::Capture): slots for the copied inputs, the function
// captured on the pool's stream, and the graph's first run.
class HostCapture final : public backend::Capture {
 public:
  HostCapture(HostDevice& device, backend::Invoker& fn, std::span<const backend::ArgSlot> args,
              const backend::RecordPlan& plan)
      : device_(device),
        fn_(static_cast<HostInvoker&>(fn)),
        plan_(plan),
        args_(args),
        inputs_(args),
        context_(device, Context::Target::pool),
        trace_(*device.arena_),
        slots_(args.size()),
        copied_(args.size(), false) {}
  HostCapture(const HostCapture&) = delete;
  HostCapture& operator=(const HostCapture&) = delete;
  // Unfinished, it gives back every block it allocated; finished, the outputs hold them.
  ~HostCapture() override { backend::free_all(arena(), context_.allocations_); }

  // Copied inputs get a slot of their own in the pool: the source's sizes and broadcast
  // dimensions, dense otherwise (whatever the source's strides: gaps, overlap, negative), so the
  // slot holds each element once; replays copy into it element by element (one memcpy when the
  // source has the slot's strides).
  [[nodiscard]] Result<void> make_slots() override {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (!plan_.copy_input[i]) continue;
      const Buffer& source = inputs_.values[i];
      if (!source.fits()) return outside_storage(i);
      const Layout layout = source.layout().dense_like();
      const std::size_t bytes = slot_bytes_for(source);
      auto memory = arena().allocate(bytes);
      if (!memory) return std::unexpected(std::move(memory.error()));
      context_.allocations_.push_back(address_of(*memory));
      slots_[i] = source.on_storage(*memory, bytes).with_layout(layout);
      copy(source, slots_[i]);
      inputs_.values[i] = slots_[i];
      copied_[i] = true;
    }
    return {};
  }

  [[nodiscard]] backend::CaptureOutcome capture() override {
    // Every input is watched, slots included: a write to a slot is carried back to the caller's
    // input after the first run (write_back), and the graph is not kept.
    snapshots_ = InputSnapshots(inputs_.values, [](std::size_t) { return true; });
    Stream& stream = device_.stream_;
    stream.begin_capture();
    if (plan_.control_flow == backend::ControlFlow::on_host) context_.segments_ = &segments_;
    auto outputs = backend::call_function(fn_.fn, context_, inputs_.view());
    context_.segments_ = nullptr;
    const bool broken = stream.capture_broken();
    // A body a conditional node cannot hold: recorded again, the host deciding.
    const bool body_forbidden = outputs && !stream.forbidden_in_body().empty();
    if (!outputs || broken || body_forbidden) {
      std::string why;
      if (broken) {
        why = "the function synchronised with the host during its capture (Context::synchronize)";
      } else if (body_forbidden) {
        why = "a loop or branch body cannot be a conditional node: it holds " + stream.forbidden_in_body();
      }
      stream.discard_capture();
      return {.work = backend::status_of(outputs),
              .broken = broken || body_forbidden,
              .broken_because = std::move(why),
              .needs_host_decisions = !broken && body_forbidden};
    }
    if (plan_.control_flow == backend::ControlFlow::on_host) segments_.cut(stream);
    graph_ = stream.end_capture();
    outputs_ = std::move(*outputs);
    return {};
  }

  // The host compares bytes: it knows a write only once the graph ran.
  [[nodiscard]] backend::WritesKnown writes_known() const noexcept override {
    return backend::WritesKnown::after_first_run;
  }
  [[nodiscard]] std::vector<std::uint32_t> written_inputs() const override {
    std::vector<std::uint32_t> written = snapshots_.written(inputs_.values);
    // Pool memory read in place is the graph's to write; a slot (pool memory too) is a copied input.
    std::erase_if(written, [&](std::uint32_t i) { return !copied_[i] && device_.in_pool(inputs_.values[i]); });
    return written;
  }

  // Slots and temporaries the outputs do not view are freed; what they keep stays in allocations_.
  [[nodiscard]] Result<void> settle_outputs() override {
    return backend::settle_outputs(arena(), context_.allocations_, std::span<Buffer>(outputs_));
  }

  // Capture ran nothing: this run produces the first outputs. A kernel may throw anything; the
  // recording is then given up, and its blocks go back with it.
  [[nodiscard]] Result<void> run_first() override {
    try {
      HostRecording::run(graph_, segments_);
    } catch (const std::exception& error) {
      return fail(Errc::function_failed, std::string("a kernel threw during the first replay: ") + error.what());
    } catch (...) {
      return fail(Errc::function_failed,
                  "a kernel threw an exception that is not a std::exception during the first replay");
    }
    return {};
  }

  // The first run wrote these slots: the caller's inputs get what was written, as an eager run
  // would have written them. The slots' blocks went back to the arena (settle_outputs), but
  // nothing allocated since, so they still hold the run's values.
  [[nodiscard]] Result<void> write_back(std::span<const std::uint32_t> inputs) override {
    for (const std::uint32_t i : inputs) {
      const Buffer& caller = *static_cast<const Buffer*>(args_[i].value);
      copy(slots_[i], caller);
    }
    return {};
  }

  [[nodiscard]] Result<backend::Recorded> finish() override {
    backend::Recorded recorded;
    recorded.recording = std::make_unique<HostRecording>(std::move(graph_), std::move(segments_), std::move(slots_),
                                                         copied_, outputs_, arena().hold(trace_.take().segments()));
    recorded.first_outputs = backend::describe_outputs(arena(), context_.allocations_, std::move(outputs_));
    context_.allocations_.clear();
    return recorded;
  }

 private:
  [[nodiscard]] Arena& arena() const noexcept { return *device_.arena_; }

  HostDevice& device_;
  HostInvoker& fn_;
  backend::RecordPlan plan_;
  std::span<const backend::ArgSlot> args_;  // the caller's arguments
  CallInputs inputs_;                       // the function's inputs: the copied ones replaced by their slots
  Context context_;                         // the pool blocks allocated so far, slots first
  backend::ArenaTraceScope trace_;          // which segments its blocks fall in (its graph uses them)
  std::vector<Buffer> slots_;               // per input: its slot, or empty when it is not copied
  std::vector<bool> copied_;
  InputSnapshots snapshots_;  // the inputs before the capture (taken by capture)
  Graph graph_;
  HostSegments segments_;  // its cuts, where the host decides its loops and branches
  Values outputs_;         // the function's, from the capture
};

Result<std::unique_ptr<backend::Capture>> HostDevice::begin_recording(backend::Invoker& fn,
                                                                      std::span<const backend::ArgSlot> args,
                                                                      const backend::RecordPlan& plan) {
  if (plan.replaces != nullptr) ++redoing_another_;
  return std::make_unique<HostCapture>(*this, fn, args, plan);
}

std::size_t HostDevice::slot_bytes(const Buffer& source) const {
  return slot_bytes_for(source);
}

void HostDevice::release(backend::StorageHandle& storage, backend::Release /*why*/, std::string_view /*function*/) {
  if (poison_) std::memset(pointer_to(storage.address), 0xFF, storage.bytes);
  if (!storage.owned_by_allocator) return;
  (void)arena_->free(storage.address);  // NOLINT(bugprone-unused-return-value): fails only if already free
}

void HostDevice::adopt(backend::StorageHandle& /*storage*/) {}

Result<std::shared_ptr<void>> HostDevice::rescue(const backend::StorageHandle& storage) {
  std::shared_ptr<std::byte[]> copy_of(new std::byte[std::max<std::size_t>(storage.bytes, 1)]);  // NOLINT
  std::memcpy(copy_of.get(), pointer_to(storage.address), storage.bytes);
  return std::shared_ptr<void>(copy_of, copy_of.get());
}

std::shared_ptr<const void> HostDevice::rebase(const void* value, const backend::StorageHandle& from,
                                               const std::shared_ptr<void>& rescued) {
  const Buffer& original = *static_cast<const Buffer*>(value);
  auto* bytes = static_cast<std::byte*>(rescued.get());
  return std::make_shared<Buffer>(original.on_storage(bytes, from.bytes, std::shared_ptr<std::byte[]>(rescued, bytes)));
}

void HostDevice::shutdown() {
  stream_.discard_capture();
  arena_.reset();
}

Result<Buffer> Backend::take(const Buffer& buffer) {
  if (buffer.empty()) return Buffer{};
  return buffer.clone();
}

std::unique_ptr<backend::Invoker> Backend::make_invoker(Callable&& fn) {
  return std::make_unique<HostInvoker>(std::move(fn));
}

Device& Backend::view(backend::Device& device) noexcept {
  return static_cast<HostDevice&>(device).view();
}

bool Device::contains(std::uintptr_t address) const noexcept {
  return device_->owns(address);
}

const Arena& Device::arena() const noexcept {
  return *device_->arena();
}

Stream& Device::stream() noexcept {
  return device_->stream();
}

std::size_t Device::recordings_redoing_another() const noexcept {
  return device_->recordings_redoing_another();
}

Result<Pool> make_pool(PoolOptions options) {
  auto device = std::make_unique<HostDevice>(options.arena, options.poison_dead_memory);
  return backend::make_pool<Pool>(std::move(device), std::move(options.tree));
}

}  // namespace cgt::host
