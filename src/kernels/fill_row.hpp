// What a memset node writes, as code a kernel and a host test run alike: cgt replaces a captured
// graph's memset nodes by kernel nodes that write the same bytes (node_rewrite.hpp says why). No
// CUDA header: compiled by nvcc for the fill kernel and by the host compiler for the unit test.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CGT_HOST_DEVICE __host__ __device__
#else
#define CGT_HOST_DEVICE
#endif

namespace cgt::kernels {

/// A memset (cudaMemsetParams): `height` rows `pitch` bytes apart, each `width` elements of
/// `element_bytes` (1, 2 or 4) bytes set to the low `element_bytes` bytes of `value`.
struct Fill {
  void* target = nullptr;
  std::size_t pitch = 0;
  std::uint32_t value = 0;
  std::uint32_t element_bytes = 1;
  std::size_t width = 0;
  std::size_t height = 1;
};

/// The four bytes a fill writes at every 4-aligned address of a row that begins at `row` (little
/// endian: byte j lies at address + j). Element k of the row starts at row + k * element_bytes, so
/// the byte at address x is byte (x - row) mod element_bytes of `value`; element_bytes divides 4,
/// so that byte depends only on x mod 4 (given the row).
CGT_HOST_DEVICE inline std::uint32_t fill_word(std::uint32_t value, std::uint32_t element_bytes,
                                               std::uintptr_t row) noexcept {
  const std::uint32_t phase = static_cast<std::uint32_t>(row % element_bytes);
  std::uint32_t word = 0;
  for (std::uint32_t j = 0; j < 4; ++j) {
    const std::uint32_t k = (j + element_bytes - phase) % element_bytes;  // byte of the element at address+j
    word |= ((value >> (8 * k)) & 0xFFU) << (8 * j);
  }
  return word;
}

/// The byte a fill whose row word is `word` writes at `address`.
CGT_HOST_DEVICE inline unsigned char fill_byte(std::uint32_t word, std::uintptr_t address) noexcept {
  return static_cast<unsigned char>((word >> (8 * (address % 4))) & 0xFFU);
}

/// Sixteen bytes stored at once (one 128-bit store on the GPU).
struct alignas(16) FillQuad {
  std::uint32_t words[4];
};

/// Worker `worker` of `workers`' share of filling `bytes` bytes at `row` with `word`: bytes up to
/// the first 16-aligned address one at a time, then 16 at a time, then the rest one at a time.
/// The workers together write every byte once and nothing outside the row.
CGT_HOST_DEVICE inline void fill_row(unsigned char* row, std::size_t bytes, std::uint32_t word, std::size_t worker,
                                     std::size_t workers) noexcept {
  const auto start = reinterpret_cast<std::uintptr_t>(row);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  std::size_t head = (16 - start % 16) % 16;
  if (head > bytes) head = bytes;
  const std::size_t quads = (bytes - head) / 16;
  const std::size_t tail = head + quads * 16;
  for (std::size_t i = worker; i < head; i += workers) row[i] = fill_byte(word, start + i);
  const FillQuad quad{{word, word, word, word}};
  auto* body = reinterpret_cast<FillQuad*>(row + head);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  for (std::size_t i = worker; i < quads; i += workers) body[i] = quad;
  for (std::size_t i = tail + worker; i < bytes; i += workers) row[i] = fill_byte(word, start + i);
}

/// Worker `worker` of `workers` along a row, on rows `first_row`, `first_row + row_step`, ...: its
/// share of `fill`.
CGT_HOST_DEVICE inline void fill_rows(const Fill& fill, std::size_t first_row, std::size_t row_step, std::size_t worker,
                                      std::size_t workers) noexcept {
  const std::size_t bytes = fill.width * fill.element_bytes;
  for (std::size_t r = first_row; r < fill.height; r += row_step) {
    unsigned char* row = static_cast<unsigned char*>(fill.target) + r * fill.pitch;
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast)
    fill_row(row, bytes, fill_word(fill.value, fill.element_bytes, reinterpret_cast<std::uintptr_t>(row)), worker,
             workers);
  }
}

}  // namespace cgt::kernels
