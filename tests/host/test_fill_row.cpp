// The fill that replaces a recorded graph's memset nodes (src/kernels/fill_row.hpp), run on the
// host exactly as the kernel's threads run it: every byte a memset would write, and nothing else,
// whatever the alignment, element size, width, pitch and number of workers.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "kernels/fill_row.hpp"

namespace {

constexpr unsigned char guard = 0x99;

// What a memset of `fill` writes, element by element.
void reference_fill(const cgt::kernels::Fill& fill) {
  for (std::size_t r = 0; r < fill.height; ++r) {
    auto* row = static_cast<unsigned char*>(fill.target) + r * fill.pitch;
    for (std::size_t e = 0; e < fill.width * fill.element_bytes; ++e) {
      row[e] = static_cast<unsigned char>((fill.value >> (8 * (e % fill.element_bytes))) & 0xFFU);
    }
  }
}

// Every worker of a grid of `rows` x `workers`, one after another.
void kernel_fill(const cgt::kernels::Fill& fill, std::size_t rows, std::size_t workers) {
  for (std::size_t first_row = 0; first_row < rows; ++first_row) {
    for (std::size_t worker = 0; worker < workers; ++worker)
      cgt::kernels::fill_rows(fill, first_row, rows, worker, workers);
  }
}

struct AlignedBytes {
  explicit AlignedBytes(std::size_t n)
      : size(n), data(static_cast<unsigned char*>(::operator new(n, std::align_val_t{16}))) {}
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  ~AlignedBytes() { ::operator delete(data, std::align_val_t{16}); }
  std::size_t size;
  unsigned char* data;
};

}  // namespace

TEST_CASE("fill_row writes what a memset writes, and only that, for every alignment and element size", "[launch]") {
  constexpr std::size_t bytes = 1024;
  AlignedBytes expected(bytes);
  AlignedBytes actual(bytes);
  int cases = 0;
  for (const std::uint32_t element_bytes : {1U, 2U, 4U}) {
    for (std::size_t offset = 0; offset < 20; ++offset) {
      for (const std::size_t width : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{5}, std::size_t{16},
                                      std::size_t{17}, std::size_t{40}, std::size_t{63}}) {
        for (const std::size_t height : {std::size_t{1}, std::size_t{3}}) {
          for (const std::size_t workers : {std::size_t{1}, std::size_t{3}, std::size_t{64}}) {
            cgt::kernels::Fill fill;
            fill.target = actual.data + offset;
            fill.value = 0xA1B2C3D4U;
            fill.element_bytes = element_bytes;
            fill.width = width;
            fill.height = height;
            fill.pitch = height == 1 ? 0 : width * element_bytes + 7 + offset % 5;  // rows of every phase
            std::fill_n(actual.data, bytes, guard);
            std::fill_n(expected.data, bytes, guard);
            kernel_fill(fill, height == 1 ? 1 : 2, workers);
            fill.target = expected.data + offset;
            reference_fill(fill);
            INFO("element_bytes " << element_bytes << " offset " << offset << " width " << width << " height " << height
                                  << " workers " << workers);
            REQUIRE(std::equal(actual.data, actual.data + bytes, expected.data));
            ++cases;
          }
        }
      }
    }
  }
  CHECK(cases == 3 * 20 * 8 * 2 * 3);
}

TEST_CASE("fill_word repeats each element's bytes from the row's start, whatever the row's alignment", "[launch]") {
  // Bytes of 0xBEEF, 2-byte elements: EF BE EF BE from a 4-aligned row; BE EF BE EF from an odd one
  // (its element 0 starts at address 1, so address 4 holds the second byte of element 1).
  CHECK(cgt::kernels::fill_word(0xBEEF, 2, 0x1000) == 0xBEEFBEEFU);
  CHECK(cgt::kernels::fill_word(0xBEEF, 2, 0x1001) == 0xEFBEEFBEU);
  CHECK(cgt::kernels::fill_word(0xAB, 1, 0x1003) == 0xABABABABU);
  CHECK(cgt::kernels::fill_word(0x11223344, 4, 0x1001) == 0x22334411U);
}
