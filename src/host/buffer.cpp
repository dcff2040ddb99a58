// Host buffers: element access through the layout, copies.
module;
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <utility>

module cgt.host;
import cgt.core;

namespace cgt::host {

Result<Buffer> Buffer::make(ElementType type, std::span<const std::int64_t> sizes) {
  auto bytes = contiguous_bytes(type, sizes);
  if (!bytes) return fail(Errc::invalid_argument, "Buffer::make: " + bytes.error().message);
  // nothrow: a size the system refuses is an error value, not std::bad_alloc.
  auto* memory = new (std::nothrow) std::byte[*bytes]();  // NOLINT(cppcoreguidelines-owning-memory)
  if (memory == nullptr) {
    return fail(Errc::out_of_memory, "Buffer::make: the system refused " + std::to_string(*bytes) + " bytes");
  }
  const std::shared_ptr<std::byte[]> owner(memory);
  return view_of(owner.get(), *bytes, type, sizes, owner);
}

Buffer Buffer::view_of(std::byte* storage, std::size_t bytes, ElementType type, std::span<const std::int64_t> sizes,
                       std::shared_ptr<std::byte[]> owner) {
  Buffer buffer;
  buffer.owner_ = std::move(owner);
  buffer.storage_ = storage;
  buffer.storage_bytes_ = bytes;
  buffer.layout_ = Layout::contiguous(type, sizes);
  buffer.fits_ = buffer.layout_.fits(bytes);
  return buffer;
}

double Buffer::get(std::size_t flat) const noexcept {
  return load_element(type(),
                      storage_ + (layout_.element_offset(flat) * static_cast<std::int64_t>(element_size(type()))));
}

void Buffer::set(std::size_t flat, double value) const noexcept {
  store_element(type(), storage_ + (layout_.element_offset(flat) * static_cast<std::int64_t>(element_size(type()))),
                value);
}

void Buffer::fill(double value) const noexcept {
  for (std::size_t i = 0, n = numel(); i < n; ++i) set(i, value);
}

Buffer Buffer::on_storage(std::byte* storage, std::size_t bytes, std::shared_ptr<std::byte[]> owner) const {
  Buffer view = *this;
  view.storage_ = storage;
  view.storage_bytes_ = bytes;
  view.fits_ = view.layout_.fits(bytes);
  view.owner_ = std::move(owner);
  return view;
}

Result<Buffer> Buffer::clone() const {
  if (!fits()) {
    return fail(Errc::invalid_argument, "Buffer::clone: the view is invalid or reaches outside its storage");
  }
  auto copy_of = make(type(), sizes());
  if (copy_of) copy(*this, *copy_of);
  return copy_of;
}

void copy(const Buffer& source, const Buffer& target) noexcept {
  // Index only the first element of dimensions broadcast in both: they alias one element.
  const Buffer from = source.with_layout(source.layout().without_shared_broadcast(target.layout()));
  const Buffer to = target.with_layout(target.layout().without_shared_broadcast(source.layout()));
  // Dense with equal strides (contiguous, or one permutation of the dimensions): one memmove.
  if (from.type() == to.type() && ((from.is_contiguous() && to.is_contiguous()) ||
                                   (from.layout().is_dense() && std::ranges::equal(from.strides(), to.strides())))) {
    std::memmove(to.data(), from.data(), from.numel() * element_size(from.type()));
    return;
  }
  for (std::size_t i = 0, n = from.numel(); i < n; ++i) to.set(i, from.get(i));
}

}  // namespace cgt::host
