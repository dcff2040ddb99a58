// Device buffers: owned allocations and copies to and from the host.
module;
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <vector>

module cgt.cuda;
import cgt.core;
import :internal;

namespace cgt::cuda {

Result<Buffer> Buffer::make(ElementType type, std::span<const std::int64_t> sizes, int device) {
  const auto checked_bytes = contiguous_bytes(type, sizes);
  if (!checked_bytes) return fail(Errc::invalid_argument, "Buffer::make: " + checked_bytes.error().message);
  const std::size_t bytes = *checked_bytes;
  CurrentDevice current;
  if (auto set = current.enter(device); !set) return std::unexpected(set.error());
  auto memory = device_allocation(bytes, "making a buffer");
  if (!memory) return std::unexpected(std::move(memory.error()));
  if (auto zeroed = checked(cudaMemset(memory->get(), 0, bytes), "zeroing a new buffer"); !zeroed) {
    return std::unexpected(zeroed.error());
  }
  return view_of(static_cast<std::byte*>(memory->get()), bytes, type, sizes, device, std::move(*memory));
}

Buffer Buffer::view_of(std::byte* storage, std::size_t bytes, ElementType type, std::span<const std::int64_t> sizes,
                       int device, std::shared_ptr<void> owner) {
  Buffer buffer;
  buffer.owner_ = std::move(owner);
  buffer.storage_ = storage;
  buffer.storage_bytes_ = bytes;
  buffer.layout_ = Layout::contiguous(type, sizes);
  buffer.fits_ = buffer.layout_.fits(bytes);
  buffer.device_ = device;
  return buffer;
}

Buffer Buffer::on_storage(std::byte* storage, std::size_t bytes, std::shared_ptr<void> owner) const {
  Buffer view = *this;
  view.storage_ = storage;
  view.storage_bytes_ = bytes;
  view.fits_ = view.layout_.fits(bytes);
  view.owner_ = std::move(owner);
  return view;
}

// read and write wait for the whole device: a pool's stream may be non-blocking, and then the
// legacy default stream's cudaMemcpy is not ordered with it. They make the buffer's device current
// first (and put the caller's back): the wait and the legacy stream are the current device's.
Result<std::vector<double>> Buffer::read() const {
  if (!fits()) return fail(Errc::invalid_argument, "Buffer::read: the view is invalid or reaches outside its storage");
  CurrentDevice current;
  if (auto set = current.enter(device_); !set) return std::unexpected(set.error());
  if (auto idle = checked(cudaDeviceSynchronize(), "waiting for the device before reading a buffer"); !idle)
    return std::unexpected(idle.error());
  std::vector<std::byte> host(storage_bytes_);
  if (auto copied =
          checked(cudaMemcpy(host.data(), storage_, storage_bytes_, cudaMemcpyDeviceToHost), "reading a buffer");
      !copied) {
    return std::unexpected(copied.error());
  }
  std::vector<double> values(numel());
  const auto size = static_cast<std::int64_t>(element_size(type()));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = load_element(type(), host.data() + (layout_.element_offset(i) * size));
  return values;
}

Result<void> Buffer::write(std::span<const double> values) const {
  if (!fits()) return fail(Errc::invalid_argument, "Buffer::write: the view is invalid or reaches outside its storage");
  CurrentDevice current;
  if (auto set = current.enter(device_); !set) return set;
  if (auto idle = checked(cudaDeviceSynchronize(), "waiting for the device before writing a buffer"); !idle)
    return idle;
  std::vector<std::byte> host(storage_bytes_);
  if (auto copied =
          checked(cudaMemcpy(host.data(), storage_, storage_bytes_, cudaMemcpyDeviceToHost), "writing a buffer");
      !copied) {
    return copied;
  }
  const auto size = static_cast<std::int64_t>(element_size(type()));
  for (std::size_t i = 0; i < values.size() && i < numel(); ++i) {
    store_element(type(), host.data() + (layout_.element_offset(i) * size), values[i]);
  }
  if (auto copied =
          checked(cudaMemcpy(storage_, host.data(), storage_bytes_, cudaMemcpyHostToDevice), "writing a buffer");
      !copied) {
    return copied;
  }
  // A pageable cudaMemcpy may return before the copy lands.
  return checked(cudaDeviceSynchronize(), "waiting for a buffer's write");
}

}  // namespace cgt::cuda
