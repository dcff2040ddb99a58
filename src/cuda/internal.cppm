// cgt.cuda:internal — what the cuda backend's units share: CUDA statuses as cgt errors, and
// device addresses as the integers the engine keys blocks by.
module;
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

module cgt.cuda:internal;
import cgt;

namespace cgt::cuda {

/// Nothing when `status` is cudaSuccess, else a backend_error that says what was being done. The
/// error is cleared first (a non-sticky one must not fail the next call).
inline Result<void> checked(cudaError_t status, const char* doing) {
  if (status == cudaSuccess) return {};
  (void)cudaGetLastError();
  return fail(Errc::backend_error, std::string("CUDA failed while ") + doing + ": " + cudaGetErrorString(status));
}

inline std::uintptr_t address_of(const void* pointer) noexcept {
  return reinterpret_cast<std::uintptr_t>(pointer);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
}

inline std::byte* pointer_to(std::uintptr_t address) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-reinterpret-cast,performance-no-int-to-ptr): inverse of address_of
  return reinterpret_cast<std::byte*>(address);
}

}  // namespace cgt::cuda
