// Strided layouts: element offsets and views.
module;
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

module cgt;

namespace cgt {
namespace {

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

double load_element(ElementType type, const std::byte* at) noexcept {
  switch (type) {
    case ElementType::f32: return load<float>(at);
    case ElementType::f64: return load<double>(at);
    case ElementType::i32: return load<std::int32_t>(at);
    case ElementType::i64: return load<std::int64_t>(at);
    case ElementType::u8: return load<std::uint8_t>(at);
  }
  return 0;
}

void store_element(ElementType type, std::byte* at, double value) noexcept {
  switch (type) {
    case ElementType::f32: store<float>(at, value); break;
    case ElementType::f64: store<double>(at, value); break;
    case ElementType::i32: store<std::int32_t>(at, value); break;
    case ElementType::i64: store<std::int64_t>(at, value); break;
    case ElementType::u8: store<std::uint8_t>(at, value); break;
  }
}

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

Layout Layout::contiguous(ElementType type, std::span<const std::int64_t> sizes) noexcept {
  Layout layout;
  layout.type_ = type;
  layout.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  std::int64_t stride = 1;
  for (std::size_t d = layout.rank_; d-- > 0;) {
    layout.sizes_[d] = sizes[d];
    layout.strides_[d] = stride;
    stride *= std::max<std::int64_t>(sizes[d], 1);
  }
  return layout;
}

std::size_t Layout::numel() const noexcept {
  std::size_t count = 1;
  for (const std::int64_t size : sizes()) count *= static_cast<std::size_t>(size);
  return count;
}

bool Layout::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (std::size_t d = rank_; d-- > 0;) {
    if (sizes_[d] != 1 && strides_[d] != expected) return false;
    expected *= std::max<std::int64_t>(sizes_[d], 1);
  }
  return true;
}

std::int64_t Layout::element_offset(std::size_t flat) const noexcept {
  std::int64_t at = offset_;
  for (std::size_t d = rank_; d-- > 0;) {
    const auto size = static_cast<std::size_t>(sizes_[d]);
    at += static_cast<std::int64_t>(flat % size) * strides_[d];
    flat /= size;
  }
  return at;
}

std::size_t Layout::required_bytes() const noexcept {
  std::int64_t last = offset_;
  for (std::size_t d = 0; d < rank_; ++d) {
    if (sizes_[d] == 0) return static_cast<std::size_t>(offset_) * element_size(type_);
    last += (sizes_[d] - 1) * strides_[d];
  }
  return static_cast<std::size_t>(last + 1) * element_size(type_);
}

Layout Layout::restrided(std::int64_t offset, std::span<const std::int64_t> sizes,
                         std::span<const std::int64_t> strides) const noexcept {
  Layout view = *this;
  view.offset_ = offset;
  view.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  std::copy_n(sizes.begin(), view.rank_, view.sizes_.begin());
  std::copy_n(strides.begin(), view.rank_, view.strides_.begin());
  return view;
}

Layout Layout::slice(std::int64_t start, std::int64_t end) const noexcept {
  Layout view = *this;
  if (rank_ == 0) return view;
  view.offset_ = offset_ + (start * strides_[0]);
  view.sizes_[0] = end - start;
  return view;
}

Layout Layout::select(std::int64_t index) const noexcept {
  if (rank_ == 0) return *this;
  return restrided(offset_ + (index * strides_[0]), sizes().subspan(1), strides().subspan(1));
}

Layout Layout::transposed() const noexcept {
  if (rank_ != 2) return *this;
  const std::array<std::int64_t, 2> sizes{sizes_[1], sizes_[0]};
  const std::array<std::int64_t, 2> strides{strides_[1], strides_[0]};
  return restrided(offset_, sizes, strides);
}

Layout Layout::expand(std::span<const std::int64_t> sizes) const noexcept {
  Layout view = *this;
  view.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  const std::size_t lead = view.rank_ - rank_;  // new leading dimensions are broadcast
  for (std::size_t d = 0; d < view.rank_; ++d) {
    const bool is_new = d < lead;
    const std::int64_t old_size = is_new ? 1 : sizes_[d - lead];
    view.sizes_[d] = sizes[d];
    view.strides_[d] = (is_new || (old_size == 1 && sizes[d] != 1)) ? 0 : strides_[d - lead];
  }
  return view;
}

Layout Layout::without_shared_broadcast(const Layout& other) const noexcept {
  Layout narrowed = *this;
  const std::uint32_t both = expanded_dims() & other.expanded_dims();
  for (std::size_t d = 0; d < rank_; ++d) {
    if (((both >> d) & 1U) != 0) narrowed.sizes_[d] = 1;
  }
  return narrowed;
}

}  // namespace cgt
