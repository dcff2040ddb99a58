// cgt.host:internal — the engine's side of the host device (backend::Device): what the engine
// calls to run, warm up and record pool functions over the arena, and the memory side of the
// tree (checkpoints, releases, rescues). Not exported: a program sees the device through its view
// (`cgt::host::Device`, modules/cgt.host-device.cppm), which this class owns.
module;
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
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

/// The host pool's device: an arena of host memory (`backend::ArenaDevice`: ownership, checkpoints,
/// memory, prediction, sleep), a stream that runs kernels at once or records them.
class HostDevice final : public backend::ArenaDevice<Buffer> {
 public:
  HostDevice(ArenaOptions arena, bool poison_dead_memory);

  /// What a program reaches with `pool.device()`.
  [[nodiscard]] host::Device& view() noexcept { return view_; }
  [[nodiscard]] Stream& stream() noexcept { return stream_; }
  [[nodiscard]] std::size_t recordings_redoing_another() const noexcept { return redoing_another_; }

  [[nodiscard]] std::int32_t device_index() const noexcept override { return 0; }
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
  void shutdown() override;

  /// For `Context` and `HostCapture`.
  [[nodiscard]] Buffer allocate_in_pool(Context& context, ElementType type, std::span<const std::int64_t> sizes);
  /// Frees the pool blocks `context` allocated since its `from`-th (Context::free_allocations_since).
  void free_pool_blocks_since(Context& context, std::size_t from);
  [[nodiscard]] Result<backend::RunResult> finish(Context& context, Values&& outputs);
  [[nodiscard]] bool in_pool(const Buffer& value) const noexcept;

 private:
  friend class HostCapture;
  [[nodiscard]] std::size_t slot_bytes(const Buffer& source) const override;

  host::Device view_{*this};
  Stream stream_;
  std::size_t redoing_another_ = 0;
};

}  // namespace cgt::host
