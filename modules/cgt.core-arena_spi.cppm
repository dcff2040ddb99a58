// cgt.core:arena_spi — what a backend whose pool is a cgt::Arena and whose values are buffers
// (`empty()`, `fits()`, `numel()`, `storage()`, `storage_bytes()`, `on_storage`, `with_layout`) does
// the same way whatever the device: free a call's temporaries, describe its outputs to the engine, checkpoint and
// restore the arena. Used by cgt.host and cgt.cuda.
module;
#include <expected>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

export module cgt.core:arena_spi;
import :arena;
import :spi;
import cgt.vocabulary;

export namespace cgt::backend {

/// Where zero-element outputs point instead of pool memory: they read nothing, so they need no
/// block, and PyTorch does not track empty outputs either. Never dereferenced.
inline std::byte* no_elements_storage() noexcept {
  alignas(256) static std::byte storage[1]{};  // NOLINT(cppcoreguidelines-avoid-c-arrays)
  return &storage[0];
}

/// `Backend::describe` for a buffer on device `device` (-1: host memory; the host backend's one
/// device is 0). Fails with `invalid_argument` for a view that reaches outside its storage: a graph,
/// or the function, would read every element of it (a hand-made `restrided`, say), so it is refused
/// before any work.
template <class Buffer>
[[nodiscard]] [[clang::always_inline]] inline Result<void> describe_buffer(const Buffer& buffer, std::int32_t device,
                                                                           ArgDesc& desc) noexcept {
  if (!buffer.empty() && !buffer.fits()) {
    return fail(Errc::invalid_argument,
                "the buffer's view is invalid or reaches outside its storage (check the sizes, strides and offset "
                "given to restrided / slice / select / expand)");
  }
  desc.kind = ArgKind::value;
  desc.storage = address_of(buffer.storage());
  desc.data = address_of(buffer.data());
  desc.sizes = buffer.sizes().data();
  desc.strides = buffer.strides().data();
  desc.rank = static_cast<std::uint8_t>(buffer.rank());
  desc.expanded = buffer.layout().expanded_dims();
  desc.dtype = static_cast<std::uint16_t>(buffer.type());
  desc.device = device;
  desc.life = buffer.life();
  return {};
}

/// `Device::stamp` for a buffer: the engine passes the pool's own output objects, which it owns
/// as mutable values.
template <class Buffer>
inline void stamp_buffer(const void* value, std::uint64_t life) noexcept {
  auto* buffer =
      const_cast<Buffer*>(static_cast<const Buffer*>(value));  // NOLINT(cppcoreguidelines-pro-type-const-cast)
  buffer->set_life(life);
}

/// Ends a call that allocated `allocations` (block addresses) in `arena` and returns `outputs`:
///  - fails with `invalid_argument` when an output is a view that is invalid or reaches outside its
///    storage (it would hand out memory no lease covers), freeing nothing;
///  - points zero-element outputs of pool memory at `no_elements_storage()`, untracked: a held
///    empty output keeps no block and changes no liveness pattern;
///  - frees the allocations that no (non-empty) output views, as a tensor dies with its last
///    reference, and leaves in `allocations` the ones outputs keep (for `describe_outputs`).
template <class Buffer>
Result<void> settle_outputs(Arena& arena, std::vector<std::uintptr_t>& allocations, std::span<Buffer> outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].empty() && !outputs[i].fits()) {
      return fail(Errc::invalid_argument,
                  "output " + std::to_string(i) +
                      " is a view whose layout is invalid or reaches outside its storage; return views inside the "
                      "buffers the function allocated or received",
                  {}, -1, static_cast<std::int32_t>(i));
    }
  }
  for (Buffer& out : outputs) {
    if (out.empty() || out.numel() != 0 || !arena.contains(address_of(out.storage()))) continue;
    out = out.on_storage(no_elements_storage(), 0).with_layout(out.layout().restrided(0, out.sizes(), out.strides()));
  }
  std::erase_if(allocations, [&](std::uintptr_t address) {
    for (const Buffer& out : outputs) {
      if (!out.empty() && address_of(out.storage()) == address) return false;
    }
    (void)arena.free(address);  // NOLINT(bugprone-unused-return-value): fails only if already free
    return true;
  });
  return {};
}

/// Frees every block in `allocations` and clears it: a call that failed keeps nothing.
inline void free_all(Arena& arena, std::vector<std::uintptr_t>& allocations) {
  for (const std::uintptr_t address : allocations) (void)arena.free(address);  // NOLINT(bugprone-unused-return-value)
  allocations.clear();
}

/// Frees the blocks of `allocations` from index `from` on and forgets them, keeping the earlier
/// ones: a loop's iteration's temporaries in a warm-up, dead once it ended (what a body makes
/// dies in it), whose memory the next iteration reuses.
inline void free_since(Arena& arena, std::vector<std::uintptr_t>& allocations, std::size_t from) {
  if (from >= allocations.size()) return;
  for (std::size_t i = from; i < allocations.size(); ++i) {
    (void)arena.free(allocations[i]);  // NOLINT(bugprone-unused-return-value)
  }
  allocations.resize(from);
}

