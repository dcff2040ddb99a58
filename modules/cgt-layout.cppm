// cgt:layout — element types and strided layouts: what a buffer view of the host and cuda backends
// is, apart from the memory it views.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

export module cgt:layout;

export namespace cgt {

/// Element types of buffers.
enum class ElementType : std::uint8_t { f32 = 1, f64, i32, i64, u8 };

/// Bytes per element of `type`.
[[nodiscard]] constexpr std::size_t element_size(ElementType type) noexcept {
  switch (type) {
    case ElementType::f32: return 4;
    case ElementType::f64: return 8;
    case ElementType::i32: return 4;
    case ElementType::i64: return 8;
    case ElementType::u8: return 1;
  }
  return 1;
}

/// The name of an element type, e.g. "f32".
[[nodiscard]] std::string_view to_string(ElementType type) noexcept;

/// The element of `type` at `at` (host memory), as a double.
[[nodiscard]] double load_element(ElementType type, const std::byte* at) noexcept;
/// Stores `value` at `at` (host memory) as an element of `type` (converted as static_cast does).
void store_element(ElementType type, std::byte* at, double value) noexcept;

/// Most dimensions a buffer can have.
inline constexpr std::size_t max_rank = 6;

/// How a view reads its storage, like a tensor's metadata: element type, sizes and strides (in
/// elements), and the offset of the first element. A value type; views are new layouts.
class Layout {
 public:
  inline Layout() = default;
  /// Row-major, no gaps.
  [[nodiscard]] static Layout contiguous(ElementType type, std::span<const std::int64_t> sizes) noexcept;

  [[nodiscard]] inline ElementType type() const noexcept { return type_; }
  [[nodiscard]] inline std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] inline std::span<const std::int64_t> sizes() const noexcept { return {sizes_.data(), rank_}; }
  [[nodiscard]] inline std::span<const std::int64_t> strides() const noexcept { return {strides_.data(), rank_}; }
  [[nodiscard]] inline std::int64_t offset() const noexcept { return offset_; }
  /// Byte offset of the first element from the start of the storage.
  [[nodiscard]] inline std::size_t byte_offset() const noexcept {
    return static_cast<std::size_t>(offset_) * element_size(type_);
  }
  /// Number of elements (the product of the sizes).
  [[nodiscard]] std::size_t numel() const noexcept;
  [[nodiscard]] bool is_contiguous() const noexcept;
  /// Offset in elements, from the storage's start, of element `flat` in row-major order.
  [[nodiscard]] std::int64_t element_offset(std::size_t flat) const noexcept;
  /// Bytes the storage must have for this layout's elements (from the offset and strides).
  [[nodiscard]] std::size_t required_bytes() const noexcept;
  /// Bit d set when dimension d has stride 0 and size > 1 (a broadcast dimension).
  [[nodiscard]] inline std::uint32_t expanded_dims() const noexcept {
    std::uint32_t mask = 0;
    for (std::size_t d = 0; d < rank_; ++d) {
      if (strides_[d] == 0 && sizes_[d] > 1) mask |= 1U << d;
    }
    return mask;
  }

  /// Other sizes, strides and offset over the same storage.
  [[nodiscard]] Layout restrided(std::int64_t offset, std::span<const std::int64_t> sizes,
                                 std::span<const std::int64_t> strides) const noexcept;
  /// Elements [start, end) of dimension 0.
  [[nodiscard]] Layout slice(std::int64_t start, std::int64_t end) const noexcept;
  /// Element `index` of dimension 0, which goes away.
  [[nodiscard]] Layout select(std::int64_t index) const noexcept;
  /// The two dimensions of a rank-2 layout swapped.
  [[nodiscard]] Layout transposed() const noexcept;
  /// Broadcast: dimensions of size 1 (and new leading ones) grow to `sizes` with stride 0.
  [[nodiscard]] Layout expand(std::span<const std::int64_t> sizes) const noexcept;
  /// Dimensions broadcast in both `this` and `other` narrowed to one element, in both: copying
  /// between the results copies each distinct element once.
  [[nodiscard]] Layout without_shared_broadcast(const Layout& other) const noexcept;

 private:
  std::array<std::int64_t, max_rank> sizes_{};
  std::array<std::int64_t, max_rank> strides_{};
  std::int64_t offset_ = 0;
  ElementType type_ = ElementType::f32;
  std::uint8_t rank_ = 0;
};

}  // namespace cgt
