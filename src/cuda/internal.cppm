// cgt.cuda:internal — what the cuda backend's units share: CUDA statuses as cgt errors (the
// helper cgt.torch shares, src/kernels/cuda_status.hpp), and device memory of its own.
module;
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>

module cgt.cuda:internal;
import cgt.core;

#include "cuda_status.hpp"  // in the purview: it names cgt types (see there)

namespace cgt::cuda {

using kernels::checked;  // NOLINT(misc-unused-using-decls): for the module's other units

/// Makes a device current for one piece of work and puts the caller's current device back after:
/// a pool on device 1 called from a thread whose current device is 0 launches on device 1 and
/// leaves the thread on device 0. When the device already is current (the usual case) it costs
/// one cudaGetDevice (the runtime answers from the thread's state, no driver call).
class CurrentDevice {
 public:
  CurrentDevice() = default;
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;
  ~CurrentDevice() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  [[nodiscard]] Result<void> enter(int device) {
    if (auto got = checked(cudaGetDevice(&previous_), "reading the current device"); !got) return got;
    if (previous_ == device) return {};
    if (auto set = checked(cudaSetDevice(device), "selecting the device"); !set) return set;
    switched_ = true;
    return {};
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

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
