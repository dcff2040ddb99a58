// Strided layouts: element offsets and views.
module;
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

module cgt.vocabulary;

namespace cgt {
namespace {

template <class T>
double load(const std::byte* at) noexcept {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return static_cast<double>(value);
}

// The double -> integer conversion without undefined behaviour: NaN becomes 0, and values past
// the type's range its nearest end. (Both bounds as doubles: the lowest is a power of two, exact;
// the highest rounds up to one, so a value at or past it is out of range.)
template <class T>
T saturated(double value) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(value);
  } else {
    if (std::isnan(value)) return T{0};
    if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (value >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(value);
  }
}

template <class T>
void store(std::byte* at, double value) noexcept {
  const T typed = saturated<T>(value);
  std::memcpy(at, &typed, sizeof(T));
}

template <class T>
bool holds(double value) noexcept {
  if constexpr (std::is_floating_point_v<T>) {
    return true;
  } else {
    // In range (the highest bound as a double may round up past the type's max: excluded), and whole.
    return value >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
           value < static_cast<double>(std::numeric_limits<T>::max()) + 1.0 && std::trunc(value) == value;
  }
}

// Checked int64 arithmetic: false on overflow (signed overflow is undefined behaviour).
bool mul(std::int64_t a, std::int64_t b, std::int64_t& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}
bool add(std::int64_t a, std::int64_t b, std::int64_t& out) noexcept {
  return !__builtin_add_overflow(a, b, &out);
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

bool holds_exactly(ElementType type, double value) noexcept {
  switch (type) {
    case ElementType::f32: return holds<float>(value);
    case ElementType::f64: return holds<double>(value);
    case ElementType::i32: return holds<std::int32_t>(value);
    case ElementType::i64: return holds<std::int64_t>(value);
    case ElementType::u8: return holds<std::uint8_t>(value);
  }
  return false;
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

Result<std::size_t> contiguous_bytes(ElementType type, std::span<const std::int64_t> sizes) {
  if (sizes.size() > max_rank) {
    return fail(Errc::invalid_argument,
                std::to_string(sizes.size()) + " dimensions; a buffer has at most " + std::to_string(max_rank));
  }
  std::int64_t count = 1;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] < 0) {
      return fail(Errc::invalid_argument,
                  "size " + std::to_string(sizes[d]) + " of dimension " + std::to_string(d) + " is negative");
    }
    if (!mul(count, sizes[d], count)) {
      return fail(Errc::invalid_argument, "the element count (the product of the sizes) overflows 64 bits");
    }
  }
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(count), element_size(type), &bytes)) {
    return fail(Errc::invalid_argument, std::to_string(count) + " elements of " + std::string(to_string(type)) +
                                            " are more bytes than a std::size_t counts");
  }
  return std::max<std::size_t>(bytes, 1);
}

namespace {

// Lowest and highest element offsets of a layout with elements; nullopt on overflow.
std::optional<std::pair<std::int64_t, std::int64_t>> extent(std::int64_t offset, std::span<const std::int64_t> sizes,
                                                            std::span<const std::int64_t> strides) noexcept {
  std::int64_t low = offset;
  std::int64_t high = offset;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    std::int64_t reach = 0;
    if (sizes[d] <= 0) continue;  // callers ask only for layouts with elements
    if (!mul(sizes[d] - 1, strides[d], reach)) return std::nullopt;
    if (!add(reach < 0 ? low : high, reach, reach < 0 ? low : high)) return std::nullopt;
  }
  return std::pair{low, high};
}

// Whether sizes and strides describe a layout whose element count and element offsets fit in
// int64 (then no arithmetic on it overflows).
bool well_formed(std::int64_t offset, std::span<const std::int64_t> sizes,
                 std::span<const std::int64_t> strides) noexcept {
  std::int64_t count = 1;
  for (const std::int64_t size : sizes) {
    if (size < 0 || !mul(count, size, count)) return false;
  }
  return count == 0 || extent(offset, sizes, strides).has_value();
}

}  // namespace

Layout Layout::invalidated() const noexcept {
  Layout view = *this;
  view.valid_ = false;
  return view;
}

