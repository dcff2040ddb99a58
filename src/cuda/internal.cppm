// cgt.cuda:internal — what the cuda backend's units share: CUDA statuses as cgt errors and the
// current device (helpers cgt.torch shares, src/kernels), and device memory of its own.
module;
#include <cuda.h>  // the driver's types only (current_device.hpp)
#include <cuda_runtime_api.h>

#include "capture_cuts.hpp"

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <vector>

module cgt.cuda:internal;
import cgt;
import cgt.core;

#include "cuda_status.hpp"     // in the purview: it names cgt types (see there)
#include "current_device.hpp"  // likewise
#include "host_segments.hpp"   // likewise

namespace cgt::cuda {

using kernels::checked;          // NOLINT(misc-unused-using-decls): for the module's other units
using kernels::current_context;  // NOLINT(misc-unused-using-decls): likewise
using kernels::CurrentDevice;    // NOLINT(misc-unused-using-decls): likewise
using kernels::HostSegments;     // NOLINT(misc-unused-using-decls): likewise
using kernels::launch_graph;     // NOLINT(misc-unused-using-decls): likewise

/// `bytes` of new memory on the current device (callers make the right one current), freed (cudaFree) when its last
/// owner lets go. Fails with out_of_memory when the device has no room, else backend_error, saying what was being done.
inline Result<std::shared_ptr<void>> device_allocation(std::size_t bytes, const char* doing) {
  void* memory = nullptr;
  if (const cudaError_t status = cudaMalloc(&memory, bytes); status != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(status == cudaErrorMemoryAllocation ? Errc::out_of_memory : Errc::backend_error,
                std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes while " + doing + ": " +
                    cudaGetErrorString(status));
  }
  return std::shared_ptr<void>(memory, [](void* pointer) { (void)cudaFree(pointer); });
}

}  // namespace cgt::cuda
