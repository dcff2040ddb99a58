// Memsets and device-to-device copies of every shape a capture may hold (1D and 2D, elements of
// 1, 2 and 4 bytes, odd offsets, widths and pitches), run on a stream inside a pool function and
// replayed on the host as the reference: the cuda and torch [launch] tests check that a recorded
// graph, its memset and memcpy nodes turned into kernels, writes exactly those bytes.
#pragma once

#include <cuda.h>  // the driver's memset types only: the functions come through cudaGetDriverEntryPoint
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace launch_test {

enum class OpKind : std::uint8_t { memset, memset2d, copy };

/// One operation on a byte buffer: a memset of `height` rows (`pitch` apart) of `width` elements
/// of `element_bytes` set to `value`, or a copy of `width` bytes from `source` to `offset`.
struct Op {
  OpKind kind = OpKind::memset;
  std::size_t offset = 0;
  std::uint32_t value = 0;
  std::uint32_t element_bytes = 1;
  std::size_t width = 0;
  std::size_t height = 1;
  std::size_t pitch = 0;
  std::size_t source = 0;
};

/// Bytes the script's buffer needs.
inline constexpr std::size_t script_bytes = 160000;

/// Before the test's own kernel: a base fill of everything, then memsets of every kind, some over
/// others (their order matters). `kernel_region` (16-aligned) holds 64 floats 1.0f for the kernel.
inline constexpr std::size_t kernel_region = 120000;
inline std::vector<Op> script_before_kernel() {
  return {
      {.kind = OpKind::memset, .offset = 0, .value = 0x11, .element_bytes = 1, .width = script_bytes},
      {.kind = OpKind::memset, .offset = 1, .value = 0xAB, .element_bytes = 1, .width = 1000},
      {.kind = OpKind::memset, .offset = 501, .value = 0x00, .element_bytes = 1, .width = 17},  // over the last
      {.kind = OpKind::memset, .offset = 1002, .value = 0xBEEF, .element_bytes = 2, .width = 333},
      {.kind = OpKind::memset, .offset = 2000, .value = 0xDEADBEEF, .element_bytes = 4, .width = 777},
      {.kind = OpKind::memset,
       .offset = 5001,
       .value = 0xCD,
       .element_bytes = 1,
       .width = 37,
       .height = 9,
       .pitch = 101},
      {.kind = OpKind::memset,
       .offset = 7002,
       .value = 0x1234,
       .element_bytes = 2,
       .width = 13,
       .height = 5,
       .pitch = 66},
      {.kind = OpKind::memset,
       .offset = 8004,
       .value = 0xA5B6C7D8,
       .element_bytes = 4,
       .width = 17,
       .height = 7,
       .pitch = 132},
      {.kind = OpKind::memset, .offset = 10007, .value = 0x5A, .element_bytes = 1, .width = 99999},  // many blocks
      {.kind = OpKind::memset, .offset = 110000, .value = 0x7F, .element_bytes = 1, .width = 3},
      {.kind = OpKind::memset, .offset = 110016, .value = 0x0102, .element_bytes = 2, .width = 1},
      {.kind = OpKind::memset, .offset = kernel_region, .value = 0x3F800000, .element_bytes = 4, .width = 64},  // 1.0f
  };
}
/// After the test's kernel: copies, one of the kernel's result (so it must wait for the kernel).
inline std::vector<Op> script_after_kernel() {
  return {
      {.kind = OpKind::copy, .offset = 130000, .width = 256, .source = kernel_region},             // aligned
      {.kind = OpKind::copy, .offset = 131001, .width = 1234, .source = 5},                        // odd
      {.kind = OpKind::copy, .offset = 140000, .width = 4096, .source = 2000},                     // over the memsets
      {.kind = OpKind::memset, .offset = 140100, .value = 0xEE, .element_bytes = 1, .width = 10},  // after a copy
  };
}

/// The operations on host memory.
inline void apply(const std::vector<Op>& ops, std::vector<unsigned char>& bytes) {
  for (const Op& op : ops) {
    if (op.kind == OpKind::copy) {
      std::memmove(bytes.data() + op.offset, bytes.data() + op.source, op.width);
      continue;
    }
    for (std::size_t r = 0; r < op.height; ++r) {
      for (std::size_t e = 0; e < op.width; ++e) {
        for (std::uint32_t b = 0; b < op.element_bytes; ++b) {
          bytes[op.offset + r * op.pitch + e * op.element_bytes + b] =
              static_cast<unsigned char>((op.value >> (8 * b)) & 0xFFU);  // little endian
        }
      }
    }
  }
}

/// The driver's memsets of 2- and 4-byte elements (the runtime has bytes only), without linking
/// the driver library.
struct DriverMemsets {
  CUresult (*d16)(CUdeviceptr, unsigned short, std::size_t, CUstream) = nullptr;
  CUresult (*d32)(CUdeviceptr, unsigned int, std::size_t, CUstream) = nullptr;
  CUresult (*d2d16)(CUdeviceptr, std::size_t, unsigned short, std::size_t, std::size_t, CUstream) = nullptr;
  CUresult (*d2d32)(CUdeviceptr, std::size_t, unsigned int, std::size_t, std::size_t, CUstream) = nullptr;

  static const DriverMemsets& get() {
    static const DriverMemsets memsets = [] {
      DriverMemsets m;
      find("cuMemsetD16Async", m.d16);
      find("cuMemsetD32Async", m.d32);
      find("cuMemsetD2D16Async", m.d2d16);
      find("cuMemsetD2D32Async", m.d2d32);
      return m;
    }();
    return memsets;
  }

 private:
  template <class Function>
  static void find(const char* name, Function& function) {
    void* found = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion(name, &found, 12000, cudaEnableDefault, &status) != cudaSuccess ||
        found == nullptr) {
      throw std::runtime_error(std::string("no driver entry point ") + name);
    }
    function = reinterpret_cast<Function>(found);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  }
};