Layout Layout::contiguous(ElementType type, std::span<const std::int64_t> sizes) noexcept {
  Layout layout;
  layout.type_ = type;
  layout.rank_ = static_cast<std::uint8_t>(std::min(sizes.size(), max_rank));
  if (sizes.size() > max_rank) layout.valid_ = false;
  std::int64_t stride = 1;
  for (std::size_t d = layout.rank_; d-- > 0;) {
    layout.sizes_[d] = sizes[d];
    layout.strides_[d] = stride;
    if (sizes[d] < 0 || !mul(stride, std::max<std::int64_t>(sizes[d], 1), stride)) {
      layout.valid_ = false;
      stride = 1;
    }
  }
  return layout;
}

std::size_t Layout::numel() const noexcept {
  if (!valid_) return 0;
  std::size_t count = 1;
  for (const std::int64_t size : sizes()) count *= static_cast<std::size_t>(size);
  return count;
}

bool Layout::is_contiguous() const noexcept {
  if (!valid_) return false;
  std::int64_t expected = 1;
  for (std::size_t d = rank_; d-- > 0;) {
    if (sizes_[d] != 1 && strides_[d] != expected) return false;
    expected *= std::max<std::int64_t>(sizes_[d], 1);  // a valid layout's products fit
  }
  return true;
}

std::int64_t Layout::element_offset(std::size_t flat) const noexcept {
  std::int64_t at = offset_;
  for (std::size_t d = rank_; d-- > 0;) {
    const auto size = static_cast<std::size_t>(std::max<std::int64_t>(sizes_[d], 1));
    at += static_cast<std::int64_t>(flat % size) * strides_[d];
    flat /= size;
  }
  return at;
}

std::size_t Layout::required_bytes() const noexcept {
  constexpr std::size_t unbounded = std::numeric_limits<std::size_t>::max();
  if (!valid_) return unbounded;
  std::int64_t last = std::max<std::int64_t>(offset_, 0);  // one past the highest element
  if (numel() != 0) {
    const auto span = extent(offset_, sizes(), strides());
    if (!span || !add(span->second, 1, last)) return unbounded;
    last = std::max<std::int64_t>(last, 0);
  }
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(last), element_size(type_), &bytes)) return unbounded;
  return bytes;
}

bool Layout::fits(std::size_t storage_bytes) const noexcept {
  // Every replay checks its copied inputs with this: one pass, no checked arithmetic, since a
  // valid layout's element offsets fit in int64 (view operations check that as they make it).
  if (!valid_) return false;
  std::int64_t low = offset_;
  std::int64_t high = offset_;
  for (std::size_t d = 0; d < rank_; ++d) {
    if (sizes_[d] == 0) return true;  // no elements: nothing to read
    const std::int64_t reach = (sizes_[d] - 1) * strides_[d];
    (reach < 0 ? low : high) += reach;
  }
  if (low < 0) return false;
  return static_cast<std::size_t>(high) < storage_bytes / element_size(type_);
}

namespace {

// The dimensions of a layout that step through memory (size > 1, stride not 0), as (|stride|,
// size) pairs sorted by |stride|, innermost first; `reversed` says whether a stride was negative.
struct Steps {
  std::array<std::int64_t, max_rank> step{};
  std::array<std::int64_t, max_rank> count{};
  std::size_t n = 0;
  bool reversed = false;
  bool broadcast = false;
};

Steps sorted_steps(std::span<const std::int64_t> sizes, std::span<const std::int64_t> strides) noexcept {
  Steps steps;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] <= 1) continue;
    if (strides[d] == 0) {
      steps.broadcast = true;
      continue;
    }
    steps.reversed = steps.reversed || strides[d] < 0;
    steps.step[steps.n] = strides[d] < 0 ? -strides[d] : strides[d];  // a valid layout's reach fits: so does this
    steps.count[steps.n++] = sizes[d];
  }
  for (std::size_t i = 1; i < steps.n; ++i) {  // insertion sort: at most max_rank entries
    for (std::size_t j = i; j > 0 && steps.step[j - 1] > steps.step[j]; --j) {
      std::swap(steps.step[j - 1], steps.step[j]);
      std::swap(steps.count[j - 1], steps.count[j]);
    }
  }
  return steps;
}

}  // namespace

bool Layout::is_injective_apart_from_broadcast() const noexcept {
  if (!valid_) return false;
  if (numel() == 0) return true;
  // Each dimension must step past all that the inner ones reach.
  const Steps steps = sorted_steps(sizes(), strides());
  std::int64_t reach = 0;  // of the inner dimensions, in elements
  for (std::size_t i = 0; i < steps.n; ++i) {
    if (steps.step[i] <= reach) return false;
    reach += (steps.count[i] - 1) * steps.step[i];
  }
  return true;
}

