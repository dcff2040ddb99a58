// Device memory whose pages can be given back while its addresses stay reserved (CUDA's virtual
// memory management: cuMemAddressReserve, cuMemCreate, cuMemMap), for an arena whose graphs must
// survive a release of its memory (`Pool::sleep`). Used by cgt.cuda with `PoolOptions::sleepable`.
// The driver's functions are reached through cudaGetDriverEntryPointByVersion, so nothing links
// libcuda.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>

namespace cgt::kernels {

/// The four operations of an arena's segment source (`cgt::SegmentSource`), over virtual memory.
struct VirtualSegments {
  /// Reserves `bytes` of addresses (rounded up to the driver's granularity) and maps pages there;
  /// null when the driver refuses.
  std::function<std::byte*(std::size_t bytes, std::size_t alignment)> obtain;
  /// Unmaps what is mapped and frees the addresses.
  std::function<void(std::byte* segment, std::size_t bytes, std::size_t alignment)> give_back;
  /// Unmaps the pages and releases them, keeping the addresses; the bytes released (0 on failure).
  std::function<std::size_t(std::byte* segment, std::size_t bytes)> unback;
  /// Maps new pages at the same addresses; false when the driver refuses.
  std::function<bool(std::byte* segment, std::size_t bytes)> reback;
};

/// Segments of device `device`'s memory made as above; empty where the driver offers no virtual
/// memory management. REQUIRES: the device is current when each function runs.
[[nodiscard]] std::optional<VirtualSegments> virtual_segments(int device);

}  // namespace cgt::kernels