/// The operations on device memory at `base`, launched on `stream` (which may be capturing).
inline void launch(const std::vector<Op>& ops, unsigned char* base, cudaStream_t stream) {
  const DriverMemsets& driver = DriverMemsets::get();
  auto* cu_stream = reinterpret_cast<CUstream>(stream);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  for (const Op& op : ops) {
    unsigned char* at = base + op.offset;
    const auto address = reinterpret_cast<CUdeviceptr>(at);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    const auto value16 = static_cast<unsigned short>(op.value);
    bool ok = true;
    if (op.kind == OpKind::copy) {
      ok = cudaMemcpyAsync(at, base + op.source, op.width, cudaMemcpyDeviceToDevice, stream) == cudaSuccess;
    } else if (op.height == 1 && op.pitch == 0) {
      if (op.element_bytes == 1) ok = cudaMemsetAsync(at, static_cast<int>(op.value), op.width, stream) == cudaSuccess;
      if (op.element_bytes == 2) ok = driver.d16(address, value16, op.width, cu_stream) == CUDA_SUCCESS;
      if (op.element_bytes == 4) ok = driver.d32(address, op.value, op.width, cu_stream) == CUDA_SUCCESS;
    } else {
      if (op.element_bytes == 1) {
        ok = cudaMemset2DAsync(at, op.pitch, static_cast<int>(op.value), op.width, op.height, stream) == cudaSuccess;
      }
      if (op.element_bytes == 2)
        ok = driver.d2d16(address, op.pitch, value16, op.width, op.height, cu_stream) == CUDA_SUCCESS;
      if (op.element_bytes == 4)
        ok = driver.d2d32(address, op.pitch, op.value, op.width, op.height, cu_stream) == CUDA_SUCCESS;
    }
    if (!ok) throw std::runtime_error("a memset or copy of the script failed to launch");
  }
}

/// Memset and copy operations in a script (what a recording of it holds as memset / memcpy nodes).
inline std::size_t memsets_in(const std::vector<Op>& ops) {
  std::size_t n = 0;
  for (const Op& op : ops) n += op.kind == OpKind::copy ? 0 : 1;
  return n;
}
inline std::size_t copies_in(const std::vector<Op>& ops) {
  return ops.size() - memsets_in(ops);
}

}  // namespace launch_test
