// cgt.vocabulary:layout — element types and strided layouts: what a buffer view of the host and cuda backends
// is, apart from the memory it views.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

export module cgt.vocabulary:layout;
import :error;

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
/// Stores `value` at `at` (host memory) as an element of `type`: converted as static_cast does
/// where the type holds the value (toward zero for an integer type), else saturated to the
/// integer type's range, NaN as 0 (static_cast of such a value is undefined behaviour).
void store_element(ElementType type, std::byte* at, double value) noexcept;
/// Whether an element of `type` holds `value` exactly: any value for a floating type (rounded for
/// f32), a whole number in range for an integer type.
[[nodiscard]] bool holds_exactly(ElementType type, double value) noexcept;

/// Most dimensions a buffer can have.
inline constexpr std::size_t max_rank = 6;

/// Bytes of a new contiguous buffer of `type` and `sizes` (at least 1). Fails with
/// `invalid_argument`, saying why, for more than `max_rank` dimensions, a negative size, or a
/// byte count that does not fit in `std::size_t` (nor the element count in `std::int64_t`).
[[nodiscard]] Result<std::size_t> contiguous_bytes(ElementType type, std::span<const std::int64_t> sizes);

/// How a view reads its storage, like a tensor's metadata: element type, sizes and strides (in
/// elements), and the offset of the first element. A value type; views are new layouts.
///
/// Views never overflow or read past their arguments: a view operation with arguments it cannot
/// honour (an index out of range, a negative size, more than `max_rank` dimensions, mismatched
/// sizes and strides, an expand of a dimension that is not 1) gives an *invalid* layout, like a NaN:
/// `valid()` is false, it has no elements (`numel()` is 0), `fits` is false for every storage,
/// and the backends refuse a buffer with it (`invalid_argument`). Whether a valid layout stays
/// inside a given storage is `fits`.
class Layout {
 public:
  inline Layout() = default;
  /// Row-major, no gaps. Invalid for a negative size, more than `max_rank` dimensions, or an
  /// element count that overflows.
  [[nodiscard]] static Layout contiguous(ElementType type, std::span<const std::int64_t> sizes) noexcept;

  [[nodiscard]] inline ElementType type() const noexcept { return type_; }
  [[nodiscard]] inline std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] inline std::span<const std::int64_t> sizes() const noexcept { return {sizes_.data(), rank_}; }
  [[nodiscard]] inline std::span<const std::int64_t> strides() const noexcept { return {strides_.data(), rank_}; }
  [[nodiscard]] inline std::int64_t offset() const noexcept { return offset_; }
  /// False when the layout came from a view operation with arguments it cannot honour.
  [[nodiscard]] inline bool valid() const noexcept { return valid_; }
  /// Byte offset of the first element from the start of the storage (0 for an invalid layout or
  /// a negative offset, which `fits` refuses).
  [[nodiscard]] inline std::size_t byte_offset() const noexcept {
    return valid_ && offset_ > 0 ? static_cast<std::size_t>(offset_) * element_size(type_) : 0;
  }
  /// Number of elements (the product of the sizes); 0 for an invalid layout.
  [[nodiscard]] std::size_t numel() const noexcept;
  [[nodiscard]] bool is_contiguous() const noexcept;
  /// Offset in elements, from the storage's start, of element `flat` in row-major order.
  [[nodiscard]] std::int64_t element_offset(std::size_t flat) const noexcept;
  /// Bytes the storage must have for this layout's elements: one past the highest element the
  /// view reaches (any strides, negative ones included). `SIZE_MAX` when that does not fit in a
  /// `std::size_t` or the layout is invalid. Says nothing of elements below the storage's start
  /// (a negative stride from a small offset): `fits` checks both ends.
  [[nodiscard]] std::size_t required_bytes() const noexcept;
  /// Whether every element lies inside a storage of `storage_bytes`: a valid layout whose lowest
  /// element is at or after the start and whose highest ends at or before `storage_bytes`. A
  /// layout without elements fits any storage (when valid).
  [[nodiscard]] bool fits(std::size_t storage_bytes) const noexcept;
  /// Whether no two elements share memory (broadcast dimensions aside: those are meant to):
  /// checked conservatively, so an unusual injective layout may answer false.
  [[nodiscard]] bool is_injective_apart_from_broadcast() const noexcept;
  /// Whether the elements fill `[data, data + numel * element size)` exactly, in some order of
  /// the dimensions, with non-negative strides and no broadcast dimension: copying that many bytes
  /// copies the view.
  [[nodiscard]] bool is_dense() const noexcept;
  /// Bit d set when dimension d has stride 0 and size > 1 (a broadcast dimension).
  [[nodiscard]] inline std::uint32_t expanded_dims() const noexcept {
    std::uint32_t mask = 0;
    for (std::size_t d = 0; d < rank_; ++d) {
      if (strides_[d] == 0 && sizes_[d] > 1) mask |= 1U << d;
    }
    return mask;
  }

  /// Other sizes, strides and offset over the same storage (like `as_strided`). Invalid when the
  /// two spans differ in length, have more than `max_rank` entries, or a size is negative.
  [[nodiscard]] Layout restrided(std::int64_t offset, std::span<const std::int64_t> sizes,
                                 std::span<const std::int64_t> strides) const noexcept;
  /// Elements [start, end) of dimension 0, with Python's (and torch's) rules: a negative index
  /// counts from the end, and both are clamped to the dimension (an empty range gives size 0).
  [[nodiscard]] Layout slice(std::int64_t start, std::int64_t end) const noexcept;
  /// Element `index` of dimension 0, which goes away; a negative index counts from the end.
  /// Invalid when out of range.
  [[nodiscard]] Layout select(std::int64_t index) const noexcept;
  /// The two dimensions of a rank-2 layout swapped.
  [[nodiscard]] Layout transposed() const noexcept;
  /// Broadcast: dimensions of size 1 (and new leading ones) grow to `sizes` with stride 0; -1
  /// keeps a dimension's size. Invalid, as torch refuses, for fewer dimensions than the layout
  /// has, more than `max_rank`, a dimension other than 1 asked to change, or a negative size.
  [[nodiscard]] Layout expand(std::span<const std::int64_t> sizes) const noexcept;
  /// Dimensions broadcast in both `this` and `other` narrowed to one element, in both: copying
  /// between the results copies each distinct element once.
  [[nodiscard]] Layout without_shared_broadcast(const Layout& other) const noexcept;
  /// A layout for a new storage holding this view's elements once: the same sizes, broadcast
  /// dimensions kept at stride 0, the others dense (no gaps, no overlap, non-negative strides) in
  /// this view's order of dimensions (outermost: the largest |stride|), offset 0. A dense view
  /// gets its own strides back. What a copied input's pool slot is made with.
  [[nodiscard]] Layout dense_like() const noexcept;
  /// This layout with `valid()` false.
  [[nodiscard]] Layout invalidated() const noexcept;

 private:
  std::array<std::int64_t, max_rank> sizes_{};
  std::array<std::int64_t, max_rank> strides_{};
  std::int64_t offset_ = 0;
  ElementType type_ = ElementType::f32;
  std::uint8_t rank_ = 0;
  bool valid_ = true;
};

}  // namespace cgt
