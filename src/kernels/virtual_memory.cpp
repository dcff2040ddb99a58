// Virtual-memory segments (virtual_memory.hpp): the driver's cuMem* functions, found at run time.
#include "virtual_memory.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>

namespace cgt::kernels {
namespace {

// The driver functions used, as the runtime hands them out.
struct Driver {
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) free_addresses = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
};

template <class F>
bool find(const char* symbol, F& function) {
  void* found = nullptr;
  cudaDriverEntryPointQueryResult status{};
  constexpr unsigned kAbi = 12000;  // the cuMem* functions' signatures since CUDA 10.2
  if (cudaGetDriverEntryPointByVersion(symbol, &found, kAbi, cudaEnableDefault, &status) != cudaSuccess ||
      status != cudaDriverEntryPointSuccess || found == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  function = reinterpret_cast<F>(found);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast): the driver's ABI
  return true;
}

std::optional<Driver> load_driver() {
  Driver driver;
  const bool all = find("cuMemGetAllocationGranularity", driver.granularity) &&
                   find("cuMemAddressReserve", driver.reserve) && find("cuMemAddressFree", driver.free_addresses) &&
                   find("cuMemCreate", driver.create) && find("cuMemRelease", driver.release) &&
                   find("cuMemMap", driver.map) && find("cuMemUnmap", driver.unmap) &&
                   find("cuMemSetAccess", driver.set_access);
  if (!all) return std::nullopt;
  return driver;
}

// One segment: its addresses, and its pages while mapped.
struct Segment {
  std::size_t reserved = 0;  // bytes of addresses (a multiple of the granularity)
  std::optional<CUmemGenericAllocationHandle> pages;
};

// What the four operations share: the driver, the device's allocation properties, the segments.
// Used by one arena, under its pool's lock.
struct State {
  Driver driver;
  CUmemAllocationProp prop{};
  std::size_t granularity = 0;
  std::map<std::uintptr_t, Segment> segments;

  [[nodiscard]] bool map_pages(std::uintptr_t base, Segment& segment) const {
    CUmemGenericAllocationHandle handle{};
    if (driver.create(&handle, segment.reserved, &prop, 0) != CUDA_SUCCESS) return false;
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (driver.map(base, segment.reserved, 0, handle, 0) != CUDA_SUCCESS) {
      (void)driver.release(handle);
      return false;
    }
    if (driver.set_access(base, segment.reserved, &access, 1) != CUDA_SUCCESS) {
      (void)driver.unmap(base, segment.reserved);
      (void)driver.release(handle);
      return false;
    }
    segment.pages = handle;
    return true;
  }

  std::size_t unmap_pages(std::uintptr_t base, Segment& segment) const {
    if (!segment.pages) return 0;
    if (driver.unmap(base, segment.reserved) != CUDA_SUCCESS) return 0;
    (void)driver.release(*segment.pages);
    segment.pages.reset();
    return segment.reserved;
  }
};

// Runs `make` with the calling thread's capture mode relaxed: a recording may need a segment, and
// the driver's allocations are no work of the stream it captures (libtorch's allocator does so too).
template <class Make>
auto relaxed(Make make) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
  auto made = make();
  if (exchanged) (void)cudaThreadExchangeStreamCaptureMode(&mode);
  return made;
}

}  // namespace

std::optional<VirtualSegments> virtual_segments(int device) {
  std::optional<Driver> driver = load_driver();
  if (!driver) return std::nullopt;
  auto state = std::make_shared<State>();
  state->driver = *driver;
  state->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  state->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  state->prop.location.id = device;
  if (driver->granularity(&state->granularity, &state->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      state->granularity == 0) {
    return std::nullopt;
  }
  VirtualSegments segments;
  segments.obtain = [state](std::size_t bytes, std::size_t /*alignment*/) -> std::byte* {
    return relaxed([&]() -> std::byte* {
      Segment segment;
      segment.reserved = (bytes + state->granularity - 1) / state->granularity * state->granularity;
      CUdeviceptr base = 0;
      if (state->driver.reserve(&base, segment.reserved, 0, 0, 0) != CUDA_SUCCESS) return nullptr;
      if (!state->map_pages(base, segment)) {
        (void)state->driver.free_addresses(base, segment.reserved);
        return nullptr;
      }
      state->segments.emplace(base, segment);
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast,performance-no-int-to-ptr): the driver's address
      return reinterpret_cast<std::byte*>(base);
    });
  };
  segments.give_back = [state](std::byte* memory, std::size_t /*bytes*/, std::size_t /*alignment*/) {
    const auto base = reinterpret_cast<std::uintptr_t>(memory);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    auto found = state->segments.find(base);
    if (found == state->segments.end()) return;
    (void)state->unmap_pages(base, found->second);
    (void)state->driver.free_addresses(base, found->second.reserved);
    state->segments.erase(found);
  };
  segments.unback = [state](std::byte* memory, std::size_t /*bytes*/) -> std::size_t {
    const auto base = reinterpret_cast<std::uintptr_t>(memory);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    auto found = state->segments.find(base);
    return found == state->segments.end() ? 0 : state->unmap_pages(base, found->second);
  };
  segments.reback = [state](std::byte* memory, std::size_t /*bytes*/) -> bool {
    const auto base = reinterpret_cast<std::uintptr_t>(memory);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    auto found = state->segments.find(base);
    if (found == state->segments.end()) return false;
    if (found->second.pages) return true;
    return relaxed([&] { return state->map_pages(base, found->second); });
  };
  return segments;
}

}  // namespace cgt::kernels
