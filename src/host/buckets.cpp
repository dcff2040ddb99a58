// Batch buckets on the host: inputs padded into ordinary memory, outputs sliced by restriding.
module;
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <vector>

module cgt.host;
import cgt.core;
import :internal;

namespace cgt::host {
namespace {

// Elements [start, end) of dimension `dim` of `buffer` (a view).
Buffer narrow(const Buffer& buffer, std::size_t dim, std::int64_t start, std::int64_t end) {
  std::vector<std::int64_t> sizes(buffer.sizes().begin(), buffer.sizes().end());
  sizes[dim] = end - start;
  return buffer.restrided(buffer.offset() + (start * buffer.strides()[dim]), sizes, buffer.strides());
}

}  // namespace

Result<backend::Padded> HostDevice::pad(const void* value, const backend::ArgDesc& /*desc*/, std::size_t dim,
                                        std::int64_t size, Pad pad) {
  const Buffer& source = *static_cast<const Buffer*>(value);
  if (pad.mode == PadMode::constant && !holds_exactly(source.type(), pad.value)) {
    // Converting it would be undefined (NaN, out of range) or silently another value (0.5 as 0).
    return fail(Errc::invalid_argument, "the pad value " + std::to_string(pad.value) + " is not a value of its " +
                                            std::string(to_string(source.type())) +
                                            " elements; choose one the type holds (Buckets::per_input)");
  }
  const std::int64_t rows = source.sizes()[dim];
  std::vector<std::int64_t> sizes(source.sizes().begin(), source.sizes().end());
  sizes[dim] = size;
  auto padded = Buffer::make(source.type(), sizes);
  if (!padded) return std::unexpected(std::move(padded.error()));
  copy(source, narrow(*padded, dim, 0, rows));
  const Buffer added = narrow(*padded, dim, rows, size);
  if (pad.mode == PadMode::replicate) {
    // The last row, broadcast over the added rows (a stride-0 view: copied as often as needed).
    std::vector<std::int64_t> strides(source.strides().begin(), source.strides().end());
    strides[dim] = 0;
    std::vector<std::int64_t> added_sizes(sizes);
    added_sizes[dim] = size - rows;
    const Buffer last = narrow(source, dim, rows - 1, rows);
    copy(last.restrided(last.offset(), added_sizes, strides), added);
  } else {
    added.fill(pad.value);
  }
  auto owner = std::make_shared<Buffer>(*std::move(padded));
  backend::Padded result{.owner = owner, .value = owner.get(), .desc = {}};
  if (auto described = Backend::describe(*owner, result.desc); !described) {
    return std::unexpected(std::move(described.error()));
  }
  return result;
}

Result<void> HostDevice::write_back(const void* padded, const void* original, std::size_t dim, std::int64_t rows) {
  const Buffer& source = *static_cast<const Buffer*>(padded);
  const Buffer& target = *static_cast<const Buffer*>(original);
  if (dim >= source.rank() || source.sizes()[dim] < rows || target.rank() != source.rank() ||
      target.sizes()[dim] != rows) {
    return fail(Errc::invalid_argument, "a padded input's write cannot be copied back: its sizes do not match");
  }
  copy(narrow(source, dim, 0, rows), target);
  return {};
}

Result<std::shared_ptr<const void>> HostDevice::slice(const void* value, const backend::StorageHandle* /*storage*/,
                                                      std::size_t dim, std::int64_t bucket, std::int64_t size) {
  const Buffer& output = *static_cast<const Buffer*>(value);
  if (output.empty() || dim >= output.rank() || output.sizes()[dim] != bucket) return nullptr;
  // The view keeps the output's life number (a copy of the buffer): the pool tells it live or stale.
  return std::make_shared<Buffer>(narrow(output, dim, 0, size));
}

std::vector<std::int64_t> HostDevice::sizes_of(const void* value) const {
  const Buffer& buffer = *static_cast<const Buffer*>(value);
  return {buffer.sizes().begin(), buffer.sizes().end()};
}

}  // namespace cgt::host
