// Host buffers: strided element access, views, copies.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

module cgt.host;

namespace cgt::host {
namespace {

std::array<std::int64_t, max_rank> contiguous_strides(std::span<const std::int64_t> sizes) {
  std::array<std::int64_t, max_rank> strides{};
  std::int64_t stride = 1;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<std::int64_t>(sizes[d], 1);
  }
  return strides;
}

// Offset in elements of the flat (row-major) index `flat`.
std::int64_t element_offset(std::size_t flat, std::span<const std::int64_t> sizes,
                            std::span<const std::int64_t> strides) noexcept {
  std::int64_t offset = 0;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    const auto size = static_cast<std::size_t>(sizes[d]);
    offset += static_cast<std::int64_t>(flat % size) * strides[d];
    flat /= size;
  }
  return offset;
}

template <class T>
double load(const std::byte* at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return static_cast<double>(value);
}

template <class T>
void store(std::byte* at, double value) noexcept {
  const T typed = static_cast<T>(value);
  std::memcpy(at, &typed, sizeof(T));
}

}  // namespace

std::string_view to_string(ElementType type) noexcept {
  switch (type) {
    case ElementType::f32: return "f32";
    case ElementType::f64: return "f64";
    case ElementType::i32: return "i32";
    case ElementType::i64: return "i64";
    case ElementType::u8: return "u8";
  }
  return "?";
}

Buffer Buffer::make(ElementType type, std::span<const std::int64_t> sizes) {
  std::size_t count = 1;
  for (const std::int64_t size : sizes) count *= static_cast<std::size_t>(size);
  const std::size_t bytes = std::max<std::size_t>(count * element_size(type), 1);
  const std::shared_ptr<std::byte[]> owner(new std::byte[bytes]());  // NOLINT(cppcoreguidelines-owning-memory)
  return view_of(owner.get(), bytes, type, sizes, owner);
}

Buffer Buffer::view_of(std::byte* storage, std::size_t bytes, ElementType type, std::span<const std::int64_t> sizes,
                       std::shared_ptr<std::byte[]> owner) {
  Buffer buffer;
  buffer.owner_ = std::move(owner);
  buffer.storage_ = storage;
  buffer.storage_bytes_ = bytes;
  buffer.type_ = type;
  buffer.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  std::copy_n(sizes.begin(), buffer.rank_, buffer.sizes_.begin());
  buffer.strides_ = contiguous_strides(buffer.sizes());
  return buffer;
}

std::size_t Buffer::numel() const noexcept {
  std::size_t count = 1;
  for (const std::int64_t size : sizes()) count *= static_cast<std::size_t>(size);
  return count;
}

bool Buffer::is_contiguous() const noexcept {
  return std::ranges::equal(strides(), std::span(contiguous_strides(sizes()).data(), rank_));
}

double Buffer::get(std::size_t flat) const noexcept {
  const std::byte* at = storage_ + ((offset_ + element_offset(flat, sizes(), strides())) *
                                    static_cast<std::int64_t>(element_size(type_)));
  switch (type_) {
    case ElementType::f32: return load<float>(at);
    case ElementType::f64: return load<double>(at);
    case ElementType::i32: return load<std::int32_t>(at);
    case ElementType::i64: return load<std::int64_t>(at);
    case ElementType::u8: return load<std::uint8_t>(at);
  }
  return 0;
}

void Buffer::set(std::size_t flat, double value) const noexcept {
  std::byte* at = storage_ + ((offset_ + element_offset(flat, sizes(), strides())) *
                              static_cast<std::int64_t>(element_size(type_)));
  switch (type_) {
    case ElementType::f32: store<float>(at, value); break;
    case ElementType::f64: store<double>(at, value); break;
    case ElementType::i32: store<std::int32_t>(at, value); break;
    case ElementType::i64: store<std::int64_t>(at, value); break;
    case ElementType::u8: store<std::uint8_t>(at, value); break;
  }
}

void Buffer::fill(double value) const noexcept {
  for (std::size_t i = 0, n = numel(); i < n; ++i) set(i, value);
}

Buffer Buffer::restrided(std::int64_t offset, std::span<const std::int64_t> sizes,
                         std::span<const std::int64_t> strides) const {
  Buffer view = *this;
  view.offset_ = offset;
  view.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  std::copy_n(sizes.begin(), view.rank_, view.sizes_.begin());
  std::copy_n(strides.begin(), view.rank_, view.strides_.begin());
  return view;
}

Buffer Buffer::slice(std::int64_t start, std::int64_t end) const {
  Buffer view = *this;
  if (rank_ == 0) return view;
  view.offset_ = offset_ + start * strides_[0];
  view.sizes_[0] = end - start;
  return view;
}

Buffer Buffer::expand(std::span<const std::int64_t> sizes) const {
  Buffer view = *this;
  view.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  const std::size_t lead = view.rank_ - rank_;  // new leading dimensions broadcast
  for (std::size_t d = 0; d < view.rank_; ++d) {
    const bool is_new = d < lead;
    const std::int64_t old_size = is_new ? 1 : sizes_[d - lead];
    view.sizes_[d] = sizes[d];
    view.strides_[d] = (is_new || (old_size == 1 && sizes[d] != 1)) ? 0 : strides_[d - lead];
  }
  return view;
}

Buffer Buffer::on_storage(std::byte* storage, std::size_t bytes, std::shared_ptr<std::byte[]> owner) const {
  Buffer view = *this;
  view.storage_ = storage;
  view.storage_bytes_ = bytes;
  view.owner_ = std::move(owner);
  return view;
}

Buffer Buffer::clone() const {
  Buffer copy_of = make(type_, sizes());
  copy(*this, copy_of);
  return copy_of;
}

std::size_t Buffer::required_bytes() const noexcept {
  std::int64_t last = offset_;
  for (std::size_t d = 0; d < rank_; ++d) {
    if (sizes_[d] == 0) return static_cast<std::size_t>(offset_) * element_size(type_);
    last += (sizes_[d] - 1) * strides_[d];
  }
  return static_cast<std::size_t>(last + 1) * element_size(type_);
}

void copy(const Buffer& source, const Buffer& target) noexcept {
  // Index only the first element of dimensions broadcast in both: they alias one element.
  std::array<std::int64_t, max_rank> sizes{};
  const std::size_t rank = source.rank();
  const std::uint32_t both = source.expanded_dims() & target.expanded_dims();
  for (std::size_t d = 0; d < rank; ++d) sizes[d] = (both >> d & 1U) != 0 ? 1 : source.sizes()[d];
  const Buffer from = source.restrided(source.offset(), std::span(sizes.data(), rank), source.strides());
  const Buffer to = target.restrided(target.offset(), std::span(sizes.data(), rank), target.strides());
  if (from.is_contiguous() && to.is_contiguous() && from.type() == to.type()) {
    std::memmove(to.data(), from.data(), from.numel() * element_size(from.type()));
    return;
  }
  for (std::size_t i = 0, n = from.numel(); i < n; ++i) to.set(i, from.get(i));
}

}  // namespace cgt::host
