// cgt.host:internal — the engine's side of the host device (backend::Device): what the engine
// calls to run, warm up and record pool functions over the arena, and the memory side of the
// tree (checkpoints, releases, rescues). Not exported: a program sees the device through its view
// (`cgt::host::Device`, modules/cgt.host-device.cppm), which this class owns.
module;
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

module cgt.host:internal;
import cgt;
import cgt.core;
import :buffer;
import :device;

namespace cgt::host {

/// Where a recording whose loops and branches the host decides (`ControlFlow::on_host`) is cut:
/// segment `i` is the captured kernels [ends[i - 1], ends[i]) (from 0 for the first), run in the
/// order `decisions` says. Filled by Context::loop_while, if_then and switch_on while capturing.
struct HostSegments {
  std::vector<std::size_t> ends;
  backend::HostDecisions decisions;
  /// Ends the segment captured since the last cut; an empty one is left out.
  void cut(const Stream& stream) {
    const std::size_t end = stream.captured();
    if (end == (ends.empty() ? 0 : ends.back())) return;
    decisions.segment(ends.size());
    ends.push_back(end);
  }
};

class HostDevice final : public backend::Device {
 public:
  HostDevice(ArenaOptions arena, bool poison_dead_memory);

  /// What a program reaches with `pool.device()`.
  [[nodiscard]] host::Device& view() noexcept { return view_; }
  [[nodiscard]] const Arena* arena() const noexcept { return arena_.get(); }
  [[nodiscard]] Stream& stream() noexcept { return stream_; }
  [[nodiscard]] std::size_t recordings_redoing_another() const noexcept { return redoing_another_; }

  [[nodiscard]] std::int32_t device_index() const noexcept override { return 0; }
  [[nodiscard]] bool releases_unowned_storage() const noexcept override { return poison_; }
  /// Whether the arena contains `storage`.
  [[nodiscard]] bool owns(std::uintptr_t storage) const noexcept override {
    return arena_ != nullptr && arena_->contains(storage);
  }
  [[nodiscard]] std::string type_name(std::uint16_t dtype) const override {
    return std::string(to_string(static_cast<ElementType>(dtype)));
  }
  /// Buffers carry their life number: a stale copy of a reclaimed output is told apart.
  [[nodiscard]] bool stamps_values() const noexcept override { return true; }
  void stamp(const void* value, std::uint64_t life) const noexcept override {
    backend::stamp_buffer<Buffer>(value, life);
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
  void adopt(backend::StorageHandle& storage) override;
  [[nodiscard]] Result<std::shared_ptr<void>> rescue(const backend::StorageHandle& storage) override;
  [[nodiscard]] std::shared_ptr<const void> rebase(const void* value, const backend::StorageHandle& from,
                                                   const std::shared_ptr<void>& rescued) override;
  /// Batch buckets: the host pads into ordinary memory and slices by restriding (src/host/buckets.cpp).
  [[nodiscard]] std::string why_no_buckets() const override { return {}; }
  [[nodiscard]] Result<backend::Padded> pad(const void* value, const backend::ArgDesc& desc, std::size_t dim,
                                            std::int64_t size, Pad pad) override;
  [[nodiscard]] Result<std::shared_ptr<const void>> slice(const void* value, const backend::StorageHandle* storage,
                                                          std::size_t dim, std::int64_t bucket,
                                                          std::int64_t size) override;
  [[nodiscard]] std::vector<std::int64_t> sizes_of(const void* value) const override;
  [[nodiscard]] Result<void> write_back(const void* padded, const void* original, std::size_t dim,
                                        std::int64_t rows) override;
  [[nodiscard]] std::vector<Block> live_blocks() const override;
  [[nodiscard]] MemoryInfo memory() const override;
  void shutdown() override;
  // Its arena predicts a recording from the warm-up's trace; host segments go back to the heap.
  [[nodiscard]] std::optional<std::size_t> predict_growth(const ArenaTrace& warmup,
                                                          std::span<const backend::ArgSlot> args,
                                                          const backend::RecordPlan& plan) const override;
  std::size_t release_unused() override;

  /// For `Context` and `HostCapture`.
  [[nodiscard]] Buffer allocate_in_pool(Context& context, ElementType type, std::span<const std::int64_t> sizes);
  /// Frees the pool blocks `context` allocated since its `from`-th (Context::free_allocations_since).
  void free_pool_blocks_since(Context& context, std::size_t from);
  [[nodiscard]] Result<backend::RunResult> finish(Context& context, Values&& outputs);
  [[nodiscard]] bool in_pool(const Buffer& value) const noexcept;

 private:
  friend class HostCapture;
  host::Device view_{*this};
  std::unique_ptr<Arena> arena_;
  Stream stream_;
  bool poison_;
  std::size_t redoing_another_ = 0;
};

}  // namespace cgt::host