bool Layout::is_dense() const noexcept {
  if (!valid_) return false;
  if (numel() == 0) return true;
  const Steps steps = sorted_steps(sizes(), strides());
  if (steps.reversed || steps.broadcast) return false;
  std::int64_t expected = 1;
  for (std::size_t i = 0; i < steps.n; ++i) {
    if (steps.step[i] != expected) return false;
    expected *= steps.count[i];
  }
  return true;
}

Layout Layout::dense_like() const noexcept {
  Layout dense = *this;
  dense.offset_ = 0;
  if (!valid_) return dense;
  // Dimensions that get a dense stride, outermost first: by |stride|, descending; ties by position.
  std::array<std::size_t, max_rank> order{};
  std::size_t n = 0;
  for (std::size_t d = 0; d < rank_; ++d) {
    if (sizes_[d] == 1) continue;                     // keeps its stride: it is never stepped along
    if (strides_[d] == 0 && sizes_[d] > 1) continue;  // broadcast: stays stride 0
    order[n++] = d;
  }
  const auto magnitude = [this](std::size_t d) { return strides_[d] < 0 ? -strides_[d] : strides_[d]; };
  for (std::size_t i = 1; i < n; ++i) {
    for (std::size_t j = i; j > 0 && magnitude(order[j - 1]) < magnitude(order[j]); --j) {
      std::swap(order[j - 1], order[j]);
    }
  }
  std::int64_t stride = 1;
  for (std::size_t i = n; i-- > 0;) {
    dense.strides_[order[i]] = stride;
    stride *= std::max<std::int64_t>(sizes_[order[i]], 1);  // at most the element count: fits
  }
  return dense;
}

Layout Layout::restrided(std::int64_t offset, std::span<const std::int64_t> sizes,
                         std::span<const std::int64_t> strides) const noexcept {
  Layout view = *this;
  view.valid_ = valid_ && sizes.size() == strides.size() && sizes.size() <= max_rank;
  view.offset_ = offset;
  view.rank_ = static_cast<std::uint8_t>(std::min({sizes.size(), strides.size(), max_rank}));
  std::copy_n(sizes.begin(), view.rank_, view.sizes_.begin());
  std::copy_n(strides.begin(), view.rank_, view.strides_.begin());
  if (!well_formed(view.offset_, view.sizes(), view.strides())) view.valid_ = false;
  return view;
}

Layout Layout::slice(std::int64_t start, std::int64_t end) const noexcept {
  Layout view = *this;
  if (rank_ == 0 || !valid_) return view;
  const std::int64_t size = sizes_[0];
  const auto clamp = [size](std::int64_t at) {
    if (at < 0) at = at < -size ? 0 : at + size;  // written so that it cannot overflow
    return std::min(at, size);
  };
  start = clamp(start);
  end = std::max(clamp(end), start);
  std::int64_t step = 0;
  if (!mul(start, strides_[0], step) || !add(offset_, step, view.offset_)) return invalidated();
  view.sizes_[0] = end - start;
  return view;
}

Layout Layout::select(std::int64_t index) const noexcept {
  if (rank_ == 0 || !valid_) return invalidated();
  if (index < 0 && index >= -sizes_[0]) index += sizes_[0];
  if (index < 0 || index >= sizes_[0]) {
    return restrided(offset_, sizes().subspan(1), strides().subspan(1)).invalidated();
  }
  // In range: the offset stays inside the layout's extent, which fits.
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
  if (sizes.size() < rank_ || sizes.size() > max_rank) return invalidated();
  view.rank_ = static_cast<std::uint8_t>(sizes.size());
  const std::size_t lead = view.rank_ - rank_;  // new leading dimensions are broadcast
  for (std::size_t d = 0; d < view.rank_; ++d) {
    const bool is_new = d < lead;
    const std::int64_t old_size = is_new ? 1 : sizes_[d - lead];
    const std::int64_t size = (sizes[d] == -1 && !is_new) ? old_size : sizes[d];
    if (size < 0 || (old_size != 1 && size != old_size)) return invalidated();
    view.sizes_[d] = size;
    view.strides_[d] = (is_new || (old_size == 1 && size != 1)) ? 0 : strides_[d - lead];
  }
  if (!well_formed(view.offset_, view.sizes(), view.strides())) view.valid_ = false;
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