/// Describes a call's outputs for the engine, which then owns them: a storage is in the pool when
/// `arena` holds it, and allocated in the call when it is one of `kept` (the call's allocations
/// that `settle_outputs` kept); an empty buffer is no output.
template <class Buffer>
RunResult describe_outputs(const Arena& arena, std::span<const std::uintptr_t> kept, std::vector<Buffer>&& outputs) {
  RunResult result;
  auto owned = std::make_shared<std::vector<Buffer>>(std::move(outputs));
  result.outputs.reserve(owned->size());
  result.values.reserve(owned->size());
  for (const Buffer& out : *owned) {
    OutputDesc desc;
    if (out.empty()) {
      desc.kind = OutputKind::none;
    } else {
      desc.storage = address_of(out.storage());
      desc.storage_bytes = out.storage_bytes();
      desc.in_pool = arena.contains(desc.storage);
      desc.allocated_in_call = desc.in_pool && std::ranges::find(kept, desc.storage) != kept.end();
    }
    result.outputs.push_back(desc);
    result.values.push_back(&out);
  }
  result.owner = std::move(owned);
  return result;
}

/// The end of a call over an arena: settles its outputs (`settle_outputs`), describes them, and
/// forgets the call's allocations, which the outputs now hold; on failure frees all of them.
template <class Buffer>
Result<RunResult> finish_call(Arena& arena, std::vector<std::uintptr_t>& allocations, std::vector<Buffer>&& outputs) {
  if (auto settled = settle_outputs(arena, allocations, std::span<Buffer>(outputs)); !settled) {
    free_all(arena, allocations);
    return std::unexpected(std::move(settled.error()));
  }
  RunResult result = describe_outputs(arena, allocations, std::move(outputs));
  allocations.clear();
  return result;
}

/// An arena's checkpoint, as the engine keeps it: it holds the segments it allocates in, which
/// restoring it needs, for as long as it is kept.
class ArenaCheckpointOf final : public Checkpoint {
 public:
  ArenaCheckpointOf(ArenaCheckpoint state, SegmentHold hold) : state_(std::move(state)), hold_(std::move(hold)) {}
  [[nodiscard]] const ArenaCheckpoint& state() const noexcept { return state_; }

 private:
  ArenaCheckpoint state_;
  SegmentHold hold_;
};

/// Device::checkpoint for an arena pool.
inline Result<std::unique_ptr<Checkpoint>> checkpoint_arena(Arena& arena) {
  ArenaCheckpoint state = arena.checkpoint();
  SegmentHold hold = arena.hold(state.allocated_segments());
  return std::make_unique<ArenaCheckpointOf>(std::move(state), std::move(hold));
}

/// Notes what one warm-up or capture asks of `arena` while it lives (`Arena::start_trace`);
/// `take` ends the note. One at a time per arena (a pool runs one call at a time).
class ArenaTraceScope {
 public:
  explicit ArenaTraceScope(Arena& arena) : arena_(&arena) { arena.start_trace(); }
  ArenaTraceScope(const ArenaTraceScope&) = delete;
  ArenaTraceScope& operator=(const ArenaTraceScope&) = delete;
  ~ArenaTraceScope() {
    if (arena_ != nullptr) (void)arena_->stop_trace();
  }
  /// The trace so far; noting stops.
  [[nodiscard]] ArenaTrace take() {
    Arena* arena = std::exchange(arena_, nullptr);
    return arena != nullptr ? arena->stop_trace() : ArenaTrace{};
  }

 private:
  Arena* arena_;
};

/// `Device::predict_growth` for an arena pool whose slots take `slot_bytes` per copied input (in
/// the order `Capture::make_slots` allocates them).
template <class SlotBytes>
std::size_t predict_arena_growth(const Arena& arena, const ArenaTrace& warmup, std::span<const ArgSlot> args,
                                 const RecordPlan& plan, GrowthFrom from, SlotBytes slot_bytes) {
  std::vector<std::size_t> slots;
  for (std::size_t i = 0; i < args.size() && i < plan.copy_input.size(); ++i) {
    if (plan.copy_input[i]) slots.push_back(slot_bytes(args[i]));
  }
  return from == GrowthFrom::now ? arena.growth_for(slots, warmup) : arena.footprint_of(slots, warmup);
}

/// Device::restore for an arena pool: back to `checkpoint` (made by checkpoint_arena), with the
/// `live` storages still allocated in it and the `dead` ones freed; anything else is an invariant
/// violation of the engine's.
inline Result<void> restore_arena(Arena& arena, const Checkpoint& checkpoint, std::span<StorageHandle* const> live,
                                  std::span<const std::uintptr_t> dead) {
  arena.restore(static_cast<const ArenaCheckpointOf&>(checkpoint).state());
  for (const StorageHandle* storage : live) {
    if (!arena.is_allocated(storage->address)) {
      return fail(Errc::invariant_violation, "a live output's block is not allocated in the restored checkpoint");
    }
  }
  for (const std::uintptr_t address : dead) {
    if (auto freed = arena.free(address); !freed) {
      return fail(Errc::invariant_violation, "a dead output's block is not allocated in the restored checkpoint");
    }
  }
  return {};
}

