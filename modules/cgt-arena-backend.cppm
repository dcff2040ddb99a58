// cgt:arena_backend — what a backend whose pool is a cgt::Arena and whose values are buffers
// (`empty()`, `storage()`, `storage_bytes()`) does the same way whatever the device: free a call's
// temporaries, describe its outputs to the engine, checkpoint and restore the arena. Used by
// cgt.host and cgt.cuda.
module;
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <span>
#include <vector>

export module cgt:arena_backend;
import :arena;
import :backend;
import :error;

export namespace cgt::backend {

/// Frees the blocks a call allocated in `arena` (`allocations`, their addresses) that are not the
/// storage of one of its `outputs`, and clears the list. Temporaries die with the call.
template <class Buffer>
void free_unreturned(Arena& arena, std::vector<std::uintptr_t>& allocations, std::span<const Buffer> outputs) {
  for (const std::uintptr_t address : allocations) {
    bool returned = false;
    for (const Buffer& out : outputs) {
      returned = returned || address_of(out.storage()) == address;
    }
    if (!returned) (void)arena.free(address);  // NOLINT(bugprone-unused-return-value): fails only if already free
  }
  allocations.clear();
}

/// Describes a call's outputs for the engine, which then owns them: a storage is in the pool when
/// `arena` holds it; an empty buffer is no output.
template <class Buffer>
RunResult describe_outputs(const Arena& arena, std::vector<Buffer>&& outputs) {
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
    }
    result.outputs.push_back(desc);
    result.values.push_back(&out);
  }
  result.owner = std::move(owned);
  return result;
}

/// An arena's checkpoint, as the engine keeps it.
class ArenaCheckpointOf final : public Checkpoint {
 public:
  explicit ArenaCheckpointOf(ArenaCheckpoint state) : state_(std::move(state)) {}
  [[nodiscard]] const ArenaCheckpoint& state() const noexcept { return state_; }

 private:
  ArenaCheckpoint state_;
};

/// Device::checkpoint for an arena pool.
inline Result<std::unique_ptr<Checkpoint>> checkpoint_arena(const Arena& arena) {
  return std::make_unique<ArenaCheckpointOf>(arena.checkpoint());
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

}  // namespace cgt::backend
