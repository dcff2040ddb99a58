// cgt.host:buffer — typed, strided views of host memory: what host pool functions take and return.
module;
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>

export module cgt.host:buffer;
// The core and the backend interface; importers of cgt.host get `cgt` only.
import cgt;
import cgt.core;

export namespace cgt::host {

// Re-exported for users of cgt.host.
using cgt::element_size;  // NOLINT(misc-unused-using-decls)
using cgt::ElementType;
using cgt::max_rank;  // NOLINT(misc-unused-using-decls)

/// A typed, strided view of host memory, like a tensor: a storage (the memory block) and a
/// `Layout` (sizes and strides in elements, the offset of the first element). Copying a buffer
/// copies the view, not the data. A buffer made by `Buffer::make` or `take()` owns its storage; a
/// buffer from a pool views pool memory and is valid as long as the lease it came from.
class Buffer {
 public:
  inline Buffer() = default;

  /// A new contiguous buffer in ordinary memory, owned, filled with zeros. Fails with
  /// `invalid_argument` for a negative size, more than `max_rank` dimensions or a byte count that
  /// overflows, and with `out_of_memory` when the system refuses the memory.
  [[nodiscard]] static Result<Buffer> make(ElementType type, std::span<const std::int64_t> sizes);
  [[nodiscard]] static Result<Buffer> make(ElementType type, std::initializer_list<std::int64_t> sizes) {
    return make(type, std::span<const std::int64_t>(sizes.begin(), sizes.size()));
  }
  /// A contiguous view of `bytes` at `storage` (owned only through `owner`, if given).
  [[nodiscard]] static Buffer view_of(std::byte* storage, std::size_t bytes, ElementType type,
                                      std::span<const std::int64_t> sizes, std::shared_ptr<std::byte[]> owner = {});

  [[nodiscard]] inline bool empty() const noexcept { return storage_ == nullptr; }
  /// Whether the view is usable: its layout is valid (see `Layout`) and every element lies inside
  /// its storage. A view made with arguments out of range is not; the pools refuse it.
  [[nodiscard]] inline bool fits() const noexcept { return fits_; }
  [[nodiscard]] inline const Layout& layout() const noexcept { return layout_; }
  [[nodiscard]] inline ElementType type() const noexcept { return layout_.type(); }
  [[nodiscard]] inline std::size_t rank() const noexcept { return layout_.rank(); }
  [[nodiscard]] inline std::span<const std::int64_t> sizes() const noexcept { return layout_.sizes(); }
  [[nodiscard]] inline std::span<const std::int64_t> strides() const noexcept { return layout_.strides(); }
  [[nodiscard]] inline std::int64_t offset() const noexcept { return layout_.offset(); }
  /// Number of elements (the product of the sizes).
  [[nodiscard]] inline std::size_t numel() const noexcept { return layout_.numel(); }
  [[nodiscard]] inline bool is_contiguous() const noexcept { return layout_.is_contiguous(); }
  /// The memory block this buffer views, and its size.
  [[nodiscard]] inline std::byte* storage() const noexcept { return storage_; }
  [[nodiscard]] inline std::size_t storage_bytes() const noexcept { return storage_bytes_; }
  /// Address of the first element.
  [[nodiscard]] inline std::byte* data() const noexcept { return storage_ + layout_.byte_offset(); }
  /// The first element as `T*`; index it directly only when the buffer is contiguous.
  template <class T>
  [[nodiscard]] inline T* as() const noexcept {
    return reinterpret_cast<T*>(data());  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  }
  [[nodiscard]] inline float* f32() const noexcept { return as<float>(); }

  /// Element `flat` in row-major order of the sizes, honouring strides, as a double.
  [[nodiscard]] double get(std::size_t flat) const noexcept;
  /// Sets element `flat` (row-major order of the sizes, honouring strides).
  void set(std::size_t flat, double value) const noexcept;
  /// Sets every element.
  void fill(double value) const noexcept;

  /// The same storage seen through another layout (a view).
  [[nodiscard]] inline Buffer with_layout(const Layout& layout) const {
    Buffer view = *this;
    view.layout_ = layout;
    view.fits_ = layout.fits(storage_bytes_);
    return view;
  }
  /// The same storage with other sizes, strides and offset (a view).
  [[nodiscard]] Buffer restrided(std::int64_t offset, std::span<const std::int64_t> sizes,
                                 std::span<const std::int64_t> strides) const {
    return with_layout(layout_.restrided(offset, sizes, strides));
  }
  /// Elements [start, end) of dimension 0 (a view).
  [[nodiscard]] Buffer slice(std::int64_t start, std::int64_t end) const {
    return with_layout(layout_.slice(start, end));
  }
  /// A broadcast view: dimensions of size 1 grow to `sizes` with stride 0 (like torch's expand).
  [[nodiscard]] Buffer expand(std::span<const std::int64_t> sizes) const { return with_layout(layout_.expand(sizes)); }
  [[nodiscard]] Buffer expand(std::initializer_list<std::int64_t> sizes) const {
    return expand(std::span<const std::int64_t>(sizes.begin(), sizes.size()));
  }
  /// The same view over another storage (same offset, sizes, strides).
  [[nodiscard]] Buffer on_storage(std::byte* storage, std::size_t bytes, std::shared_ptr<std::byte[]> owner = {}) const;
  /// An owned, contiguous copy in ordinary memory. Fails with `invalid_argument` for a view that
  /// does not fit its storage, and with `out_of_memory`.
  [[nodiscard]] Result<Buffer> clone() const;
  /// Bytes the storage must have for this view's elements (from the offset and strides).
  [[nodiscard]] inline std::size_t required_bytes() const noexcept { return layout_.required_bytes(); }
  /// Bit d set when dimension d has stride 0 and size > 1 (a broadcast dimension).
  [[nodiscard]] inline std::uint32_t expanded_dims() const noexcept { return layout_.expanded_dims(); }
  [[nodiscard]] inline const std::shared_ptr<std::byte[]>& owner() const noexcept { return owner_; }

  /// For the pool: which life number of pool memory this value was handed out in (0: not
  /// handed out by a pool). A copy of a value keeps it; the pool refuses an input whose life number
  /// is not the current one of its memory (an escaped copy of an output whose memory was reused).
  [[nodiscard]] inline std::uint64_t life() const noexcept { return life_; }
  inline void set_life(std::uint64_t life) noexcept { life_ = life; }

 private:
  std::shared_ptr<std::byte[]> owner_;
  std::byte* storage_ = nullptr;
  std::size_t storage_bytes_ = 0;
  Layout layout_;
  // Decided whenever the view or its storage changes (a pool checks every input on every call).
  bool fits_ = layout_.fits(0);
  std::uint64_t life_ = 0;
};

/// Copies `source` into `target` element by element (same sizes, any strides: negative, overlapping
/// or broadcast ones read correctly; `target` must not overlap itself, apart from dimensions
/// broadcast in both). Dimensions that are broadcast in both (stride 0) are copied once, not once
/// per element. Both must fit their storages (`Buffer::fits`).
void copy(const Buffer& source, const Buffer& target) noexcept;

}  // namespace cgt::host