/// What a device whose pool is a `cgt::Arena` and whose values are `Buffer`s (cgt.host, cgt.cuda)
/// does the same way whatever the memory: who owns which address, the checkpoints, the memory
/// queries, the prediction of a recording, segments given back, sleep and wake. The backend
/// derives from it, makes `arena_`, says what a copied input's slot takes (`slot_bytes`), and
/// where its memory must be changed from (`on_pool_device`).
template <class Buffer>
class ArenaDevice : public Device {
 public:
  /// Null after `shutdown()`.
  [[nodiscard]] const Arena* arena() const noexcept { return arena_.get(); }

  [[nodiscard]] std::string type_name(std::uint16_t dtype) const override {
    return std::string(to_string(static_cast<ElementType>(dtype)));
  }
  [[nodiscard]] bool releases_unowned_storage() const noexcept override { return poison_; }
  /// Whether the arena contains `storage`.
  [[nodiscard]] bool owns(std::uintptr_t storage) const noexcept override {
    return arena_ != nullptr && arena_->contains(storage);
  }
  /// Buffers carry their life number: a stale copy of a reclaimed output is told apart.
  [[nodiscard]] bool stamps_values() const noexcept override { return true; }
  void stamp(const void* value, std::uint64_t life) const noexcept override { stamp_buffer<Buffer>(value, life); }
  [[nodiscard]] Result<std::unique_ptr<Checkpoint>> checkpoint() override { return checkpoint_arena(*arena_); }
  [[nodiscard]] Result<void> restore(const Checkpoint& checkpoint, std::span<StorageHandle* const> live,
                                     std::span<const std::uintptr_t> dead) override {
    return restore_arena(*arena_, checkpoint, live, dead);
  }
  [[nodiscard]] std::vector<Block> live_blocks() const override {
    return arena_ ? arena_->live_blocks() : std::vector<Block>{};
  }
  [[nodiscard]] MemoryInfo memory() const override { return arena_ ? arena_->memory() : MemoryInfo{}; }

  // The memory contract: the arena replays a warm-up's trace to predict a recording, gives back
  // the segments nothing holds, and sleeps with its addresses kept.
  [[nodiscard]] std::optional<std::size_t> predict_growth(const ArenaTrace& warmup, std::span<const ArgSlot> args,
                                                          const RecordPlan& plan, GrowthFrom from) const override {
    if (!arena_) return std::nullopt;
    return predict_arena_growth(*arena_, warmup, args, plan, from, [this](const ArgSlot& arg) {
      return slot_bytes(*static_cast<const Buffer*>(arg.value));
    });
  }
  std::size_t release_unused() override {
    std::size_t released = 0;
    // Where the memory cannot be changed (cgt.cuda: its device not current), nothing is given back.
    if (arena_ && !on_pool_device([&] { released = arena_->release_unused(); })) return 0;
    return released;
  }
  [[nodiscard]] Result<std::size_t> sleep() override {
    if (!arena_) return fail(Errc::pool_shut_down, "the pool's memory went with its shutdown");
    Result<std::size_t> released = std::size_t{0};
    if (auto entered = on_pool_device([&] { released = arena_->sleep(); }); !entered) {
      return std::unexpected(std::move(entered.error()));
    }
    return released;
  }
  [[nodiscard]] Result<void> wake() override {
    if (!arena_) return {};
    Result<void> woken;
    if (auto entered = on_pool_device([&] { woken = arena_->wake(); }); !entered) return entered;
    return woken;
  }
  [[nodiscard]] bool asleep() const noexcept override { return arena_ != nullptr && arena_->asleep(); }
  [[nodiscard]] std::size_t asleep_bytes() const noexcept override { return arena_ ? arena_->asleep_bytes() : 0; }

 protected:
  explicit ArenaDevice(bool poison_dead_memory) noexcept : poison_(poison_dead_memory) {}
  /// The bytes of the slot `Capture::make_slots` allocates for the copied input `source`.
  [[nodiscard]] virtual std::size_t slot_bytes(const Buffer& source) const = 0;
  /// Runs `change`, which may give segments back to the system or take them, where the pool's
  /// memory can be changed (cgt.cuda: its device current). Default: as is.
  [[nodiscard]] virtual Result<void> on_pool_device(const std::function<void()>& change) {
    change();
    return {};
  }

  std::unique_ptr<Arena> arena_;  ///< made by the backend; reset by its `shutdown()`
  bool poison_;                   ///< fill memory with 0xFF when it dies or is reclaimed
};

}  // namespace cgt::backend
